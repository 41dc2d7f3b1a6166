"""convgrad.torch: the registered custom ops against PyTorch's own convolutions, finite
differences (gradcheck / gradgradcheck in f64), torch.library.opcheck, low precision, strides,
zero-copy, errors, the modules and torch.compile."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
# Importing parts of torch (opcheck, torch.compile) defines torch.jit script methods, which warn.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

import convgrad  # noqa: E402
import convgrad.torch as ct  # noqa: E402
from convgrad import interop  # noqa: E402
from convgrad.engines import get_engine  # noqa: E402
from interop_cases import CASES, GROUPED, IDS, Case  # noqa: E402


# ---------------------------------------------------------------------------------------------
# The op on a case, and PyTorch's own result
# ---------------------------------------------------------------------------------------------
def inputs(case: Case, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Random non-zero src, weights, bias in the case's layouts (contiguous leaves)."""
    return tuple(None if a is None else torch.from_numpy(a).to(dtype) for a in case.arrays(np.random.default_rng()))


def ours(case: Case):
    function = ct.conv_transpose if case.transposed else ct.convolution
    return lambda x, w, b=None: function(x, w, b, **case.attrs)


def reference(case: Case):
    """The same op with torch.nn.functional (NCX / PyTorch weights; asymmetric pads by F.pad and cropping)."""
    strides, dilations, pb, pe = case.geometry()

    def run(x, w, b=None):
        xs, ws = from_data(x, case.data_format), from_weights(w, case.wformat)
        if not case.transposed:
            pad = [p for b_, e in zip(reversed(pb), reversed(pe)) for p in (b_, e)]
            conv = (F.conv1d, F.conv2d, F.conv3d)[case.rank - 1]
            y = conv(F.pad(xs, pad), ws, b, stride=strides, dilation=dilations, groups=case.groups)
        else:
            conv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[case.rank - 1]
            full = conv(xs, ws, None, stride=strides, dilation=dilations, groups=case.groups)
            extra = case.output_padding or (0,) * case.rank
            full = F.pad(full, [p for e in reversed(extra) for p in (0, e)])
            y = full[(slice(None), slice(None), *(slice(b_, n - e) for b_, e, n in zip(pb, pe, full.shape[2:])))]
            if b is not None:
                y = y + b.view(1, -1, *(1,) * case.rank)
        return to_data(y, case.data_format)
    return run


def to_data(t, data_format):
    return t if data_format == "NCX" else t.movedim(1, -1)


def from_data(t, data_format):
    return t if data_format == "NCX" else t.movedim(-1, 1)


def from_weights(t, weights_format):
    """OIX/IOX or XIO/XOI weights in PyTorch's (A, B, *K) layout (OIX and IOX are PyTorch's)."""
    return t if weights_format[0] != "X" else t.permute(t.ndim - 1, t.ndim - 2, *range(t.ndim - 2))


def _cotangent(y):
    return torch.rand_like(y) - 0.5


# ---------------------------------------------------------------------------------------------
# Against PyTorch, finite differences, opcheck
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_pytorch_values_and_gradients(case: Case) -> None:
    x, w, b = (t.requires_grad_() if t is not None else None for t in inputs(case))
    params = [t for t in (x, w, b) if t is not None]
    got, want = ours(case)(x, w, b), reference(case)(x, w, b)
    assert got.shape == want.shape and got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = _cotangent(got)
    torch.testing.assert_close(torch.autograd.grad(got, params, g), torch.autograd.grad(want, params, g),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradcheck_and_gradgradcheck(case: Case) -> None:
    args = tuple(t.requires_grad_() for t in inputs(case) if t is not None)
    assert torch.autograd.gradcheck(ours(case), args, fast_mode=True)
    assert torch.autograd.gradgradcheck(ours(case), args, fast_mode=True)


def test_gradgradcheck_slow_mode_against_every_element() -> None:
    """One small case with the full (slow-mode) Jacobians, first and second order."""
    case = Case(False, (4, 3), (2, 2), cin=2, cout=2, strides=(2, 1), pads_begin=(1, 0), pads_end=(0, 1), n=1)
    args = tuple(t.requires_grad_() for t in inputs(case))
    assert torch.autograd.gradcheck(ours(case), args)
    assert torch.autograd.gradgradcheck(ours(case), args)


def test_the_gradient_ops_are_differentiable_too() -> None:
    """Gradients of the backward ops (the adjoint table's second level) by finite differences."""
    cases = [Case(False, (5, 4), (3, 2), strides=(2, 1), dilations=(1, 2), pads_begin=(1, 0), pads_end=(0, 1), n=1),
             Case(True, (3, 2), (2, 3), strides=(2, 1), pads_begin=(0, 1), pads_end=(1, 0), output_padding=(1, 0), n=1)]
    for case in cases:
        x, w, _ = inputs(case)
        y = ours(case)(x, w)
        attrs = case.attrs
        dy = torch.rand_like(y, requires_grad=True)
        ops = torch.ops.convgrad
        if case.transposed:
            # ConvTranspose's data gradient is a convolution of dy; its weights gradient pairs x, dy.
            calls = [(lambda a, b: ops.conv_transpose_backward_data(a, b, **attrs), (dy, w)),
                     (lambda a, b: ops.conv_transpose_backward_weights(a, b, weights_shape=list(w.shape), **attrs), (x, dy))]
        else:
            calls = [(lambda a, b: ops.convolution_backward_data(a, b, dst_shape=list(x.shape), **attrs), (dy, w)),
                     (lambda a, b: ops.convolution_backward_weights(a, b, weights_shape=list(w.shape), **attrs), (x, dy))]
        for function, args in calls:
            args = tuple(a.detach().clone().requires_grad_() for a in args)
            assert torch.autograd.gradcheck(function, args, fast_mode=True)
            assert torch.autograd.gradgradcheck(function, args, fast_mode=True)


def test_opcheck_every_registered_op() -> None:
    case = Case(False, (5, 4), (3, 2), strides=(2, 1), pads_begin=(1, 0), pads_end=(0, 1), n=1)
    tcase = Case(True, (3, 2), (2, 3), strides=(2, 1), pads_begin=(0, 1), pads_end=(1, 0), output_padding=(1, 0), n=1)
    x, w, b = inputs(case, torch.float32)
    tx, tw, tb = inputs(tcase, torch.float32)
    y, ty = ours(case)(x, w, b), ours(tcase)(tx, tw, tb)
    a, ta = case.attrs, tcase.attrs
    ops = torch.ops.convgrad
    samples = [
        (ops.convolution, (x, w, b), a),
        (ops.convolution, (x, w), dict(a, auto_pad="same_lower")),
        (ops.convolution_backward_data, (torch.rand_like(y), w), dict(a, dst_shape=list(x.shape))),
        (ops.convolution_backward_weights, (x, torch.rand_like(y)), dict(a, weights_shape=list(w.shape))),
        (ops.conv_transpose, (tx, tw, tb), ta),
        (ops.conv_transpose_backward_data, (torch.rand_like(ty), tw), ta),
        (ops.conv_transpose_backward_weights, (tx, torch.rand_like(ty)), dict(ta, weights_shape=list(tw.shape))),
    ]
    for op, args, kwargs in samples:
        torch.library.opcheck(op, tuple(t.detach().clone().requires_grad_() for t in args), kwargs)


# ---------------------------------------------------------------------------------------------
# The eager path (plain tensors: no dispatcher) against the registered ops
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_eager_path_equals_the_registered_op(case: Case) -> None:
    """Plain tensors take ``ct._Eager`` (no dispatcher); its values equal the registered op's bit
    for bit, and so do its gradients, both those its backward computes directly and those of
    ``create_graph`` (through the differentiable ops)."""
    leaves = [t.requires_grad_() for t in inputs(case, torch.float32) if t is not None]
    registered = (torch.ops.convgrad.conv_transpose if case.transposed else torch.ops.convgrad.convolution)
    eager, dispatched = ours(case)(*leaves), registered(*leaves, **case.attrs)
    assert type(eager.grad_fn).__name__ == "_EagerBackward" != type(dispatched.grad_fn).__name__
    assert torch.equal(eager, dispatched)
    g = _cotangent(eager)
    direct = torch.autograd.grad(eager, leaves, g)
    differentiable = torch.autograd.grad(ours(case)(*leaves), leaves, g, create_graph=True)
    assert all(d.grad_fn is None for d in direct) and all(d.grad_fn is not None for d in differentiable[:2])  # bias: g summed
    for want, *got in zip(torch.autograd.grad(dispatched, leaves, g), direct, differentiable):
        assert all(torch.equal(want, t) for t in got)


def test_eager_errors_are_the_registered_ops_errors() -> None:
    """An invalid call fails alike with and without the dispatcher."""
    x, w = torch.randn(1, 6, 6, 2), torch.randn(3, 3, 2, 4)
    calls = [((x, w, torch.ones(3)), {}), ((x, w.double()), {}), ((x[0], w), {}), ((x, w), {"dilations": [4, 4]})]
    for tensors, attrs in calls:
        messages = []
        for run in (ct.convolution, torch.ops.convgrad.convolution):
            with pytest.raises(convgrad.ConvgradError) as info:
                run(*tensors, **attrs)
            messages.append((type(info.value), str(info.value)))
        assert messages[0] == messages[1]


def test_plain_tensors_under_a_functorch_transform_take_the_registered_op() -> None:
    """Inside ``torch.func.vmap`` (a transform active, though these tensors are not batched) a
    call that wants a gradient takes the registered op: ``ct._Eager`` has no ``setup_context``,
    which PyTorch requires of a Function under functorch transforms."""
    x, w = torch.randn(1, 6, 6, 2), torch.randn(3, 3, 2, 4, requires_grad=True)
    want = ct.convolution(x, w, pads_begin=1, pads_end=1)
    got = torch.func.vmap(lambda s: s * ct.convolution(x, w, pads_begin=1, pads_end=1))(torch.tensor([1.0, 2.0]))
    assert torch.equal(got[0], want.detach()) and torch.equal(got[1], 2 * want.detach())
    torch.testing.assert_close(torch.autograd.grad(got.sum(), w), torch.autograd.grad(3 * want.sum(), w))


@pytest.mark.parametrize("transposed", [False, True])
def test_backward_computes_only_the_gradients_asked_for(transposed: bool, monkeypatch) -> None:
    """A backward without create_graph runs the gradient ops of the inputs that want one, each
    once, in the engine (the first layer's input wants none), directly: not through the
    differentiable ops."""
    def differentiable(*args):
        raise AssertionError("a plain backward went through the differentiable ops")
    monkeypatch.setattr(ct, "_vjp", differentiable)
    engine = get_engine(None)
    tasks: list[str] = []
    for task in ("forward", "backward_data", "backward_weights"):
        def counted(*args, _run=getattr(engine, task), _task=task, **kwargs):
            tasks.append(_task)
            return _run(*args, **kwargs)
        monkeypatch.setattr(engine, task, counted)

    def bind(g, task, *args, _bind=engine.bind):  # a repeated call's run, bound by execution.execute
        run = _bind(g, task, *args)
        return None if run is None else lambda a, b: tasks.append(task) or run(a, b)
    monkeypatch.setattr(engine, "bind", bind)

    def bind_at(g, task, *args, _bind_at=engine.bind_at):  # a repeated small call's run from memory
        run = _bind_at(g, task, *args)
        return None if run is None else lambda a, b, out: tasks.append(task) or run(a, b, out)
    monkeypatch.setattr(engine, "bind_at", bind_at)
    interop._cached_op.cache_clear()  # fresh ops: no run bound before (by earlier tests) goes uncounted
    interop._plain.clear()
    ct._plans.clear()
    # ConvTranspose's data gradient is a convolution (forward), its weights gradient backward_weights.
    data_task = "forward" if transposed else "backward_data"
    function = ct.conv_transpose if transposed else ct.convolution
    x, w, b = torch.randn(1, 6, 6, 2), torch.randn(3, 3, 4, 2) if transposed else torch.randn(3, 3, 2, 4), torch.randn(4)
    for wanted, expected in [((True, False, False), [data_task]), ((False, True, False), ["backward_weights"]),
                             ((False, False, True), []), ((True, True, True), [data_task, "backward_weights"])]:
        leaves = [t.clone().requires_grad_(want) for t, want in zip((x, w, b), wanted)]
        y = function(*leaves, pads_begin=1, pads_end=1)
        tasks.clear()
        y.sum().backward()
        assert tasks == expected
        assert [t.grad is not None for t in leaves] == list(wanted)


def test_backward_keeps_no_memory_of_the_inputs() -> None:
    """After a backward (no retain_graph) autograd has freed the saved inputs, and the op's node,
    alive as long as its output, holds nothing else of them: its problem only."""
    x, w = torch.randn(1, 6, 6, 2, requires_grad=True), torch.randn(3, 3, 2, 4, requires_grad=True)
    y = ct.convolution(x * 2, w, pads_begin=1, pads_end=1)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="freed"):
        y.grad_fn.saved_tensors
    assert [type(v).__name__ for v in vars(y.grad_fn).values()] == ["Problem"]


# ---------------------------------------------------------------------------------------------
# Precisions, strides, zero-copy
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,mantissa", [(torch.bfloat16, 7), (torch.float16, 10)])
@pytest.mark.parametrize("case", GROUPED, ids=[c.id for c in GROUPED])
def test_low_precision_forward_and_backward_against_f64(case: Case, dtype, mantissa) -> None:
    """bf16/f16 values and gradients against PyTorch in float64 on the very same (rounded) inputs
    and cotangent. convgrad sums in f32 and rounds once, so each element is within half an ulp of
    the exact value (2^-(mantissa+1) of it) plus the f32 accumulation error: sums of at most 64
    products, each rounded at 2^-24, whose absolute values add up to at most a few times the
    largest output: 2^-16 of the largest output bounds it."""
    low = tuple(t.to(dtype).requires_grad_() for t in inputs(case))
    exact = tuple(t.detach().double().requires_grad_() for t in low)  # the same values, in f64
    y_low, y_exact = ours(case)(*low), reference(case)(*exact)
    assert y_low.dtype == dtype
    g = _cotangent(y_exact).to(dtype)
    grads_low = torch.autograd.grad(y_low, low, g)
    grads_exact = torch.autograd.grad(y_exact, exact, g.double())
    for name, got, want in zip(("y", "d src", "d weights", "d bias"), (y_low, *grads_low), (y_exact, *grads_exact)):
        assert got.dtype == dtype
        bound = 2.0 ** -(mantissa + 1) * want.abs() + 2.0 ** -16 * want.abs().max()
        error = (got.double() - want).abs()
        assert (error <= bound).all(), f"{name}: off by {(error / bound).max().item():.3g} of the bound"


def test_non_contiguous_inputs_give_the_same_result() -> None:
    case = CASES[1]
    x, w, b = inputs(case)
    x_odd = torch.empty(tuple(reversed(x.shape)), dtype=x.dtype).permute(*reversed(range(x.ndim)))
    x_odd.copy_(x)  # Fortran order
    w_wide = torch.zeros((*w.shape[:-1], 2 * w.shape[-1]), dtype=w.dtype)[..., ::2]
    w_wide.copy_(w)  # every other element
    assert not x_odd.is_contiguous() and not w_wide.is_contiguous()
    x1, w1, x2, w2 = (t.clone().requires_grad_() if t.is_contiguous() else t.detach().requires_grad_()
                      for t in (x, w, x_odd, w_wide))
    y1, y2 = ours(case)(x1, w1, b), ours(case)(x2, w2, b)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    g = _cotangent(y1).t() if y1.ndim == 2 else _cotangent(y1).movedim(1, -1).contiguous().movedim(-1, 1)
    assert not g.is_contiguous()
    torch.testing.assert_close(torch.autograd.grad(y1, (x1, w1), g), torch.autograd.grad(y2, (x2, w2), g),
                               rtol=0, atol=0)


def test_a_warm_call_goes_from_its_signature_to_the_engine(monkeypatch) -> None:
    """A repeated eager call of one signature (op, attributes as given, each tensor's shape,
    strides and dtype: ``convgrad.torch._signature``) parses no attribute and resolves nothing
    again, with the cold call's bits; invalid neighbours (an attribute, a dtype) still get the
    cold call's errors, word for word."""
    case = CASES[1]
    x, w, b = inputs(case, torch.float32)
    function = ct.conv_transpose if case.transposed else ct.convolution
    bad_attrs, bad_dtype = {**case.attrs, "strides": 0}, (x.to(torch.int32), w, b)
    ct._resolved.clear()
    interop._plain.clear()
    errors = []
    for args, attrs in (((x, w, b), bad_attrs), (bad_dtype, case.attrs)):
        with pytest.raises(convgrad.ConvgradError) as info:
            function(*args, **attrs)
        errors.append((type(info.value), str(info.value)))
    cold = function(x, w, b, **case.attrs)

    def refuse(*args, **kwargs):
        raise AssertionError("a warm call parsed or resolved again")
    with monkeypatch.context() as patched:
        patched.setattr(interop, "attributes_and_op", refuse)
        patched.setattr(convgrad.Op, "resolve", refuse)
        warm = function(x, w, b, **case.attrs)
    torch.testing.assert_close(warm, cold, rtol=0, atol=0)
    for (args, attrs), (kind, message) in zip((((x, w, b), bad_attrs), (bad_dtype, case.attrs)), errors):
        with pytest.raises(kind) as info:
            function(*args, **attrs)
        assert str(info.value) == message


def test_a_warm_small_call_runs_from_the_tensors_memory(monkeypatch) -> None:
    """A repeated small f32 call of channels-last data and X-first weights without bias runs
    the engine's compiled loops on the tensors' memory (``FastEngine.bind_at``), with the cold
    call's bits, for Convolution and ConvTranspose (whose inputs' roles are y and w), where
    autograd records the call too (its node's forward, and then its gradients); not where a
    tensor is a negative view, a strategy is forced since (the engine's state) or the memory
    budget is too small since (convgrad's error)."""
    from convgrad.engines.fast import direct_flat

    calls = []
    run_at = direct_flat.run_at
    monkeypatch.setattr(direct_flat, "run_at", lambda *args: calls.append(1) or run_at(*args))
    rng = np.random.default_rng()
    x = torch.from_numpy(rng.standard_normal((2, 6, 5, 3)).astype(np.float32))
    for function, w in ((ct.convolution, torch.from_numpy(rng.standard_normal((3, 3, 3, 4)).astype(np.float32))),
                        (ct.conv_transpose, torch.from_numpy(rng.standard_normal((3, 2, 4, 3)).astype(np.float32)))):
        attrs = dict(pads_begin=[1, 0], pads_end=[0, 1])
        ct._resolved.clear()
        cold = function(x, w, **attrs)
        numpy = (convgrad.convolution if function is ct.convolution else convgrad.conv_transpose)(x.numpy(), w.numpy(),
                                                                                                  **attrs)
        calls.clear()
        torch.testing.assert_close(function(x, w, **attrs), cold, rtol=0, atol=0)
        assert calls == [1]
        np.testing.assert_array_equal(cold.numpy(), numpy)
        calls.clear()
        torch.testing.assert_close(function(torch._neg_view(x), w, **attrs), -cold, rtol=0, atol=0)
        assert calls == []
        leaf = x.clone().requires_grad_()
        recorded = function(leaf, w, **attrs)
        torch.testing.assert_close(recorded, cold, rtol=0, atol=0)
        assert calls == [1] and recorded.grad_fn is not None and recorded.requires_grad
        calls.clear()
        with convgrad.engines.fast.forced_strategy("gemm"):
            forced = function(x, w, **attrs)
        torch.testing.assert_close(forced, cold, rtol=1e-5, atol=1e-5)
        assert calls == []
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        grads = []
        for _ in range(2):                                # the second backward's gradients from memory
            xg.grad = wg.grad = None
            calls.clear()
            (function(xg, wg, **attrs) * cold).sum().backward()   # dy = cold: contiguous
            grads.append((xg.grad, wg.grad))
        assert calls == [1, 1, 1]                         # the forward and both gradients
        backward = (convgrad.convolution_backward_data, convgrad.convolution_backward_weights) \
            if function is ct.convolution else (convgrad.conv_transpose_backward_data, convgrad.conv_transpose_backward_weights)
        want_dx = backward[0](cold.numpy(), w.numpy(), **({"dst_shape": list(x.shape)} if function is ct.convolution else {}),
                              **attrs)
        want_dw = backward[1](x.numpy(), cold.numpy(), list(w.shape), **attrs)
        for dx, dw in grads:
            np.testing.assert_array_equal(dx.numpy(), want_dx)
            np.testing.assert_array_equal(dw.numpy(), want_dw)
        calls.clear()
        convgrad.set_memory_budget(16)
        try:
            with pytest.raises(convgrad.ResourceError):
                function(x, w, **attrs)
        finally:
            convgrad.set_memory_budget(None)


@pytest.mark.parametrize("warm_first", [False, True], ids=["cold", "after-a-plain-call"])
def test_negative_views_are_read_as_their_values(warm_first: bool) -> None:
    """A tensor with PyTorch's negative bit (``torch._neg_view``: same memory, values negated)
    has a plain tensor's shape, strides and dtype, so a warm call of that signature meets it
    too: both read its values, not its memory (they read the memory, unnegated, before)."""
    case = CASES[1]
    x, w, b = inputs(case, torch.float32)
    negated = torch._neg_view(x)
    assert negated.is_neg() and negated.stride() == x.stride()
    if warm_first:
        ours(case)(x, w, b)
    torch.testing.assert_close(ours(case)(negated, w, None), ours(case)(-x, w, None), rtol=0, atol=0)
    torch.testing.assert_close(ours(case)(negated, w, None), -ours(case)(x, w, None), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_zero_copy_in_and_out(dtype, monkeypatch) -> None:
    base = torch.rand(3, 8, 5).to(dtype)
    view = base[:, ::2].transpose(1, 2)  # non-contiguous
    array = ct.to_numpy(view)
    assert array.__array_interface__["data"][0] == view.data_ptr() and array.shape == tuple(view.shape)
    assert array.strides == tuple(s * view.element_size() for s in view.stride())
    assert torch.equal(ct.from_numpy(array), view)
    back = ct.from_numpy(array.copy())
    assert back.dtype == dtype
    # The whole call: the engine reads the caller's memory and the result is the engine's array.
    seen_in, seen_out = [], []
    real_to, real_from = ct.to_numpy, ct.from_numpy
    monkeypatch.setattr(ct, "to_numpy", lambda t, *a: seen_in.append((t.data_ptr(), real_to(t, *a))) or seen_in[-1][1])
    monkeypatch.setattr(ct, "from_numpy", lambda a: seen_out.append((a, real_from(a))) or seen_out[-1][1])
    x, w, _ = inputs(CASES[0], dtype)
    x = torch.cat([x, x], dim=-1)[..., ::2]  # NXC channels two elements apart
    y = ours(CASES[0])(x, w)
    assert len(seen_in) == 2 and not x.is_contiguous()
    for pointer, arr in seen_in:
        assert arr.__array_interface__["data"][0] == pointer
    (arr, out), = seen_out
    assert out.data_ptr() == arr.__array_interface__["data"][0] and torch.equal(out, y)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------
def test_convgrad_errors_pass_through_with_their_message() -> None:
    case = CASES[0]
    x, w, b = inputs(case, torch.float32)
    attrs = case.attrs
    with pytest.raises(convgrad.AttributeValueError, match="Convolution: attribute 'strides' = \\[0\\]"):
        ct.convolution(x, w, b, **dict(attrs, strides=[0]))
    with pytest.raises(convgrad.UnknownAttributeError, match="attribute 'output_padding'"):
        ct.convolution(x, w, b, output_padding=[1], **attrs)  # Convolution has none
    with pytest.raises(convgrad.AttributeValueError, match="'auto_pad' = 'same'"):
        ct.convolution(x, w, **dict(attrs, auto_pad="same"))
    with pytest.raises(convgrad.ShapeError, match="input 'bias' has shape \\[4\\]: expected \\[3\\]"):
        ct.convolution(x, w, torch.ones(4), **attrs)
    with pytest.raises(convgrad.DTypeError, match="input 'weights' has dtype f64: expected f32"):
        ct.convolution(x, w.double(), **attrs)
    with pytest.raises(convgrad.DTypeError, match="has dtype int32: expected one of f32, bf16, f16, f64"):
        ct.convolution(x.int(), w.int(), **attrs)
    with pytest.raises(convgrad.InputTypeError, match="input 'src' is a ndarray: expected a torch.Tensor"):
        ct.convolution(x.numpy(), w, **attrs)
    with pytest.raises(convgrad.InputTypeError, match="input 'weights' is on device meta: expected a CPU tensor"):
        ct.convolution(x, w.to("meta"), **attrs)
    # Scalars for every spatial axis, and omitted strides, dilations and pads (1, 1, 0) as in convgrad's API.
    rank, geometry = x.ndim - 2, ("strides", "dilations", "pads_begin", "pads_end")
    rest = {k: v for k, v in attrs.items() if k not in geometry and k != "auto_pad"}
    want = ct.convolution(x, w, strides=[1] * rank, dilations=[1] * rank, pads_begin=[0] * rank, pads_end=[0] * rank,
                          **rest)
    torch.testing.assert_close(ct.convolution(x, w, strides=1, dilations=1, pads_begin=0, pads_end=0, **rest), want)
    torch.testing.assert_close(ct.convolution(x, w, **rest), want)
    with pytest.raises(convgrad.ShapeError, match="ConvTranspose: input 'weights'"):
        ct.conv_transpose(x, w, strides=[1])  # XOI weights of the wrong channels
    # Under autograd too, and the inputs are untouched.
    xg = x.clone().requires_grad_()
    with pytest.raises(convgrad.ShapeError, match="Convolution: input 'src' has spatial size \\[7\\]"):
        ct.convolution(xg, w, **dict(attrs, pads_begin=[0], dilations=[4]))
    assert torch.equal(xg.detach(), x)


# ---------------------------------------------------------------------------------------------
# Modules, torch.compile, import isolation
# ---------------------------------------------------------------------------------------------
def test_conv_module_layout_init_and_forward() -> None:
    m = ct.Conv(4, 6, (3, 2), strides=2, pads_begin=1, pads_end=(0, 1), groups=2, data_format="NCX")
    assert m.weight.shape == (3, 2, 2, 6) and m.bias.shape == (6,)  # XIO: (*K, in/groups, out)
    bound = 1 / math.sqrt(2 * 3 * 2)
    assert m.weight.abs().max() <= bound and m.weight.abs().max() > bound / 2  # torch.nn.Conv2d's range
    ref = torch.nn.Conv2d(4, 6, (3, 2), stride=2, groups=2, dtype=torch.float32)
    ref.weight.data.copy_(from_weights(m.weight.data, "XIO"))
    ref.bias.data.copy_(m.bias.data)
    x = torch.randn(2, 4, 7, 6)
    torch.testing.assert_close(m(x), ref(F.pad(x, [1, 1, 1, 0])))  # (W: 1, 1), (H: 1, 0)
    assert ct.Conv(4, 6, 3, weights_format="OIX", bias=False, dims=3).weight.shape == (6, 4, 3, 3, 3)
    t = ct.ConvTranspose(4, 6, 3, strides=2, output_padding=1, groups=2, dims=1)
    assert t.weight.shape == (3, 3, 4)  # XOI: (*K, out/groups, in)
    tref = torch.nn.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1, groups=2)
    tref.weight.data.copy_(from_weights(t.weight.data, "XOI"))
    tref.bias.data.copy_(t.bias.data)
    x = torch.randn(2, 5, 4)  # NXC
    torch.testing.assert_close(t(x), to_data(tref(from_data(x, "NXC")), "NXC"))
    with pytest.raises(convgrad.AttributeValueError, match="'weights_format' = 'OIX'"):
        ct.ConvTranspose(4, 6, 3, weights_format="OIX")
    with pytest.raises(convgrad.AttributeValueError, match="'groups' = 4: expected a divisor of out_channels = 6"):
        ct.Conv(4, 6, 3, groups=4)
    with pytest.raises(convgrad.UnknownAttributeError, match="'output_padding'"):
        ct.Conv(4, 6, 3, output_padding=1)
    assert "weights_format=XOI" in repr(t)


def _small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        ct.Conv(1, 4, 3, auto_pad="same_upper", data_format="NCX"), torch.nn.ReLU(),
        ct.Conv(4, 4, 3, strides=2, pads_begin=(1, 0), pads_end=(0, 1), data_format="NCX"), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3))


def test_torch_compile_gives_the_eager_loss_and_gradients() -> None:
    """Dynamo traces the model in one graph (fake kernels give the shapes), AOTAutograd traces the
    backward through the registered autograd formulas. Backend aot_eager: inductor runs the same
    graphs and agrees too, but its C++ compilation took 72 s on the 2-core machine."""
    x, labels = torch.randn(5, 1, 8, 8), torch.tensor([0, 1, 2, 1, 0])
    results = []
    for compiled in (False, True):
        model = _small_model()
        run = torch.compile(model, fullgraph=True, backend="aot_eager") if compiled else model
        loss = F.cross_entropy(run(x), labels)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (loss, grads), (closs, cgrads) = results
    torch.testing.assert_close(closs, loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cgrads, grads, rtol=1e-5, atol=1e-6)


def test_import_convgrad_imports_neither_framework() -> None:
    code = "import sys, convgrad; print('torch' in sys.modules, 'jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_train_digits_example_curves_agree(tmp_path, capsys) -> None:
    """examples/train_digits.py for one short epoch: both loss curves printed, plotted, equal."""
    pytest.importorskip("sklearn")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "train_digits.py"
    spec = importlib.util.spec_from_file_location("train_digits", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    history = example.main(["--epochs", "1", "--batches", "6", "--plot", str(tmp_path / "curves.png")])
    torch_loss, ours = np.array(history["torch_loss"]), np.array(history["convgrad_loss"])
    assert len(ours) == 6 and np.isfinite(ours).all() and len(set(ours.tolist())) == 6
    np.testing.assert_allclose(ours, torch_loss, rtol=0, atol=1e-5)
    out = capsys.readouterr().out
    assert "max |loss difference| over 6 steps" in out and (tmp_path / "curves.png").stat().st_size > 10_000


def test_forward_mode_tangents_are_refused_not_dropped() -> None:
    """convgrad's ops have reverse-mode derivatives only: a forward-mode tangent on an input, from
    ``torch.autograd.forward_ad`` or ``torch.func.jvp``, is an InputError naming the op and input
    (PyTorch would otherwise give zero tangents silently)."""
    from torch.autograd import forward_ad

    x, w = torch.randn(1, 6, 6, 2), torch.randn(3, 3, 2, 4)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(w, torch.ones_like(w))
        with pytest.raises(convgrad.InputError, match="Convolution: input 'weights' has a forward-mode tangent"):
            ct.convolution(x, dual, pads_begin=1, pads_end=1)
        ct.convolution(x, w, pads_begin=1, pads_end=1)      # no tangent: fine inside the level too
    with pytest.raises(convgrad.InputError, match="input 'src' has a forward-mode tangent"):
        torch.func.jvp(lambda a: ct.convolution(a, w, pads_begin=1, pads_end=1), (x,), (torch.ones_like(x),))
