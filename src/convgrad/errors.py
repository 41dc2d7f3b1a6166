"""The one exception hierarchy of convgrad.

Every error convgrad raises is a :class:`ConvgradError` and also a ``ValueError`` or a
``TypeError``, so callers can catch either the specific class, the family, or the builtin.
Messages name the op, the attribute or input, the value given and what was expected.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConvgradError",
    "UnknownOpError",
    "AttributeValueError",
    "UnknownAttributeError",
    "MissingAttributeError",
    "AttributeTypeError",
    "InputError",
    "ShapeError",
    "InputTypeError",
    "DTypeError",
    "ResourceError",
    "EngineError",
    "describe",
]


def describe(value: Any, limit: int = 80) -> str:
    """A short, printable rendering of a user-supplied value for error messages."""
    try:
        text = repr(value.tolist()) if hasattr(value, "tolist") and getattr(value, "size", 2) < 32 else repr(value)
    except Exception:  # pragma: no cover - repr of hostile objects
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConvgradError(Exception):
    """Base class of every error raised by convgrad."""

    def __init__(self, op: str | None, message: str) -> None:
        self.op = op
        super().__init__(f"{op}: {message}" if op else message)


class UnknownOpError(ConvgradError, ValueError):
    """The op kind is not one of the family."""


class AttributeValueError(ConvgradError, ValueError):
    """An attribute has a value outside its allowed range or inconsistent with the inputs."""

    def __init__(self, op: str | None, attribute: str, value: Any, expected: str) -> None:
        self.attribute = attribute
        self.value = value
        super().__init__(op, f"attribute '{attribute}' = {describe(value)}: expected {expected}")


class UnknownAttributeError(AttributeValueError):
    """An attribute name the op does not have (a typo must not pass silently)."""

    def __init__(self, op: str | None, attribute: str, value: Any, known: list[str]) -> None:
        super().__init__(op, attribute, value, "one of the op's attributes: " + ", ".join(known))


class MissingAttributeError(AttributeValueError):
    """A required attribute was not given."""

    def __init__(self, op: str | None, attribute: str, expected: str) -> None:
        self.attribute = attribute
        self.value = None
        ConvgradError.__init__(self, op, f"attribute '{attribute}' is required: expected {expected}")


class AttributeTypeError(ConvgradError, TypeError):
    """An attribute value has the wrong type (e.g. a float where s64 is expected)."""

    def __init__(self, op: str | None, attribute: str, value: Any, expected: str) -> None:
        self.attribute = attribute
        self.value = value
        super().__init__(
            op, f"attribute '{attribute}' = {describe(value)} ({type(value).__name__}): expected {expected}"
        )


class InputError(ConvgradError, ValueError):
    """An input tensor is missing, extra, or has an unusable value."""

    def __init__(self, op: str | None, input_name: str | None, message: str) -> None:
        self.input = input_name
        super().__init__(op, f"input '{input_name}' {message}" if input_name else message)


class ShapeError(InputError):
    """Input shapes disagree with each other or with the attributes."""


class InputTypeError(ConvgradError, TypeError):
    """An input is not convertible to an array."""

    def __init__(self, op: str | None, input_name: str | None, message: str) -> None:
        self.input = input_name
        super().__init__(op, f"input '{input_name}' {message}" if input_name else message)


class DTypeError(InputTypeError):
    """An input has an unsupported dtype, or the inputs' dtypes differ."""


class ResourceError(ConvgradError, ValueError):
    """The problem would need more memory than the configured budget."""


class EngineError(ConvgradError, ValueError):
    """An unknown engine name was requested."""
