"""Vector-Jacobian products of the ops, written with the ops themselves (framework-neutral).

Each op of the family is linear in each of its data inputs, and each gradient is again an op of
the family. With the canonical forward convolution ``y = conv(x, w)`` and a cotangent ``g``::

    <conv(x, w), g> = <x, backward_data(g, w)> = <w, backward_weights(x, g)>

so, for the six ops that form a closed set under differentiation (ConvolutionBackpropFilters is
ConvolutionBackwardWeights under older names):

============================  =======================================  =========================================
op (data inputs)              gradient of the first input              gradient of the second input
============================  =======================================  =========================================
Convolution(src, W, b)        ConvolutionBackwardData(g, W)            ConvolutionBackwardWeights(src, g)
ConvolutionBackwardData(dy,W) Convolution(g, W)                        ConvolutionBackwardWeights(g, dy)
ConvolutionBackwardWeights    ConvolutionBackwardData(dy, g)           Convolution(x, g)
  (x, dy)
ConvTranspose(src, W, b)      ConvTransposeBackwardData(g, W)          ConvTransposeBackwardWeights(src, g)
ConvTransposeBackwardData     ConvTranspose(g, W)                      ConvTransposeBackwardWeights(g, dd)
  (dd, W)
ConvTransposeBackwardWeights  ConvTransposeBackwardData(dd, g)         ConvTranspose(s, g)
  (s, dd)
============================  =======================================  =========================================

and the bias gradient is ``g`` summed over the batch and spatial axes. The gradient ops run with
the op's *resolved* geometry (explicit pads, ``auto_pad="none"``, the output_padding that gives
the input's exact size), because auto_pad's same_* pads of a gradient op can differ from the
forward op's (SEMANTICS.md: ConvTranspose uses max(0, EK - S), its gradient ops the input size).

Framework adapters (:mod:`convgrad.torch`, :mod:`convgrad.jax`) call :func:`vjp` with their own
differentiable op wrappers, so gradients of gradients follow the same table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .problem import Problem

__all__ = ["DIFFERENTIABLE", "Step", "resolved_attributes", "bias_axes", "steps", "vjp"]

# Per data input (spec order): the op giving its gradient, that op's data arguments ("g" is the
# cotangent, an int the op's own input of that index) and the shape attribute it takes, with the
# input whose shape it is; "bias" is the sum of g over the batch and spatial axes.
_Rule = tuple[str, tuple[Any, ...], tuple[str, int] | None] | str
_RULES: dict[str, tuple[_Rule, ...]] = {
    "Convolution": (("ConvolutionBackwardData", ("g", 1), ("dst_shape", 0)),
                    ("ConvolutionBackwardWeights", (0, "g"), ("weights_shape", 1)),
                    "bias"),
    "ConvolutionBackwardData": (("Convolution", ("g", 1), None),
                                ("ConvolutionBackwardWeights", ("g", 0), ("weights_shape", 1))),
    "ConvolutionBackwardWeights": (("ConvolutionBackwardData", (1, "g"), ("dst_shape", 0)),
                                   ("Convolution", (0, "g"), None)),
    "ConvTranspose": (("ConvTransposeBackwardData", ("g", 1), None),
                      ("ConvTransposeBackwardWeights", (0, "g"), ("weights_shape", 1)),
                      "bias"),
    "ConvTransposeBackwardData": (("ConvTranspose", ("g", 1), None),
                                  ("ConvTransposeBackwardWeights", ("g", 0), ("weights_shape", 1))),
    "ConvTransposeBackwardWeights": (("ConvTransposeBackwardData", (1, "g"), None),
                                     ("ConvTranspose", (0, "g"), None)),
}

#: The ops with gradients (each gradient is one of them).
DIFFERENTIABLE: tuple[str, ...] = tuple(_RULES)


def resolved_attributes(problem: Problem) -> dict[str, Any]:
    """The attributes every gradient op of ``problem`` runs with: its geometry made explicit.

    For the transposed ops, output_padding is the one that gives the convolution input's actual
    size: ``I - (S*(O-1) + EK - PB - PE)`` per axis."""
    g = problem.geometry
    attrs: dict[str, Any] = {
        "strides": list(g.strides), "pads_begin": list(g.pads_begin), "pads_end": list(g.pads_end),
        "dilations": list(g.dilations), "groups": g.groups, "auto_pad": "none",
        "data_format": problem.data_format, "weights_format": problem.weights_format,
    }
    if problem.definition.transposed:
        attrs["output_padding"] = [i - (s * (o - 1) + ek - pb - pe) for i, o, s, ek, pb, pe in zip(
            g.in_size, g.out_size, g.strides, g.effective_kernel, g.pads_begin, g.pads_end)]
    return attrs


def bias_axes(problem: Problem) -> tuple[int, ...]:
    """The axes a bias gradient sums over: all but the channel axis of the op's output."""
    ndim = problem.geometry.rank + 2
    channel = 1 if problem.data_format == "NCX" else ndim - 1
    return tuple(a for a in range(ndim) if a != channel)


class Step(NamedTuple):
    """How one data input's gradient is computed: op ``kind`` on ``args`` (``"g"``: the
    cotangent; an int: the op's own input of that index) with ``attrs``, the resolved geometry
    (:func:`resolved_attributes`) plus the shape attribute it takes."""

    kind: str
    args: tuple[str | int, ...]
    attrs: dict[str, Any]


def steps(problem: Problem, shapes: Sequence[Sequence[int] | None]) -> list[Step | str | None]:
    """Per data input of ``problem``'s op (spec order; ``shapes``: theirs, None where absent): the
    :class:`Step` giving its gradient, ``"bias"`` (the cotangent summed over :func:`bias_axes`),
    or None where the input is absent."""
    attrs = resolved_attributes(problem)
    out: list[Step | str | None] = []
    for rule, shape in zip(_RULES[problem.op], shapes):
        if shape is None or rule == "bias":
            out.append(None if shape is None else rule)
            continue
        kind, args, shape_of = rule
        out.append(Step(kind, args, attrs if shape_of is None else {**attrs, shape_of[0]: list(shapes[shape_of[1]])}))
    out.extend([None] * (len(shapes) - len(out)))
    return out


def vjp(problem: Problem, inputs: Sequence[Any], grad: Any, needed: Sequence[bool],
        apply: Callable[..., Any], sum_over: Callable[[Any, tuple[int, ...]], Any],
        shape: Callable[[Any], Sequence[int]], plan: Sequence[Step | str | None] | None = None) -> list[Any]:
    """Gradients of ``problem``'s op with respect to its data inputs (spec order), given the
    cotangent ``grad`` of its output: None where not ``needed`` or where the input is absent.

    ``apply(step, *data)`` runs a :class:`Step`'s op in the framework (differentiably where
    gradients of gradients are wanted), ``sum_over(g, axes)`` sums an array over axes, ``shape(a)``
    is an array's shape; ``plan``: the inputs' :func:`steps`, where the caller has them."""
    if plan is None:
        plan = steps(problem, [None if a is None else shape(a) for a in inputs])
    grads: list[Any] = []
    for step, need in zip(plan, needed):
        if not need or step is None:
            grads.append(None)
        elif step == "bias":
            grads.append(sum_over(grad, bias_axes(problem)))
        else:
            grads.append(apply(step, *[grad if a == "g" else inputs[a] for a in step.args]))
    grads.extend([None] * (len(inputs) - len(grads)))
    return grads
