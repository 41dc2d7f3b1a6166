"""oneDNN-style op objects: ``Op(kind, **attrs)``, shape inference and execution."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .attributes import Attrs, parse_attributes
from .dtypes import (as_array, as_shape_values, check_data_dtype, check_lazy_array, is_dask_array, parse_dtype,
                     round_to)
from .engines import Engine, get_engine
from .errors import AttributeValueError, InputError, InputTypeError, describe
from .layout import data_from_canonical, data_to_canonical, weights_in_format, weights_to_canonical
from .limits import check_memory
from .opdefs import OpDef, get_opdef
from .problem import Problem, TensorInfo, build_problem
from .tensor_ops import TensorProblem, build_tensor_problem, run_tensor_problem

__all__ = ["Op", "execute", "execute_canonical", "finish"]


class Op:
    """One op of the table with its attributes, e.g.
    ``Op("ConvolutionBackwardWeights", strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1],
    dilations=[1, 1], weights_shape=[3, 3, 16, 32])``.

    Attributes take their oneDNN names and are validated at once (unknown names, types, ranges).
    ``op(*inputs)`` runs it on inputs in the specification's index order and returns a NumPy array
    (a lazy dask array when an input is one: see :mod:`convgrad.dask`);
    ``op.infer(*inputs_or_shapes)`` resolves shapes, dtype and pads without computing.

    The attributes may also come as a mapping, ``Op(kind, {"strides": [1, 1], ...})``, next to
    keywords; an attribute given both ways is an error.

    ``lenient=True`` (what the functional API uses) fills omitted pads with 0 and dilations with 1;
    by default those attributes are required, as the specification says.
    """

    def __init__(self, kind: str | None = None, attrs: Mapping[str, Any] | None = None, /, *extra: Any,
                 lenient: bool = False, **kwargs: Any) -> None:
        self.definition: OpDef = get_opdef(kind)
        self.attrs: Attrs = parse_attributes(self.definition, _merge_attrs(self.kind, attrs, extra, kwargs))
        if not isinstance(lenient, (bool, np.bool_)):
            raise InputTypeError(self.kind, None, f"Op(..., lenient={describe(lenient)}): expected True or False")
        self.lenient = bool(lenient)
        self._last: tuple[tuple[Any, ...], Problem] | None = None  # the last resolution (see _resolve)

    @property
    def kind(self) -> str:
        return self.definition.kind

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v!r}" for k, v in self.attrs.items())
        return f"Op({self.kind!r}{', ' if attrs else ''}{attrs})"

    # -- inference ---------------------------------------------------------------------------
    def infer(self, *inputs: Any, dtype: Any = "f32") -> Problem | TensorProblem:
        """Output shape and dtype and, for a convolution, the resolved pads (a
        :class:`~convgrad.problem.Problem`; a :class:`~convgrad.tensor_ops.TensorProblem` for the
        other ops), without computing. Each data input may be an array or just its shape (a tuple of ints,
        taken as ``dtype``); a shape input (index 2) gives its values."""
        return self._resolve(inputs, parse_dtype(dtype))[0]

    # -- execution -----------------------------------------------------------------------------
    def prepare(self, *inputs: Any) -> tuple[Problem | TensorProblem, dict[str, np.ndarray]]:
        """Convert and check the inputs: the resolved problem and the data arrays by role
        (convolutions) or by input name (the other ops, where roles repeat)."""
        return self._resolve(inputs, None)

    def _resolve(self, inputs: tuple[Any, ...],
                 shapes_as: np.dtype | None) -> tuple[Problem | TensorProblem, dict[str, np.ndarray]]:
        """Problem and data arrays from the inputs; with ``shapes_as``, a tuple or list stands for a
        data input of that shape and dtype."""
        convolution = self.definition.family == "convolution"
        infos: list[TensorInfo | None] = []
        arrays: dict[str, np.ndarray] = {}
        for spec, value in zip(self.definition.inputs, inputs):
            if value is None:
                infos.append(None)
            elif spec.role == "shape":
                infos.append(TensorInfo(values=as_shape_values(value, self.kind, spec.name)))
            elif shapes_as is not None and isinstance(value, (tuple, list)):
                infos.append(TensorInfo(shape=_shape_of(value, self.kind, spec.name), dtype=shapes_as))
            else:
                array = (check_lazy_array(value, self.kind, spec.name) if is_dask_array(value)
                         else as_array(value, self.kind, spec.name))
                infos.append(TensorInfo(shape=array.shape, dtype=check_data_dtype(array, self.kind, spec.name)))
                arrays[spec.role if convolution else spec.name] = array
        infos.extend([TensorInfo()] * max(0, len(inputs) - len(infos)))
        # Shape inference is a pure function of these: an op called again on inputs of the same
        # shapes, dtypes and shape values (a training loop) reuses its last resolution.
        key = (tuple(infos), tuple(self.attrs.items()), self.lenient)
        last = self._last  # one read: another thread may replace it meanwhile
        if last is None or last[0] != key:
            last = (key, build_problem(self.definition, self.attrs, infos, self.lenient) if convolution
                    else build_tensor_problem(self.definition, self.attrs, infos))
            self._last = last
        return last[1], arrays

    def __call__(self, *inputs: Any, engine: str | Engine | None = None) -> np.ndarray:
        problem, arrays = self.prepare(*inputs)
        if any(is_dask_array(a) for a in arrays.values()):  # shapes resolved and checked above, eagerly
            from .dask.arrays import execute_lazy

            return execute_lazy(problem, arrays, get_engine(engine), self)
        return execute(problem, arrays, get_engine(engine))


def _merge_attrs(op: str, attrs: Any, extra: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Any, Any]:
    """The attributes given as a mapping and as keywords, each name at most once."""
    if extra:
        raise InputTypeError(op, None, f"Op() takes the op kind and at most one attribute mapping; "
                             f"{len(extra)} more positional arguments were given")
    if attrs is None:
        return kwargs
    try:
        if not isinstance(attrs, Mapping):
            raise TypeError
        attrs = dict(attrs)
    except Exception:
        raise InputTypeError(op, None, f"Op(kind, attrs): attrs = {describe(attrs)} ({type(attrs).__name__}): "
                             "expected a mapping of attribute names to values") from None
    for name in attrs:
        if name in kwargs:
            raise AttributeValueError(op, name, kwargs[name], "given once, but it is both in the attribute "
                                      "mapping and a keyword argument")
    return {**attrs, **kwargs}


def _shape_of(value: Sequence[Any], op: str, name: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(v) for v in value)
        if any(isinstance(v, bool) or int(v) != v for v in value):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise InputError(op, name, f"= {value!r}: expected an array or a shape (a tuple of integers)") from None
    return shape


def execute(problem: Problem | TensorProblem, arrays: dict[str, np.ndarray], engine: Engine) -> np.ndarray:
    """Run a resolved problem: canonical views in, one engine call, bias, one rounding, user layout out
    (the other ops: :func:`~convgrad.tensor_ops.run_tensor_problem`). The memory guard runs first;
    NaN and Inf propagate as IEEE arithmetic does, without warnings."""
    if isinstance(problem, TensorProblem):
        return run_tensor_problem(problem, [arrays[s.name] for s in problem.definition.inputs], engine)
    return finish(problem, execute_canonical(problem, arrays, engine), arrays.get("bias"))


def execute_canonical(problem: Problem, arrays: dict[str, np.ndarray], engine: Engine) -> np.ndarray:
    """The engine's canonical result (data ``(N, *X, C)``, weights ``(*K, ICg, OC)``) in its
    accumulation dtype (f32, f64 for f64 data), before bias, rounding and layout: partial results
    that are summed later (batch or space chunks) are summed in this form and rounded once by
    :func:`finish`. The memory guard runs first."""
    check_memory(problem, engine)
    g, fmt, wfmt = problem.geometry, problem.data_format, problem.weights_format
    canonical = {role: (weights_to_canonical(a, wfmt) if role == "w" else data_to_canonical(a, fmt))
                 for role, a in arrays.items() if role != "bias"}
    with np.errstate(all="ignore"):  # IEEE arithmetic: NaN and Inf propagate, overflow gives Inf
        if problem.task == "forward":
            return engine.forward(g, canonical["x"], canonical["w"])
        if problem.task == "backward_data":
            return engine.backward_data(g, canonical["y"], canonical["w"])
        return engine.backward_weights(g, canonical["x"], canonical["y"])


def finish(problem: Problem, result: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """A canonical result of :func:`execute_canonical` as the op's output: plus bias, rounded once
    to the output dtype, in the user's layout (a fresh C-contiguous array)."""
    fmt, wfmt = problem.data_format, problem.weights_format
    with np.errstate(all="ignore"):
        if bias is not None:
            result = result + bias.astype(result.dtype)
        result = round_to(result, problem.dtype)
    if problem.definition.output.role == "w":
        return weights_in_format(result, wfmt)
    return np.ascontiguousarray(data_from_canonical(result, fmt))
