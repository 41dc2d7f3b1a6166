"""Results in the inputs' own array library: a torch tensor or a JAX array in, the same kind out.

As SciPy and scikit-learn do with the array API: the result goes back to the library of the op's
first data input through DLPack (zero-copy on the CPU) where that library speaks it (a
``from_dlpack`` in its array namespace or top-level module); NumPy arrays, anything else
``numpy.asarray`` takes, and libraries without ``from_dlpack`` get NumPy arrays.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .dtypes import bfloat16

__all__ = ["in_library_of"]


def _from_dlpack(value: Any) -> Callable[[np.ndarray], Any] | None:
    """The ``from_dlpack`` of ``value``'s library, or None (NumPy, plain data, no DLPack)."""
    if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack__"):
        return None
    if hasattr(value, "__array_namespace__"):
        namespace = value.__array_namespace__()
    else:
        namespace = importlib.import_module(type(value).__module__.split(".")[0])
    return getattr(namespace, "from_dlpack", None)


def in_library_of(value: Any, result: np.ndarray) -> Any:
    """``result`` as an array of ``value``'s library (see the module docstring); bf16, which
    DLPack exchanges as raw 16-bit words, goes as its bit pattern to torch and as NumPy elsewhere."""
    convert = _from_dlpack(value)
    if convert is None:
        return result
    if result.dtype == bfloat16:
        if type(value).__module__.split(".")[0] != "torch":
            return result
        import torch

        return convert(result.view(np.int16)).view(torch.bfloat16)
    return convert(result)
