"""Compiled tap gathers and scatters of the output-row GEMMs (:mod:`.output_rows`).

With every array seen as 3-D spatial (missing leading axes of size 1), a zero-padded input ``P``
(n, P0, P1, P2, G, C) and the tap ``k`` of output ``o`` at ``p = o*S + k*D`` (always inside ``P``),
over a run of the flat output rows ``r = (n, o)``:

- :func:`scatter` (col2im): ``P[n, o*S + k*D, g, c] += Z[g, r, k, c]`` for every tap;
- :func:`gather`  (im2col): ``Z[r, g, k, c] = P[n, o*S + k*D, g, c]``.

One pass over Z with the channels innermost (contiguous on both sides). NumPy's strided
``+=``/copy per tap runs a short inner loop per output row instead: 3x slower for a dilated 7x7
output with 64 channels. Serial on purpose, as :mod:`convgrad.casts` explains.
"""

from __future__ import annotations

import numba
import numpy as np

from ...problem import ConvGeometry

__all__ = ["scatter", "gather"]


@numba.njit(inline="always")
def _position(r, out):  # pragma: no cover - compiled
    """(image, o0, o1, o2) of flat output row r of (n, *out) rows."""
    image, rest = divmod(r, out[0] * out[1] * out[2])
    o0, rest = divmod(rest, out[1] * out[2])
    o1, o2 = divmod(rest, out[2])
    return image, o0, o1, o2


@numba.njit(cache=True)
def _columns(padded, z, first, out, kernel, dilations, strides, scatter):  # pragma: no cover - compiled
    """``scatter``: padded[tap] += z[g, r, k]; else z[r, g, k] = padded[tap] (see the module)."""
    g_, c_ = padded.shape[4:]
    for r in range(z.shape[1] if scatter else z.shape[0]):
        image, o0, o1, o2 = _position(first + r, out)
        t = 0
        for k0 in range(kernel[0]):
            p0 = o0 * strides[0] + k0 * dilations[0]
            for k1 in range(kernel[1]):
                p1 = o1 * strides[1] + k1 * dilations[1]
                for k2 in range(kernel[2]):
                    p2 = o2 * strides[2] + k2 * dilations[2]
                    for g in range(g_):
                        for c in range(c_):
                            if scatter:
                                padded[image, p0, p1, p2, g, c] += z[g, r, t, c]
                            else:
                                z[r, g, t, c] = padded[image, p0, p1, p2, g, c]
                    t += 1


def _run(padded: np.ndarray, z: np.ndarray, g: ConvGeometry, first: int, scatter: bool) -> None:
    fill = (1,) * (3 - g.rank)
    params = (np.array(fill + v, np.int64) for v in (g.out_size, g.kernel, g.dilations, g.strides))
    cols = z.reshape(*z.shape[:2], -1, g.icg)
    _columns(padded.reshape(padded.shape[0], *fill, *padded.shape[1:-1], g.groups, g.icg), cols, first,
             *params, scatter)


def scatter(z: np.ndarray, padded: np.ndarray, g: ConvGeometry, first: int) -> None:
    """col2im of the output rows ``first, first + 1, ...`` of the images of ``padded``:
    ``z`` (G, rows, prod(K)*ICg) and ``padded`` (n, *P, IC), both contiguous."""
    _run(padded, z, g, first, scatter=True)


def gather(padded: np.ndarray, z: np.ndarray, g: ConvGeometry, first: int) -> None:
    """im2col of the output rows ``first, first + 1, ...`` of the images of ``padded`` into ``z``
    (rows, G, prod(K)*ICg), contiguous (``padded`` (n, *P, IC) as well)."""
    _run(padded, z, g, first, scatter=False)
