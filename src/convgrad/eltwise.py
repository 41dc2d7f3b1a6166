"""The element-wise ops' math: forward ``dst = f(src)`` and backward ``diff_src = diff_dst * f'(.)``.

Every function takes arrays in the compute dtype (f64 for the reference engine, f32 for the fast
path with f32/bf16/f16 data) and returns the result in that dtype; the caller rounds it once to the
output dtype. Formulas follow oneDNN's eltwise primitive (``src/common/math_utils.hpp``), which the
Graph ops lower to: e.g. HardSwish is hardswish(alpha=1/6, beta=1/2), SoftPlus soft_relu(alpha=beta),
Clamp clip_v2, Reciprocal pow(alpha=1, beta=-1). Backward functions with ``use_dst`` read the forward
op's dst in place of its src where oneDNN allows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

__all__ = ["FORWARD", "BACKWARD", "erf"]

Attrs = dict[str, Any]


@numba.vectorize(cache=True)  # compiled per dtype on first use (GELU), not at import
def erf(x: float) -> float:  # pragma: no cover - compiled
    """The error function, element-wise (NumPy has none)."""
    return math.erf(x)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def _sigmoid(s: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-s))


def _softplus(s: np.ndarray, beta: float = 1.0) -> np.ndarray:
    """ln(1 + exp(beta * s)) / beta without overflow: logaddexp(0, beta * s) / beta."""
    return np.logaddexp(0, beta * s) / beta


def _gelu(s: np.ndarray, a: Attrs) -> np.ndarray:
    if a["mode"] == "gelu_tanh":
        return 0.5 * s * (1 + np.tanh(_SQRT_2_OVER_PI * (s + _GELU_CUBIC * s ** 3)))
    return 0.5 * s * (1 + erf(s * (1 / math.sqrt(2.0))))


def _gelu_backward(s: np.ndarray, dd: np.ndarray, a: Attrs) -> np.ndarray:
    if a["mode"] == "gelu_tanh":
        t = np.tanh(_SQRT_2_OVER_PI * (s + _GELU_CUBIC * s ** 3))
        dg = _SQRT_2_OVER_PI * (1 + 3 * _GELU_CUBIC * s * s)
        return dd * 0.5 * ((1 + t) + s * (1 - t * t) * dg)
    v = s * (1 / math.sqrt(2.0))
    return dd * 0.5 * (1 + erf(v) + v * (2 / math.sqrt(math.pi)) * np.exp(-v * v))


def _mish_backward(s: np.ndarray, dd: np.ndarray, a: Attrs) -> np.ndarray:
    t = np.tanh(_softplus(s))
    return dd * (t + s * _sigmoid(s) * (1 - t * t))


def _clamp(s: np.ndarray, a: Attrs) -> np.ndarray:
    return np.minimum(np.maximum(s, a["min"]), a["max"])


def _zero_unless(condition: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``value`` where ``condition``, else 0 (NaN in ``value`` kept where selected)."""
    return np.where(condition, value, 0)


#: algorithm -> dst = f(src, attrs)
FORWARD: dict[str, Callable[[np.ndarray, Attrs], np.ndarray]] = {
    "relu": lambda s, a: np.maximum(s, 0),  # NaN stays NaN
    "leaky_relu": lambda s, a: np.where(s >= 0, s, a["alpha"] * s),
    "sigmoid": lambda s, a: _sigmoid(s),
    "tanh": lambda s, a: np.tanh(s),
    "elu": lambda s, a: np.where(s > 0, s, a["alpha"] * np.expm1(s)),
    "gelu": _gelu,
    "hard_sigmoid": lambda s, a: np.clip(a["alpha"] * s + a["beta"], 0, 1),
    "hard_swish": lambda s, a: s * np.clip(s + 3, 0, 6) / 6,
    "mish": lambda s, a: s * np.tanh(_softplus(s)),
    "soft_plus": lambda s, a: _softplus(s, a["beta"]),
    "clamp": _clamp,
    "abs": lambda s, a: np.abs(s),
    "square": lambda s, a: s * s,
    "sqrt": lambda s, a: np.sqrt(s),
    "exp": lambda s, a: np.exp(s),
    "log": lambda s, a: np.log(s),
    "pow": lambda s, a: np.power(s, a["beta"]),
    "round": lambda s, a: np.rint(s),  # ties to even, as oneDNN's nearbyintf
    "reciprocal": lambda s, a: 1 / s,
}

#: algorithm -> diff_src = f(src or dst, diff_dst, attrs); attrs["use_dst"] says which input 0 is.
BACKWARD: dict[str, Callable[[np.ndarray, np.ndarray, Attrs], np.ndarray]] = {
    "relu": lambda v, dd, a: _zero_unless(v > 0, dd),
    "sigmoid": lambda v, dd, a: dd * _from(v, a, _sigmoid) * (1 - _from(v, a, _sigmoid)),
    "tanh": lambda v, dd, a: dd * (1 - _from(v, a, np.tanh)) * (1 + _from(v, a, np.tanh)),
    "elu": lambda v, dd, a: dd * (np.where(v > 0, 1, v + a["alpha"]) if a["use_dst"]
                                  else np.where(v > 0, 1, a["alpha"] * np.exp(v))),
    "gelu": _gelu_backward,
    "hard_sigmoid": lambda s, dd, a: _zero_unless((a["alpha"] * s + a["beta"] > 0) & (a["alpha"] * s + a["beta"] < 1),
                                                  dd * a["alpha"]),
    "hard_swish": lambda s, dd, a: np.where(s <= -3, 0, np.where(s >= 3, dd, dd * (s / 3 + 0.5))),
    "mish": _mish_backward,
    "soft_plus": lambda s, dd, a: dd * _sigmoid(a["beta"] * s),
    "clamp": lambda v, dd, a: _zero_unless((v > a["min"]) & (v < a["max"]), dd),
    "abs": lambda s, dd, a: np.where(s > 0, dd, np.where(s < 0, -dd, 0)),
    "sqrt": lambda v, dd, a: dd / (2 * _from(v, a, np.sqrt)),
}


def _from(v: np.ndarray, a: Attrs, forward: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The forward op's dst: input 0 itself with use_dst, else ``forward(src)``."""
    return v if a.get("use_dst") else forward(v)
