"""Environment variables read on every call, at dictionary speed.

``os.environ.get`` encodes the name and decodes the value at each read (about 0.7 µs); a warm
call reads several variables (``CONVGRAD_ENGINE``, ``CONVGRAD_STRATEGY``, ``CONVGRAD_PLANS``,
...), so :func:`env` reads ``os.environ``'s own mapping directly (about 0.03 µs). It sees every
change made through ``os.environ``, as ``os.environ.get`` does.
"""

from __future__ import annotations

import os

__all__ = ["env", "raw_values"]

_DATA = getattr(os.environ, "_data", None)
_KEYS: dict[str, object] = {}


def env(name: str) -> str | None:
    """``os.environ.get(name)``."""
    if _DATA is None:
        return os.environ.get(name)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = os.environ.encodekey(name)  # type: ignore[attr-defined]
    value = _DATA.get(key)
    return None if value is None else os.environ.decodevalue(value)  # type: ignore[attr-defined]


def raw_values(names: tuple[str, ...]) -> tuple[object, ...]:
    """The values of ``names`` as ``os.environ`` holds them (encoded), in one call: equal exactly
    where :func:`env`'s are, for memos keyed by the environment."""
    if _DATA is None:
        return tuple([os.environ.get(name) for name in names])
    keys = _KEY_TUPLES.get(names)
    if keys is None:
        keys = _KEY_TUPLES[names] = tuple(os.environ.encodekey(name) for name in names)  # type: ignore[attr-defined]
    return tuple(map(_DATA.get, keys))


_KEY_TUPLES: dict[tuple[str, ...], tuple[bytes, ...]] = {}
