"""The ops on dask arrays: lazy results built from per-block NumPy calls.

``Op.__call__`` (and so every function of the functional API) comes here when an input is a
dask array, after shape inference has resolved and checked the whole problem. The result is a
lazy dask array of the op's output shape and dtype:

- Batch chunks stay as they are: each forward output or data gradient block is the NumPy op on
  the matching batch rows; the weights gradient is the sum of per-chunk partial gradients.
- Spatial chunks are aligned to the stride (:mod:`convgrad.dask.blocks`) and read the halo the
  kernel needs from their neighbours (``dask.array.overlap`` with asymmetric depth and
  ``boundary="none"``); channels are one chunk.
- Partial weights gradients (per batch chunk and spatial block) stay in the accumulation dtype
  (f32; f64 for f64 data), are added in a tree (``split_every``) and rounded once at the end.
- Each block call passes the memory guard on its own; the largest block is checked when the
  lazy array is built, so a chunking too coarse for the budget fails at once. The whole array
  is never held by one task.
- The ops around convolutions whose output element depends only on the inputs' elements at the
  same (broadcast) position (:data:`ELEMENTWISE_FAMILIES`) run block by block on dask's own
  chunks (``map_blocks``); the others (BiasAdd, BiasAddBackward, the layout ops) take NumPy data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np

from ..dtypes import compute_dtype, is_dask_array
from ..engines import Engine, available_engines, get_engine
from ..errors import InputTypeError
from ..limits import check_memory
from ..execution import execute_canonical, finish
from ..problem import Problem, data_shape
from ..tensor_ops import TensorProblem
from .blocks import AxisSplit, Window, boundaries, split_axis

if TYPE_CHECKING:
    from ..op import Op

__all__ = ["execute_lazy", "SPLIT_EVERY", "ELEMENTWISE_FAMILIES"]

#: Partial weights gradients added per task of the tree sum.
SPLIT_EVERY = 8
#: Families of the ops around convolutions that run block by block on dask arrays.
ELEMENTWISE_FAMILIES = ("eltwise", "eltwise_backward", "binary", "typecast")


@dataclass(frozen=True)
class _Plan:
    """What every block task needs: the whole problem, the split of each spatial axis, the engine."""

    problem: Problem
    splits: tuple[AxisSplit, ...]
    engine: str | Engine

    def sub_problem(self, n: int, windows: tuple[Window, ...]) -> Problem:
        """The convolution of one block: batch ``n``, the windows' sizes and pads."""
        p = self.problem
        g = replace(p.geometry, n=n, in_size=tuple(w.b - w.a for w in windows),
                    out_size=tuple(w.ob - w.oa for w in windows), pads_begin=tuple(w.pb for w in windows),
                    pads_end=tuple(w.pe for w in windows))
        shape = {"x": lambda: data_shape(n, g.ic, g.in_size, p.data_format),
                 "y": lambda: data_shape(n, g.oc, g.out_size, p.data_format),
                 "w": lambda: p.output_shape}[p.definition.output.role]()
        return replace(p, geometry=g, output_shape=shape)

    def canonical(self, n: int, windows: tuple[Window, ...], arrays: dict[str, Any]) -> np.ndarray:
        """The canonical, unrounded result of one block (0 where its windows read only padding)."""
        sub = self.sub_problem(n, windows)
        if any(w.empty for w in windows):
            g = sub.geometry
            shape = {"x": g.x_shape, "y": g.y_shape, "w": g.w_shape}[sub.definition.output.role]
            return np.zeros(shape, compute_dtype(sub.dtype))
        return execute_canonical(sub, arrays, get_engine(self.engine))


def _spatial_axes(problem: Problem) -> tuple[int, ...]:
    r = problem.geometry.rank
    return tuple(range(1, r + 1)) if problem.data_format == "NXC" else tuple(range(2, r + 2))


def _channel_axis(problem: Problem) -> int:
    return problem.geometry.rank + 1 if problem.data_format == "NXC" else 1


def _local(block: np.ndarray, axes: tuple[int, ...], starts: list[int], windows: tuple[Window, ...]) -> np.ndarray:
    """The part ``[a, b)`` of each window of a block whose first element is at ``starts``."""
    index = [slice(None)] * block.ndim
    for axis, start, w in zip(axes, starts, windows):
        index[axis] = slice(w.a - start, w.b - start)
    return block[tuple(index)]


def _block_ids(ids: tuple[np.ndarray, ...]) -> list[int]:
    return [int(i[0]) for i in ids]


def _forward_block(x: np.ndarray, w: np.ndarray, *rest: np.ndarray, plan: _Plan) -> np.ndarray:
    """y block: the forward convolution of the x window it reads (its block and the right halo)."""
    bias, ids = (rest[0], rest[1:]) if plan.problem.has_bias else (None, rest)
    j = _block_ids(ids)
    windows = tuple(s.output_window(k) for s, k in zip(plan.splits, j))
    axes = _spatial_axes(plan.problem)
    x = _local(x, axes, [s.i[k] for s, k in zip(plan.splits, j)], windows)
    return finish(plan.problem, plan.canonical(x.shape[0], windows, {"x": x, "w": w}), bias)


def _data_block(y: np.ndarray, w: np.ndarray, *rest: np.ndarray, plan: _Plan) -> np.ndarray:
    """x block: the data gradient from the y range it receives from (its block and the left halo),
    cut to the block; positions no window reaches get 0 (plus bias), as in the whole problem."""
    bias, ids = (rest[0], rest[1:]) if plan.problem.has_bias else (None, rest)
    j = _block_ids(ids)
    windows = tuple(s.data_window(k) for s, k in zip(plan.splits, j))
    part = plan.canonical(y.shape[0], windows, {"y": y, "w": w})
    spans = [(s.i[k], s.i[k + 1]) for s, k in zip(plan.splits, j)]
    if any(w.a != i0 or w.b != i1 for w, (i0, i1) in zip(windows, spans)):
        block = np.zeros((part.shape[0], *(i1 - i0 for i0, i1 in spans), part.shape[-1]), part.dtype)
        into, take = [slice(None)], [slice(None)]
        for w, (i0, i1) in zip(windows, spans):
            lo, hi = max(w.a, i0), min(w.b, i1)
            into.append(slice(lo - i0, max(lo, hi) - i0))
            take.append(slice(lo - w.a, max(lo, hi) - w.a))
        block[tuple(into)] = part[tuple(take)]
        part = block
    return finish(plan.problem, part, bias)


def _weights_block(x: np.ndarray, y: np.ndarray, *ids: np.ndarray, plan: _Plan) -> np.ndarray:
    """The weights gradient of one batch chunk and spatial block, unrounded, with a leading
    length-1 axis per block axis (batch and spatial) for the tree sum."""
    j = _block_ids(ids)
    windows = tuple(s.output_window(k) for s, k in zip(plan.splits, j))
    x = _local(x, _spatial_axes(plan.problem), [s.i[k] for s, k in zip(plan.splits, j)], windows)
    part = plan.canonical(x.shape[0], windows, {"x": x, "y": y})
    return part.reshape((1,) * (len(j) + 1) + part.shape)


def _finish_weights(total: np.ndarray, plan: _Plan) -> np.ndarray:
    return finish(plan.problem, total)


def _as_dask(value: Any) -> da.Array:
    if isinstance(value, da.Array):
        return value if value.dtype.isnative else value.astype(value.dtype.newbyteorder("="))
    return da.from_array(value, chunks=-1)


def _splits(problem: Problem, data: dict[str, da.Array]) -> tuple[AxisSplit, ...]:
    """The split of each spatial axis, from the chunks of the data input that leads: x for the
    forward problem, y for the data gradient, for the weights gradient x where it is chunked."""
    g = problem.geometry
    axes = _spatial_axes(problem)
    splits = []
    for k, axis in enumerate(axes):
        if problem.task == "backward_data" or (problem.task == "backward_weights" and len(data["x"].chunks[axis]) == 1):
            cuts, cuts_in = boundaries(data["y"].chunks[axis]), "y"
        else:
            cuts, cuts_in = boundaries(data["x"].chunks[axis]), "x"
        splits.append(split_axis(cuts, in_size=g.in_size[k], out_size=g.out_size[k], stride=g.strides[k],
                                 pad_begin=g.pads_begin[k], eff_kernel=g.effective_kernel[k], cuts_in=cuts_in,
                                 halo="left" if problem.task == "backward_data" else "right"))
    return tuple(splits)


def _check_largest_block(plan: _Plan, batch_chunks: tuple[int, ...], engine: Engine) -> None:
    """The memory guard for the largest block, now rather than in the middle of a computation."""
    backward_data = plan.problem.task == "backward_data"
    windows = []
    for s in plan.splits:
        pick = s.data_window if backward_data else s.output_window
        windows.append(max((pick(j) for j in range(s.blocks)), key=lambda w: (w.b - w.a, w.ob - w.oa)))
    check_memory(plan.sub_problem(max(batch_chunks), tuple(windows)), engine)


def execute_lazy(problem: Problem | TensorProblem, arrays: dict[str, Any], engine: Engine, op: Op) -> da.Array:
    """The lazy result of ``op``'s resolved problem whose inputs (some of them dask arrays) are
    ``arrays`` by role (by name for the ops around convolutions); see the module docstring for how
    it is chunked."""
    if isinstance(problem, TensorProblem):
        return _elementwise_lazy(problem, arrays, engine, op)
    channel = _channel_axis(problem)
    data = {role: _as_dask(a).rechunk({channel: -1}) for role, a in arrays.items() if role in ("x", "y")}
    weights = {role: _as_dask(a).rechunk(-1) for role, a in arrays.items() if role in ("w", "bias")}
    splits = _splits(problem, data)
    plan = _Plan(problem, splits, _engine_ref(engine))
    axes = _spatial_axes(problem)
    lead = "y" if problem.task == "backward_data" else "x"
    batch_chunks = data[lead].chunks[0]
    for role in data:
        spatial = {a: (s.o_sizes() if role == "y" else s.i_sizes()) for a, s in zip(axes, splits)}
        data[role] = data[role].rechunk({0: batch_chunks, **spatial})
    _check_largest_block(plan, batch_chunks, engine)

    index = {axis: f"s{k}" for k, axis in enumerate(axes)}
    index[0] = "n"
    rank = problem.geometry.rank
    ndim = rank + 2

    def data_index(channel_letter: str) -> tuple[str, ...]:
        return tuple(index.get(axis, channel_letter) for axis in range(ndim))

    ids = []
    for k, s in enumerate(splits):
        ids += [da.arange(s.blocks, chunks=1), (f"s{k}",)]
    if problem.task == "backward_weights":
        x = _overlap(data["x"], {a: (0, s.right_halo) for a, s in zip(axes, splits) if s.blocks > 1})
        w_axes = tuple(f"w{k}" for k in range(rank + 2))
        partial = da.blockwise(
            _weights_block, ("n", *(f"s{k}" for k in range(rank)), *w_axes),
            x, data_index("ci"), data["y"], data_index("co"), *ids,
            new_axes=dict(zip(w_axes, problem.geometry.w_shape)),
            adjust_chunks={"n": 1, **{f"s{k}": 1 for k in range(rank)}},
            dtype=compute_dtype(problem.dtype), concatenate=True, align_arrays=False, plan=plan)
        total = partial.sum(axis=tuple(range(rank + 1)), split_every=SPLIT_EVERY)
        return da.map_blocks(_finish_weights, total, chunks=tuple((d,) for d in problem.output_shape),
                             dtype=problem.dtype, meta=np.empty((0,) * ndim, problem.dtype), plan=plan)
    forward = problem.task == "forward"
    source = data["x"] if forward else data["y"]
    depth = {a: ((0, s.right_halo) if forward else (s.left_halo, 0)) for a, s in zip(axes, splits) if s.blocks > 1}
    extra = [weights["w"], tuple(f"w{k}" for k in range(ndim))]
    if "bias" in weights:
        extra += [weights["bias"], ("b",)]
    out_channels = problem.geometry.oc if forward else problem.geometry.ic
    return da.blockwise(
        _forward_block if forward else _data_block, data_index("co" if forward else "ci"),
        _overlap(source, depth), data_index("ci" if forward else "co"), *extra, *ids,
        new_axes={"co" if forward else "ci": out_channels},
        adjust_chunks={f"s{k}": (s.o_sizes() if forward else s.i_sizes()) for k, s in enumerate(splits)},
        dtype=problem.dtype, meta=np.empty((0,) * ndim, problem.dtype), concatenate=True, align_arrays=False,
        plan=plan)


def _engine_ref(engine: Engine) -> str | Engine:
    """A registered engine by name (workers look it up), any other engine object as it is."""
    name = getattr(engine, "name", None)
    return name if name in available_engines() and get_engine(name) is engine else engine


def _overlap(array: da.Array, depth: dict[int, tuple[int, int]]) -> da.Array:
    """``array`` with each block extended by its neighbours' halos (none past the array's ends)."""
    if not any(lo or hi for lo, hi in depth.values()):
        return array
    extended = da.overlap.overlap(array, depth=depth, boundary="none")
    if extended.numblocks != array.numblocks:  # the splits keep every block at least as large as its halo
        raise AssertionError(f"dask regrouped the blocks: {array.chunks} -> {extended.chunks}")
    return extended


def _elementwise_lazy(problem: TensorProblem, arrays: dict[str, Any], engine: Engine, op: Op) -> da.Array:
    """An element-wise, binary or TypeCast op as the same op on each block (dask broadcasts and
    aligns the inputs' chunks); every block is a whole problem of its own, checked and rounded."""
    family = problem.definition.family
    if family not in ELEMENTWISE_FAMILIES:
        name = next(name for name, a in arrays.items() if is_dask_array(a))
        raise InputTypeError(problem.op, name, f"is a dask array: {family} ops take NumPy data here (call "
                             ".compute() first); dask arrays work with the convolution ops and the "
                             "element-wise, binary and TypeCast ops")
    shape = problem.output_shape
    inputs = [_as_dask(arrays[spec.name]) for spec in problem.definition.inputs]
    lead = next((a for a in inputs if a.shape == shape), None)
    chunks = (lead if lead is not None else da.broadcast_to(inputs[0], shape)).chunks
    # A broadcast operand becomes a zero-stride view of the result's shape, in the result's chunks.
    blocks = [a.rechunk(chunks) if a.shape == shape else da.broadcast_to(a, shape, chunks=chunks) for a in inputs]
    ref = _engine_ref(engine)
    return da.map_blocks(lambda *b: op(*b, engine=ref), *blocks, dtype=problem.dtype,
                         meta=np.empty((0,) * len(shape), problem.dtype))
