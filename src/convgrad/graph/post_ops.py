"""benchdnn's ``--attr-post-ops`` for the conv driver: parsed into :class:`PostOp` entries, which
:mod:`.conv` turns into graph ops after the forward convolution, as oneDNN applies them.

Syntax (``+`` between entries; benchdnn's own names, with their ``eltwise_``/``binary_`` aliases):

- ``sum[:SCALE[:ZERO_POINT[:DT]]]``: dst = result + SCALE * (previous dst - ZERO_POINT) (Add, and
  Multiply by the scale when it is not 1);
- ``ELTWISE[:ALPHA[:BETA[:SCALE]]]``: the graph's element-wise ops (relu -> ReLU or LeakyReLU with
  a non-zero alpha, logistic -> Sigmoid, clip/clip_v2 -> Clamp, soft_relu (alpha non-zero) ->
  SoftPlus, gelu_erf and gelu_tanh -> GELU, pow with alpha 1 -> Pow, hardswish with alpha 1/6 and
  beta 1/2 -> HardSwish, abs, elu, exp, hardsigmoid, log, mish, round, sqrt, square, tanh; ALPHA
  and BETA default to 0 as in benchdnn; the ``_dst`` forms compute the same forward values);
- ``BINARY:DT[:MASK[:TAG]]``: add, sub, mul, div, max, min with a second operand of data type DT
  whose shape follows MASK (``common`` one value, ``per_oc`` one per channel, ``per_tensor`` the
  whole dst, or an integer bit mask over n, c, spatial dims), laid out as TAG;
- ``prelu[:MASK]``: max(x, 0) + w * min(x, 0) with f32 weights w shaped by MASK (ReLU, Subtract,
  Multiply, Add: each value rounded once);
- ``dw:KkSsPp[:DT]`` (also ``dw_k3s1p1``): a depthwise convolution (kernel K, stride S, left pad P)
  on the result, with bias in the FWD_B direction; the entries after it apply to its output.

Refused with a named error: linear, swish (no graph op computes them), the comparison and select
binary algorithms. Entries that quantize (an integer DT, a zero point, an eltwise output scale)
report :attr:`PostOp.quantization`, which the driver skips.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .tags import parse_tag

__all__ = ["PostOp", "parse_post_ops", "mask_dims"]

_FLOAT = ("f32", "bf16", "f16")
_INTEGER = ("s8", "u8", "s32", "s4", "u4")

#: benchdnn eltwise name -> graph op kind (alpha and beta become its attributes in _eltwise).
_ELTWISE: dict[str, str] = {
    "relu": "ReLU", "logistic": "Sigmoid", "tanh": "Tanh", "elu": "Elu", "exp": "Exp", "gelu_erf": "GELU",
    "gelu_tanh": "GELU", "hardsigmoid": "HardSigmoid", "hardswish": "HardSwish", "log": "Log", "mish": "Mish",
    "round": "Round", "sqrt": "Sqrt", "square": "Square", "abs": "Abs", "clip": "Clamp", "clip_v2": "Clamp",
    "soft_relu": "SoftPlus", "srelu": "SoftPlus", "pow": "Pow",
}
_USE_DST = {"relu_dst": "relu", "logistic_dst": "logistic", "tanh_dst": "tanh", "elu_dst": "elu",
            "exp_dst": "exp", "sqrt_dst": "sqrt", "clip_v2_dst": "clip_v2"}
_BINARY = {"add": "Add", "sub": "Subtract", "mul": "Multiply", "div": "Divide", "max": "Maximum", "min": "Minimum"}
_UNSUPPORTED = {"linear": "no graph element-wise op computes alpha * x + beta",
                "swish": "no graph element-wise op computes x * sigmoid(alpha * x)",
                **{k: "a comparison (its result is a 0/1 mask, not a float op of the graph)"
                   for k in ("eq", "ge", "gt", "le", "lt", "ne")},
                "select": "a three-operand select (the graph's binary ops take two)"}
_DW = re.compile(r"k([0-9]+)s([0-9]+)p([0-9]+)")


@dataclass(frozen=True)
class PostOp:
    """One post-op: ``family`` sum, eltwise, binary, prelu or dw, with the graph op it becomes."""

    family: str
    text: str
    op_kind: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    scale: float = 1.0
    dt: str = ""  # sum: previous dst; binary: operand; dw: its dst ("": the conv's dst type)
    mask: frozenset[int] = frozenset()  # benchdnn dims (0 n, 1 c, 2.. spatial) the operand spans
    full: bool = False  # per_tensor: every dim
    tag: str = "any"
    kernel: int = 0
    stride: int = 0
    padding: int = 0
    quantization: str = ""  # why the entry is integer quantization ("" if it is not)


def _number(entry: str, what: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--attr-post-ops: {entry!r}: {what} {text!r} is not a number") from None


def _mask(entry: str, text: str) -> tuple[frozenset[int], bool]:
    policies = {"common": frozenset(), "per_oc": frozenset({1}), "per_dim_0": frozenset({0}),
                "per_dim_1": frozenset({1}), "per_dim_01": frozenset({0, 1})}
    if text in policies:
        return policies[text], False
    if text == "per_tensor":
        return frozenset(), True
    if text.isascii() and text.isdigit() and int(text) < 2**5:
        return frozenset(b for b in range(5) if int(text) >> b & 1), False
    raise ValueError(f"--attr-post-ops: {entry!r}: mask {text!r}: expected common, per_oc, per_tensor, "
                     "per_dim_0, per_dim_1, per_dim_01 or an integer bit mask below 32")


def _dt(entry: str, text: str) -> str:
    if text not in _FLOAT + _INTEGER:
        raise ValueError(f"--attr-post-ops: {entry!r}: data type {text!r}: expected one of "
                         f"{', '.join(_FLOAT + _INTEGER)}")
    return text


def _quantized(dt: str) -> str:
    return f"integer data type {dt}" if dt in _INTEGER else ""


def _eltwise(entry: str, name: str, args: list[str]) -> PostOp:
    base = _USE_DST.get(name, name)
    if len(args) > 3:
        raise ValueError(f"--attr-post-ops: {entry!r}: expected at most ALPHA:BETA:SCALE after {name}")
    alpha, beta, scale = ([_number(entry, w, a) for w, a in zip(("alpha", "beta", "scale"), args)] + [None] * 3)[:3]
    alpha, beta = alpha or 0.0, beta or 0.0  # benchdnn's defaults
    attrs: dict[str, Any] = {}
    kind = _ELTWISE[base]
    refuse = ""
    if base == "relu" and alpha:
        kind, attrs = "LeakyReLU", {"alpha": alpha}
    elif base == "elu":
        attrs = {"alpha": alpha}
    elif base.startswith("gelu"):
        attrs = {"mode": base}
    elif base == "hardsigmoid":
        attrs = {"alpha": alpha, "beta": beta}
    elif base in ("clip", "clip_v2"):
        attrs = {"min": alpha, "max": beta}
    elif base in ("soft_relu", "srelu"):
        attrs = {"beta": alpha}
        refuse = "" if alpha else "soft_relu needs a non-zero alpha (ln(1 + exp(alpha * x)) / alpha)"
    elif base == "pow":
        attrs = {"beta": beta}
        refuse = "" if alpha == 1 else "the graph's Pow computes x^beta only: give pow:1:BETA"
    elif base == "hardswish" and not (abs(alpha - 1 / 6) < 1e-6 and beta == 0.5):
        refuse = "the graph's HardSwish is x * min(max(x / 6 + 1 / 2, 0), 1) only: give hardswish:0.166667:0.5"
    if refuse:
        raise ValueError(f"--attr-post-ops: {entry!r}: {refuse}")
    quantization = f"eltwise output scale {scale:g}" if scale not in (None, 1.0) else ""
    return PostOp("eltwise", entry, kind, attrs, quantization=quantization)


def _binary(entry: str, name: str, args: list[str]) -> PostOp:
    if not args or len(args) > 3:
        raise ValueError(f"--attr-post-ops: {entry!r}: expected {name}:DT[:MASK[:TAG]]")
    dt = _dt(entry, args[0])
    mask, full = _mask(entry, args[1]) if len(args) > 1 else (frozenset(), False)
    tag = parse_tag(args[2]) if len(args) > 2 else "any"
    return PostOp("binary", entry, _BINARY[name], dt=dt, mask=mask, full=full, tag=tag, quantization=_quantized(dt))


def _entry(entry: str) -> PostOp:
    name, *args = entry.split(":")
    name = name.lower()
    if name.startswith("dw_") or name == "dw":
        spec = name[3:] if name.startswith("dw_") else (args.pop(0) if args else "")
        match = _DW.fullmatch(spec.lower())
        if not match or len(args) > 1:
            raise ValueError(f"--attr-post-ops: {entry!r}: expected dw:kKsSpP[:DT], e.g. dw:k3s1p1")
        k, s, p = (int(v) for v in match.groups())
        if k < 1 or s < 1 or p >= k:
            raise ValueError(f"--attr-post-ops: {entry!r}: expected a kernel >= 1, a stride >= 1 and a pad "
                             "below the kernel")
        dt = _dt(entry, args[0]) if args else ""
        return PostOp("dw", entry, "Convolution", dt=dt, kernel=k, stride=s, padding=p, quantization=_quantized(dt))
    if name == "sum":
        if len(args) > 3:
            raise ValueError(f"--attr-post-ops: {entry!r}: expected sum[:SCALE[:ZERO_POINT[:DT]]]")
        scale = _number(entry, "scale", args[0]) if args else 1.0
        zero_point = int(_number(entry, "zero point", args[1])) if len(args) > 1 else 0
        dt = _dt(entry, args[2]) if len(args) > 2 else ""
        quantization = f"zero point {zero_point}" if zero_point else _quantized(dt)
        return PostOp("sum", entry, "Add", scale=scale, dt=dt, quantization=quantization)
    if name == "prelu":
        if len(args) > 1:
            raise ValueError(f"--attr-post-ops: {entry!r}: expected prelu[:MASK]")
        mask, full = _mask(entry, args[0]) if args else (frozenset(), False)
        return PostOp("prelu", entry, "PReLU", dt="f32", mask=mask, full=full)
    for prefix, table in (("eltwise_", _ELTWISE.keys() | _USE_DST.keys()), ("binary_", _BINARY.keys())):
        if name.startswith(prefix) and name[len(prefix):] in table:
            name = name[len(prefix):]
    if name in _UNSUPPORTED:
        raise ValueError(f"--attr-post-ops: {entry!r}: convgrad cannot apply {name}: {_UNSUPPORTED[name]}")
    if name in _ELTWISE or name in _USE_DST:
        return _eltwise(entry, name, args)
    if name in _BINARY:
        return _binary(entry, name, args)
    raise ValueError(f"--attr-post-ops: {entry!r}: unknown post-op {name!r} (expected sum, dw, prelu, an "
                     f"eltwise ({', '.join(sorted(_ELTWISE.keys() | _USE_DST.keys()))}) or a binary "
                     f"({', '.join(_BINARY)}))")


def parse_post_ops(text: str) -> tuple[PostOp, ...]:
    """One ``--attr-post-ops`` value (``""``: none); ValueError naming the entry."""
    entries = tuple(_entry(e) for e in text.split("+")) if text.strip() else ()
    if sum(e.family == "dw" for e in entries) > 1:
        raise ValueError(f"--attr-post-ops: {text!r}: at most one dw entry")
    return entries


def mask_dims(post_op: PostOp, rank: int) -> frozenset[int]:
    """The benchdnn dims (0 n, 1 c, 2.. spatial) the operand of ``post_op`` spans for a dst of ``rank``."""
    if post_op.full:
        return frozenset(range(rank))
    if any(d >= rank for d in post_op.mask):
        raise ValueError(f"--attr-post-ops: {post_op.text!r}: the mask names dim {max(post_op.mask)} of a "
                         f"{rank}D dst")
    return post_op.mask
