"""NaN-poisoned allocations: while :func:`poisoned_allocations` is active, every ``np.empty`` /
``np.empty_like`` that convgrad's own Python code makes (engine outputs, workspaces, the API's
layout copies) returns a NaN-filled array, so that an element that is read before it is written,
or never written at all (a dropped zero fill, a loop that stops short), shows in the result
instead of passing by whatever the heap held.

Which modules: every loaded ``convgrad`` module whose source allocates with ``np.empty``. Modules
without numba code get a NumPy stand-in as their ``np``. In modules with numba code the compiled
functions must keep resolving ``np`` to NumPy itself (numba compiles against the module's globals,
and caches what it compiled; some modules compile at run time, in cached factories), so there
each plain Python function is replaced by a copy of it
whose globals see the stand-in as ``np`` (and the module for every other name); the compiled functions are left alone.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import numba
import numpy as np


class PoisonedNumpy:
    """NumPy, except that ``empty`` and ``empty_like`` return NaN-filled floating arrays."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def _poison(a: np.ndarray) -> np.ndarray:
        if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
            a.fill(np.nan)
        return a

    def empty(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self._poison(np.empty(*args, **kwargs))

    def empty_like(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self._poison(np.empty_like(*args, **kwargs))


_ALLOCATES: dict[str, bool] = {}


def _allocates(module: types.ModuleType) -> bool:
    """Whether the module's source calls ``np.empty`` (read once per module)."""
    if module.__name__ not in _ALLOCATES:
        try:
            _ALLOCATES[module.__name__] = "np.empty" in inspect.getsource(module)
        except (OSError, TypeError):
            _ALLOCATES[module.__name__] = False
    return _ALLOCATES[module.__name__]


def _allocating_modules() -> list[types.ModuleType]:
    return [module for name, module in list(sys.modules.items())
            if (name == "convgrad" or name.startswith("convgrad.")) and getattr(module, "np", None) is np
            and _allocates(module)]


def _compiled(module: types.ModuleType) -> bool:
    """Whether the module has numba code: compiled functions, or factories that compile them at
    run time (the jit strategy's drivers, ``functools.cache``d: left alone, so that what they
    compile sees NumPy itself, whichever test compiles them first)."""
    return any(isinstance(v, numba.core.dispatcher.Dispatcher) for v in vars(module).values()) \
        or "njit" in inspect.getsource(module)


class _Globals(dict):
    """A module's globals as its functions see them, ``np`` aside: every other name is looked up
    in the module itself at each use (so its functions call each other's copies, and constants a
    test patches on the module are seen)."""

    def __init__(self, module: types.ModuleType, stand_in: PoisonedNumpy) -> None:
        # what the interpreter reads with dict.get (builtins; the package, for imports in a function)
        super().__init__({name: vars(module)[name] for name in ("__builtins__", "__name__", "__package__", "__spec__")})
        self.module, self.stand_in = module, stand_in

    def __getitem__(self, name: str) -> Any:
        return self.stand_in if name == "np" else vars(self.module)[name]


def poison(setattr: Callable[[Any, str, Any], None]) -> None:
    """Make convgrad's ``np.empty`` allocations NaN-filled, each change made with ``setattr``
    (``monkeypatch.setattr`` in a fixture, so that its undo keeps one order with the test's own
    patches)."""
    import convgrad  # noqa: F401  (loads the engines)
    stand_in = PoisonedNumpy()
    for module in _allocating_modules():
        if not _compiled(module):
            setattr(module, "np", stand_in)
            continue
        env = _Globals(module, stand_in)
        for name, f in list(vars(module).items()):
            if isinstance(f, types.FunctionType) and f.__module__ == module.__name__:
                copy = types.FunctionType(f.__code__, env, f.__name__, f.__defaults__, f.__closure__)
                copy.__kwdefaults__, copy.__doc__ = f.__kwdefaults__, f.__doc__
                setattr(module, name, copy)


@contextlib.contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Within the block, convgrad's ``np.empty`` allocations are NaN-filled (see :func:`poison`)."""
    undo: list[tuple[Any, str, Any]] = []

    def patch(target: Any, name: str, value: Any) -> None:
        undo.append((target, name, getattr(target, name)))
        setattr(target, name, value)
    poison(patch)
    try:
        yield
    finally:
        for target, name, value in reversed(undo):
            setattr(target, name, value)
