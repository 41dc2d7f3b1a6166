"""benchdnn memory format tags (``--stag``, ``--wtag``, ``--dtag``, a binary post-op's operand) as
strides of the conv driver's logical tensors.

A tag lists a tensor's dimensions from the outermost to the innermost in memory. Dimensions are
benchdnn's logical ones: data ``n, c, spatial...``; weights ``o, i, spatial...`` and, grouped,
``g, o, i, spatial...``. Three spellings: letters ``abcdef`` (``acdb``: channels last for 4D),
meta-tags with ``x`` for the spatial letters (``abx``, ``axb``, ``xba``; with a ``c`` in a grouped
weights tag ``x`` starts at ``d``, as ``abxc``), and oneDNN's named tags (``nhwc``, ``goiw``,
``hwio``). ``any`` lets convgrad choose (dense in the ops' own layout). Blocked tags (``aBx16b``:
an upper-case letter, block sizes) are oneDNN's storage of the same values in blocks; convgrad
has no blocked layout and computes with their plain order (``aBx16b`` -> ``abx``), which
:func:`tag_note` states.

convgrad's grouped weights have one output-channel axis ``O = g * OC/g + o``; a grouped weights tag
is expressible when ``g`` is immediately outside ``o`` in memory (as in ``goiw``, ``xcab``... read
as ``hwigo``).
"""

from __future__ import annotations

import re

from .model import dense_strides

__all__ = ["parse_tag", "tag_order", "tag_strides", "tag_note"]

_BLOCKED = re.compile(r"([a-fA-Fx]+)([0-9]+[a-f])+")
_PLAIN = re.compile(r"[a-fx]+|[ngoidhwc]+")


def parse_tag(text: str) -> str:
    """Validate a tag's spelling (``any``, a plain, meta, named or blocked tag); ValueError if not."""
    tag = text.strip()
    if tag == "any" or _PLAIN.fullmatch(tag) or _BLOCKED.fullmatch(tag):
        return tag
    raise ValueError(f"{text!r}: expected any, a plain tag (abx, axb, xba, acdb...), a named tag (nhwc, goiw...) "
                     "or a blocked tag (aBx16b...)")


def tag_note(tag: str) -> str | None:
    """The note a blocked tag earns (it runs in its plain order), else None."""
    match = _BLOCKED.fullmatch(tag)
    if not match:
        return None
    return (f"tag {tag}: oneDNN's blocked storage of the same values; convgrad has no blocked layout and "
            f"computes with the plain order {match.group(1).lower()}")


def _dims(kind: str, spatial: int, grouped: bool) -> list[str]:
    names = ["d", "h", "w"][3 - spatial:]
    return (["n", "c"] if kind == "data" else (["g"] if grouped else []) + ["o", "i"]) + names


def tag_order(tag: str, kind: str, spatial: int, grouped: bool = False) -> list[str]:
    """The tensor's benchdnn dimensions (``n c h w``, ``g o i h w``...) in the memory order of ``tag``
    (outermost first); ValueError naming the tag when it does not fit the tensor."""
    dims = _dims(kind, spatial, grouped)
    match = _BLOCKED.fullmatch(tag)
    plain = match.group(1).lower() if match else tag
    if set(plain) <= set("abcdefx"):
        letters = "abcdef"[:len(dims)]
        if "x" in plain:
            start = 3 if "c" in plain and kind == "weights" and grouped else 2
            plain = plain.replace("x", letters[start:])
        order = [dims[letters.index(ch)] if ch in letters else "?" for ch in plain]
    else:
        order = list(plain)
    if sorted(order) != sorted(dims):
        raise ValueError(f"tag {tag!r} does not fit a {len(dims)}D {kind} tensor ({''.join(dims)})")
    return order


def tag_strides(tag: str, kind: str, shape: tuple[int, ...], axes: list[str]) -> tuple[int, ...] | None:
    """Strides (elements) of a tensor of ``shape`` whose axes are the benchdnn dimensions ``axes``
    (``O`` is a grouped weights tensor's g and o together), laid out as ``tag``; None for ``any``."""
    if tag == "any":
        return None
    spatial = sum(a in "dhw" for a in axes)
    grouped = "O" in axes
    order = tag_order(tag, kind, spatial, grouped)
    if grouped:
        at = order.index("g")
        if at + 1 >= len(order) or order[at + 1] != "o":
            raise ValueError(f"tag {tag!r}: grouped weights need g immediately outside o in memory (convgrad's "
                             "one output-channel axis holds both)")
        order[at:at + 2] = ["O"]
    return dense_strides(shape, tuple(axes.index(a) for a in order))
