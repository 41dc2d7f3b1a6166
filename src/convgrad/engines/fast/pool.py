"""The fast engine's one thread pool: GNU OpenMP's, safe under ``fork()`` and concurrent callers.

- **Threading layer**: numba's ``omp`` where numba's OpenMP layer loads (else ``workqueue``),
  unless ``NUMBA_THREADING_LAYER`` names one. Its threads wait for work by spinning a while, as
  PyTorch's do, and start a parallel region sooner than ``workqueue``'s: inside a training step
  bf16 -30 %, f32 -5 % step time (docs/engine-measurements.md, "One pool: OpenMP"). Imported before PyTorch,
  numba's layer and PyTorch share one ``libgomp`` (PyTorch's ``libgomp.so.1`` binds to the one
  numba loaded); imported after, each has its own (numba names ``libgomp.so.1.0.0``): the step
  time measured the same either way.
- **Spinning**: libgomp's threads spin 300,000 rounds (~7 ms on a Zen 5) after a parallel
  region; beside a BLAS call that followed one of ours, they slowed it by a fifth. Where the
  user sets none of ``GOMP_SPINCOUNT``, ``OMP_WAIT_POLICY`` and ``NUMBA_THREADING_LAYER``, this
  module loads numba's libgomp with ``GOMP_SPINCOUNT`` = ``TUNING.omp_spin_count`` (a libgomp
  that PyTorch loaded first keeps its own setting; numba then loads its own).
- **fork()**: a GNU OpenMP pool does not survive a fork (the child's copy names threads that
  do not exist: a parallel region there aborts or hangs, and numba's layer terminates such a
  child). In a forked child every call runs on a thread started in that child, a new OpenMP
  master with a pool of its own, and numba's fork guard is re-armed for the child.
- **One call at a time**: every fast-engine call holds :func:`serial`'s lock (``workqueue``
  terminates the process on concurrent parallel launches; OpenMP would oversubscribe the
  cores). The lock is re-created in a forked child.
- **No BLAS threads spinning after a call**: after a call that ran on NumPy's BLAS (the ``gemm``
  strategy), OpenBLAS's threads keep spinning (its timeout: 2^28 cycles, about 70 ms) on the
  cores numba's and PyTorch's threads need next: ResNet-50's bf16 first-layer weights gradient
  took 18-24 ms alone and 45-64 ms right after the first layer's data gradient (on BLAS).
  :func:`quiet_blas` shuts OpenBLAS's threads down (its ``blas_thread_shutdown_``, 60-110 µs;
  its next call starts them again) where no other Python thread could be inside a BLAS call:
  after a large BLAS-based call at once, after a small one (:func:`blas_ran`) only before the
  next call on numba's threads within ``TUNING.blas_spin_seconds`` (:func:`blas_spinning`): a
  run of small BLAS calls pays nothing, and the 1-D suite's ``jit`` calls after them ran 2-4x
  slower beside the spinning threads (docs/engine-measurements.md, "eighth session").

The layer is chosen when this module is imported, before any parallel kernel runs; a process
that already ran one keeps the layer it has.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import numba
from numba.np.ufunc import parallel as _parallel

from .tuning import TUNING

__all__ = ["run", "serial", "layer", "quiet_blas", "blas_ran", "blas_spinning", "threads"]

T = TypeVar("T")


def _omp_loads() -> bool:
    """Whether numba's OpenMP layer loads. Its libgomp reads ``GOMP_SPINCOUNT`` as it loads: set
    to ``TUNING.omp_spin_count`` for that moment (module docstring), unless the user set it or
    ``OMP_WAIT_POLICY``; child processes do not inherit it."""
    ours = not {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(os.environ)
    if ours:
        os.environ["GOMP_SPINCOUNT"] = str(TUNING.omp_spin_count)
    try:
        from numba.np.ufunc import omppool  # noqa: F401  (loads a libgomp)
    except ImportError:
        return False
    finally:
        if ours:
            del os.environ["GOMP_SPINCOUNT"]
    return True


if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "omp" if _omp_loads() else "workqueue"

_lock = threading.RLock()
_inside = threading.local()
#: When a BLAS-based call last ended with OpenBLAS's threads left running (None: stopped since).
_blas_ended: list[float | None] = [None]
_child: ThreadPoolExecutor | None = None      # set in a forked child whose layer is OpenMP
_forked = False


def _renew() -> None:
    """In a forked child: a fresh lock, and (OpenMP) calls moved to a thread of the child's own."""
    global _lock, _child, _forked
    _lock = threading.RLock()
    _inside.__dict__.clear()
    _blas_ended[0] = None                          # the parent's BLAS threads are not the child's
    _child = None
    _forked = layer() == "omp"
    if _forked:
        from numba.np.ufunc import omppool         # numba records the pid that may run kernels
        ctypes.CFUNCTYPE(None, ctypes.c_int)(omppool.launch_threads)(numba.config.NUMBA_NUM_THREADS)


os.register_at_fork(after_in_child=_renew)


def threads() -> int:
    """``numba.get_num_threads()``; once numba's threads run, its C getter alone (0.75 -> 0.1 µs)."""
    get = getattr(_parallel, "_get_num_threads", None)
    return get() if get is not None else numba.get_num_threads()


def serial() -> threading.RLock:
    """The lock every parallel fast-engine call holds (re-entrant: a call may nest another)."""
    return _lock


def _call(fn: Callable[..., T], args: tuple, threads: int | None = None) -> T:
    _inside.active = True
    try:
        if threads is not None:
            numba.set_num_threads(threads)
        return fn(*args)
    finally:
        _inside.active = False


def run(fn: Callable[..., T], *args) -> T:
    """``fn(*args)`` under the lock, in the pool; in a forked child (OpenMP layer) on a thread of
    the child's own, with the caller's context variables and numba thread count."""
    global _child
    if getattr(_inside, "active", False):        # nested in a call already in the pool
        return fn(*args)
    with _lock:
        if not _forked:
            return _call(fn, args)
        if _child is None:
            _child = ThreadPoolExecutor(1, thread_name_prefix="convgrad-pool")
        context = contextvars.copy_context()          # NumPy's errstate, among others
        return _child.submit(context.run, _call, fn, args, numba.get_num_threads()).result()


def layer() -> str:
    """The threading layer in use: numba's own name once a parallel kernel has run, else the
    configured one."""
    try:
        return numba.threading_layer()
    except ValueError:          # no parallel kernel has run yet
        return numba.config.THREADING_LAYER


@functools.cache
def _openblas_shutdowns() -> list[Callable[[], None]]:
    """``blas_thread_shutdown_`` of every OpenBLAS the process has loaded at the first call
    (NumPy's, and SciPy's where it is loaded: found in the process's mappings); none for another
    BLAS, or off Linux."""
    try:
        with open("/proc/self/maps") as maps:
            paths = dict.fromkeys(line.split()[-1] for line in maps
                                  if "openblas" in line.rsplit("/", 1)[-1].lower())
        found = (getattr(ctypes.CDLL(path), "blas_thread_shutdown_", None) for path in paths)
        return [fn for fn in found if fn is not None]
    except OSError:
        return []


def blas_ran() -> None:
    """Note that a BLAS-based call just ended, its threads left spinning."""
    _blas_ended[0] = time.monotonic()


def blas_spinning() -> bool:
    """Whether OpenBLAS's threads may still spin: a BLAS-based call ended within
    ``TUNING.blas_spin_seconds`` and they were not stopped since."""
    ended = _blas_ended[0]
    return ended is not None and time.monotonic() - ended < TUNING.blas_spin_seconds


def quiet_blas() -> None:
    """Stop OpenBLAS's threads spinning after a BLAS-based call (module docstring), unless
    another Python thread is running (it could be inside a BLAS call of its own)."""
    if threading.active_count() > 1:
        return
    for shutdown in _openblas_shutdowns():
        shutdown()
    _blas_ended[0] = None
