"""The engine's large arrays, kept from call to call: temporaries (a padded copy, packed panels,
position pairs) and the memory of results.

A fresh array of tens of MB costs its pages: glibc maps large blocks anew (and returns them when
freed), and the first touch of each 4 KiB page faults, two threads faulting at once slowest
(a 51 MB GEMM result: 25-80 ms instead of 9; ResNet-50's bf16 gradients in sequence 491 ->
364 ms with glibc told to keep freed memory, docs/engine-measurements.md, "Fourth round"). So:

- :func:`empty` and :func:`zeros`: within one engine call (:func:`call`), temporaries on blocks
  that earlier calls used, which go back to the cache when the outermost call ends (or when
  the :func:`part` of the call that took them ends);
- :func:`result`: a result on a cached block, *lent* to its caller: the block goes back to the
  cache only when the last array on its memory is freed (the result, its views, a tensor made
  from it), never while any of them lives.

At most ``TUNING.workspace_cache_bytes`` stay cached while unused. Small arrays, and temporaries
outside a call, are fresh ones. Every array from 4 KiB starts on a cache line (:data:`ALIGN`): NumPy's own
large arrays start 16 bytes past a page, and a kernel's 64-byte vector loads from them each
touched two lines (docs/engine-measurements.md, "Fifth round").
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ... import kernel_cache

from .tuning import TUNING

__all__ = ["call", "part", "empty", "zeros", "result", "cached_bytes", "clear", "address", "line_empty", "ALIGN"]

_state = threading.local()   # this thread's call depth and blocks taken
_free: list[np.ndarray] = []  # uint8 blocks, free between calls (shared: calls hold the pool's lock)
_returned: list[np.ndarray] = []  # blocks of freed results, moved to _free under the lock
_lock = threading.Lock()
_PAGE = 1 << 21              # large blocks are whole 2 MiB (huge page) multiples ...
_GRAIN = 1 << 16             # ... the others 64 KiB ones (a 2.3 MB block was 4 MiB: 1.7 MB of slack)
#: Bytes every array of this module from 4 KiB is aligned to: a cache line, an AVX-512 vector.
ALIGN = 64


@kernel_cache.njit()
def address(a):  # pragma: no cover - compiled
    """Where ``a``'s data starts (0.5 µs; NumPy's ``a.ctypes.data`` 2.8)."""
    return a.ctypes.data


@kernel_cache.njit()
def line_empty(count, dtype):  # pragma: no cover - compiled
    """An uninitialised 1-D array of ``count`` values of ``dtype`` made in compiled code, from a
    cache line: numba's own ``np.empty`` starts on 32 bytes, half of them off a line, where a
    kernel's 64-byte vectors or tile rows would each touch two."""
    spare = np.empty(count + ALIGN, dtype)
    skip = (-spare.ctypes.data % ALIGN) // spare.itemsize
    return spare[skip:skip + count]


def _aligned(nbytes: int) -> np.ndarray:
    """A fresh uint8 array of ``nbytes``, from 4 KiB starting on an :data:`ALIGN` boundary
    (smaller ones as NumPy places them: aligning costs a microsecond, a tiny call's budget)."""
    if nbytes < 4096:
        return np.empty(nbytes, np.uint8)
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -address(raw) % ALIGN
    return raw[start:start + nbytes]


class _Lease:
    """A block lent out as a result's memory: arrays on it hold this object (their base), whose
    end gives the block back, while the blocks given back and not yet settled stay within the
    cache's bound. Only a list append here (atomic): it runs wherever the last array is freed,
    even inside this module's locked sections."""

    __slots__ = ("block", "__array_interface__")

    def __init__(self, block: np.ndarray, nbytes: int) -> None:
        self.block = block
        self.__array_interface__ = {"data": (block.ctypes.data, False), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}

    def __del__(self, returned: list[np.ndarray] = _returned, names: dict = globals()) -> None:
        tuning = names.get("TUNING")        # the module's (bound now: at exit its names may be gone)
        if tuning is not None and sum(block.nbytes for block in returned) + self.block.nbytes \
                <= tuning.workspace_cache_bytes:
            returned.append(self.block)     # else its memory goes back to the allocator, as a plain array's would


def _take(nbytes: int) -> np.ndarray:
    """The smallest free block that holds ``nbytes`` (at most twice as large), else a new one."""
    with _lock:
        _settle()
        at = next((i for i, block in enumerate(_free) if nbytes <= block.nbytes <= 2 * nbytes + _PAGE), None)
        block = _free.pop(at) if at is not None else None
    grain = _PAGE if nbytes >= 8 * _PAGE else _GRAIN
    return block if block is not None else _aligned(-(-nbytes // grain) * grain)


def _settle() -> None:
    """(Under the lock) freed results' blocks into the cache, then the cache within its bound."""
    while _returned:
        _free.append(_returned.pop())
    _free.sort(key=lambda block: block.nbytes)
    while sum(block.nbytes for block in _free) > TUNING.workspace_cache_bytes:
        _free.pop()          # the largest first


def _taken() -> list[np.ndarray] | None:
    return getattr(_state, "taken", None)


class call:  # noqa: N801 - used as a function: ``with call():``
    """One engine call: blocks taken inside return to the cache when the outermost one ends."""

    __slots__ = ("outer",)

    def __enter__(self) -> None:
        self.outer = _taken() is None
        if self.outer:
            _state.taken = []

    def __exit__(self, *exc: object) -> None:
        if not self.outer:
            return
        taken, _state.taken = _state.taken, None
        if taken:
            with _lock:
                _free.extend(taken)
                _settle()


class part:  # noqa: N801 - used as a function: ``with part():``
    """A part of an engine call whose temporaries die with it (one GEMM of several): the blocks
    taken inside go back to the cache when it ends, for the call's next parts to take."""

    __slots__ = ("start",)

    def __enter__(self) -> None:
        taken = _taken()
        self.start = None if taken is None else len(taken)

    def __exit__(self, *exc: object) -> None:
        taken = _taken()
        if self.start is None or taken is None or len(taken) == self.start:
            return
        mine = taken[self.start:]
        del taken[self.start:]
        with _lock:
            _free.extend(mine)
            _settle()


def empty(count: int, dtype: np.dtype) -> np.ndarray:
    """A 1-D array of ``count`` values of ``dtype``, uninitialised, aligned: from the cache within
    a call (the smallest free block that holds it, at most twice its size), else new."""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    taken = _taken()
    if taken is None or nbytes < TUNING.workspace_min_bytes:
        return _aligned(nbytes).view(dtype)
    block = _take(nbytes)
    taken.append(block)
    return block[:nbytes].view(dtype)


def zeros(count: int, dtype: np.dtype) -> np.ndarray:
    """:func:`empty`, zeroed."""
    out = empty(count, dtype)
    out.fill(0)
    return out


def result(shape: tuple[int, ...], dtype: np.dtype, fill: bool = False, offset: int = 0) -> np.ndarray:
    """A C-contiguous array of ``shape`` for a result, from 4 KiB starting ``offset`` bytes
    (below :data:`ALIGN`) past an aligned address, zeroed if ``fill``: large ones on a cached block lent
    to it (:class:`_Lease`: back in the cache when the last array on it is freed, so a result kept
    by its caller is never written again), small ones fresh."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize + offset
    raw = _aligned(nbytes) if nbytes < TUNING.workspace_min_bytes else np.asarray(_Lease(_take(nbytes), nbytes))
    out = (raw[offset:] if offset else raw).view(dtype).reshape(shape)
    if fill:
        out.fill(0)
    return out


def cached_bytes() -> int:
    """Bytes held in the cache while unused."""
    with _lock:
        _settle()
        return sum(block.nbytes for block in _free)


def clear() -> None:
    """Drop the cached blocks (their memory goes back to the allocator)."""
    with _lock:
        _settle()
        _free.clear()
