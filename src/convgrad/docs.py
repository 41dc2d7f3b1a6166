"""Render ``docs/ops.md`` from the op table: ``python -m convgrad.docs > docs/ops.md``.

Everything comes from :data:`convgrad.opdefs.OPS` and the generated functions' signatures, so the
page cannot drift from the code (a test compares the committed page with :func:`render`).
"""

from __future__ import annotations

import inspect

from . import functional
from .opdefs import OPS, AttrSpec, OpDef

__all__ = ["render", "render_op"]

# A short runnable example per op: (inputs, keyword attributes), on the arrays of _SETUP.
_PADS = "strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1]"
_EXAMPLES = {
    "Convolution": ("x, w", _PADS),
    "ConvolutionBackwardData": ("y, w, x.shape", _PADS),
    "ConvolutionBackwardWeights": ("x, y, w.shape", 'strides=[1, 1], auto_pad="same_upper"'),
    "ConvolutionBackpropFilters": ("x, y, w.shape", 'strides=[1, 1], auto_pad="same_upper", filter_format="XIO"'),
    "ConvTranspose": ("y, w", _PADS),
    "ConvTransposeBackwardData": ("x, w", _PADS),
    "ConvTransposeBackwardWeights": ("y, x, w.shape", _PADS),
    "BiasAdd": ("y, y[0, 0, 0]", ""),
    "BiasAddBackward": ("y", ""),
    "TypeCast": ("y", 'dtype="f16"'),
    "StaticReshape": ("y", "shape=[0, -1, 1, 6], special_zero=True"),
    "StaticTranspose": ("y", "order=[0, 3, 1, 2]"),
}
# The other ops' examples: inputs by family, the attributes each op requires.
_FAMILY_INPUTS = {"eltwise": "y", "eltwise_backward": "y, y", "binary": "y, y[0]", "reorder": "y"}
_REQUIRED = {"alpha": "alpha=0.5", "beta": "beta=2.0", "min": "min=-0.5, max=0.5"}
_SETUP = """import numpy as np
import convgrad as cg

x = np.random.rand(2, 8, 8, 4).astype(np.float32)  # NXC: N=2, 8x8, 4 channels
w = np.random.rand(3, 3, 4, 6).astype(np.float32)  # XIO (XOI for ConvTranspose ops): 3x3 kernel, 4 <-> 6 channels
y = np.random.rand(2, 8, 8, 6).astype(np.float32)  # NXC: N=2, 8x8, 6 channels"""


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(spec: AttrSpec) -> str:
    return "—" if spec.default is None else f"`{spec.default}`"


def render_op(d: OpDef) -> str:
    """The Markdown section of one op."""
    lines = [f"## {d.kind}", ""]
    if d.versioned_name:
        lines += [f"Versioned name: `{d.versioned_name}` (also accepted as the kind).", ""]
    lines += [d.summary, "", "```text", d.math, "```", "", "### Inputs", "",
              "| index | name | required |", "| --- | --- | --- |"]
    lines += [f"| {i} | `{s.name}` | {'required' if s.required else 'optional'} |" for i, s in enumerate(d.inputs)]
    lines += ["", "### Output", "", f"`{d.output.name}`", "", "### Attributes", "",
              "| name | type | default | required | accepted values | description |",
              "| --- | --- | --- | --- | --- | --- |"]
    for a in d.attributes:
        lines.append(f"| `{a.name}` | {a.type} | {_default(a)} | {'required' if a.required else 'optional'} | "
                     f"{_cell(a.expected())} | {_cell(a.description)} |")
    function = getattr(functional, d.function)
    inputs, attrs = _example(d)
    lines += ["", "### Function", "", "```python", f"convgrad.{d.function}{inspect.signature(function)}", "```",
              "", "### Example", "", "```python", _SETUP, "",
              f"out = cg.{d.function}({', '.join(filter(None, (inputs, attrs)))})", "print(out.shape, out.dtype)",
              "```", ""]
    return "\n".join(lines)


def _example(d: OpDef) -> tuple[str, str]:
    """(inputs, keyword attributes) of the op's example."""
    if d.kind in _EXAMPLES:
        return _EXAMPLES[d.kind]
    attrs = [_REQUIRED[a.name] for a in d.attributes if a.required and a.name in _REQUIRED]
    return _FAMILY_INPUTS[d.family], ", ".join(attrs)


def render() -> str:
    """The whole ``docs/ops.md`` page."""
    head = ["# convgrad ops", "",
            "Generated from `convgrad.opdefs.OPS` by `python -m convgrad.docs > docs/ops.md`; do not edit by hand.",
            "", "Every op is available as a function (inputs positional in the specification's index order, "
            "attributes by keyword; for the convolutions omitted pads mean 0 and omitted dilations 1) and as "
            "`convgrad.Op(kind, **attrs)` (attributes as the specification requires them).", "",
            "The convolutions:", ""]
    others = [d for d in OPS.values() if d.family != "convolution"]
    head += [f"- [{d.kind}](#{d.kind.lower()}) — `convgrad.{d.function}`" for d in OPS.values() if d not in others]
    head += ["", "The ops around them (element-wise, binary, bias, type and layout; results rounded once to the "
             "output dtype, computed in f64 by the reference engine and in f32 otherwise):", ""]
    head += [f"- [{d.kind}](#{d.kind.lower()}) — `convgrad.{d.function}` ({d.family.replace('_', ' ')})"
             for d in others]
    return "\n".join(head) + "\n\n" + "\n".join(render_op(d) for d in OPS.values())


if __name__ == "__main__":
    print(render(), end="")
