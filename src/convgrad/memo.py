"""A bounded memo shared by threads: what the warm path of repeated calls remembers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Memo"]

K = TypeVar("K")
V = TypeVar("V")


class Memo(Generic[K, V]):
    """A dict of at most ``size`` entries (full: it starts afresh); reads take no lock (a dict
    read is atomic), writes one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: dict[K, V] = {}
        self._lock = threading.Lock()
        #: ``get(key)``: the entry or None (the dict's own method: no Python frame on a warm call).
        self.get: Callable[[K], V | None] = self._entries.get

    def put(self, key: K, value: V) -> V:
        with self._lock:
            if len(self._entries) >= self.size:
                self._entries.clear()
            self._entries[key] = value
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __getstate__(self) -> int:
        """Pickled empty (a memo is this process's): an object holding one pickles, as dask does."""
        return self.size

    def __setstate__(self, size: int) -> None:
        self.__init__(size)  # type: ignore[misc]
