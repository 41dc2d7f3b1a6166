"""benchdnn convolution problems (``--dir`` + descriptor) as one-op graphs, so that ``convgrad conv``
shares everything after this point with ``convgrad graph``.

Directions: FWD_D (Convolution), FWD_B (Convolution with bias), BWD_D (ConvolutionBackwardData,
dst_shape attribute), BWD_W (ConvolutionBackwardWeights, weights_shape attribute). ``--tag=nxc``
gives NXC data with XIO weights (oneDNN Graph's defaults), ``--tag=ncx`` NCX data with OIX weights.
Tensor ids: 0 src/diff_src, 1 weights/diff_weights, 2 dst/diff_dst, 3 bias.
"""

from __future__ import annotations

from ..descriptor import ConvDescriptor
from ..problem import data_shape, weights_shape
from .model import Graph, GraphOp, LogicalTensor

__all__ = ["DIRECTIONS", "descriptor_graph"]

#: --dir value -> (op kind, input tensor ids, output tensor id).
DIRECTIONS: dict[str, tuple[str, tuple[int, ...], int]] = {
    "FWD_D": ("Convolution", (0, 1), 2),
    "FWD_B": ("Convolution", (0, 1, 3), 2),
    "BWD_D": ("ConvolutionBackwardData", (2, 1), 0),
    "BWD_W": ("ConvolutionBackwardWeights", (0, 2), 1),
}


def descriptor_graph(desc: ConvDescriptor, direction: str, dtype: str, tag: str) -> Graph:
    """The one-op graph that runs ``desc`` in ``direction`` with data type ``dtype`` and layout ``tag``."""
    kind, input_ids, output_id = DIRECTIONS[direction]
    data_format, weights_format = ("NXC", "XIO") if tag == "nxc" else ("NCX", "OIX")
    shapes = {
        0: data_shape(desc.n, desc.ic, desc.in_size, data_format),
        1: weights_shape(desc.oc, desc.ic // desc.groups, desc.kernel, weights_format),
        2: data_shape(desc.n, desc.oc, desc.out_size, data_format),
        3: (desc.oc,),
    }
    attrs: dict[str, object] = {
        "strides": list(desc.strides), "pads_begin": list(desc.pads_begin), "pads_end": list(desc.pads_end),
        "dilations": list(desc.dilations), "groups": desc.groups, "auto_pad": "None",
        "data_format": data_format, "weights_format": weights_format,
    }
    if direction == "BWD_D":
        attrs["dst_shape"] = list(shapes[0])
    elif direction == "BWD_W":
        attrs["weights_shape"] = list(shapes[1])
    tensors = {tid: LogicalTensor(tid, dtype, shape) for tid, shape in shapes.items()}
    op = GraphOp(0, desc.name or kind, kind, attrs, tuple(tensors[t] for t in input_ids), (tensors[output_id],))
    return Graph((op,), source=desc.text or desc.canonical())
