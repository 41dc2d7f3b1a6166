"""The phase frame: every convolution as shifted row-slices of flat (rows, channels) buffers.

Per spatial axis (sizes I, O, K, stride S, dilation D, pads PB/PE) the tap of kernel offset k for
output o reads the padded input at ``p = o*S + k*D``. Writing ``p = S*q + r`` splits the padded
input into S phases; offset k reads phase ``r_k = (k*D) mod S`` at ``q = o + s_k`` with
``s_k = (k*D) div S``. Within one phase this is a stride-1 problem, and in a frame of
``Q = O + max_k s_k`` positions per axis (every tap of every output lies inside it, since
``S*(O-1) + EK <= I + PB + PE``) a multi-axis shift is one *flat row offset*: with the phase buffer
``P_r`` of n images viewed as a (rows, C) matrix and the output placed at the frame row m of its
position::

    y[m]    = sum_k P_{r_k}[m + shift_k] @ w[k]           (forward)
    dP_r[m] = sum_{k: r_k = r} dy_ext[m - shift_k] @ w[k]^T  (backward data)
    dw[k]   = sum_m P_{r_k}[m + shift_k]^T dy_ext[m]        (backward weights)

``dy_ext`` is dy in the frame with zeros at the rows that are no output (``o >= O`` on some axis),
so those rows contribute nothing; frame rows of y past O are computed and dropped. For stride 1
there is one phase and the buffer is just the padded input; for a 1x1 stride-S kernel it is one
subsampled phase; with no padding and stride 1 it *is* the input (no copy).

Row order. When ``Q = O`` on every axis (no junk rows) the rows run image by image, as the data
does, so inputs and outputs can serve as frames without a copy. Otherwise the batch sits *inside*
the first spatial axis, rows ordered ``(q_1, n, q_2, ..., q_r)``: the junk rows ``q_1 >= O_1`` of
all images then form one tail that is never computed, which cuts the wasted work from
``prod(Q/O)`` to ``prod_{a>1}(Q_a/O_a)`` (none at all in 1-D), e.g. from 1.65x to 1.29x for a
7x7 image with a 3x3 kernel.

The buffers are (rows, C) matrices stored row by row, or channel by channel (``input_major`` for
the x side, ``output_major`` for the y side): BLAS takes either order as it is, so NCX data is
copied into its frame along contiguous memory instead of being transposed, and narrow channel
groups are gathered and summed along runs of rows rather than runs of a few channels.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from ... import casts, layout
from ...problem import ConvGeometry
from . import workspace
from .geometry import stride_phase

__all__ = ["Frame", "empty_like_data"]

_ALL = slice(None)


def empty_like_data(shape: tuple[int, ...], dtype: np.dtype, like: np.ndarray, fill: bool = False,
                    offset: int = 0) -> np.ndarray:
    """A new canonical (N, *X, C) result array of ``shape`` in the memory order of the data
    ``like`` (so NCX results need no transposition later), zeroed if ``fill``, ``offset`` bytes
    past an aligned address (:func:`.workspace.result`: large ones on memory the engine has used
    before)."""
    if layout.channels_first(like):
        return np.moveaxis(workspace.result((shape[0], shape[-1], *shape[1:-1]), dtype, fill, offset), 1, -1)
    return workspace.result(shape, dtype, fill, offset)


@dataclass(frozen=True)
class Frame:
    """Phase decomposition of one convolution geometry (see the module docstring).

    Building one, and everything the memory estimate asks of it (``size``, ``phase_count``,
    ``max_shift``), costs O(rank) whatever the kernel; the per-offset tables are built when the
    engine first runs it."""

    g: ConvGeometry
    size: tuple[int, ...]                    #: Q per axis
    input_major: bool = False                #: input-side buffers (x, dx) stored channel by channel
    output_major: bool = False               #: output-side buffers (y, dy) stored channel by channel

    @classmethod
    @functools.lru_cache(maxsize=256)
    def of(cls, g: ConvGeometry, input_major: bool = False, output_major: bool = False) -> Frame:
        size = tuple(o + (k - 1) * d // s for o, k, d, s in zip(g.out_size, g.kernel, g.dilations, g.strides))
        return cls(g, size, input_major, output_major)

    @property
    def _axes(self) -> list[tuple[int, int, int]]:
        return list(zip(self.g.kernel, self.g.dilations, self.g.strides))

    @functools.cached_property
    def phases(self) -> tuple[tuple[int, ...], ...]:
        """The phase combinations some offset reads, in order."""
        return tuple(itertools.product(*(sorted({stride_phase(kk, d, s)[0] for kk in range(k)})
                                         for k, d, s in self._axes)))

    @property
    def phase_count(self) -> int:
        """``len(phases)`` in closed form: per axis the residues k*D mod S are the multiples of
        gcd(D, S), so an axis has min(K, S / gcd(D, S)) phases."""
        return math.prod(min(k, s // math.gcd(d, s)) for k, d, s in self._axes)

    @functools.cached_property
    def tap_phase(self) -> tuple[int, ...]:
        """Per kernel offset (C order): index into ``phases``."""
        index = {p: i for i, p in enumerate(self.phases)}
        return tuple(index[tuple(stride_phase(kk, d, s)[0] for kk, (_, d, s) in zip(offset, self._axes))]
                     for offset in itertools.product(*(range(k) for k in self.g.kernel)))

    @functools.cached_property
    def tap_steps(self) -> tuple[tuple[int, ...], ...]:
        """Per kernel offset: its shift in frame positions per axis."""
        return tuple(tuple(stride_phase(kk, d, s)[1] for kk, (_, d, s) in zip(offset, self._axes))
                     for offset in itertools.product(*(range(k) for k in self.g.kernel)))

    # -- rows -----------------------------------------------------------------------------------
    @property
    def image_rows(self) -> int:
        return math.prod(self.size)

    @property
    def batch_inside(self) -> bool:
        """Rows ordered (q_1, n, q_2, ...) rather than image by image (see the module docstring)."""
        return self.size != self.g.out_size

    def _strides(self, n: int) -> tuple[int, tuple[int, ...]]:
        """(row stride of an image, row stride of each spatial axis) for ``n`` images."""
        inner = [math.prod(self.size[a + 1:]) for a in range(len(self.size))]
        if self.batch_inside:
            return inner[0], (n * inner[0], *inner[1:])
        return self.image_rows, tuple(inner)

    @functools.lru_cache(maxsize=64)
    def taps(self, n: int) -> tuple[tuple[int, int], ...]:
        """(phase, flat row shift) of every kernel offset, for frames of ``n`` images (cached)."""
        _, strides = self._strides(n)
        return tuple((p, sum(s * rs for s, rs in zip(steps, strides))) for p, steps in zip(self.tap_phase, self.tap_steps))

    def output_grid(self, n: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        """(frame rows per image, O, frame rows per step along each axis) for ``n`` images: the
        output (i, o) sits at frame row ``i*image + sum_a o_a*step_a``."""
        image, strides = self._strides(n)
        return image, self.g.out_size, strides

    def max_shift(self, n: int) -> int:
        """The largest flat row shift of an offset, that of the last one (steps grow with k)."""
        _, strides = self._strides(n)
        return sum((k - 1) * d // s * rs for (k, d, s), rs in zip(self._axes, strides))

    def span(self, n: int) -> int:
        """Frame rows up to and including the last output of ``n`` images."""
        image, strides = self._strides(n)
        return (n - 1) * image + sum((o - 1) * rs for o, rs in zip(self.g.out_size, strides)) + 1

    def phase_rows(self, phase: int, n: int) -> tuple[int, int]:
        """The rows of ``phase`` that hold input positions (all rows unless the batch is inside)."""
        slices = self._phase_slices(self.phases[phase])
        if not self.batch_inside or slices is None:
            return 0, n * self.image_rows
        _, strides = self._strides(n)
        return slices[0][1].start * strides[0], slices[0][1].stop * strides[0]

    @property
    def covers_input(self) -> bool:
        """Whether every input position lies in some phase (else backward data leaves zeros):
        the phases are disjoint, so their counts of input positions must add up to all."""
        slices = (self._phase_slices(phase) for phase in self.phases)
        return sum(math.prod(s.stop - s.start for s in frame[1:-1])
                   for frame, _ in filter(None, slices)) == math.prod(self.g.in_size)

    @property
    def input_fills_frame(self) -> bool:
        """Whether the input positions of every phase fill its whole frame (no padding, no
        positions past the input): phase buffers then need no zero fill."""
        slices = [self._phase_slices(phase) for phase in self.phases]
        return all(s is not None and all(f.start == 0 and f.stop == q for f, q in zip(s[0][1:-1], self.size))
                   for s in slices)

    @property
    def input_is_frame(self) -> bool:
        """Stride 1 and no padding: the phase buffer would be a copy of the input."""
        g = self.g
        return all(s == 1 for s in g.strides) and not any(g.pads_begin) and not any(g.pads_end)

    # -- buffers --------------------------------------------------------------------------------
    @staticmethod
    def _widened(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """f16 data converted by :mod:`convgrad.casts` (faster than NumPy's cast); other dtypes
        are converted by the copy into the frame."""
        return casts.to_f32(a) if a.dtype == np.float16 and dtype == np.float32 else a

    @staticmethod
    def _alloc(lead: tuple[int, ...], rows: int, c: int, dtype: np.dtype, fill: bool, major: bool) -> np.ndarray:
        """A (*lead, rows, C) buffer, channel-major in memory if ``major``; zeroed if ``fill``."""
        make = np.zeros if fill else np.empty
        if not major:
            return make((*lead, rows, c), dtype)
        return np.swapaxes(make((*lead, c, rows), dtype), -1, -2)

    def _images(self, rows: np.ndarray, n: int) -> np.ndarray:
        """View (..., n*prod(Q), C) frame rows as (..., n, *Q, C) whatever the row order."""
        lead, c = rows.shape[:-2], rows.shape[-1]
        if not self.batch_inside:
            return rows.reshape(*lead, n, *self.size, c)
        return np.swapaxes(rows.reshape(*lead, self.size[0], n, *self.size[1:], c), len(lead), len(lead) + 1)

    def _own_rows(self, a: np.ndarray, dtype: np.dtype, major: bool) -> np.ndarray | None:
        """``a`` (n, *X, C) as frame rows without a copy (right dtype, order and row layout), or None."""
        if a.dtype != dtype or (self.batch_inside and a.shape[0] > 1):
            return None
        if a.ndim > 2 and layout.channels_first(a) != major:
            return None
        if not (a.flags.c_contiguous or (major and a.shape[0] == 1)):
            return None
        flat = a.reshape(-1, a.shape[-1])
        return flat if np.shares_memory(flat, a) or not a.size else None

    # -- the input side (x, dx) -------------------------------------------------------------------
    def _phase_slices(self, phase: tuple[int, ...]) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
        """(frame slices, input slices) of the input positions in ``phase``; None if there are none."""
        frame, data = [_ALL], [_ALL]
        for r, s, pb, i, q in zip(phase, self.g.strides, self.g.pads_begin, self.g.in_size, self.size):
            lo, hi = max(0, -((r - pb) // s)), min(q, -((r - pb - i) // s))
            if hi <= lo:
                return None
            start = s * lo + r - pb
            frame.append(slice(lo, hi))
            data.append(slice(start, start + s * (hi - lo - 1) + 1, s))
        return (*frame, _ALL), (*data, _ALL)

    def phase_input(self, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """The phase buffers of ``x`` (n, *I, C) as ``(phases, n*prod(Q), C)`` in ``dtype``."""
        n, c = x.shape[0], x.shape[-1]
        x = self._widened(x, dtype)
        own = self._own_rows(x, dtype, self.input_major) if self.input_is_frame else None
        if own is not None:
            return own[None]
        buf = self._alloc((len(self.phases),), n * self.image_rows, c, dtype, not self.input_fills_frame,
                          self.input_major)
        images = self._images(buf, n)
        for ph, phase in enumerate(self.phases):
            slices = self._phase_slices(phase)
            if slices is not None:
                images[ph][slices[0]] = x[slices[1]]
        return buf

    def input_target(self, dx: np.ndarray, dtype: np.dtype, zeroed: bool = False) -> np.ndarray:
        """Where backward data writes its phase buffers (in ``dtype``): ``dx`` itself if it is the
        frame, else new buffers (copied into ``dx`` by :meth:`scatter_input`, rounding if ``dx``
        is bf16), ``zeroed`` for sums scattered into them (``dx`` itself must then be zero)."""
        n, c = dx.shape[0], dx.shape[-1]
        own = self._own_rows(dx, dtype, self.input_major) if self.input_is_frame else None
        if own is not None:
            return own[None]
        return self._alloc((len(self.phases),), n * self.image_rows, c, dtype, zeroed, self.input_major)

    def scatter_input(self, phases: np.ndarray, dx: np.ndarray) -> None:
        """Copy phase buffers back to ``dx`` (zero-filled; positions no tap reads stay 0). A
        16-bit ``dx`` is assembled in the buffers' dtype first, in its own memory order, and
        then rounded along memory (rather than in the strided phase copies)."""
        if np.shares_memory(phases, dx):
            return
        wide = dx if dx.dtype == phases.dtype else \
            empty_like_data(dx.shape, phases.dtype, dx, fill=not self.covers_input)
        images = self._images(phases, dx.shape[0])
        for ph, phase in enumerate(self.phases):
            slices = self._phase_slices(phase)
            if slices is not None:
                wide[slices[1]] = images[ph][slices[0]]
        if wide is not dx:
            casts.copy_into(dx, wide)

    # -- the output side (y, dy) ------------------------------------------------------------------
    def _output_slices(self) -> tuple[slice, ...]:
        return (_ALL, *(slice(0, o) for o in self.g.out_size), _ALL)

    def extended_output(self, dy: np.ndarray, dtype: np.dtype, lead: int = 0) -> np.ndarray:
        """``dy`` (n, *O, C) in the frame, zeros elsewhere, after ``lead`` zero rows: (lead + rows, C).
        Only the rows that get no dy are zeroed (each buffer row is written once)."""
        n, c = dy.shape[0], dy.shape[-1]
        dy = self._widened(dy, dtype)
        own = self._own_rows(dy, dtype, self.output_major) if not lead and not self.batch_inside else None
        if own is not None:
            return own
        buf = self._alloc((), lead + n * self.image_rows, c, dtype, False, self.output_major)
        buf[:lead] = 0
        images = self._images(buf[lead:], n)
        for axis, o in enumerate(self.g.out_size):  # the junk slab past O on each axis
            images[(_ALL, *(slice(0, p) for p in self.g.out_size[:axis]), slice(o, None))] = 0
        images[self._output_slices()] = dy
        return buf

    def output_target(self, y: np.ndarray) -> np.ndarray:
        """Where forward writes its frame rows: ``y`` itself if it is the frame."""
        n, c = y.shape[0], y.shape[-1]
        own = self._own_rows(y, y.dtype, self.output_major) if not self.batch_inside else None
        if own is not None:
            return own
        return self._alloc((), n * self.image_rows, c, y.dtype, False, self.output_major)

    def crop_output(self, rows: np.ndarray, y: np.ndarray) -> None:
        """Copy the output rows of a frame buffer into ``y`` (no-op if ``rows`` is ``y``)."""
        if np.shares_memory(rows, y):
            return
        y[...] = self._images(rows, y.shape[0])[self._output_slices()]
