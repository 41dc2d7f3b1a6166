"""The plan cache: plans measured on this CPU (``convgrad tune``), looked up by :func:`.plan.select`.

Owned by the plans branch (issue 22), which replaces this module at the merge; until then no plan
is cached and :func:`.plan.select` uses the tuning table's defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .features import Features
    from .plan import Plan

__all__ = ["lookup"]


def lookup(f: Features) -> Plan | None:
    """The cached plan of the problem ``f``, or None."""
    return None
