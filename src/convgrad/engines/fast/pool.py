"""The fast engine's one thread pool: numba's, safe under ``fork()`` and concurrent callers.

- **Threading layer**: numba's ``workqueue`` unless ``NUMBA_THREADING_LAYER`` names another.
  GNU OpenMP (numba's default where present) terminates a child process forked after the parent
  ran a parallel kernel ("fork() called from a process already using GNU OpenMP"): PyTorch's
  DataLoader workers and ``multiprocessing`` pools fork by default on Linux. ``workqueue`` is
  fork-safe, and its idle workers sleep instead of spinning beside PyTorch's own OpenMP threads.
  Measured on a Zen 4 (docs/engine.md): the same speed alone and in sequence as OpenMP.
- **One call at a time**: ``workqueue`` refuses parallel kernels launched from several threads
  at once (it terminates the process), so every fast-engine call holds :func:`serial`'s lock.
  The lock is re-created in a forked child (a fork while another thread held it would otherwise
  leave the child's copy locked forever).

The layer is chosen when this module is imported, before any parallel kernel runs; a process
that already ran one keeps the layer it has.
"""

from __future__ import annotations

import os
import threading

import numba

__all__ = ["serial", "layer"]

if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"

_lock = threading.RLock()


def _renew() -> None:
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_renew)


def serial() -> threading.RLock:
    """The lock every parallel fast-engine call holds (re-entrant: a call may nest another)."""
    return _lock


def layer() -> str:
    """The threading layer in use: numba's own name once a parallel kernel has run, else the
    configured one."""
    try:
        return numba.threading_layer()
    except ValueError:          # no parallel kernel has run yet
        return numba.config.THREADING_LAYER
