"""The environment for child Python processes of the tests."""

from __future__ import annotations


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child Python that must import the same convgrad as the
    tests do (the checkout, an installed copy or a mutated one): its folder first on PYTHONPATH."""
    import os
    from pathlib import Path

    import convgrad
    here = str(Path(convgrad.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}
