"""convgrad's compiled functions: numba's disk cache made safe for processes that compile the
same functions at once, and compiles that a caller's warnings filters cannot break.

numba numbers a new cache entry's data file from an index it reads without a lock, and trusts the
index when it loads: two processes compiling variants of one function at once (``pytest -n``, a
pool's workers, a forked child beside its parent) can leave one variant's key naming another's
machine code, which a later process then runs (numba issues 4807 and 10128; seen here: a bf16
data gradient off by 1e32 after parallel test runs). Every function convgrad compiles with a
disk cache goes through :func:`njit` (or :func:`guard` its cache file): each entry is saved and
loaded under an exclusive ``flock`` of a file beside the index (none where that is unavailable),
and its data carries its key, so that an entry under another key is a miss, compiled again.
numba dates an entry by its function's own file only, but the machine code also holds what it
inlined from other modules (the micro-kernel's IR, geometry's loops): an edit there left the
old code running. Each entry is dated by every Python file of convgrad too (:func:`_package_stamp`).

numba's own warnings while it compiles (``NumbaIRAssumptionWarning``, a pedantic check that the
16-bit loads of :func:`convgrad.casts.widened` trip on a cold cache) are not the caller's
business: under a caller's ``warnings.simplefilter("error")`` they made the first call of a
16-bit problem fail (docs/guarantees.md, promise 6). Compiles run with numba's warnings ignored.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numba
from numba.core.errors import NumbaWarning

__all__ = ["njit", "guard", "quiet"]

#: The mark of a cache entry's data stored with its key.
_KEYED = "convgrad-keyed-1"


def njit(**options: Any) -> Callable[[Callable], Any]:
    """``numba.njit(cache=True, **options)`` with its cache file guarded (:func:`guard`; compiled
    without a disk cache should numba's cache internals differ from what the guard expects), its
    compiles :func:`quiet`."""
    def wrap(fn: Callable) -> Any:
        dispatcher = numba.njit(cache=True, **options)(fn)
        cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)  # an IndexDataCacheFile
        if not guard(cache_file):
            dispatcher = numba.njit(cache=False, **options)(fn)
        dispatcher.compile = quiet(dispatcher.compile)     # numba's dispatch compiles through it
        return dispatcher
    return wrap


def quiet(compile_: Callable) -> Callable:
    """``compile_`` run with numba's own warnings ignored, whatever the caller's filters."""
    @functools.wraps(compile_)
    def run(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NumbaWarning)
            return compile_(*args, **kwargs)
    return run


@functools.cache
def _package_stamp() -> tuple[tuple[str, int, int], ...]:
    """(path, mtime in ns, size) of every Python file of convgrad, once per process."""
    root = pathlib.Path(__file__).resolve().parent
    return tuple(sorted((str(p.relative_to(root)), st.st_mtime_ns, st.st_size)
                        for p in root.rglob("*.py") for st in (p.stat(),)))


def guard(cache_file: Any) -> bool:
    """Make numba's ``IndexDataCacheFile`` ``cache_file`` save and load under the lock, each
    entry's data with its key, its index dated by convgrad's files too (the module docstring);
    False (nothing changed) where it is not one."""
    if not all(hasattr(cache_file, name) for name in ("_source_stamp", "_index_path", "save", "load")):
        return False
    save, load = cache_file.save, cache_file.load
    lock_path = cache_file._index_path + ".lock"
    cache_file._source_stamp = (cache_file._source_stamp, _package_stamp())   # the module docstring

    @contextlib.contextmanager
    def locked() -> Iterator[None]:
        try:
            import fcntl
            handle = open(lock_path, "a+b")
        except (ImportError, OSError):
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def save_keyed(key: Any, data: Any) -> None:
        with locked():
            save(key, (_KEYED, key, data))

    def load_keyed(key: Any) -> Any:
        with locked():
            got = load(key)
        if isinstance(got, tuple) and len(got) == 3 and got[0] == _KEYED and got[1] == key:
            return got[2]
        return None

    cache_file.save, cache_file.load = save_keyed, load_keyed
    return True
