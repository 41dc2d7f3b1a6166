"""``C += A @ B`` on NumPy's own BLAS: the one GEMM form NumPy does not expose (``beta = 1``).

Summing the GEMMs of a convolution's kernel offsets with ``np.matmul`` into a scratch block and
``+=`` costs as much memory traffic as the GEMM itself for 64 channels; BLAS accumulates in its
output tile for free. It has to be *NumPy's* BLAS: a second OpenBLAS (SciPy's) keeps its own
threads, which spin after each call and slow whichever library runs next (docs/engine-measurements.md).

NumPy's wheels ship OpenBLAS as ``scipy-openblas`` with ILP64 CBLAS symbols
(``scipy_cblas_sgemm64_``; ``cblas_sgemm64_`` before NumPy 2). Where NumPy was built against some
other BLAS, :func:`addmm` returns False and the caller falls back to ``matmul`` + ``+=``.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path

import numpy as np

__all__ = ["addmm", "available"]

_ROW_MAJOR, _COL_MAJOR, _NO_TRANS, _TRANS = 101, 102, 111, 112
_SUFFIX = {"linux": ".so", "darwin": ".dylib", "win32": ".dll"}


def _library() -> ctypes.CDLL | None:
    """NumPy's bundled scipy-openblas (already loaded by NumPy, so the same threads), or None."""
    config = getattr(np, "__config__", None)
    blas = getattr(config, "CONFIG", {}).get("Build Dependencies", {}).get("blas", {})
    if blas.get("name") not in ("scipy-openblas", "openblas") or "USE64BITINT" not in str(blas):
        return None
    root = Path(np.__file__).resolve().parent
    suffix = _SUFFIX.get(sys.platform, ".so")
    candidates = [p for d in (root.parent / "numpy.libs", root / ".dylibs", root / ".libs")
                  for p in (sorted(d.glob(f"*openblas*{suffix}*")) if d.is_dir() else [])]
    for path in candidates:
        try:
            return ctypes.CDLL(str(path))
        except OSError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def _functions() -> dict[np.dtype, ctypes._CFuncPtr]:
    """ILP64 ``cblas_?gemm`` of NumPy's BLAS per dtype (empty where there is none)."""
    lib = _library()
    found: dict[np.dtype, ctypes._CFuncPtr] = {}
    for dtype, letter, scalar in ((np.dtype(np.float32), "s", ctypes.c_float),
                                  (np.dtype(np.float64), "d", ctypes.c_double)):
        for name in (f"scipy_cblas_{letter}gemm64_", f"cblas_{letter}gemm64_"):
            fn = getattr(lib, name, None) if lib is not None else None
            if fn is not None:
                i64 = ctypes.c_int64
                fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, i64, i64, i64, scalar, ctypes.c_void_p,
                               i64, ctypes.c_void_p, i64, scalar, ctypes.c_void_p, i64]
                fn.restype = None
                found[dtype] = fn
                break
    return found


def available(dtype: np.dtype) -> bool:
    """Whether :func:`addmm` can run for ``dtype``."""
    return np.dtype(dtype) in _functions()


def _order(m: np.ndarray) -> tuple[bool, int] | None:
    """(row-major?, leading dimension in elements) of a 2-D matrix BLAS takes as it is, or None."""
    (rows, cols), (s0, s1), item = m.shape, m.strides, m.itemsize
    if s1 == item and s0 % item == 0 and s0 >= cols * item:
        return True, s0 // item
    if s0 == item and s1 % item == 0 and s1 >= rows * item:
        return False, s1 // item
    return None


def addmm(c: np.ndarray, a: np.ndarray, b: np.ndarray, beta: float = 1.0) -> bool:
    """``c = beta * c + a @ b`` in place for 2-D (M, K) @ (K, N) -> (M, N) of one float dtype, any
    row- or column-major strides (views included). False (``c`` untouched) where BLAS cannot take
    the operands as they are: the caller then falls back to NumPy."""
    gemm = _functions().get(c.dtype)
    if gemm is None or a.dtype != c.dtype or b.dtype != c.dtype or min(*a.shape, *b.shape) < 2:
        return False
    (m, k), n = a.shape, b.shape[1]
    orders = _order(c), _order(a), _order(b)
    if None in orders or c.shape != (m, n) or b.shape[0] != k or np.may_share_memory(c, a) \
            or np.may_share_memory(c, b):
        return False
    (c_rows, ldc), (a_rows, lda), (b_rows, ldb) = orders
    trans = {True: _NO_TRANS, False: _TRANS} if c_rows else {True: _TRANS, False: _NO_TRANS}
    gemm(_ROW_MAJOR if c_rows else _COL_MAJOR, trans[a_rows], trans[b_rows], m, n, k, 1.0, a.ctypes.data, lda,
         b.ctypes.data, ldb, beta, c.ctypes.data, ldc)
    return True
