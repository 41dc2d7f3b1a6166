"""The optional extras' entry check: ``import convgrad.torch`` without PyTorch names the extra to
install instead of ending in a bare ``ModuleNotFoundError``."""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra(exc: ModuleNotFoundError, extra: str, library: str) -> ModuleNotFoundError:
    """What ``convgrad.<extra>`` raises when importing ``library`` failed with ``exc``: a
    ModuleNotFoundError saying ``pip install 'convgrad[<extra>]'``; ``exc`` itself if the missing
    module is not the library's (one missing inside the library passes through unchanged)."""
    if exc.name is None or exc.name.split(".")[0] != extra:
        return exc
    return ModuleNotFoundError(f"convgrad.{extra} needs {library}, which is not installed: "
                               f"pip install 'convgrad[{extra}]'", name=exc.name)
