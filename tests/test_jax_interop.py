"""convgrad.jax: values and gradients (jax.grad under jax.jit, second order) against
jax.lax.conv_general_dilated with the same padding pairs; vmap, low precision and errors."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import convgrad  # noqa: E402
import convgrad.jax as cj  # noqa: E402
from interop_cases import CASES, GROUPED, IDS, Case  # noqa: E402


def inputs(case: Case, dtype=jnp.float32):
    """Random non-zero src, weights, bias in the case's layouts."""
    return tuple(None if a is None else jnp.asarray(a, dtype) for a in case.arrays(np.random.default_rng()))


def ours(case: Case):
    function = cj.conv_transpose if case.transposed else cj.convolution
    return lambda x, w, b=None: function(x, w, b, **case.attrs)


def reference(case: Case):
    """jax.lax.conv_general_dilated with explicit padding pairs; a ConvTranspose as the convolution
    of the src dilated by the strides (lhs_dilation) with the flipped, per-group transposed weights."""
    strides, dilations, pb, pe = case.geometry()
    spatial = "DHW"[3 - case.rank:]
    data = "NC" + spatial if case.data_format == "NCX" else "N" + spatial + "C"
    numbers = (data, "OI" + spatial, data)

    def run(x, w, b=None):
        if case.wformat[0] == "X":  # (*K, B, A) -> (A, B, *K)
            w = jnp.transpose(w, (case.rank + 1, case.rank, *range(case.rank)))
        if not case.transposed:
            y = jax.lax.conv_general_dilated(x, w, strides, list(zip(pb, pe)), rhs_dilation=dilations,
                                             dimension_numbers=numbers, feature_group_count=case.groups)
        else:
            g = case.groups
            w = w.reshape(g, w.shape[0] // g, *w.shape[1:]).swapaxes(1, 2)  # (G, O/G, I/G, *K)
            w = jnp.flip(w.reshape(-1, *w.shape[2:]), axis=tuple(range(2, 2 + case.rank)))
            extra = case.output_padding or (0,) * case.rank
            eff = [(k - 1) * d + 1 for k, d in zip(case.kernel, dilations)]
            padding = [(e - 1 - b_, e - 1 - a + p) for e, b_, a, p in zip(eff, pb, pe, extra)]
            y = jax.lax.conv_general_dilated(x, w, (1,) * case.rank, padding, lhs_dilation=strides,
                                             rhs_dilation=dilations, dimension_numbers=numbers, feature_group_count=g)
        if b is None:
            return y
        return y + (b.reshape(-1, *(1,) * case.rank) if case.data_format == "NCX" else b)
    return run


def assert_close(got, want, rtol=1e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=rtol * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grad_under_jit_equals_the_vjp_of_lax_conv(case: Case) -> None:
    args = tuple(a for a in inputs(case) if a is not None)  # src, weights (, bias)
    shape = jax.eval_shape(reference(case), *args).shape
    cot = jnp.asarray(np.random.default_rng().uniform(-1, 1, shape), jnp.float32)
    numbers = tuple(range(len(args)))

    @jax.jit  # one compilation for both sides (JAX compiles every eager op on its own)
    def both(args, cot):
        want, vjp = jax.vjp(reference(case), *args)
        grads = jax.grad(lambda *a: jnp.sum(ours(case)(*a) * cot), argnums=numbers)(*args)
        return (ours(case)(*args), *grads), (want, *vjp(cot))

    for got, expected in zip(*both(args, cot)):
        assert got.dtype == expected.dtype
        assert_close(got, expected)


@pytest.mark.parametrize("case", GROUPED, ids=[c.id for c in GROUPED])
def test_second_order_gradients_equal_lax(case: Case) -> None:
    x, w, b = inputs(case)

    def curvature(function):
        loss = lambda x, w: jnp.sum(jnp.tanh(function(x, w, b)))  # noqa: E731
        return jax.grad(lambda x, w: jnp.sum(jax.grad(loss, argnums=1)(x, w) ** 2), argnums=(0, 1))(x, w)

    got, want = jax.jit(lambda: (curvature(ours(case)), curvature(reference(case))))()
    for got, want in zip(got, want):
        assert_close(got, want, rtol=1e-4)


def test_vmap_over_a_batch_of_calls() -> None:
    """vmap runs the callback once per element (vmap_method="sequential"), values and gradients."""
    case = GROUPED[1]
    x, w, b = inputs(case)
    xs, ws = jnp.stack([x, 2 * x, -x]), jnp.stack([w, w + 1, 3 * w])

    def batched(function):
        values = jax.vmap(function, in_axes=(0, 0, None))(xs, ws, b)
        grads = jax.vmap(jax.grad(lambda x, w: jnp.sum(function(x, w, b) ** 2), argnums=1), in_axes=(0, None))(xs, w)
        return values, grads

    got, want = jax.jit(lambda: (batched(ours(case)), batched(reference(case))))()
    for g, e in zip(got, want):
        assert g.shape[0] == 3
        assert_close(g, e)


_SMALL = [  # (kind, size, kernel, attributes): the engine runs each on its serial flat loops
    ("Convolution", (7, 6), (3, 3), dict(pads_begin=[1, 0], pads_end=[2, 1])),
    ("Convolution", (9,), (3,), dict(dilations=[2], pads_begin=[2], pads_end=[1])),
    ("Convolution", (4, 5, 3), (2, 2, 1), dict(pads_begin=[1, 0, 0], pads_end=[0, 1, 0])),
    ("ConvTranspose", (5, 4), (3, 2), dict(pads_begin=[1, 0], pads_end=[0, 1])),
]


@pytest.mark.parametrize("kind, size, kernel, attrs", _SMALL, ids=[f"{k}-{len(s)}d" for k, s, _, _ in _SMALL])
def test_small_f32_calls_run_compiled_under_jit(kind, size, kernel, attrs) -> None:
    """Under jax.jit, a small f32 call of channels-last data and X-first weights without bias
    runs the engine's serial loops from the compiled XLA target (no Python at run time): value
    and both gradients (value_and_grad, and each element of a vmap) equal the functional API's
    bit for bit; the lowered computation calls the compiled target for the value and both
    gradients, the host target for a call with bias or NCX data."""
    from convgrad import xla_ffi

    rng = np.random.default_rng()
    cin, cout = 3, 2
    x = rng.standard_normal((2, *size, cin)).astype(np.float32)
    wshape = (*kernel, cin, cout) if kind == "Convolution" else (*kernel, cout, cin)
    w = rng.standard_normal(wshape).astype(np.float32)
    function = cj.convolution if kind == "Convolution" else cj.conv_transpose
    forward = convgrad.convolution if kind == "Convolution" else convgrad.conv_transpose
    want = forward(x, w, **attrs)
    dy = 2 * want                                        # the gradient of sum(y ** 2)
    if kind == "Convolution":
        want_dx = convgrad.convolution_backward_data(dy, w, list(x.shape), **attrs)
        want_dw = convgrad.convolution_backward_weights(x, dy, list(w.shape), **attrs)
    else:
        want_dx = convgrad.conv_transpose_backward_data(dy, w, **attrs)
        want_dw = convgrad.conv_transpose_backward_weights(x, dy, list(w.shape), **attrs)

    loss = jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(function(x, w, **attrs) ** 2), argnums=(0, 1)))
    value = jax.jit(lambda x, w: function(x, w, **attrs))
    np.testing.assert_array_equal(np.asarray(value(x, w)), want)
    _, (dx, dw) = loss(x, w)
    np.testing.assert_array_equal(np.asarray(dx), want_dx)
    np.testing.assert_array_equal(np.asarray(dw), want_dw)
    if len(size) == 1:                                  # vmap: a call per element, also compiled
        each = jax.jit(jax.vmap(lambda x, w: function(x, w, **attrs), in_axes=(0, None)))(jnp.stack([x, -x]), w)
        np.testing.assert_array_equal(np.asarray(each[1]), forward(-x, w, **attrs))
    target = xla_ffi.kernel_target()
    assert loss.lower(x, w).as_text().count(f"custom_call @{target}(") == 3
    assert f"@{target}(" not in jax.jit(lambda x, w: function(x, w, np.ones(cout, np.float32), **attrs)
                                        ).lower(x, w).as_text()              # a bias: the host target


def test_a_compiled_kernel_that_raises_is_the_calls_error() -> None:
    """The compiled target's kernel reports an exception (an allocation that failed) as the
    call's RESOURCE_EXHAUSTED error; the next call of a kernel that does not raise runs."""
    import numba

    from convgrad import xla_ffi

    @numba.njit
    def raising(a, b, out, params):  # pragma: no cover - compiled
        raise MemoryError("no frames")

    @numba.njit
    def copying(a, b, out, params):  # pragma: no cover - compiled
        src = numba.carray(convgrad.addresses.f32_at(a), 4)
        dst = numba.carray(convgrad.addresses.f32_at(out), 4)
        dst[:] = src[::-1]

    def call(kernel):
        params = jnp.asarray(xla_ffi.kernel_params(kernel, np.zeros(1, np.int32)))
        out = jax.ShapeDtypeStruct((4,), jnp.float32)
        return jax.jit(lambda a: jax.ffi.ffi_call(xla_ffi.kernel_target(), out)(a, a, params))

    a = jnp.arange(4, dtype=jnp.float32)
    with pytest.raises((ValueError, RuntimeError), match="RESOURCE_EXHAUSTED: ResourceError: convgrad's compiled"):
        call(raising)(a).block_until_ready()
    np.testing.assert_array_equal(np.asarray(call(copying)(a)), [3, 2, 1, 0])


def test_compiled_calls_check_memory_when_traced() -> None:
    """A compiled small call runs the memory guard when it is traced: a budget too small is
    convgrad's ResourceError there, naming the tensor."""
    x, w = np.ones((1, 5, 5, 2), np.float32), np.ones((3, 3, 2, 2), np.float32)
    convgrad.set_memory_budget(16)
    try:
        with pytest.raises(convgrad.ResourceError, match="Convolution: the result 'dst'"):
            jax.jit(lambda x, w: cj.convolution(x, w, pads_begin=[1, 1], pads_end=[1, 1]))(x, w)
    finally:
        convgrad.set_memory_budget(None)


@pytest.mark.parametrize("dtype,mantissa", [(jnp.bfloat16, 7), (jnp.float16, 10)])
def test_low_precision_against_f64(dtype, mantissa) -> None:
    """bf16/f16 values and gradients (under jit) against lax in float64 on the same rounded inputs:
    within half an ulp of each exact value plus the f32 accumulation error (2^-16 of the largest
    value; see the PyTorch twin of this test, test_torch_interop.py)."""
    case = CASES[1]
    low = inputs(case, dtype)

    @jax.jit
    def run(*inputs):
        return ours(case)(*inputs), *jax.grad(lambda *a: jnp.sum(ours(case)(*a)), argnums=(0, 1, 2))(*inputs)

    got_all = run(*low)
    with jax.enable_x64(True):
        exact = tuple(jnp.asarray(np.asarray(a, np.float64)) for a in low)
        want_all = (reference(case)(*exact),
                    *jax.grad(lambda *a: jnp.sum(reference(case)(*a)), argnums=(0, 1, 2))(*exact))
        want_all = [np.asarray(w, np.float64) for w in want_all]
    for name, got, want in zip(("y", "d src", "d weights", "d bias"), got_all, want_all):
        assert got.dtype == dtype
        bound = 2.0 ** -(mantissa + 1) * np.abs(want) + 2.0 ** -16 * np.abs(want).max()
        error = np.abs(np.asarray(got, np.float64) - want)
        assert (error <= bound).all(), f"{name}: off by {(error / bound).max():.3g} of the bound"


def test_f64_with_x64_enabled() -> None:
    case = CASES[0]
    with jax.enable_x64(True):
        x, w, b = inputs(case, jnp.float64)
        got = jax.grad(lambda w: jnp.sum(ours(case)(x, w, b) ** 2))(w)
        want = jax.grad(lambda w: jnp.sum(reference(case)(x, w, b) ** 2))(w)
        assert got.dtype == jnp.float64
        assert_close(got, want, rtol=1e-12)


def test_convgrad_errors_pass_through() -> None:
    case = CASES[0]
    x, w, b = inputs(case)
    attrs = case.attrs
    with pytest.raises(convgrad.AttributeValueError, match="Convolution: attribute 'dilations' = \\[0\\]"):
        cj.convolution(x, w, b, **dict(attrs, dilations=[0]))
    with pytest.raises(convgrad.UnknownAttributeError, match="attribute 'output_padding'"):
        cj.convolution(x, w, output_padding=[1], **attrs)
    with pytest.raises(convgrad.ShapeError, match="input 'bias' has shape \\[2\\]: expected \\[3\\]"):
        jax.jit(lambda x: cj.convolution(x, w, b[:2], **attrs))(x)
    with pytest.raises(convgrad.DTypeError, match="input 'weights' has dtype f16: expected f32"):
        cj.convolution(x, w.astype(jnp.float16), **attrs)
    with pytest.raises(convgrad.DTypeError, match="has dtype int32: expected one of f32, bf16, f16, f64"):
        cj.convolution(x.astype(jnp.int32), w.astype(jnp.int32), **attrs)
    # NumPy inputs are taken as jax arrays.
    assert_close(cj.convolution(np.asarray(x), np.asarray(w), **attrs), reference(case)(x, w, 0 * b))


def test_run_time_errors_come_back_through_xla() -> None:
    """An error inside the custom call (here the memory guard, which only runs at execution)
    reaches the caller with convgrad's message; the next call runs."""
    case = CASES[0]
    x, w, b = inputs(case)
    run = jax.jit(lambda x, w: ours(case)(x, w, b))
    want = np.asarray(reference(case)(x, w, b))
    convgrad.set_memory_budget(16)
    try:
        with pytest.raises((ValueError, RuntimeError), match="RESOURCE_EXHAUSTED: ResourceError: Convolution: the result 'dst'"):
            run(x, w).block_until_ready()
    finally:
        convgrad.set_memory_budget(None)
    assert_close(run(x, w), want)


def test_custom_call_buffers() -> None:
    """The host function sees read-only views of the call's inputs, of every shape the call site
    has (also empty ones, a batch of 0), and its result lands in the output; inputs are unchanged."""
    case = CASES[0]
    x, w, b = inputs(case)
    x_before, w_before = np.array(x), np.array(w)
    run = jax.jit(lambda x, w: ours(case)(x, w, b))
    for batch in (x, x[:0], jnp.concatenate([x, -x])):
        got = run(batch, w)
        want = reference(case)(batch, w, b)
        assert got.shape == want.shape
        if batch.shape[0]:
            assert_close(got, want)
    np.testing.assert_array_equal(np.asarray(x), x_before)
    np.testing.assert_array_equal(np.asarray(w), w_before)

    from convgrad import xla_ffi

    seen = []
    target = xla_ffi.host_target(lambda a: seen.append(a.flags.writeable) or a * 2, "test")
    double = jax.jit(lambda a: jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(a.shape, a.dtype))(a))
    a = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(double(a)), 2 * np.arange(6).reshape(2, 3))
    assert seen == [False]


def test_one_xla_target_per_op_and_attributes() -> None:
    """A call site registers its XLA target once: the same op and attributes again, also after
    the cache of differentiable functions dropped them, reuse it (registrations live as long as
    the process)."""
    from convgrad import jax as cjax, xla_ffi

    case = CASES[0]
    x, w, b = inputs(case)
    want = reference(case)(x, w, b)
    assert_close(ours(case)(x, w, b), want)
    registered = len(xla_ffi._handlers)
    cjax._differentiable.cache_clear()
    assert_close(jax.jit(ours(case))(x, w, b), want)
    assert len(xla_ffi._handlers) == registered


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_readme_snippets_run() -> None:
    """The README's "Inside PyTorch and JAX" examples run as printed."""
    import re
    from pathlib import Path

    pytest.importorskip("torch")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Inside PyTorch and JAX"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["w"].grad.shape == (3, 3, 16, 32) and namespace["b"].grad.shape == (32,)
    assert namespace["dweights"].shape == (3, 3, 16, 32) and namespace["per_example"].shape == (4, 3, 3, 16, 32)
