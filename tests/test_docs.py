"""The generated op documentation is current, complete, and its examples run."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import convgrad as cg
from convgrad import docs

OPS_MD = Path(__file__).resolve().parent.parent / "docs" / "ops.md"


def test_ops_md_is_up_to_date():
    assert OPS_MD.read_text() == docs.render(), "docs/ops.md is stale: run python -m convgrad.docs > docs/ops.md"


@pytest.mark.parametrize("kind", list(cg.OPS))
def test_section_lists_everything_and_its_example_runs(kind):
    d = cg.OPS[kind]
    section = docs.render_op(d)
    for i, spec in enumerate(d.inputs):
        assert f"| {i} | `{spec.name}` | {'required' if spec.required else 'optional'} |" in section
    for a in d.attributes:
        assert f"| `{a.name}` | {a.type} |" in section and a.expected() in section
    assert str(inspect.signature(getattr(cg, d.function))) in section
    assert d.math in section and d.output.name in section
    example = re.findall(r"```python\n(.*?)```", section, re.S)[-1]
    namespace: dict = {}
    exec(compile(example, f"<example of {kind}>", "exec"), namespace)
    assert namespace["out"].dtype == ("float16" if kind == "TypeCast" else "float32")
    assert namespace["out"].ndim == (1 if kind == "BiasAddBackward" else 4)
