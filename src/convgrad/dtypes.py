"""Data types: which are supported, converting user inputs to arrays, and the final rounding.

Data tensors are f32, bf16 (``ml_dtypes.bfloat16``), f16, or f64 (an extension for reference
use). Shape tensors are integer (s32 in the spec). Results are accumulated in f32 or f64 and
rounded once, to nearest even, to the output dtype.
"""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np

from . import casts
from .errors import DTypeError, InputError, InputTypeError, ShapeError, describe
from .opdefs import MAX_NDIMS

__all__ = ["DATA_DTYPES", "dtype_name", "parse_dtype", "as_array", "as_shape_values", "round_to", "compute_dtype",
           "is_dask_array", "check_lazy_array"]

bfloat16 = np.dtype(ml_dtypes.bfloat16)

#: Supported data dtypes by oneDNN name.
DATA_DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "bf16": bfloat16,
    "f16": np.dtype(np.float16),
    "f64": np.dtype(np.float64),
}
_NAMES = {v: k for k, v in DATA_DTYPES.items()}
_S32 = np.iinfo(np.int32)


def dtype_name(dtype: np.dtype) -> str:
    """oneDNN's short name of a data dtype (``f32``, ``bf16``, ...), or numpy's name."""
    return _NAMES.get(np.dtype(dtype), np.dtype(dtype).name)


def parse_dtype(value: Any) -> np.dtype:
    """A supported data dtype from a oneDNN name, a numpy dtype or a type."""
    if isinstance(value, str) and value in DATA_DTYPES:
        return DATA_DTYPES[value]
    try:
        dtype = np.dtype(value)
    except Exception:  # numpy raises TypeError, ValueError, KeyError... for odd specifications
        dtype = None
    if dtype not in _NAMES:
        raise DTypeError(None, None, f"dtype {describe(value)} is not supported: expected one of "
                         + ", ".join(DATA_DTYPES))
    return dtype


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """Accumulation dtype of the fast path: f64 for f64 data, f32 for everything else."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def as_array(value: Any, op: str, name: str) -> np.ndarray:
    """Convert an input (array-like or ``__dlpack__`` object) to a NumPy array without copying
    where possible (a non-native byte order is copied to native). The caller's object is never
    modified. Masked arrays are refused: their mask would be silently ignored."""
    if isinstance(value, np.ma.MaskedArray):
        raise InputTypeError(op, name, "is a masked array: expected a plain array (use .filled(...) to choose "
                             "the values of the masked elements)")
    if isinstance(value, np.ndarray):
        array = value.view(np.ndarray)  # subclasses (memmap, matrix) as plain arrays
    else:
        array = _convert(value, op, name)
    return array if array.dtype.isnative else _native(array)


def _native(array: np.ndarray) -> np.ndarray:
    """``array`` in native byte order: a copy of its distinct elements only, broadcast back along
    the axes it repeats (stride 0), so a huge broadcast view costs no more than its data."""
    repeated = tuple(slice(0, 1) if stride == 0 and size > 1 else slice(None)
                     for stride, size in zip(array.strides, array.shape))
    compact = array[repeated].astype(array.dtype.newbyteorder("="))
    return compact if compact.shape == array.shape else np.broadcast_to(compact, array.shape)


def is_dask_array(value: Any) -> bool:
    """Whether ``value`` is a dask array, told by its type's module, so without importing dask."""
    return type(value).__module__.startswith("dask.array")


def check_lazy_array(value: Any, op: str, name: str) -> Any:
    """A dask array input as it is (nothing computed), if its shape is known."""
    if any(not isinstance(s, (int, np.integer)) for s in value.shape):  # NaN: chunks of unknown size
        raise InputError(op, name, f"is a dask array of unknown shape {value.shape}: expected known chunk "
                         "sizes (call .compute_chunk_sizes() first)")
    return value


def _convert(value: Any, op: str, name: str) -> np.ndarray:
    try:
        if hasattr(value, "__dlpack__"):
            try:
                return np.from_dlpack(value)
            except (TypeError, RuntimeError, BufferError, ValueError):
                bits = _torch_bf16_bits(value)
                if bits is not None:
                    return bits.view(bfloat16)
                # e.g. a dtype NumPy's DLPack import lacks: fall back to the array protocol
        return np.asarray(value)
    except Exception as exc:
        raise InputTypeError(op, name, f"= {describe(value)} cannot be converted to an array ({exc})") from None


def _torch_bf16_bits(value: Any) -> np.ndarray | None:
    """NumPy's DLPack import (and torch's __array__) lack bfloat16: import a torch bf16 tensor's
    bits as int16 (zero-copy, any strides); None for anything else."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor) or value.dtype != torch.bfloat16:
        return None
    return np.from_dlpack(value.view(torch.int16))


def check_data_dtype(array: np.ndarray, op: str, name: str) -> np.dtype:
    """The array's dtype if it is a supported data dtype, else a :class:`DTypeError`."""
    if array.dtype not in _NAMES:
        raise DTypeError(op, name, f"has dtype {array.dtype}: expected one of {', '.join(DATA_DTYPES)}")
    return array.dtype


def as_shape_values(value: Any, op: str, name: str) -> tuple[int, ...]:
    """The values of a 1-D integer shape tensor (s32 in the spec; any integer dtype accepted)."""
    array = as_array(value, op, name)
    if array.dtype.kind not in "iu" and not (array.size == 0 and array.dtype.kind == "f"):
        raise DTypeError(op, name, f"= {describe(array)} has dtype {array.dtype}: expected a 1-D integer (s32) "
                         "shape tensor")
    if array.ndim != 1:
        raise InputError(op, name, f"has shape {array.shape}: expected a 1-D integer (s32) shape tensor")
    if array.shape[0] > MAX_NDIMS:  # before reading the values: it may be a huge (broadcast) array
        raise ShapeError(op, name, f"has {array.shape[0]} values: expected a tensor shape, 3 to 5 values "
                         f"(at most {MAX_NDIMS}, oneDNN's DNNL_MAX_NDIMS)")
    values = tuple(int(v) for v in array.tolist())
    if any(v < _S32.min or v > _S32.max for v in values):
        raise InputError(op, name, f"= {describe(list(values))}: values must fit in s32")
    return values


def _round_to_odd_f32(values: np.ndarray) -> np.ndarray:
    """Round f64 to f32 with round-to-odd, so that a later RNE to a narrower format is exact."""
    nearest = values.astype(np.float32)
    inexact = nearest.astype(np.float64) != values
    if not inexact.any():
        return nearest
    # Truncate toward zero, then set the last bit (sticky) on the inexact ones.
    overshoot = inexact & (np.abs(nearest.astype(np.float64)) > np.abs(values))
    nearest[overshoot] = np.nextafter(nearest[overshoot], np.float32(0))
    bits = nearest.view(np.uint32)
    bits[inexact] |= np.uint32(1)
    return nearest


def round_to(result: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round an f32/f64 result once, to nearest even, to ``dtype``.

    ml_dtypes converts f64 to bf16 through f32 (two roundings), so f64 results go through a
    round-to-odd f32 first, which makes the second rounding exact.
    """
    if result.dtype == dtype:
        return result
    if dtype in (np.float16, bfloat16) and result.dtype == np.float32:
        return casts.from_f32(result, dtype)  # NumPy's f32 -> f16 is 10x slower, ml_dtypes' -> bf16 2x
    if dtype == bfloat16 and result.dtype == np.float64:
        finite = np.isfinite(result) & (np.abs(result) < np.finfo(np.float32).max)
        if finite.all():
            return _round_to_odd_f32(result).astype(dtype)
    return result.astype(dtype)
