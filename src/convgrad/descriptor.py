"""benchdnn convolution problem descriptors (driver_conv), e.g. ``mb50ic64ih56oc256oh56kh1ph0``.

Grammar: ``gG mbN icC idD ihH iwW ocK odD ohH owW kdK khK kwK sdS shS swS pdP phP pwP ddD dhD dwD
nNAME``; fields in any order, ``_`` separators allowed, the name last (everything after ``n``).
Dilation is written minus one (``dh0`` = dense). Resolution follows benchdnn's ``str2desc``: mb 2,
g 1, strides 1 by default; per axis a missing output size is computed with a symmetric pad (default
0) and a missing pad from the output size; then a 2D problem without w copies h to w, a 3D problem
with neither h nor w copies d to both. The right pad is what makes the output size hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .problem import ConvGeometry
from .untrusted import MAX_NAME_CHARS, integer, shorten

__all__ = ["ConvDescriptor", "DescriptorError", "parse_descriptor", "parse_descriptor_file"]

_KEYS = ("g", "mb", "ic", "id", "ih", "iw", "oc", "od", "oh", "ow", "kd", "kh", "kw",
         "sd", "sh", "sw", "pd", "ph", "pw", "dd", "dh", "dw")
_TOKEN = re.compile(r"(mb|ic|id|ih|iw|oc|od|oh|ow|kd|kh|kw|sd|sh|sw|pd|ph|pw|dd|dh|dw|g)([0-9]+)")


class DescriptorError(ValueError):
    """A descriptor that does not follow the grammar or describes an impossible problem."""


@dataclass(frozen=True)
class ConvDescriptor(ConvGeometry):
    """A resolved problem: the convolution's geometry (spatial tuples ordered d, h, w; rank 1 = w
    only), with the descriptor's name and text."""

    name: str = ""
    text: str = ""

    def with_mb(self, mb: int) -> "ConvDescriptor":
        return replace(self, n=mb)

    def canonical(self) -> str:
        """The descriptor written out in full (benchdnn's canonical order, dilation minus one)."""
        axes = "dhw"[3 - self.rank:]
        parts = [f"g{self.groups}", f"mb{self.n}", f"ic{self.ic}"]
        parts += [f"i{a}{v}" for a, v in zip(axes, self.in_size)]
        parts += [f"oc{self.oc}"] + [f"o{a}{v}" for a, v in zip(axes, self.out_size)]
        parts += [f"k{a}{v}" for a, v in zip(axes, self.kernel)]
        parts += [f"s{a}{v}" for a, v in zip(axes, self.strides)]
        parts += [f"p{a}{v}" for a, v in zip(axes, self.pads_begin)]
        parts += [f"d{a}{v - 1}" for a, v in zip(axes, self.dilations)]
        return "".join(parts) + (f'n"{self.name}"' if self.name else "")


def _named(text: str) -> str:
    """How messages name a descriptor (a long one cut)."""
    return f"descriptor {shorten(text, MAX_NAME_CHARS)!r}"


def parse_descriptor(text: str) -> ConvDescriptor:
    """Parse one descriptor (no comments) into a resolved problem, with benchdnn's rules."""
    values: dict[str, int] = {}
    name, pos, body = "", 0, text.strip()
    while pos < len(body):
        match = _TOKEN.match(body, pos)
        if match:
            key = match.group(1)
            if key in values:
                raise DescriptorError(f"{_named(text)}: '{key}' given twice")
            try:
                values[key], pos = integer(match.group(2), f"'{key}'"), match.end()
            except ValueError as exc:
                raise DescriptorError(f"{_named(text)}: {exc}") from None
        elif body[pos] == "n":
            name, pos = body[pos + 1:].strip().strip('"'), len(body)
        elif body[pos] == "_":
            pos += 1
        else:
            raise DescriptorError(f"{_named(text)}: cannot read {shorten(body[pos:], 40)!r} (expected one of "
                                  f"{' '.join(_KEYS)} followed by a number, or n\"name\")")
    if not values.get("ic") or not values.get("oc"):
        raise DescriptorError(f"{_named(text)}: 'ic' and 'oc' are required and positive")
    return _resolve(values, name, body)


def _half_toward_zero(value: int) -> int:
    return -((-value) // 2) if value < 0 else value // 2


def _resolve(v: dict[str, int], name: str, text: str) -> ConvDescriptor:
    # Per axis, as benchdnn's str2desc: an axis is present when any of i/k/o/d is given, or s != 1,
    # or p > 0; then i and k are required, a missing o is computed with symmetric pad p (default 0),
    # a missing p is computed from o.
    axes: dict[str, list[int] | None] = {}
    for a in "dhw":
        i, k, o, d = (v.get(f"{p}{a}", 0) for p in "ikod")
        s, p = v.get(f"s{a}", 1), v.get(f"p{a}", -1)
        if not (i or k or o or d or s != 1 or p > 0):
            axes[a] = None
            continue
        if not i or not k or s < 1:
            raise DescriptorError(f"{_named(text)}: axis '{a}' needs i{a} and k{a} (and s{a} >= 1)")
        ek = (k - 1) * (d + 1) + 1
        if not o:
            p = max(p, 0)
            o = (i - ek + 2 * p) // s + 1
            if o <= 0:
                raise DescriptorError(f"{_named(text)}: axis '{a}' has no output (o{a} = {o})")
        elif p < 0:
            p = _half_toward_zero((o - 1) * s - i + ek)
            if p < 0:
                raise DescriptorError(f"{_named(text)}: o{a}={o} is too small for i{a}={i}, k{a}={k}")
        axes[a] = [o, i, k, s, p, d]
    # Rank from which output sizes exist; then benchdnn's square/cubic propagation.
    if axes["d"] is not None:
        if axes["h"] is None and axes["w"] is None:
            axes["h"] = axes["w"] = axes["d"]
        elif axes["h"] is None or axes["w"] is None:
            raise DescriptorError(f"{_named(text)}: a 3D problem needs both h and w, or neither (cubic)")
        used = "dhw"
    elif axes["h"] is not None:
        axes["w"] = axes["w"] or axes["h"]
        used = "hw"
    elif axes["w"] is not None:
        used = "w"
    else:
        raise DescriptorError(f"{_named(text)}: at least one spatial axis is required")
    o, i, k, s, p, d = (tuple(axes[a][n] for a in used) for n in range(6))
    dil = tuple(x + 1 for x in d)
    # Right pad as benchdnn computes it; a negative one (trailing input no window reads) is only
    # representable when it is smaller than the stride, i.e. when pads_end = 0 gives the same output.
    pads_end = tuple((oo - 1) * ss - ii + (kk - 1) * dd + 1 - pp for oo, ss, ii, kk, dd, pp in zip(o, s, i, k, dil, p))
    if any(pe <= -ss for pe, ss in zip(pads_end, s)):
        raise DescriptorError(f"{_named(text)}: output size {list(o)} leaves input unread beyond a stride "
                              "(negative right padding)")
    groups = v.get("g", 1)
    if groups < 1 or v["ic"] % groups or v["oc"] % groups:
        raise DescriptorError(f"{_named(text)}: ic={v['ic']} and oc={v['oc']} must divide by g={groups}")
    return ConvDescriptor(v.get("mb", 2), groups, v["ic"], v["oc"], i, o, k, s, dil, p,
                          tuple(max(0, pe) for pe in pads_end), name, text)


def parse_descriptor_file(lines: list[str]) -> list[tuple[int, ConvDescriptor | DescriptorError]]:
    """Parse a shapes file: (line number, descriptor or the error for that line), skipping comments."""
    out: list[tuple[int, ConvDescriptor | DescriptorError]] = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            out.append((number, parse_descriptor(line)))
        except DescriptorError as exc:
            out.append((number, exc))
    return out
