"""The plan cache: plans measured on this machine by ``convgrad tune`` (FFTW's *wisdom*).

One JSON file, ``plans.json`` in the user's cache directory (``platformdirs``: honours
``XDG_CACHE_HOME``), or the file ``CONVGRAD_PLANS`` names; ``CONVGRAD_PLANS=off`` ignores it::

    {"format": "convgrad-plans", "version": 1,
     "machines": {MACHINE: {"cpu": ..., "cpu_name": ..., "features": [...], "family": ...,
                            "threads": N, "convgrad": VERSION,
                            "plans": {PROBLEM: {"plan": {...}, "ms": T, "default_ms": T0, "tuned": DATE}}}}}

``MACHINE`` names the CPU model, LLVM's name for it, its vector features, the kernel family in
use, the thread count and convgrad's version: a plan is only looked up under the key of the
machine asking (a cache copied from another CPU, or written by another version, is never used).
``PROBLEM`` is :meth:`Features.key`. A file that cannot be read as such (corrupt, foreign,
truncated) or an entry that is not a plan is ignored with one warning per process, never an
error. Writers take a lock file and replace the file atomically (a temporary file renamed over
it), so two processes tuning at once lose nothing and a reader never sees half a file.

A warm call checks the file's stamp (a system call) at most every ``POLL_SECONDS``: a cache
that another process rewrites is used within that time; this process's own writes at once.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...environment import env, raw_values
from . import isa

if TYPE_CHECKING:  # plan.py asks this module (lookup), so it imports Plan only where it reads one
    from .features import Features
    from .plan import Plan

__all__ = ["PlanCacheWarning", "Entry", "warn", "cache_file", "enabled", "autotune_enabled", "state", "lookup",
           "store", "entries", "clear", "machine_key"]

FORMAT, VERSION = "convgrad-plans", 1


class PlanCacheWarning(UserWarning):
    """The plan cache file (or an entry of it) could not be used; the tuning table's rule runs."""


@dataclass(frozen=True)
class Entry:
    """One cached plan: for which machine and problem, and what it measured."""

    machine: str
    problem: str
    plan: Plan | None          # None: the entry is not a valid plan
    ms: float | None
    default_ms: float | None
    tuned: str
    current: bool              # written for this machine (the only ones lookup uses)


def enabled() -> bool:
    """Whether plans are looked up at all (``CONVGRAD_PLANS`` is not ``off``)."""
    return _on(env("CONVGRAD_PLANS"))


def _on(plans: str | None) -> bool:
    return (plans or "").strip().lower() not in ("off", "0", "false", "no")


def autotune_enabled() -> bool:
    """``CONVGRAD_AUTOTUNE=1``: tune each problem without a cached plan at its first call."""
    return (env("CONVGRAD_AUTOTUNE") or "").strip().lower() in ("1", "on", "true", "yes")


def state() -> tuple[Any, ...] | None:
    """What :func:`lookup` answers from besides the problem, now: ``None`` with plans off, else
    the file's (path, mtime, size), this process's write count and ``CONVGRAD_AUTOTUNE`` (a memo
    of lookups is valid while this is unchanged)."""
    raw = raw_values(_STATE_VARIABLES)
    name = _names.get(raw)
    if name is None:
        values = [env(v) for v in _STATE_VARIABLES]
        name = _names[raw] = (str(_cache_file(*values[:3])) if _on(values[0]) else "",
                              (values[3] or "").strip().lower() in ("1", "on", "true", "yes"))
    if not name[0]:
        return None
    return _polled(name[0]), _writes[0], name[1]


#: Seconds a warm call's view of the cache file's stamp lasts (:func:`state`).
POLL_SECONDS = 0.5
_polls: dict[str, tuple[float, int, tuple[str, int | None, int | None]]] = {}  # name: (expiry, writes, stamp)


def _polled(name: str) -> tuple[str, int | None, int | None]:
    """:func:`_stamp`, taken anew after ``POLL_SECONDS`` or a write of this process (the system
    call and what it displaces cost a tiny call about 5 µs)."""
    now = time.monotonic()
    seen = _polls.get(name)
    if seen is None or now >= seen[0] or seen[1] != _writes[0]:
        seen = _polls[name] = (now + POLL_SECONDS, _writes[0], _stamp(name))
    return seen[2]


#: The variables state() reads, and its file name ("" with plans off) and autotune flag per their values.
_STATE_VARIABLES = ("CONVGRAD_PLANS", "XDG_CACHE_HOME", "HOME", "CONVGRAD_AUTOTUNE")
_names: dict[tuple[object, ...], tuple[str, bool]] = {}


def cache_file() -> Path:
    """The cache file: ``CONVGRAD_PLANS`` when it names a file, else ``plans.json`` in the
    user's cache directory for convgrad (``XDG_CACHE_HOME``, else under ``HOME``)."""
    return _cache_file(*(env(k) for k in ("CONVGRAD_PLANS", "XDG_CACHE_HOME", "HOME")))


@functools.lru_cache(maxsize=8)
def _cache_file(plans: str | None, xdg: str | None, home: str | None) -> Path:
    """:func:`cache_file` for these environment values (platformdirs costs tens of microseconds:
    select asks at every call)."""
    named = (plans or "").strip()
    if named and enabled() and named.lower() not in ("on", "1", "true", "yes"):
        return Path(named).expanduser()
    import platformdirs
    return Path(platformdirs.user_cache_dir("convgrad", appauthor=False)) / "plans.json"


@functools.cache
def _cpu() -> tuple[str, str, tuple[str, ...]]:
    """(CPU model, LLVM's CPU name, the host's vector features relevant to the kernels)."""
    from llvmlite import binding
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    if not model:
        import platform
        model = platform.processor() or platform.machine()
    vector = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512bf16", "avx512fp16",
              "amx-tile", "amx-bf16")
    return model, binding.get_host_cpu_name(), tuple(sorted(f for f in isa.host_features() if f in vector))


def _threads() -> int:
    import numba
    return numba.get_num_threads()


def machine() -> dict[str, Any]:
    """What the machine key is made of, for this process now."""
    from ... import __version__
    model, name, features = _cpu()
    return {"cpu": model, "cpu_name": name, "features": list(features), "family": isa.family(),
            "threads": _threads(), "convgrad": __version__}


def machine_key(info: dict[str, Any] | None = None) -> str:
    """The key plans of this machine (or of ``info``) are stored under."""
    if info is None:
        return _machine_key(isa.family(), _threads())
    m = info
    return (f"{m['cpu']} | {m['cpu_name']} | {'+'.join(m['features'])} | family={m['family']} | "
            f"threads={m['threads']} | convgrad {m['convgrad']}")


@functools.lru_cache(maxsize=16)
def _machine_key(family: str, threads: int) -> str:
    """This machine's key with that kernel family and thread count (the rest cannot change)."""
    return machine_key({**machine(), "family": family, "threads": threads})


# -- reading ------------------------------------------------------------------------------------
_warned: set[str] = set()
_loaded: dict[str, Any] = {}   # "stamp": (path, mtime_ns, size), "data": the file's dict, "plans": {}
_writes = [0]                  # store / clear calls in this process (a file rewritten within its mtime's tick)


def warn(message: str) -> None:
    """One warning per distinct message per process."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, PlanCacheWarning, stacklevel=4)


def _valid(data: Any) -> bool:
    return (isinstance(data, dict) and data.get("format") == FORMAT and data.get("version") == VERSION
            and isinstance(data.get("machines"), dict)
            and all(isinstance(m, dict) and isinstance(m.get("plans", {}), dict) for m in data["machines"].values()))


def _read(path: Path) -> dict[str, Any]:
    """The file's contents, or an empty cache (with one warning) where it is not a plan cache."""
    try:
        with path.open("rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return _empty()
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        warn(f"plan cache {path}: cannot be read ({type(exc).__name__}: {str(exc)[:200]}); ignored: the tuning "
              "table's plans run (`convgrad tune` rewrites it)")
        return _empty()
    if not _valid(data):
        warn(f"plan cache {path}: not a convgrad plan cache of format {FORMAT!r} version {VERSION}; ignored: the "
              "tuning table's plans run (`convgrad tune` rewrites it)")
        return _empty()
    return data


def _empty() -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "machines": {}}


def _stamp(name: str) -> tuple[str, int | None, int | None]:
    """The file's (name, mtime in ns, size), (name, None, None) where there is none."""
    if os.access(name, os.F_OK):  # no exception to pay for where there is no file (most calls)
        with contextlib.suppress(OSError):
            st = os.stat(name)
            return name, st.st_mtime_ns, st.st_size
    return name, None, None


def _current() -> dict[str, Any]:
    """The cache as on disk now (re-read only when the file changed)."""
    path = cache_file()
    stamp = _stamp(str(path))
    if _loaded.get("stamp") != stamp:
        _loaded.update(stamp=stamp, data=_read(path), plans={})
    return _loaded


def lookup(f: Features, tune: bool = False) -> Plan | None:
    """The plan cached for problem ``f`` on this machine, or ``None`` (none cached, plans off, or
    the entry is not a valid plan: then one warning). With ``tune`` and ``CONVGRAD_AUTOTUNE=1``
    a problem without a cached plan is tuned first (:func:`.tune.autotuned`)."""
    if not enabled():
        return None
    state = _current()
    key = (machine_key(), f)
    plans = state["plans"]
    if key not in plans:
        entry = state["data"]["machines"].get(key[0], {}).get("plans", {}).get(f.key())
        plans[key] = _plan(entry, state["stamp"][0]) if entry is not None else None
    if plans[key] is None and tune:
        from .tune import autotuned
        return autotuned(f)
    return plans[key]


def _plan(entry: Any, path: str) -> Plan | None:
    from .plan import Plan
    try:
        if not isinstance(entry, dict):
            raise ValueError(f"expected an object, got {type(entry).__name__}")
        return Plan.from_json(entry["plan"])
    except (KeyError, TypeError, ValueError) as exc:
        warn(f"plan cache {path}: an entry is not a plan ({type(exc).__name__}: {str(exc)[:200]}); ignored")
        return None


# -- writing ------------------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` + ``.lock`` (POSIX ``flock``; elsewhere no lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically by ``data`` (a temporary file in the same folder, renamed)."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store(f: Features, plan: Plan, ms: float | None = None, default_ms: float | None = None) -> Path:
    """Record ``plan`` as the one to use for ``f`` on this machine (with its measured median
    ``ms`` and the default plan's ``default_ms``); returns the cache file."""
    path = cache_file()
    info = machine()
    key = machine_key(info)
    with _locked(path):
        data = _read(path)
        slot = data["machines"].setdefault(key, {**info, "plans": {}})
        slot.setdefault("plans", {})[f.key()] = {
            "plan": plan.to_json(), "ms": ms, "default_ms": default_ms,
            "tuned": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        _write(path, data)
    _loaded.clear()
    _writes[0] += 1
    return path


def entries() -> list[Entry]:
    """Every cached plan, this machine's first."""
    state = _current()
    here = machine_key()
    out = []
    for key, slot in state["data"]["machines"].items():
        for problem, entry in slot.get("plans", {}).items():
            fields = entry if isinstance(entry, dict) else {}
            out.append(Entry(key, problem, _plan(entry, state["stamp"][0]), fields.get("ms"), fields.get("default_ms"),
                             str(fields.get("tuned", "")), key == here))
    return sorted(out, key=lambda e: (not e.current, e.machine, e.problem))


def clear(all_machines: bool = False) -> int:
    """Remove this machine's plans (or every machine's); returns how many were removed."""
    path = cache_file()
    with _locked(path):
        data = _read(path)
        keys = list(data["machines"]) if all_machines else [machine_key()]
        removed = sum(len(data["machines"].pop(k, {}).get("plans", {})) for k in keys)
        _write(path, data)
    _loaded.clear()
    _writes[0] += 1
    return removed
