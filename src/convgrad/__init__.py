"""convgrad: the oneDNN Graph convolution-gradient family, spec-exact, in NumPy.

Seven ops (Convolution, ConvolutionBackwardData, ConvolutionBackwardWeights,
ConvolutionBackpropFilters, ConvTranspose, ConvTransposeBackwardData, ConvTransposeBackwardWeights)
as functions (``convgrad.convolution_backward_weights(src, diff_dst, weights_shape, strides=...)``)
and as oneDNN-style op objects (``convgrad.Op(kind, **attrs)``), and the ops that sit around them in
real graphs (element-wise ops and their backward ops, binary ops, BiasAdd, TypeCast, Reorder,
StaticReshape, StaticTranspose), also as functions (``convgrad.relu``, ``convgrad.bias_add``, ...).
"""

from __future__ import annotations

from .engines import available_engines, get_engine, set_default_engine
from .errors import (
    AttributeTypeError,
    AttributeValueError,
    ConvgradError,
    DTypeError,
    EngineError,
    InputError,
    InputTypeError,
    MissingAttributeError,
    ResourceError,
    ShapeError,
    UnknownAttributeError,
    UnknownOpError,
)
from .functional import (
    conv_transpose,
    conv_transpose_backward_data,
    conv_transpose_backward_weights,
    convolution,
    convolution_backprop_filters,
    convolution_backward_data,
    convolution_backward_weights,
)
from .functional import __all__ as _FUNCTIONS
from .limits import memory_budget, set_memory_budget
from .op import Op
from .opdefs import OPS
from .problem import ConvGeometry, Problem

from . import functional as _functional

# The other ops' functions (relu, add, bias_add, ...), generated from the op table like the seven above.
_AROUND = [name for name in _FUNCTIONS if name not in globals()]
globals().update({name: getattr(_functional, name) for name in _AROUND})

__version__ = "0.1.0"

__all__ = [
    "Op", "OPS", "Problem", "ConvGeometry",
    "convolution", "convolution_backward_data", "convolution_backward_weights", "convolution_backprop_filters",
    "conv_transpose", "conv_transpose_backward_data", "conv_transpose_backward_weights",
    "available_engines", "get_engine", "set_default_engine", "memory_budget", "set_memory_budget",
    "ConvgradError", "UnknownOpError", "AttributeValueError", "UnknownAttributeError", "MissingAttributeError",
    "AttributeTypeError", "InputError", "ShapeError", "InputTypeError", "DTypeError", "ResourceError", "EngineError",
    *_AROUND,
]
