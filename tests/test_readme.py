"""Every README snippet runs as written (issue 23), so the README cannot drift again.

- Each ```python block runs in a fresh namespace in an empty folder (the Dask one writes its zarr
  stores there); a block whose extra is not installed is skipped.
- Each ``$ convgrad ...`` line of the shell blocks runs from the repository root with click's
  runner; the lines shown under it (but ``...`` and table rows, whose widths follow the numbers)
  must appear in its output in order, every number (seeds, timings) standing for any number, and
  ``$ echo $?`` shows its exit code. The only line not run names a scheduler at a placeholder
  address (``HOST``). ``make demo`` runs ``convgrad demo`` (tested below); ``make test`` is this suite.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from convgrad import demo
from convgrad.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    """The README's fenced blocks of ``language`` ("" for plain ones), in order."""
    blocks, current, inside = [], [], None
    for line in README.splitlines():
        if line.startswith("```"):
            if inside is None:
                inside, current = line[3:].strip(), []
            else:
                if inside == language:
                    blocks.append("\n".join(current) + "\n")
                inside = None
        elif inside is not None:
            current.append(line)
    return blocks


PYTHON_BLOCKS = _blocks("python")
SHELL_BLOCKS = [b for b in _blocks("") if b.startswith("$ ")]
_NUMBER = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")
_TABLE = tuple("┏┃┡│└")


def _commands() -> list[tuple[str, list[str]]]:
    """(command line, the output lines shown under it) of every ``$`` line of the shell blocks."""
    commands: list[tuple[str, list[str]]] = []
    for block in SHELL_BLOCKS:
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif commands:
                commands[-1][1].append(line)
    return commands


COMMANDS = _commands()


def test_the_readme_has_its_snippets():
    assert len(PYTHON_BLOCKS) >= 4 and len(COMMANDS) >= 8
    assert any("volume.zarr" in b for b in PYTHON_BLOCKS)


@pytest.mark.parametrize("code", PYTHON_BLOCKS, ids=[f"python{i}" for i in range(len(PYTHON_BLOCKS))])
def test_python_snippet_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for extra in ("torch", "jax", "dask"):
        if re.search(rf"^import {extra}\b", code, re.M):
            pytest.importorskip(extra)
    with contextlib.ExitStack() as stack:
        if "dask" in code:  # another test's dask.distributed client may have left itself the default scheduler
            dask = pytest.importorskip("dask")
            stack.enter_context(dask.config.set(scheduler="threads"))
        exec(compile(code, "<README snippet>", "exec"), {"__name__": "readme"})


def _normal(line: str) -> str:
    return _NUMBER.sub("N", line.rstrip())


@pytest.mark.parametrize("command, shown", COMMANDS, ids=[c[0][:60] for c in COMMANDS])
def test_shell_snippet_runs_and_prints_what_the_readme_shows(command, shown, monkeypatch):
    if "HOST" in command:
        pytest.skip("a scheduler at a placeholder address")
    if command == "echo $?":
        return  # checked with the command before it
    words = shlex.split(command.split("  #")[0])
    stdout_only = "2>/dev/null" in words
    words = [w for w in words if w != "2>/dev/null"]
    assert words[0] == "convgrad", command
    if "--scheduler=local:2" in words:
        pytest.importorskip("distributed")
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, words[1:], env={"COLUMNS": "200"}, catch_exceptions=False)
    output = [_normal(line) for line in (result.stdout if stdout_only else result.output).splitlines()]
    index = COMMANDS.index((command, shown))
    following = COMMANDS[index + 1] if index + 1 < len(COMMANDS) else None
    expected_code = int(following[1][0]) if following and following[0] == "echo $?" else 0
    assert result.exit_code == expected_code, result.output
    position = 0
    for line in shown:
        if line == "..." or line.startswith(_TABLE) or not line.strip():
            continue
        want = _normal(line)
        while position < len(output) and output[position] != want:
            position += 1
        assert position < len(output), f"README shows {line!r}; the command printed:\n{result.output}"
        position += 1


def test_make_demo_times_like_the_benchmark(capsys):
    console = Console(width=160, force_terminal=False)
    assert demo.run(mb=1, seed=os.getpid(), console=console)
    out = capsys.readouterr().out
    assert "median ms" in out and "spread" in out and "all checks passed" in out
    assert "(slowest - fastest) / median" in out


def test_make_demo_finite_difference_catches_a_wrong_weights_gradient(capsys, monkeypatch):
    """The demo's finite-difference check fails a weights gradient whose kernel is flipped (a
    check that cannot fail proves nothing), on the scale of its terms."""
    real = demo.convolution_backward_weights
    monkeypatch.setattr(demo, "convolution_backward_weights", lambda *a, **k: real(*a, **k)[::-1, ::-1].copy())
    assert not demo.run(mb=1, seed=os.getpid(), console=Console(width=200, force_terminal=False))
    row = next(line for line in capsys.readouterr().out.splitlines() if "finite difference" in line)
    assert "FAILED" in row
