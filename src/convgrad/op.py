"""oneDNN-style op objects: ``Op(kind, **attrs)``, shape inference and execution."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .attributes import Attrs, parse_attributes
from .dtypes import as_array, as_shape_values, check_data_dtype, check_lazy_array, is_dask_array, parse_dtype
from .engines import Engine, get_engine
from .errors import AttributeValueError, InputError, InputTypeError, MissingAttributeError, describe
from .execution import Warm, execute
from .libraries import in_library_of
from .memo import Memo
from .opdefs import MAX_NDIMS, OpDef, get_opdef
from .problem import Problem, TensorInfo, build_problem
from .tensor_ops import TensorProblem, build_tensor_problem

__all__ = ["Op"]


class Op:
    """One op of the table with its attributes, e.g.
    ``Op("ConvolutionBackwardWeights", strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1],
    dilations=[1, 1], weights_shape=[3, 3, 16, 32])``.

    Attributes take their oneDNN names and are validated at once (unknown names, types, ranges).
    ``op(*inputs)`` runs it on inputs in the specification's index order and returns a NumPy array,
    or an array of the first input's library where it speaks DLPack (a torch tensor for torch
    tensors: :mod:`convgrad.libraries`), or a lazy dask array when an input is one (see
    :mod:`convgrad.dask`);
    ``op.infer(*inputs_or_shapes)`` resolves shapes, dtype and pads without computing.

    The attributes may also come as a mapping, ``Op(kind, {"strides": [1, 1], ...})``, next to
    keywords; an attribute given both ways is an error.

    ``lenient=True`` (what the functional API uses) fills omitted pads with 0 and dilations with 1;
    by default those attributes are required, as the specification says.
    """

    def __init__(self, kind: str | None = None, attrs: Mapping[str, Any] | None = None, /, *extra: Any,
                 lenient: bool = False, **kwargs: Any) -> None:
        self.definition: OpDef = get_opdef(kind)
        if not isinstance(lenient, (bool, np.bool_)):
            raise InputTypeError(self.kind, None, f"Op(..., lenient={describe(lenient)}): expected True or False")
        self.lenient = bool(lenient)
        self.attrs: Attrs = parse_attributes(self.definition, _merge_attrs(self.kind, attrs, extra, kwargs),
                                             scalars=self.lenient)
        self._check_required()
        self._last: tuple[tuple[Any, ...], Problem] | None = None  # the last resolution (see _resolve)
        #: The warm path (:meth:`__call__`): per signature of plain NumPy inputs (:func:`_signature`),
        #: the problem a cold call resolved from them, its inputs' roles and its memory estimates
        #: (made at the first call: an Op built inside a traced function, torch.compile's, holds no lock).
        self._warm: Memo[tuple[Any, ...], _Prepared] | None = None

    def _check_required(self) -> None:
        """The specification's required attributes, when the op is built: strides, pads (unless
        auto_pad is not none) and dilations of a convolution, unless ``lenient``, which fills them
        (strides and dilations 1, pads 0); the other ops' required ones (Elu's alpha) always."""
        convolution = self.definition.family == "convolution"
        for spec in self.definition.attributes:
            if not spec.required or spec.name in self.attrs or (convolution and self.lenient):
                continue
            if spec.name.startswith("pads_") and self.attrs.get("auto_pad", "none") != "none":
                continue
            raise MissingAttributeError(self.kind, spec.name, spec.expected())

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
        given: list[tuple[Any, ...] | None] = []  # per input: None, (shape values,) or (shape, dtype)
        arrays: dict[str, np.ndarray] = {}
        for spec, value in zip(self.definition.inputs, inputs):
            if value is None:
                given.append(None)
            elif spec.role == "shape":
                given.append((as_shape_values(value, self.kind, spec.name),))
            elif shapes_as is not None and isinstance(value, (tuple, list)):
                given.append((_shape_of(value, self.kind, spec.name), shapes_as))
            else:
                array = (check_lazy_array(value, self.kind, spec.name) if is_dask_array(value)
                         else as_array(value, self.kind, spec.name))
                given.append((array.shape, check_data_dtype(array, self.kind, spec.name)))
                arrays[spec.role if convolution else spec.name] = array
        # Shape inference is a pure function of these: an op called again on inputs of the same
        # shapes, dtypes and shape values (a training loop) reuses its last resolution.
        key = (tuple(given), len(inputs), tuple(self.attrs.items()), self.lenient)
        last = self._last  # one read: another thread may replace it meanwhile
        if last is None or last[0] != key:
            infos = [None if g is None else TensorInfo(values=g[0]) if len(g) == 1 else TensorInfo(shape=g[0], dtype=g[1])
                     for g in given]
            infos.extend([TensorInfo()] * max(0, len(inputs) - len(infos)))
            last = (key, build_problem(self.definition, self.attrs, infos, self.lenient) if convolution
                    else build_tensor_problem(self.definition, self.attrs, infos))
            self._last = last
        return last[1], arrays

    def resolve(self, *inputs: Any) -> tuple[Problem | TensorProblem, dict[str, np.ndarray], Warm | None]:
        """:meth:`prepare`'s problem and arrays, and what calls of the inputs' signature keep for
        :func:`~convgrad.execution.execute` (memory estimates, bound runs; None off the warm
        path). The warm path: a call whose inputs have a signature a call resolved before
        (:func:`_signature`: plain arrays of the same shapes, dtypes and strides, the same shape
        values, the attributes as they are now) reuses that resolution, which depends on nothing
        else."""
        signature = _signature(inputs, self.definition, self.attrs, self.lenient) \
            if self.definition.family == "convolution" else None
        memo = self._warm
        warm = memo.get(signature) if signature is not None and memo is not None else None
        if warm is not None:
            return warm.problem, {role: inputs[i] for i, role in warm.roles}, warm.warm
        problem, arrays = self.prepare(*inputs)
        if signature is None or not isinstance(problem, Problem):
            return problem, arrays, None
        roles = tuple((i, spec.role) for i, (spec, value) in enumerate(zip(self.definition.inputs, inputs))
                      if value is not None and spec.role != "shape")
        prepared = _Prepared(problem, roles, Warm())
        if memo is None:
            memo = self._warm = Memo(_WARM_ENTRIES)
        memo.put(signature, prepared)  # resolved without error: a warm call gets the same problem
        return problem, arrays, prepared.warm

    def __call__(self, *inputs: Any, engine: str | Engine | None = None) -> np.ndarray:
        problem, arrays, warm = self.resolve(*inputs)
        if warm is None and any(is_dask_array(a) for a in arrays.values()):  # resolved and checked, eagerly
            from .dask.arrays import execute_lazy

            return execute_lazy(problem, arrays, get_engine(engine), self)
        return in_library_of(inputs[0] if inputs else None, execute(problem, arrays, get_engine(engine), warm))


#: Entries of an Op's warm path.
_WARM_ENTRIES = 64


@dataclass(frozen=True)
class _Prepared:
    """What a cold call established for a signature of inputs: the resolved problem, the
    (input index, role) of its data inputs, and what its calls keep (:class:`~convgrad.execution.Warm`)."""

    problem: Problem
    roles: tuple[tuple[int, str], ...]
    warm: Warm


def _signature(inputs: tuple[Any, ...], definition: OpDef, attrs: Attrs, lenient: bool) -> tuple[Any, ...] | None:
    """Everything :meth:`Op.prepare` reads that a warm call must match (the attributes as they
    are now, ``lenient`` and the inputs), or None where the warm path does not apply: each input
    None; a data input as a plain NumPy array of native byte order (shape, dtype, strides); a
    shape input as a tuple or list of Python ints, or a 1-D integer NumPy array of at most
    ``MAX_NDIMS`` values (type, dtype and values)."""
    if len(inputs) > len(definition.inputs):
        return None
    key: list[Any] = [len(inputs), lenient, tuple(attrs.items())]
    for spec, value in zip(definition.inputs, inputs):
        if value is None:
            key.append(None)
        elif spec.role == "shape":
            if type(value) in (tuple, list) and all(type(v) is int for v in value):
                key.append((type(value), *value))
            elif type(value) is np.ndarray and value.ndim == 1 and value.size <= MAX_NDIMS \
                    and value.dtype.kind in "iu" and value.dtype.isnative:
                key.append((value.dtype, *value.tolist()))
            else:
                return None
        elif type(value) is np.ndarray and value.dtype.isnative:
            key.append((value.shape, value.dtype, value.strides))
        else:
            return None
    return tuple(key)


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
