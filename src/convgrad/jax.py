"""convgrad's ops inside JAX: differentiable functions on jax arrays.

``convgrad.jax.convolution(src, weights, bias=None, *, strides, ...)`` and
``convgrad.jax.conv_transpose(...)`` take the functional API's attributes and return a jax
array. Each is a ``jax.custom_vjp`` whose primal runs convgrad on the host as an XLA custom call
(:mod:`convgrad.xla_ffi`; shapes from :meth:`convgrad.Op.infer` at trace time), so it works under
``jax.jit`` and ``jax.grad``; the VJP (:mod:`convgrad.adjoints`) is made of the same
differentiable ops, so gradients of gradients work too. ``jax.vmap`` runs the custom call once per
batch element (``vmap_method="sequential"``). Data: f32, bf16, f16, and f64 where JAX has x64
enabled; attributes are static (Python values), not traced. A small f32 call whose inputs and
result are canonical as given runs the engine's compiled loops from a compiled custom call
(:func:`convgrad.xla_ffi.kernel_target`: no Python at run time), its plan and memory guard
those of the trace.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .extras import missing_extra

try:
    import jax
    import jax.numpy as jnp
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "jax", "JAX") from exc

from . import adjoints, interop
from .engines import get_engine
from .engines.fast import direct_flat
from .errors import InputTypeError
from .execution import TASK_INPUTS, compiled_entry, execute
from .limits import check_memory
from .opdefs import OPS
from .problem import Problem
from .xla_ffi import host_target, kernel_params, kernel_target

__all__ = ["convolution", "conv_transpose"]


def _apply(kind: str, *arrays: Any, **attrs: Any) -> jax.Array:
    """Run op ``kind`` on jax arrays (None where an optional input is absent), differentiably."""
    present = tuple(a is not None for a in arrays)
    key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
    return _differentiable(kind, key, present)(*[a for a in arrays if a is not None])


#: The XLA custom-call target of each (op, attributes, present inputs) this process has run.
_targets: dict[tuple[Any, ...], str] = {}


@functools.lru_cache(maxsize=512)
def _differentiable(kind: str, key: tuple[tuple[str, Any], ...], present: tuple[bool, ...]) -> Callable[..., jax.Array]:
    """The custom_vjp function of the present data inputs, for one op and its attributes."""
    attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in key}
    names = interop.data_input_names(OPS[kind])
    roles = [s.role for s, p in zip((s for s in OPS[kind].inputs if s.role != "shape"), present) if p]

    def full(arrays: Sequence[Any]) -> list[Any]:
        it = iter(arrays)
        return [next(it) if p else None for p in present]

    def problem(arrays: Sequence[Any]) -> Any:
        return interop.infer(kind, attrs, [None if a is None else (a.shape, np.dtype(a.dtype)) for a in full(arrays)])

    target = _targets.get((kind, key, present))
    if target is None:  # one XLA target per op, attributes and inputs, also after this cache evicts them
        op = interop.op_for(kind, attrs)

        def host(*arrays: np.ndarray) -> np.ndarray:
            problem, data, warm = op.resolve(*full(arrays))
            return execute(problem, data, get_engine(None), warm)

        target = _targets.setdefault((kind, key, present), host_target(host, OPS[kind].function))

    @jax.custom_vjp
    def primal(*arrays: Any) -> jax.Array:
        p = problem(arrays)
        out = jax.ShapeDtypeStruct(p.output_shape, p.dtype)
        compiled = _compiled(p, arrays, roles)
        if compiled is not None:
            params, order = compiled
            return jax.ffi.ffi_call(kernel_target(), out, vmap_method="sequential")(*(arrays[i] for i in order), params)
        return jax.ffi.ffi_call(target, out, vmap_method="sequential")(*arrays)

    def forward(*arrays: Any) -> tuple[jax.Array, tuple[Any, ...]]:
        return primal(*arrays), arrays

    def backward(arrays: tuple[Any, ...], grad: jax.Array) -> tuple[Any, ...]:
        grads = adjoints.vjp(problem(arrays), full(arrays), grad, present,
                             lambda step, *data: _apply(step.kind, *data, **step.attrs),
                             lambda g, axes: jnp.sum(g, axis=axes), lambda a: a.shape)
        return tuple(g for g, p in zip(grads, present) if p)

    primal.defvjp(forward, backward)
    primal.__name__ = f"{OPS[kind].function}_{'_'.join(names)}"
    return primal


def _compiled(p: Problem, arrays: Sequence[Any], roles: Sequence[str]) -> tuple[jax.Array, tuple[int, int]] | None:
    """(the parameters of the engine's compiled run of ``p``, a constant of the trace; the indices
    of ``arrays`` in the order of its inputs' roles) where the engine has one
    (:meth:`FastEngine.at_params`: a small f32 problem on serial loops) and its inputs and result
    are canonical as given (channels-last data, X-first weights, no bias, no shape input); else
    None. The plan and the memory guard are the trace's: a ResourceError is raised now."""
    entry = compiled_entry(p, "at_params") if len(arrays) == 2 else None
    if entry is None:
        return None
    engine, params = entry
    order = tuple(roles.index(role) for role in TASK_INPUTS[p.task])
    if tuple(math.prod(arrays[i].shape) for i in order) != direct_flat.input_sizes(params):
        return None          # the loops' views must cover the buffers exactly (never read past one)
    check_memory(p, engine)
    return jnp.asarray(kernel_params(direct_flat.run_at, params)), order


def _call(kind: str, arrays: tuple[Any, ...], attrs: dict[str, Any]) -> jax.Array:
    """Validate the attributes as convgrad does, make the inputs jax arrays, run the op."""
    plain = interop.plain_attributes(kind, attrs, getattr(arrays[0], "ndim", 2) - 2)  # ConvgradError if bad
    converted = []
    for value, name in zip(arrays, interop.data_input_names(OPS[kind])):
        if value is not None and not isinstance(value, jax.Array):
            try:
                value = jnp.asarray(value)
            except TypeError as exc:
                raise InputTypeError(kind, name, f"= {type(value).__name__} cannot be converted to a jax array "
                                     f"({exc})") from None
        converted.append(value)
    # Shapes and dtypes are checked now, with convgrad's messages (not from inside a trace).
    interop.infer(kind, plain, [None if a is None else (a.shape, np.dtype(a.dtype)) for a in converted])
    return _apply(kind, *converted, **plain)


def convolution(src: Any, weights: Any, bias: Any = None, *, strides: int | Sequence[int] | None = None,
                pads_begin: int | Sequence[int] | None = None, pads_end: int | Sequence[int] | None = None,
                dilations: int | Sequence[int] | None = None, groups: int = 1, auto_pad: str = "none",
                data_format: str = "NXC", weights_format: str = "XIO", **unknown: Any) -> jax.Array:
    """Convolution (oneDNN Graph ``Convolution``) of jax arrays, differentiable in src, weights and
    bias (``jax.grad``, ``jax.jit``, ``jax.vmap``). Attributes, defaults and errors as
    :func:`convgrad.convolution`; gradients are ConvolutionBackwardData / ConvolutionBackwardWeights."""
    return _call("Convolution", (src, weights, bias), dict(
        strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, groups=groups,
        auto_pad=auto_pad, data_format=data_format, weights_format=weights_format, **unknown))


def conv_transpose(src: Any, weights: Any, bias: Any = None, *, strides: int | Sequence[int] | None = None,
                   pads_begin: int | Sequence[int] | None = None, pads_end: int | Sequence[int] | None = None,
                   dilations: int | Sequence[int] | None = None, groups: int = 1, auto_pad: str = "none",
                   data_format: str = "NXC", weights_format: str = "XOI",
                   output_padding: int | Sequence[int] | None = None, **unknown: Any) -> jax.Array:
    """Transposed convolution (oneDNN Graph ``ConvTranspose``) of jax arrays, differentiable in src,
    weights and bias. Attributes, defaults and errors as :func:`convgrad.conv_transpose`; gradients
    are ConvTransposeBackwardData / ConvTransposeBackwardWeights."""
    return _call("ConvTranspose", (src, weights, bias), dict(
        strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations, groups=groups,
        auto_pad=auto_pad, data_format=data_format, weights_format=weights_format, output_padding=output_padding, **unknown))
