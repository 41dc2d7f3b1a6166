"""PyTorch's convolution modules computed by convgrad: ``convert(model)`` and ``restore(model)``.

:class:`Conv1d`, :class:`Conv2d`, :class:`Conv3d`, :class:`ConvTranspose1d`,
:class:`ConvTranspose2d` and :class:`ConvTranspose3d` are subclasses of the ``torch.nn`` classes
of the same names: the same constructor, attributes, ``weight`` (OIX; IOX transposed),
``state_dict``, hooks and repr; only the computation is convgrad's
(:func:`convgrad.torch.convolution` / :func:`convgrad.torch.conv_transpose`). Inputs have
PyTorch's NCX logical shape (or CX, un-batched); one laid out channels-last in memory runs as NXC
data without a copy and gives a channels-last output, any other as NCX. ``padding="same"`` pads
as PyTorch does (the odd element of an even kernel's padding at the end).

:func:`convert` changes the class of every ``torch.nn`` convolution module of a model to its
convgrad twin (the same module objects, Parameters, hooks and flags) and :func:`restore` changes
them back. Used through :mod:`convgrad.torch`, which imports this module.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, TypeVar

import torch

from .errors import AttributeValueError, ConvgradError, DTypeError, InputError, InputTypeError

__all__ = ["convert", "restore", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d"]

M = TypeVar("M", bound=torch.nn.Module)


class _Convgrad:
    """The computation shared by the six modules (a mixin before the ``torch.nn`` class)."""

    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: str | tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    transposed: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        error = _refusal(self, f"convgrad.torch.{type(self).__name__}")  # type: ignore[arg-type]
        if error is not None:
            raise error

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      output_padding: list[int] | None = None) -> torch.Tensor:
        """The convolution of ``input`` (N, C, *X) or (C, *X), in its own memory format."""
        refuse_tangents(f"convgrad.torch.{type(self).__name__}", [("input", input), ("weight", weight), ("bias", bias)])
        rank = len(self.kernel_size)
        unbatched = input.dim() == rank + 1
        x = input.unsqueeze(0) if unbatched else input
        channels_last = not x.is_contiguous() and x.movedim(1, -1).is_contiguous()
        if self.padding == "same":
            total = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)]
            begin, end = [t // 2 for t in total], [t - t // 2 for t in total]
        else:
            begin = end = [0] * rank if self.padding == "valid" else list(self.padding)
        geometry: dict[str, Any] = dict(strides=list(self.stride), pads_begin=begin, pads_end=end,
                                        dilations=list(self.dilation), groups=self.groups,
                                        data_format="NXC" if channels_last else "NCX")
        src = x.movedim(1, -1) if channels_last else x
        if self.transposed:
            y = conv_transpose(src, weight, bias, weights_format="IOX", output_padding=output_padding, **geometry)
        else:
            y = convolution(src, weight, bias, weights_format="OIX", **geometry)
        y = y.movedim(-1, 1) if channels_last else y
        return y.squeeze(0) if unbatched else y


class _ConvgradTranspose(_Convgrad):
    """The transposed modules' forward: ``output_size`` as ``torch.nn.ConvTransposeNd`` takes it."""

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        output_padding = self._output_padding(  # type: ignore[attr-defined]
            input, output_size, self.stride, self.padding, self.kernel_size, len(self.kernel_size), self.dilation)
        return self._conv_forward(input, self.weight, self.bias, output_padding)  # type: ignore[attr-defined]


class Conv1d(_Convgrad, torch.nn.Conv1d):
    """``torch.nn.Conv1d`` computed by convgrad."""


class Conv2d(_Convgrad, torch.nn.Conv2d):
    """``torch.nn.Conv2d`` computed by convgrad."""


class Conv3d(_Convgrad, torch.nn.Conv3d):
    """``torch.nn.Conv3d`` computed by convgrad."""


class ConvTranspose1d(_ConvgradTranspose, torch.nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` computed by convgrad."""


class ConvTranspose2d(_ConvgradTranspose, torch.nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` computed by convgrad."""


class ConvTranspose3d(_ConvgradTranspose, torch.nn.ConvTranspose3d):
    """``torch.nn.ConvTranspose3d`` computed by convgrad."""


#: torch.nn's class -> convgrad's twin, and back.
_TWINS: dict[type[torch.nn.Module], type[torch.nn.Module]] = {
    c.__bases__[-1]: c for c in (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)}
_TORCH_CLASSES = {twin: original for original, twin in _TWINS.items()}


def _refusal(module: torch.nn.Module, where: str) -> ConvgradError | None:
    """Why convgrad cannot compute the convolution module ``module`` (``where`` names it), or None."""
    if module.padding_mode != "zeros":
        return AttributeValueError(where, "padding_mode", module.padding_mode,
                                   "'zeros' (convgrad's convolutions pad with zeros only)")
    for name in ("weight", "bias"):
        tensor = getattr(module, name)
        if tensor is None:
            continue
        if tensor.dtype not in _TORCH_DTYPES.values():
            return DTypeError(where, None, f"parameter '{name}' has dtype {tensor.dtype}: expected one of "
                              f"{', '.join(map(str, _TORCH_DTYPES.values()))} (convgrad's convolutions are real)")
        if tensor.device.type != "cpu":
            return InputTypeError(where, None, f"parameter '{name}' is on device {tensor.device}: expected a CPU tensor")
    return None


def _conversion_refusal(module: torch.nn.Module, where: str) -> ConvgradError | None:
    """:func:`_refusal`, and a subclass of a torch.nn convolution class is refused too."""
    base = next(c for c in type(module).__mro__ if c in _TWINS)
    if type(module) is not base:
        return InputTypeError(where, None, f"is a {type(module).__qualname__}, a subclass of torch.nn.{base.__name__}: "
                              "expected torch.nn's own class (a subclass's forward may differ)")
    return _refusal(module, where)


def convert(module: M, *, inplace: bool = False, strict: bool = True) -> M:
    """``module`` (a deep copy unless ``inplace``) with every ``torch.nn.Conv1d/2d/3d`` and
    ``ConvTranspose1d/2d/3d`` computed by convgrad: its class changed to the convgrad twin, the
    same object, Parameters, hooks and flags. Modules converted already are left as they are.

    A module convgrad cannot compute (``padding_mode`` other than zeros, a dtype other than f32,
    bf16, f16, f64, a non-CPU device, a subclass) raises its ConvgradError naming the module,
    before anything is changed; with ``strict=False`` it stays PyTorch's, with a warning."""
    model = module if inplace else copy.deepcopy(module)
    found = [(m, _conversion_refusal(m, f"module '{name}'" if name else f"the {type(m).__name__} given"))
             for name, m in model.named_modules() if isinstance(m, tuple(_TWINS)) and not isinstance(m, _Convgrad)]
    errors = [error for _, error in found if error is not None]
    if errors and strict:
        raise errors[0]
    for m, error in found:
        if error is None:
            m.__class__ = _TWINS[type(m)]
        else:
            warnings.warn(f"{error}; left as {type(m).__qualname__}", stacklevel=2)
    return model


def restore(module: M, *, inplace: bool = False) -> M:
    """``module`` (a deep copy unless ``inplace``) with every convgrad convolution module (of
    the six classes here, not subclasses) back to its ``torch.nn`` class: the same object,
    Parameters and attributes."""
    model = module if inplace else copy.deepcopy(module)
    for m in model.modules():
        if type(m) in _TORCH_CLASSES:
            m.__class__ = _TORCH_CLASSES[type(m)]
    return model


# convgrad.torch imports this module at its end, so either module can be imported first.
from .torch import _TORCH_DTYPES, conv_transpose, convolution, refuse_tangents  # noqa: E402
