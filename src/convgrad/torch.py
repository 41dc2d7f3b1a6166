"""convgrad's ops inside PyTorch: differentiable custom ops and a convolution module.

``convgrad.torch.convolution(src, weights, bias=None, *, strides, ...)`` and
``convgrad.torch.conv_transpose(...)`` take CPU tensors (f32, bf16, f16, f64; any strides) and
the functional API's attributes, and return a tensor that autograd differentiates in src,
weights and bias. The six differentiable ops of the family are registered with
``torch.library.custom_op`` as ``convgrad::<function>`` (``torch.ops.convgrad.convolution``,
``torch.ops.convgrad.convolution_backward_data``, ...), each with a fake kernel (shapes from
:meth:`convgrad.Op.infer`, so ``torch.compile`` traces them without data) and an autograd formula
from :mod:`convgrad.adjoints` made of the same ops: double backward works.

Tensors cross into NumPy and back without copies (DLPack; bf16 as its 16-bit pattern);
ConvgradError passes through with its message. :class:`Conv` and :class:`ConvTranspose` are
``nn.Module``s holding weights (and bias) in the op's layout. ``convert(model)`` / ``restore(model)``
swap a model's ``torch.nn.ConvNd`` / ``ConvTransposeNd`` for convgrad's twins and back (:mod:`convgrad.torch_modules`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .extras import missing_extra

try:
    import torch
    from torch.autograd import forward_ad
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "torch", "PyTorch") from exc

from . import adjoints, interop
from .attributes import attributes_key
from .dtypes import DATA_DTYPES, as_array, bfloat16
from .engines import get_engine
from .errors import AttributeValueError, DTypeError, InputError, InputTypeError
from .execution import TASK_INPUTS, Warm, compiled_entry, execute
from .limits import check_memory, memory_budget
from .memo import Memo
from .op import Op
from .opdefs import OPS, AttrSpec, OpDef
from .problem import Problem

__all__ = ["convolution", "conv_transpose", "Conv", "ConvTranspose", "convert", "restore", "Conv1d", "Conv2d", "Conv3d",
           "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]

_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {
    DATA_DTYPES["f32"]: torch.float32, DATA_DTYPES["bf16"]: torch.bfloat16,
    DATA_DTYPES["f16"]: torch.float16, DATA_DTYPES["f64"]: torch.float64,
}
_NUMPY_DTYPES = {v: k for k, v in _TORCH_DTYPES.items()}


# ---------------------------------------------------------------------------------------------
# Tensors <-> arrays (zero-copy)
# ---------------------------------------------------------------------------------------------
def to_numpy(tensor: torch.Tensor, op: str = "convgrad.torch", name: str = "tensor") -> np.ndarray:
    """A NumPy view of a CPU tensor's memory, any strides (bf16 as ``ml_dtypes.bfloat16``)."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    try:
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.int16).numpy().view(bfloat16)
        if tensor.dtype in _NUMPY_DTYPES:
            return tensor.numpy()
    except (RuntimeError, TypeError):  # a negative view (its values resolved), a conjugate one, a device
        if tensor.is_neg():
            return to_numpy(tensor.resolve_neg(), op, name)
    return as_array(tensor, op, name)    # convgrad's own error for what it cannot take


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """A tensor on ``array``'s memory (bf16 through its 16-bit pattern); a read-only array is copied."""
    if not array.flags.writeable:
        array = array.copy()
    if array.dtype == bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _spec(tensor: torch.Tensor, op: str, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """The tensor's shape and NumPy dtype, what shape inference reads."""
    dtype = _NUMPY_DTYPES.get(tensor.dtype)
    if dtype is None:
        try:
            dtype = np.dtype(str(tensor.dtype).removeprefix("torch."))  # int32, bool, ... (convgrad says why not)
        except TypeError:
            raise DTypeError(op, name, f"has dtype {tensor.dtype}: expected one of {', '.join(DATA_DTYPES)}") from None
    return tuple(tensor.shape), dtype


def _problem(d: OpDef, tensors: Sequence[torch.Tensor | None], attrs: dict[str, Any]) -> Problem:
    """Shape inference on the tensors' shapes and dtypes alone (no data is read)."""
    return interop.infer(d.kind, attrs, [None if t is None else _spec(t, d.kind, name)
                                         for t, name in zip(tensors, interop.data_input_names(d))])


# ---------------------------------------------------------------------------------------------
# The registered ops
# ---------------------------------------------------------------------------------------------
def _attribute_schema(a: AttrSpec) -> str:
    if a.type == "s64":
        return f"int {a.name}={a.default}"
    if a.type == "string":
        return f'str {a.name}="{a.default}"'
    return f"{'SymInt' if a.full_shape else 'int'}[]? {a.name}=None"


def _schema(d: OpDef) -> str:
    """``(Tensor src, Tensor weights, Tensor? bias=None, *, int[]? strides=None, int[]? pads_begin=None, ...)
    -> Tensor``: data inputs positionally, every attribute by keyword (a shape input as its
    attribute, dst_shape / weights_shape)."""
    inputs = [f"Tensor {s.name}" if s.required else f"Tensor? {s.name}=None" for s in d.inputs if s.role != "shape"]
    return f"({', '.join(inputs)}, *, {', '.join(_attribute_schema(a) for a in d.attributes)}) -> Tensor"


def _register(d: OpDef) -> Any:
    names = interop.data_input_names(d)

    def run(*tensors: torch.Tensor | None, **attrs: Any) -> torch.Tensor:
        arrays = [None if t is None else to_numpy(t, d.kind, name) for t, name in zip(tensors, names)]
        return from_numpy(interop.op_for(d.kind, attrs)(*arrays))

    def fake(*tensors: torch.Tensor | None, **attrs: Any) -> torch.Tensor:
        problem = _problem(d, tensors, attrs)
        return tensors[0].new_empty(problem.output_shape, dtype=_TORCH_DTYPES[problem.dtype])

    def setup_context(ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any) -> None:
        ctx.problem = _problem(d, inputs, keyword_only_inputs)
        ctx.save_for_backward(*inputs)

    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _vjp(ctx.problem, ctx.saved_tensors, grad, ctx.needs_input_grad)

    run.__name__ = fake.__name__ = d.function
    op = torch.library.custom_op(f"convgrad::{d.function}", run, mutates_args=(), device_types="cpu",
                                 schema=_schema(d))
    op.register_fake(fake)
    op.register_autograd(backward, setup_context=setup_context)
    return op


_REGISTERED = {kind: _register(OPS[kind]) for kind in adjoints.DIFFERENTIABLE}
_NAMES = {kind: interop.data_input_names(OPS[kind]) for kind in adjoints.DIFFERENTIABLE}


def _vjp(problem: Problem, saved: Sequence[torch.Tensor | None], grad: torch.Tensor,
         needs: Sequence[bool]) -> tuple[torch.Tensor | None, ...]:
    """The gradients through the ops themselves (:func:`_apply`: differentiable, so double
    backward works)."""
    return tuple(adjoints.vjp(problem, saved, grad, needs, lambda step, *data: _apply(step.kind, *data, **step.attrs),
                              _sum, _shape))


def _gradients(problem: Problem, saved: Sequence[torch.Tensor | None], grad: torch.Tensor,
               needs: Sequence[bool]) -> tuple[torch.Tensor | None, ...]:
    """:func:`_vjp`'s gradients where none of them is differentiated again (a backward without
    ``create_graph`` on plain tensors), computed directly (no autograd node, no dispatch test),
    with the gradient ops and attributes remembered for the forward's problem, in one engine call
    scope: a step the engine bound runs from the tensors' memory (:func:`_direct`: contiguous
    f32, their addresses; NumPy views cost 0.8 µs each, an array's address as much), any other on
    NumPy views. (The views are made here, not kept from the forward: they would hold the inputs'
    memory after autograd frees its saved tensors.)"""
    hit = _plans.get(id(problem))
    if hit is None or hit[0] is not problem:
        plan = adjoints.steps(problem, [None if t is None else t.shape for t in saved])
        ops = {s.kind: interop.op_for(s.kind, s.attrs) for s in plan if isinstance(s, adjoints.Step)}
        hit = _plans.put(id(problem), (problem, plan, ops, {}))
    _, plan, ops, runs = hit

    engine = get_engine(None)

    def direct(step: adjoints.Step, *tensors: torch.Tensor) -> torch.Tensor:
        run = runs.get(step.kind)
        if run is not None and all(t.dtype is torch.float32 for t in tensors):   # from memory (a broadcast
            result = _from_memory(run, [t.contiguous() for t in tensors])         # gradient made contiguous)
            if result is not None:
                return result
        arrays = [to_numpy(t) if t is grad else _view(t) for t in tensors]
        resolved = ops[step.kind].resolve(*arrays)
        if step.kind not in runs and resolved[2] is not None:
            runs[step.kind] = _direct(resolved[0], list(resolved[1]), resolved[2])
        return _compute(*resolved, engine)

    with getattr(engine, "scope", contextlib.nullcontext)():
        return tuple(adjoints.vjp(problem, saved, grad, needs, direct, lambda _, axes: _sum(grad, axes), np.shape,
                                  plan))


#: Per problem of an eager forward (by identity: the warm path gives one problem object per
#: signature, and an entry holds its problem, so the id is not reused meanwhile): its gradients'
#: steps, their ops and their runs from memory (:func:`_gradients`, :func:`_direct`).
_plans: Memo[int, tuple[Problem, list[adjoints.Step | str | None], dict[str, Op], dict[str, "_Direct | None"]]] = \
    Memo(512)


def _sum(grad: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
    return grad.sum(axes)


def _shape(tensor: torch.Tensor) -> torch.Size:
    return tensor.shape


class _Eager(torch.autograd.Function):
    """A registered op's computation and autograd formula, called without the dispatcher's layers
    (tens of microseconds a call): ``apply(problem, arrays, warm, *tensors)`` with what
    :meth:`convgrad.Op.resolve` made of the tensors' NumPy views. Its backward computes the
    gradients directly (:func:`_gradients`) unless they are to be differentiated again
    (``create_graph``) or a mode watches (then the ops, :func:`_vjp`).
    (The ``ctx`` form of forward: ``setup_context`` would cost an ``inspect.signature`` per call;
    ``torch.func`` calls, which need it, take the registered op.)"""

    @staticmethod
    def forward(ctx: Any, problem: Problem, arrays: dict[str, np.ndarray] | tuple[tuple[tuple[int, str], ...], _Direct],
                warm: Warm | None, *tensors: torch.Tensor | None) -> torch.Tensor:
        """``arrays``: the inputs' views by role, or a warm call's (roles, run from memory): the
        run where it does not decline (:func:`_from_memory`), else views made here."""
        ctx.problem = problem
        ctx.save_for_backward(*tensors)
        if isinstance(arrays, tuple):
            roles, direct = arrays
            result = _from_memory(direct, tensors)
            if result is not None:
                return result
            arrays = {role: _view(tensors[i]) for i, role in roles}
        return _compute(problem, arrays, warm)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        saved, needs = ctx.saved_tensors, ctx.needs_input_grad[3:]
        gradients = _vjp if torch.is_grad_enabled() or not _eager((grad, *saved)) else _gradients
        return None, None, None, *gradients(ctx.problem, saved, grad, needs)


#: ``_Eager.apply`` without ``torch.autograd.Function.apply``'s Python layer (about 2 µs), whose
#: work is for functorch transforms and ``setup_context``: none of them where :func:`_eager` holds.
_eager_apply = super(torch.autograd.Function, _Eager).apply
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def _eager(tensors: Sequence[torch.Tensor | None], compiling: bool | None = None) -> bool:
    """Whether a call may skip the dispatcher: plain tensors, nothing tracing or transforming them
    (``torch.compile``, ``torch.export``, fake or proxy tensors, ``torch.func``, modes);
    ``compiling``: ``torch.compiler.is_compiling()``, where the caller has it."""
    if (torch.compiler.is_compiling() if compiling is None else compiling) or torch._C._len_torch_dispatch_stack() \
            or torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active():
        return False
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or _functorch_wrapped(t)):
            return False
    return True


def _apply(kind: str, *tensors: torch.Tensor | None, **attrs: Any) -> torch.Tensor:
    """Op ``kind`` of plain attributes on tensors (:func:`_run`)."""
    return _run(kind, tensors, attrs, None)


def _arrays(kind: str, tensors: Sequence[torch.Tensor | None]) -> list[np.ndarray | None]:
    """NumPy views of op ``kind``'s data inputs."""
    return [None if t is None else to_numpy(t, kind, name) for t, name in zip(tensors, _NAMES[kind])]


def _run(kind: str, tensors: Sequence[torch.Tensor | None], attrs: Mapping[str, Any], op: Op | None,
         eager: bool | None = None, signature: tuple[Any, ...] | None = None) -> torch.Tensor:
    """Op ``kind`` of plain attributes on tensors (``op``: their :func:`~convgrad.interop.op_for`,
    ``eager``: :func:`_eager` of the tensors, where the caller has them): eagerly (:class:`_Eager`,
    or no autograd node where no gradient is wanted) where :func:`_eager` allows, else the
    registered op. An eager call's resolution is kept under its ``signature`` (:func:`_signature`)."""
    if not (_eager(tensors) if eager is None else eager):
        return _REGISTERED[kind](*tensors, **attrs)
    problem, arrays, warm = (op or interop.op_for(kind, attrs)).resolve(*_arrays(kind, tensors))
    if signature is not None and warm is not None:
        roles = tuple(zip([i for i, t in enumerate(tensors) if t is not None], arrays))
        plain = all(t is None or t.dtype == torch.float32 and t.is_contiguous() for t in tensors)
        _resolved.put(signature, (problem, roles, warm, _direct(problem, [r for _, r in roles], warm) if plain else None))
    return _eagerly(problem, arrays, warm, tensors)


def _direct(problem: Problem, roles: Sequence[str], warm: Warm) -> _Direct | None:
    """A repeated call's run from its inputs' memory, where the engine binds one
    (:meth:`FastEngine.bind_at`: a small f32 problem on serial loops) and the inputs and result
    are canonical as given (channels-last data, X-first weights, no bias; ``roles``: the call's
    data inputs' roles, in order): (the positions of the engine's two inputs among them,
    ``run(a, b)`` on their addresses (C-contiguous f32) giving the result, or None where the
    engine's state or the memory budget changed since: the caller then takes the general path);
    else None."""
    entry = compiled_entry(problem, "bind_at") if len(roles) == 2 else None
    if entry is None:
        return None
    engine, run = entry
    state = engine.state()
    check_memory(problem, engine, warm.estimates)
    needed = sum(warm.estimates.get((engine, state)) or (0,))
    shape = problem.output_shape

    def direct(a: int, b: int) -> torch.Tensor | None:
        if engine.state() != state or needed > memory_budget():
            return None
        out = torch.empty(*shape)                      # (unpacked: 0.8 µs less than a tuple)
        run(a, b, out.data_ptr())
        return out
    first, second = (list(roles).index(role) for role in TASK_INPUTS[problem.task])
    return first, second, direct


#: :func:`_direct`'s result: the engine's two inputs' positions and the run on their addresses.
_Direct = tuple[int, int, Callable[[int, int], "torch.Tensor | None"]]


def _from_memory(direct: _Direct, tensors: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """:func:`_direct`'s run on the present tensors (the signature made them C-contiguous f32
    when it was made), None where it declines or a tensor is a negative view (its memory is not
    its values)."""
    present = [t for t in tensors if t is not None]
    a, b = present[direct[0]], present[direct[1]]
    return None if a.is_neg() or b.is_neg() else direct[2](a.data_ptr(), b.data_ptr())


def _wants_gradient(tensors: Sequence[torch.Tensor | None]) -> bool:
    """Whether autograd records a call on ``tensors``."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return True
    return False


def _eagerly(problem: Problem, arrays: dict[str, np.ndarray], warm: Warm | None,
             tensors: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """A resolved problem on the tensors' views: through :class:`_Eager` where a gradient is wanted."""
    if _wants_gradient(tensors):
        return _eager_apply(problem, arrays, warm, *tensors)
    return _compute(problem, arrays, warm)


def _signature(kind: str, tensors: Sequence[Any], attrs: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What a call's resolution depends on: the op, its attributes as given (type-exact:
    :func:`~convgrad.attributes.attributes_key`) and each input's shape, strides and dtype (plain
    CPU tensors only); None where the warm path does not apply."""
    key = attributes_key(attrs)
    if key is None:
        return None
    signature: list[Any] = [kind, key]
    for t in tensors:
        if t is None:
            signature.append(None)
        elif type(t) in _PLAIN and t.is_cpu:
            signature.append((t.shape, t.stride(), t.dtype))
        else:
            return None
    return tuple(signature)


def _view(tensor: torch.Tensor) -> np.ndarray:
    """:func:`to_numpy` of a tensor a call of its signature has viewed before (a float dtype, CPU),
    without its checks (it takes over where ``numpy()`` refuses: a negative view)."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    try:
        return tensor.view(torch.int16).numpy().view(bfloat16) if tensor.dtype is torch.bfloat16 else tensor.numpy()
    except (RuntimeError, TypeError):
        return to_numpy(tensor)


#: Eager calls' resolutions by :func:`_signature`: (problem, (tensor index, role) of each input,
#: what its repeated calls keep, the run from the tensors' memory where there is one:
#: :func:`_direct`). A warm call goes from its signature to the engine's bound run.
_resolved: Memo[tuple[Any, ...], tuple[Problem, tuple[tuple[int, str], ...], Warm, "_Direct | None"]] = Memo(512)


def _compute(problem: Problem, arrays: dict[str, np.ndarray], warm: Warm | None = None,
             engine: Any = None) -> torch.Tensor:
    return from_numpy(execute(problem, arrays, engine or get_engine(None), warm))


def refuse_tangents(where: str, tensors: Sequence[tuple[str, torch.Tensor | None]]) -> None:
    """An InputError for the first of the (name, tensor) pairs that carries a forward-mode tangent
    (``torch.func.jvp``, ``jacfwd``, ``torch.autograd.forward_ad``): convgrad's ops have
    reverse-mode derivatives only, and PyTorch would drop the tangent silently. (Not checked while
    ``torch.compile`` traces: the registered ops run there.)"""
    if torch.compiler.is_compiling():
        return
    if forward_ad._current_level < 0 and not any(isinstance(t, torch.Tensor) and _functorch_wrapped(t)
                                                 for _, t in tensors):
        return  # no dual level entered, nothing transformed: no tangent anywhere (the common case, cheaply)
    for name, tensor in tensors:
        if isinstance(tensor, torch.Tensor) and forward_ad.unpack_dual(tensor).tangent is not None:
            raise InputError(where, name, "has a forward-mode tangent (torch.func.jvp, jacfwd, "
                             "torch.autograd.forward_ad): expected none, convgrad's ops have reverse-mode "
                             "derivatives only")


def _call(kind: str, tensors: tuple[Any, ...], attrs: dict[str, Any]) -> torch.Tensor:
    """Validate the attributes as convgrad does, check the tensors, run the op (under
    ``torch.compile`` nothing is remembered: Dynamo traces this code)."""
    compiling = torch.compiler.is_compiling()
    signature = None if compiling else _signature(kind, tensors, attrs)
    hit = _resolved.get(signature) if signature is not None else None
    if hit is not None and forward_ad._current_level < 0 and _eager(tensors, False):  # a call resolved before
        problem, roles, warm, direct = hit
        if direct is not None:
            if _wants_gradient(tensors):                  # the node's forward runs from memory too
                return _eager_apply(problem, (roles, direct), warm, *tensors)
            result = _from_memory(direct, tensors)
            if result is not None:
                return result
        return _eagerly(problem, {role: _view(tensors[i]) for i, role in roles}, warm, tensors)
    plain, op = interop.attributes_and_op(kind, attrs, getattr(tensors[0], "ndim", 2) - 2,  # ConvgradError if bad
                                          remember=not compiling)
    eager = _eager(tensors, compiling)
    if not eager or forward_ad._current_level >= 0:  # else no tensor can carry a tangent (refuse_tangents' test)
        refuse_tangents(kind, list(zip(_NAMES[kind], tensors)))
    for tensor, name in zip(tensors, _NAMES[kind]):
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise InputTypeError(kind, name, f"is a {type(tensor).__name__}: expected a torch.Tensor "
                                 "(convgrad's functional API takes NumPy arrays)")
        if not tensor.is_cpu:
            raise InputTypeError(kind, name, f"is on device {tensor.device}: expected a CPU tensor")
    return _run(kind, tensors, plain, op, eager, signature)


# ---------------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------------
def convolution(src: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None = None, *,
                strides: int | Sequence[int] | None = None, pads_begin: int | Sequence[int] | None = None,
                pads_end: int | Sequence[int] | None = None, dilations: int | Sequence[int] | None = None,
                groups: int = 1, auto_pad: str = "none", data_format: str = "NXC",
                weights_format: str = "XIO", **unknown: Any) -> torch.Tensor:
    """Convolution (oneDNN Graph ``Convolution``) of CPU tensors, differentiable in src, weights
    and bias. Attributes, defaults and errors as :func:`convgrad.convolution`: omitted strides 1, pads 0,
    omitted dilations 1, an unknown keyword is an UnknownAttributeError; ``data_format`` NXC or NCX,
    ``weights_format`` XIO or OIX; bias has one value per output channel. Gradients: ConvolutionBackwardData / ConvolutionBackwardWeights."""
    return _call("Convolution", (src, weights, bias), dict(
        strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, groups=groups,
        auto_pad=auto_pad, data_format=data_format, weights_format=weights_format, **unknown))


def conv_transpose(src: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None = None, *,
                   strides: int | Sequence[int] | None = None, pads_begin: int | Sequence[int] | None = None,
                   pads_end: int | Sequence[int] | None = None, dilations: int | Sequence[int] | None = None,
                   groups: int = 1, auto_pad: str = "none", data_format: str = "NXC",
                   weights_format: str = "XOI", output_padding: int | Sequence[int] | None = None, **unknown: Any) -> torch.Tensor:
    """Transposed convolution (oneDNN Graph ``ConvTranspose``) of CPU tensors, differentiable in
    src, weights and bias. Attributes, defaults and errors as :func:`convgrad.conv_transpose`;
    ``weights_format`` XOI or IOX (IOX is PyTorch's ConvTranspose weight layout). Gradients:
    ConvTransposeBackwardData (a convolution) / ConvTransposeBackwardWeights."""
    return _call("ConvTranspose", (src, weights, bias), dict(
        strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, groups=groups,
        auto_pad=auto_pad, data_format=data_format, weights_format=weights_format, output_padding=output_padding, **unknown))


# ---------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------
def _per_axis(value: int | Sequence[int] | None, rank: int) -> list[int] | None:
    """An int broadcast to every spatial axis; a sequence as given (convgrad checks its length)."""
    if value is None or isinstance(value, (str, bytes)):
        return value  # type: ignore[return-value]
    return [value] * rank if isinstance(value, (int, np.integer)) else list(value)


class Conv(torch.nn.Module):
    """A convolution layer on :func:`convolution`: ``Conv(in_channels, out_channels, kernel_size,
    strides=1, pads_begin=0, pads_end=0, dilations=1, groups=1, auto_pad="none",
    data_format="NXC", weights_format="XIO", bias=True)``.

    ``kernel_size`` is one int per spatial axis, or an int for every axis of a ``dims``-D layer
    (default 2); strides, pads and dilations likewise. ``weight`` is held in ``weights_format``
    (XIO: ``(*K, in_channels/groups, out_channels)``; OIX: PyTorch's ``(out, in/groups, *K)``),
    ``bias`` (or None) has ``out_channels`` values. Initialised as ``torch.nn.ConvNd``:
    uniform in +-1/sqrt(fan_in) (kaiming-uniform with a = sqrt(5)) for both. The attributes are
    validated here, with convgrad's errors (an unknown keyword is an UnknownAttributeError)."""

    _transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], *,
                 strides: int | Sequence[int] = 1, pads_begin: int | Sequence[int] | None = None,
                 pads_end: int | Sequence[int] | None = None, dilations: int | Sequence[int] = 1,
                 groups: int = 1, auto_pad: str = "none", data_format: str = "NXC",
                 weights_format: str | None = None, bias: bool = True, dims: int = 2,
                 dtype: torch.dtype | None = None, **extra: Any) -> None:
        super().__init__()
        rank = dims if isinstance(kernel_size, (int, np.integer)) else len(kernel_size)
        kernel = _per_axis(kernel_size, rank)
        kind = "ConvTranspose" if self._transposed else "Convolution"
        self.attrs: dict[str, Any] = {
            "strides": _per_axis(strides, rank), "pads_begin": _per_axis(pads_begin, rank),
            "pads_end": _per_axis(pads_end, rank), "dilations": _per_axis(dilations, rank), "groups": groups,
            "auto_pad": auto_pad, "data_format": data_format,
            "weights_format": weights_format or OPS[kind].attr("weights_format").default,
            **{k: _per_axis(v, rank) for k, v in extra.items()},
        }
        fmt = interop.plain_attributes(kind, self.attrs, rank)["weights_format"]  # ConvgradError on a bad one
        for name, channels in (("in_channels", in_channels), ("out_channels", out_channels)):
            if channels % groups:
                raise AttributeValueError(kind, "groups", groups, f"a divisor of {name} = {channels}")
        # Canonical (A, B, K): the convolution's (OC, ICg) or, transposed, (IC, OC/groups) (IOX).
        a, b = (in_channels, out_channels // groups) if self._transposed else (out_channels, in_channels // groups)
        shape = (*kernel, b, a) if fmt[0] == "X" else (a, b, *kernel)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, tuple(kernel)
        self.weight = torch.nn.Parameter(torch.empty(shape, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(out_channels, dtype=dtype)) if bias else None
        self.fan_in = b * math.prod(kernel)  # as PyTorch counts it: weights axis 1 (B) times the taps
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform in +-1/sqrt(fan_in), as torch.nn.ConvNd."""
        bound = 1 / math.sqrt(self.fan_in) if self.fan_in > 0 else 0.0
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        function = conv_transpose if self._transposed else convolution
        return function(src, self.weight, self.bias, **self.attrs)

    def extra_repr(self) -> str:
        given = ", ".join(f"{k}={v}" for k, v in self.attrs.items() if v is not None)
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, {given}"


class ConvTranspose(Conv):
    """A transposed-convolution layer on :func:`conv_transpose`; arguments as :class:`Conv` plus
    ``output_padding``. ``weight`` is held in XOI (``(*K, out_channels/groups, in_channels)``,
    the default) or IOX (PyTorch's ConvTranspose layout); initialised as torch.nn.ConvTransposeNd."""

    _transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], *,
                 output_padding: int | Sequence[int] | None = None, **kwargs: Any) -> None:
        super().__init__(in_channels, out_channels, kernel_size, output_padding=output_padding, **kwargs)

from .torch_modules import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d, convert, restore  # noqa: E402,E501
