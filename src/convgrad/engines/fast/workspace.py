"""The engine's temporaries, kept from call to call: a padded copy, packed panels, position pairs.

A fresh array of tens of MB costs its pages: glibc maps large blocks anew (and returns them when
freed), and the first touch of each 4 KiB page faults, two threads faulting at once slowest
(a 51 MB GEMM result: 25-80 ms instead of 9; ResNet-50's bf16 gradients in sequence 491 ->
364 ms with glibc told to keep freed memory, docs/engine.md "Fourth round"). Within one engine
call (:func:`call`), :func:`empty` and :func:`zeros` hand out blocks that the previous calls
used, which go back to the cache when the outermost call ends; at most
``TUNING.workspace_cache_bytes`` stay cached between calls. Only temporaries come from here: a
strategy's result (or a view of it) never does, since its memory is reused after the call.
Outside a call, and for small arrays, these are ``np.empty``/``np.zeros``.
"""

from __future__ import annotations

import threading

import numpy as np

from .tuning import TUNING

__all__ = ["call", "empty", "zeros", "cached_bytes", "clear"]

_state = threading.local()   # this thread's call depth and blocks taken
_free: list[np.ndarray] = []  # uint8 blocks, free between calls (shared: calls hold the pool's lock)
_lock = threading.Lock()
_PAGE = 1 << 21              # blocks are whole 2 MiB (huge page) multiples


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
                _free.sort(key=lambda block: block.nbytes)
                while sum(block.nbytes for block in _free) > TUNING.workspace_cache_bytes:
                    _free.pop()          # the largest first


def empty(count: int, dtype: np.dtype) -> np.ndarray:
    """A 1-D array of ``count`` values of ``dtype``, uninitialised: from the cache within a call
    (the smallest free block that holds it, at most twice its size), else new."""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    taken = _taken()
    if taken is None or nbytes < TUNING.workspace_min_bytes:
        return np.empty(count, dtype)
    with _lock:
        at = next((i for i, block in enumerate(_free) if nbytes <= block.nbytes <= 2 * nbytes + _PAGE), None)
        block = _free.pop(at) if at is not None else None
    if block is None:
        block = np.empty(-(-nbytes // _PAGE) * _PAGE, np.uint8)
    taken.append(block)
    return block[:nbytes].view(dtype)


def zeros(count: int, dtype: np.dtype) -> np.ndarray:
    """:func:`empty`, zeroed."""
    out = empty(count, dtype)
    out.fill(0)
    return out


def cached_bytes() -> int:
    """Bytes held in the cache between calls."""
    with _lock:
        return sum(block.nbytes for block in _free)


def clear() -> None:
    """Drop the cached blocks (their memory goes back to the allocator)."""
    with _lock:
        _free.clear()
