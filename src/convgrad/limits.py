"""Size limits and the memory guard: fail fast with a clear error instead of overflowing or
being killed for memory.

- Every size of a resolved problem (each dimension, padded sizes, element and byte counts of
  every tensor, also when the batch is 0) must fit in int64; otherwise a :class:`ShapeError` at
  shape inference.
- Before an engine runs, the output plus the engine's working set must fit in the memory budget
  (:func:`check_memory`); otherwise a :class:`ResourceError` that gives both numbers and how to
  raise the budget. Nothing is allocated before these checks. ``Op.infer`` allocates nothing, so
  it resolves any representable problem, also one too large for this machine (graph compilers plan
  for other machines).

The budget is, in order: :func:`set_memory_budget`, the ``CONVGRAD_MEMORY_BUDGET`` environment
variable (bytes, or with a unit: ``512MiB``, ``2GiB``, ``1.5GB``), else half of the memory
available now (``MemAvailable`` of ``/proc/meminfo``, bounded by the cgroup's limit; elsewhere
``sysconf``; 4 GiB if nothing can be read).
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import TYPE_CHECKING

import numpy as np

from . import environment
from .errors import ResourceError, ShapeError
from .memo import Memo

if TYPE_CHECKING:
    from .engines import Engine
    from .problem import Problem

__all__ = ["DEFAULT_FRACTION", "parse_size", "format_size", "available_memory", "memory_budget", "check_bytes",
           "set_memory_budget", "check_sizes", "estimate_bytes", "check_memory"]

#: Share of the available memory one call may use when no budget is configured.
DEFAULT_FRACTION = 0.5
_ENV = "CONVGRAD_MEMORY_BUDGET"
_INT64_MAX = 2**63 - 1
_FALLBACK_AVAILABLE = 4 * 2**30
_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9,
          "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_REFRESH_SECONDS = 0.5
_budget: list[int | None] = [None]
_available: list[tuple[float, int]] = [(0.0, 0)]  # (expiry time, bytes), replaced as a whole


def parse_size(text: str) -> int:
    """Bytes from ``"1073741824"``, ``"512MiB"``, ``"2GiB"``, ``"1.5GB"`` (units in any case)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", text)
    unit = match and match.group(2).upper()
    if not match or unit not in _UNITS:
        raise ResourceError(None, f"memory size {text!r} is not understood: expected bytes or a number "
                            "with a unit such as 512MiB, 2GiB or 1.5GB")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(nbytes: int) -> str:
    """``nbytes`` for people: ``"1.5 GiB"``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def _read_int(path: str, field: str | None = None) -> int | None:
    """An integer from a file (or from the line ``field: N kB`` of it), None if unreadable."""
    try:
        with open(path) as f:
            if field is None:
                return int(f.read().split()[0])
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom() -> int | None:
    """Memory left below this process's cgroup limit (v2 or v1), None if there is no limit."""
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < 2**60:
            return max(0, limit - usage)
    return None


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable``, bounded by the cgroup limit), read at
    most every ``_REFRESH_SECONDS`` (reading costs about as much as a small convolution)."""
    expiry, value = _available[0]
    if time.monotonic() < expiry:
        return value
    value = _read_available()
    _available[0] = (time.monotonic() + _REFRESH_SECONDS, value)
    return value


def _read_available() -> int:
    available = _read_int("/proc/meminfo", "MemAvailable")
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            available = _FALLBACK_AVAILABLE
    headroom = _cgroup_headroom()
    return available if headroom is None else min(available, headroom)


def set_memory_budget(budget: int | str | None) -> None:
    """Set the bytes one call may allocate (an int, or a string such as ``"2GiB"``);
    ``None`` restores the default (``CONVGRAD_MEMORY_BUDGET``, else half the available memory)."""
    if isinstance(budget, str):
        budget = parse_size(budget)
    if budget is not None and (isinstance(budget, (bool, np.bool_)) or not isinstance(budget, (int, np.integer))
                               or budget < 0):
        raise ResourceError(None, f"memory budget {budget!r}: expected a non-negative number of bytes, "
                            "a size string such as '2GiB', or None")
    _budget[0] = None if budget is None else int(budget)


def memory_budget() -> int:
    """The bytes one call may allocate now (see the module docstring for where it comes from)."""
    if _budget[0] is not None:
        return _budget[0]
    env = environment.env(_ENV)
    if env:
        return parse_size(env)
    return int(available_memory() * DEFAULT_FRACTION)


def _over_budget(op: str, what: str, needed: int) -> ResourceError:
    budget = memory_budget()
    return ResourceError(op, f"{what} needs about {format_size(needed)} ({needed} bytes), over the memory "
                         f"budget of {format_size(budget)} ({budget} bytes). Raise it with "
                         f"convgrad.set_memory_budget('...GiB') or the {_ENV} environment variable "
                         "(default: half of the available memory), or split the problem (e.g. the batch)")


def check_bytes(op: str, what: str, needed: int) -> None:
    """Raise :class:`ResourceError` if ``what`` of ``op`` needs more than the memory budget."""
    if needed > memory_budget():
        raise _over_budget(op, what, needed)


def _describe(name: str, shape: tuple[int, ...]) -> str:
    """``'src' [1, 1000000, 1000000, 1] (1e+12 values)``."""
    count = math.prod(shape)
    return f"'{name}' {list(shape)} ({count if count < 10**6 else f'{count:.3g}'} value{'s' if count != 1 else ''})"


def check_sizes(problem: Problem) -> None:
    """Reject a resolved problem whose sizes overflow int64 (at shape inference). O(rank) work."""
    g = problem.geometry
    tensors = {f"'{name}'": shape for name, shape in problem.tensor_shapes().items()}
    x_name = next(spec.name for spec in (*problem.definition.inputs, problem.definition.output) if spec.role == "x")
    tensors[f"zero-padded '{x_name}'"] = (g.n, *g.padded_size, g.ic)
    itemsize = max(problem.dtype.itemsize, 8)
    for name, shape in tensors.items():  # NumPy refuses such shapes even with a 0 among them
        if math.prod(max(d, 1) for d in shape) * itemsize > _INT64_MAX:
            raise ShapeError(problem.op, None, f"the {name} tensor of this problem would have shape "
                             f"{list(shape)}: sizes beyond int64 cannot be allocated or indexed")


def _fallback_workspace(problem: Problem) -> int:
    """For engines that do not say: f64 copies of the inputs, the padded input and the result, twice."""
    g = problem.geometry
    padded = g.n * g.ic * math.prod(g.padded_size)
    return 2 * 8 * (padded + math.prod(g.x_shape) + math.prod(g.y_shape) + math.prod(g.w_shape))


def estimate_bytes(problem: Problem, engine: Engine) -> int:
    """Peak extra bytes of one call: the engine's working set (``engine.workspace_bytes`` where it
    has one, else a conservative estimate) plus the result's copies (:func:`_result_bytes`)."""
    return _engine_bytes(problem, engine) + _result_bytes(problem, engine)


def _engine_bytes(problem: Problem, engine: Engine) -> int:
    workspace = getattr(engine, "workspace_bytes", None)
    return int(workspace(problem.geometry, problem.task, problem.dtype) if callable(workspace)
               else _fallback_workspace(problem))


def _result_bytes(problem: Problem, engine: Engine | None = None) -> int:
    """The result's copies: the engine's own (in ``engine.result_dtype(dtype)``, float64 for an
    engine that does not say), then the API layer's new arrays while it lives: plus bias (same
    dtype), rounded to the output dtype (where that differs), and in the user's layout (a copy
    whenever the engine's memory order is not the layout's)."""
    result_dtype = getattr(engine, "result_dtype", None)
    acc = np.dtype(result_dtype(problem.dtype) if callable(result_dtype) else np.float64)
    out = np.dtype(problem.dtype)
    per_value = acc.itemsize * (1 + problem.has_bias) + (out.itemsize if acc != out else 0) + out.itemsize
    return math.prod(problem.output_shape) * per_value


def check_memory(problem: Problem, engine: Engine, estimates: Memo | None = None) -> None:
    """Raise :class:`ResourceError` if running ``problem`` on ``engine`` would exceed the budget.

    The result's own copies are checked first, then the engine's estimate; both are closed forms
    of the sizes (O(rank) work whatever the sizes), and the error names the tensors and sizes.
    ``estimates``: a memo of both for this problem (a warm call's), by engine and the engine's
    state (``engine.state()``, where it has one: what its estimate depends on besides the sizes);
    the budget is read at every call."""
    budget = memory_budget()
    key = (engine, engine.state() if callable(getattr(engine, "state", None)) else None)
    known = estimates.get(key) if estimates is not None else None
    result, workspace = known if known is not None else (_result_bytes(problem, engine), None)
    if result > budget:
        name = problem.definition.output.name
        raise _over_budget(problem.op, f"the result {_describe(name, problem.output_shape)} alone", result)
    if workspace is None:
        workspace = _engine_bytes(problem, engine)
        if estimates is not None:
            estimates.put(key, (result, workspace))
    needed = workspace + result
    if needed > budget:
        tensors = ", ".join(_describe(*item) for item in problem.tensor_shapes().items())
        raise _over_budget(problem.op, f"running this problem on the {getattr(engine, 'name', '?')} engine "
                           f"(tensors {tensors})", needed)
