"""Fast casts between f32 and the 16-bit floats: IEEE half (f16) both ways, and f32 -> bf16.

NumPy's own f16 casts run at ~0.1-0.2 Gelem/s on AVX2, and ml_dtypes' f32 -> bf16 at ~2 Gelem/s
in cache (here 5); bf16 -> f32 is a shift that ml_dtypes already does at copy speed.
Equal to NumPy's and ml_dtypes' casts, value for value (a NaN stays a NaN; its bits may differ).
f16:

- where the CPU converts halves (x86 F16C: LLVM lowers ``fpext``/``fptrunc`` of ``half`` to
  ``vcvtph2ps``/``vcvtps2ph``), compiled loops use those instructions (~0.12 ns a value in cache,
  3-6x the software loops below); :data:`HARDWARE` says whether they passed a check against
  NumPy on every half and on the rounding cases when this module loaded;
- elsewhere widening looks every half up in a table NumPy made, and narrowing rounds to nearest
  even, with overflow to inf, gradual underflow to subnormals and NaN kept NaN (after
  F. Giesen's ``float_to_half_fast3_rtne``), written with selects.

bf16: round to nearest even on the bits (``(u + 0x7FFF + odd) >> 16``, which also carries into
inf on overflow), NaNs set quiet in a second pass that runs only if there is one.

Arrays whose memory is not one contiguous block (in C or channels-first order) fall back to NumPy.
The loops are serial on purpose: numba's parallel (OpenMP) threads keep spinning after a parallel
loop and then starve the BLAS threads of the GEMMs that follow (2.5x slower on 2 cores).

``(u + 0xC8000FFF + odd) >> 13`` is ``u - (112 << 23) + 0xFFF + odd`` modulo 2^32: rebias the
exponent and round the 13 dropped bits to nearest even.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numba
import numpy as np

from . import kernel_cache
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

__all__ = ["HARDWARE", "to_f32", "from_f32", "astype", "copy_into"]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


@intrinsic
def _half_to_single(typingctx, bits):  # pragma: no cover - compiled
    """The half with these 16 bits, as a float32 (LLVM ``fpext``)."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def _bf16_to_single(typingctx, bits):  # pragma: no cover - compiled
    """The bf16 with these 16 bits, as a float32 (exact: they are the float32's upper half)."""
    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())
    return types.float32(types.uint16), codegen


#: ``kind`` of :func:`widened` and of the compiled kernels' data arrays: f32 values as they are,
#: or 16 bits that are a bf16's, or an IEEE half's.
F32_VALUES, BF16_BITS, F16_BITS = 0, 1, 2
#: The kind of each data dtype the kernels read.
KINDS: dict[np.dtype, int] = {np.dtype(np.float32): F32_VALUES, BFLOAT16: BF16_BITS,
                              np.dtype(np.float16): F16_BITS}


def bits(a: np.ndarray) -> np.ndarray:
    """A 16-bit float array as its uint16 bits (the compiled kernels' view of it); others as they are."""
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a


def widened(value, kind):  # pragma: no cover - replaced in compiled code by its overload
    """In compiled loops: a data value as they compute with it: a float as it is; uint16 bits of
    a bf16 (``kind`` :data:`BF16_BITS`) or of a half (:data:`F16_BITS`) widened to float32,
    exactly (the loops read 16-bit data where it lies: :func:`in_place`)."""
    raise NotImplementedError("convgrad.casts.widened runs only in compiled code")


@overload(widened, inline="always")
def _widened(value, kind):  # pragma: no cover - compiled
    if value == types.uint16:
        return lambda value, kind: _half_to_single(value) if kind == F16_BITS else _bf16_to_single(value)
    return lambda value, kind: value


def bits_kind(dtype: np.dtype) -> int:
    """The kind compiled loops read (:func:`widened`) and write (:func:`narrowed`) 16-bit
    ``dtype`` data as, value by value: bf16 always, f16 where the CPU converts halves
    (:data:`HARDWARE`); else :data:`F32_VALUES` (the data needs f32 copies)."""
    kind = KINDS.get(np.dtype(dtype), F32_VALUES)
    return kind if kind != F16_BITS or HARDWARE else F32_VALUES


def in_place(a: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(the uint16 bits of 16-bit float data, its :func:`bits_kind`) where compiled loops can
    widen it value by value, else None."""
    kind = bits_kind(a.dtype)
    return (bits(a), kind) if kind != F32_VALUES else None


@intrinsic
def _single_to_half(typingctx, value):  # pragma: no cover - compiled
    """The bits of a float32 rounded to the nearest half (LLVM ``fptrunc``, round to nearest even)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


@kernel_cache.njit()
def _widen_hw(h, out):  # pragma: no cover - compiled
    for i in range(h.size):
        out[i] = _half_to_single(h[i])


@kernel_cache.njit()
def _narrow_hw(f, out):  # pragma: no cover - compiled
    for i in range(f.size):
        out[i] = _single_to_half(f[i])


@functools.lru_cache(maxsize=1)
def _table() -> np.ndarray:
    """Every half as a single (256 KiB, L2-resident), from NumPy's exact widening."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@kernel_cache.njit()
def _widen(h, table, out):  # pragma: no cover - compiled
    for i in range(h.size):
        out[i] = table[h[i]]


@kernel_cache.njit()
def _narrow(f, bits, out):  # pragma: no cover - compiled
    for i in range(f.size):
        u = bits[i]
        sign = (u >> 16) & 0x8000
        u &= 0x7FFFFFFF
        special = 0x7E00 if u > 0x7F800000 else 0x7C00  # NaN, or overflow to inf
        tiny = np.uint32(np.rint(abs(f[i]) * np.float32(16777216.0)))  # subnormal: units of 2^-24
        normal = (u + 0xC8000FFF + ((u >> 13) & 1)) >> 13  # rebias, round the 13 dropped bits
        o = special if u >= 0x47800000 else (tiny if u < 0x38800000 else normal)
        out[i] = np.uint16((o | sign) & 0xFFFF)


@numba.njit(inline="always")
def bf16_bits(u):  # pragma: no cover - compiled
    """The bf16 bits nearest (ties to even) to the f32 of bits ``u`` (a NaN quiet), for compiled
    loops that round as they store."""
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.uint16((((u >> 16) | 0x40) if nan else ((u + 0x7FFF + ((u >> 16) & 1)) >> 16)) & 0xFFFF)


@intrinsic
def _single_bits(typingctx, value):  # pragma: no cover - compiled
    """The bits of a float32 as a uint32."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


def narrowed(value, kind):  # pragma: no cover - replaced in compiled code by its overload
    """In compiled loops, :func:`widened`'s inverse: the bits of the bf16 (``kind``
    :data:`BF16_BITS`) or half (:data:`F16_BITS`, where the CPU converts halves) nearest to
    ``value`` as float32, ties to even (a NaN quiet): a result rounded once, as it is stored."""
    raise NotImplementedError("convgrad.casts.narrowed runs only in compiled code")


@overload(narrowed, inline="always")
def _narrowed(value, kind):  # pragma: no cover - compiled
    def impl(value, kind):
        single = np.float32(value)
        return _single_to_half(single) if kind == F16_BITS else bf16_bits(_single_bits(single))
    return impl


@kernel_cache.njit()
def _narrow_bf16(bits, out):  # pragma: no cover - compiled
    nan = False
    for i in range(bits.size):
        u = bits[i]
        out[i] = np.uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)
        nan |= (u & 0x7FFFFFFF) > 0x7F800000
    if nan:
        for i in range(bits.size):
            if (bits[i] & 0x7FFFFFFF) > 0x7F800000:
                out[i] = np.uint16((bits[i] >> 16) | 0x40)


def _agrees(ours: np.ndarray, numpy: np.ndarray) -> bool:
    unsigned = np.uint16 if ours.dtype == np.float16 else np.uint32
    return bool(((ours.view(unsigned) == numpy.view(unsigned)) | (np.isnan(ours) & np.isnan(numpy))).all())


def _hardware() -> bool:
    """Whether the hardware loops compile here and agree with NumPy on every half and on the
    rounding cases (ties, overflow, subnormals, NaN)."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(all="ignore"):
        # every half, the midpoints to the next half (normal halves) and just either side of them
        wide = every.view(np.float16).astype(np.float32)
        mid = (wide.view(np.uint32) | 0x1000).view(np.float32)
        singles = np.concatenate([wide, mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf)),
                                  np.array([65520.0, 1e6, -1e-9, 2.0 ** -25, 3 * 2.0 ** -26], np.float32)])
        expected = singles.astype(np.float16)
    try:
        out, halves = np.empty(every.size, np.float32), np.empty(singles.size, np.uint16)
        _widen_hw(every, out)
        _narrow_hw(singles, halves)
    except Exception:  # noqa: BLE001 - no half type on this target: LLVM could not lower the loops
        return False
    return _agrees(out, wide) and _agrees(halves.view(np.float16), expected)


#: Whether this machine converts with the hardware loops (see the module docstring).
HARDWARE = _hardware()


def _widen_into(h: np.ndarray, out: np.ndarray) -> None:
    """Flat uint16 half bits ``h`` widened into flat float32 ``out``."""
    if HARDWARE:
        _widen_hw(h, out)
    else:
        _widen(h, _table(), out)


def _narrow_into(f: np.ndarray, out: np.ndarray, dtype: np.dtype) -> None:
    """Flat float32 ``f`` rounded into the flat uint16 bits ``out`` of ``dtype`` (f16 or bf16)."""
    if dtype == BFLOAT16:
        _narrow_bf16(f.view(np.uint32), out)
    elif HARDWARE:
        _narrow_hw(f, out)
    else:
        _narrow(f, f.view(np.uint32), out)


def _flat(a: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """A flat view of ``a``'s memory and the axis order that restores it (C order or channels
    moved to axis 1), or None."""
    if a.flags.c_contiguous:
        return a.reshape(-1), tuple(range(a.ndim))
    if a.ndim > 2 and np.moveaxis(a, -1, 1).flags.c_contiguous:
        return np.moveaxis(a, -1, 1).reshape(-1), (0, *range(2, a.ndim), 1)
    return None


def to_f32(a: np.ndarray) -> np.ndarray:
    """``a`` (float16) as float32, in the same memory order."""
    flat = _flat(a)
    if flat is None:
        return a.astype(np.float32)
    out = np.empty(flat[0].size, np.float32)
    _widen_into(flat[0].view(np.uint16), out)
    base = out.reshape(a.shape if flat[1] == tuple(range(a.ndim)) else np.moveaxis(a, -1, 1).shape)
    return base.transpose(flat[1]) if flat[1] != tuple(range(a.ndim)) else base


def from_f32(a: np.ndarray, dtype: np.dtype = np.dtype(np.float16)) -> np.ndarray:
    """``a`` (float32) rounded to ``dtype`` (float16 or bf16; nearest even), in the same memory order."""
    flat = _flat(a)
    if flat is None:
        return a.astype(dtype)
    out = np.empty(flat[0].size, np.uint16)
    _narrow_into(flat[0], out, np.dtype(dtype))
    base = out.view(dtype).reshape(a.shape if flat[1] == tuple(range(a.ndim)) else np.moveaxis(a, -1, 1).shape)
    return base.transpose(flat[1]) if flat[1] != tuple(range(a.ndim)) else base


def astype(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` in ``dtype``, in its own memory order (``a`` itself if it already is): the cast runs
    along memory (a transposed view cast into C order ran at ~6 ns a value), f16 -> f32 here."""
    if a.dtype == dtype:
        return a
    return to_f32(a) if a.dtype == np.float16 and dtype == np.float32 else a.astype(dtype, order="K")


def copy_into(out: np.ndarray, a: np.ndarray) -> None:
    """``out[...] = a`` for arrays of one shape, converting float16 <-> float32 and float32 ->
    bf16 here (along memory where both lie in one order, C or channels-first; a strided side
    goes through a contiguous copy) and any other pair by NumPy's assignment."""
    if a.dtype == np.float16 and out.dtype == np.float32 and out.flags.c_contiguous:
        _widen_into(np.ascontiguousarray(a).reshape(-1).view(np.uint16), out.reshape(-1))
    elif a.dtype == np.float32 and out.dtype in (np.float16, BFLOAT16) and (flat := _flat(a)) is not None:
        into = _flat(out)
        if into is not None and into[1] == flat[1]:  # one memory order: flat into flat
            _narrow_into(flat[0], into[0].view(np.uint16), out.dtype)
        else:
            out[...] = from_f32(a, out.dtype)
    else:
        out[...] = a
