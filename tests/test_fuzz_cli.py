"""Hypothesis fuzzing of the command line: ``convgrad graph`` and ``convgrad conv``.

Every invocation must end with a documented exit code (0 all passed, 1 some case failed, 2 usage
error), print no traceback, count every case in ``tests:T passed:P skipped:S failed:F`` and, for each failed
case, name the file (and batch line) and the field. Inputs: the example graph files mutated (fields
dropped, renamed or given wrong types, random attributes, shapes, dtypes and strides, wrong input
counts, unknown kinds, duplicate ids, cycles), random bytes and truncated JSON; random and garbage
``--in-shapes``, ``--op-attrs``, ``--mb``, ``--dt``; conv descriptors; batch files mixing good and
bad lines, missing nested files and batches that include themselves. Sizes are tiny or absurd
(absurd ones must be refused before anything is allocated), so no case can take long.

``CONVGRAD_FUZZ_EXAMPLES`` sets the examples per test (``make fuzz`` runs them with a large value).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import currently_in_test_context, event, given
from hypothesis import strategies as st

from child_env import subprocess_env

from convgrad.cli import main
from convgrad.driver import CONV, GRAPH, Driver
from convgrad.graph import DIRECTIONS
from convgrad.graph.model import TENSOR_DTYPES
from convgrad.opdefs import OPS
from convgrad.report import check_template
from convgrad.untrusted import MAX_NAME_CHARS, printable, shorten

from reliability_support import fuzz_settings as fuzz

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
GRAPHS = {path.name: json.loads(path.read_text()) for path in sorted(EXAMPLES.glob("*.json"))}
ATTR_NAMES = sorted({name for d in OPS.values() for name in d.attr_names})


# --- running the CLI and checking what it promises ----------------------------------------------

_SUMMARY = re.compile(r"^tests:(\d+) passed:(\d+) skipped:\d+ failed:(\d+)$", re.M)
_CASE = re.compile(r"^(\d+):(PASSED|FAILED \((.*)\)) __REPRO: (.*)$", re.M)


@dataclass
class Outcome:
    """One invocation: exit code, output, and (unless a usage error) its cases."""

    code: int
    output: str
    passed: list[str]  # repro commands of the passed cases
    failed: list[str]  # reasons of the failed cases


def invoke(args: list[str], perf: bool = False) -> Outcome:
    """Run the CLI in-process and check the promises every invocation must keep."""
    result = CliRunner().invoke(main, args)
    out = result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exc_info)
    assert result.exit_code in (0, 1, 2), (args, out)
    if currently_in_test_context():
        event(f"exit {result.exit_code}")  # shown by --hypothesis-show-statistics
    assert "Traceback" not in out and "internal error" not in out, (args, out)
    if result.exit_code == 2:
        assert "Error:" in out, (args, out)
        return Outcome(2, out, [], [])
    summary = _SUMMARY.search(out)
    assert summary, (args, out)
    total, passed, failed = map(int, summary.groups())
    cases = _CASE.findall(out)
    reasons = [m[2] for m in cases if m[1] != "PASSED"]
    repros = [m[3] for m in cases if m[1] == "PASSED"]
    if perf:  # passed cases print perf lines instead (def, csv or perf,...; the csv header is not a case)
        repros = [line for line in out.splitlines() if line.startswith("perf,") and "min_ms" not in line]
    assert (total, passed, failed) == (len(repros) + len(reasons), len(repros), len(reasons)), (args, out)
    assert result.exit_code == (1 if failed else 0), (args, out)
    return Outcome(result.exit_code, out, repros, reasons)


def parses(driver: Driver, options: dict[str, str]) -> bool:
    """Whether every driver option value is valid (else the CLI must exit 2)."""
    try:
        for name, value in options.items():
            driver.knobs[name].check(value)
    except ValueError:
        return False
    return True


# --- strategies: values, option strings, graph documents, descriptors ---------------------------

HUGE = st.sampled_from([2**31, 10**12, 2**62, 2**63, 2**64, -(2**63), 10**30])
SMALL = st.integers(-2, 6)
INTS = st.one_of(SMALL, SMALL, SMALL, HUGE)
IDS = st.one_of(st.integers(0, 2), st.integers(0, 2), st.integers(0, 5))  # tensor and op ids, mostly in the graph
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=12)
JSON_VALUES = st.recursive(st.none() | st.booleans() | INTS | st.floats() | TEXT,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=3),
                           max_leaves=8)


def _garbage(draw: st.DrawFn, alphabet: str) -> str | None:
    """One time in five, random text (any, or from the option's own alphabet); else None."""
    return draw(st.one_of(TEXT, st.text(alphabet, max_size=24))) if draw(st.integers(0, 4)) == 0 else None


def _shape_text(draw: st.DrawFn) -> str:
    dims = draw(st.lists(st.one_of(st.integers(0, 5), st.integers(0, 5), HUGE.filter(lambda v: v > 0)), max_size=6))
    return "x".join(map(str, dims)) if dims else draw(st.sampled_from(["-", "0", ""]))


@st.composite
def in_shapes(draw: st.DrawFn) -> str:
    """``--in-shapes`` values: ID:SHAPE[*TAG] and ID:TAG items, or garbage."""
    if (text := _garbage(draw, "0123456789x:+*-abcdez")) is not None:
        return text
    items = []
    for _ in range(draw(st.integers(1, 2))):
        shape = _shape_text(draw)
        rank = shape.count("x") + 1 if shape not in ("-", "") else 0
        tag = "".join(draw(st.permutations("abcdef"[:draw(st.integers(max(rank - 1, 0), rank + 1))])))
        spec = draw(st.sampled_from([shape, f"{shape}*{tag}", tag]))
        items.append(f"{draw(IDS)}:{spec}")
    return "+".join(items)


@st.composite
def op_attrs(draw: st.DrawFn) -> str:
    """``--op-attrs`` values: OPID:NAME:VALUE[*NAME:VALUE][+...], names and values valid or not."""
    if (text := _garbage(draw, "0123456789x:+*_abdginprst")) is not None:
        return text
    ops = []
    for _ in range(draw(st.integers(1, 2))):
        assignments = []
        for _ in range(draw(st.integers(1, 3))):
            name = draw(st.one_of(st.sampled_from(ATTR_NAMES), TEXT.filter(lambda t: ":" not in t)))
            value = draw(st.one_of(st.builds(lambda v: "x".join(map(str, v)), st.lists(INTS, max_size=4)),
                                   st.sampled_from(["SAME_UPPER", "same_lower", "VALID", "NXC", "NCX", "OIX",
                                                    "XIO", "IOX", "XOI", "none", "0", "1", "2", ""]), TEXT))
            assignments.append(f"{name}:{value}")
        ops.append(f"{draw(IDS)}:{'*'.join(assignments)}")
    return "+".join(ops)


def _mostly(valid: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Three times in four a value from ``valid``, else random text."""
    return st.one_of(valid, valid, valid, TEXT)


MB = _mostly(st.one_of(st.integers(0, 3).map(str), HUGE.map(str)))
DT = _mostly(st.sampled_from(["f32", "bf16", "f16", "0:f16", "1:bf16+0:bf16", "9:f32", "f64", "s32", "0:"]))


@st.composite
def graph_options(draw: st.DrawFn) -> dict[str, str]:
    """Some of --in-shapes, --op-attrs, --mb, --dt with random values."""
    strategies = {"in-shapes": in_shapes(), "op-attrs": op_attrs(), "mb": MB, "dt": DT}
    names = draw(st.lists(st.sampled_from(sorted(strategies)), unique=True, max_size=3))
    return {name: draw(strategies[name]) for name in names}


def _nodes(node: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) pair of a JSON document."""
    keys = node.keys() if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else ()
    return [pair for key in keys for pair in [(node, key), *_nodes(node[key])]]


def _tensors(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for op in doc["graph"] for t in (*op["inputs"], *op["outputs"])]


def _mutate_field(draw: st.DrawFn, doc: dict[str, Any]) -> None:
    """Drop, rename or replace (with a random JSON value) any field or list item."""
    container, key = draw(st.sampled_from(_nodes(doc)))
    action = draw(st.sampled_from(["drop", "rename", "replace"]))
    value = container.pop(key) if action != "replace" else None
    if action == "rename" and isinstance(container, dict):
        container[draw(TEXT)] = value
    elif action == "replace":
        container[key] = draw(JSON_VALUES)


def _mutate_attr(draw: st.DrawFn, doc: dict[str, Any]) -> None:
    """A random attribute (name, declared type, value), valid or not."""
    op = draw(st.sampled_from(doc["graph"]))
    lists = [a["value"] for a in op["attrs"].values() if isinstance(a, dict) and isinstance(a.get("value"), list)
             and a["value"]]
    if lists and draw(st.booleans()):  # one entry of a list attribute
        values = draw(st.sampled_from(lists))
        values[draw(st.integers(0, len(values) - 1))] = draw(INTS)
        return
    kind = draw(st.sampled_from(["s64", "s64[]", "string", "f32", "f32[]", "bool", "s32[]"]))
    value = draw(st.one_of(st.lists(INTS, max_size=4), INTS, st.sampled_from(["SAME_UPPER", "valid", "NCX", "XIO"]),
                           JSON_VALUES))
    op["attrs"][draw(st.one_of(st.sampled_from(ATTR_NAMES), TEXT))] = {"type": kind, "value": value}


def _mutate_tensor(draw: st.DrawFn, doc: dict[str, Any]) -> None:
    """A random shape, stride (overlapping, negative, short) or dtype of one tensor."""
    tensor = draw(st.sampled_from(_tensors(doc)))
    field = draw(st.sampled_from(["shape", "stride", "entry", "entry", "dtype", "layout_type", "id"]))
    if field in ("shape", "stride"):
        tensor[field] = draw(st.lists(INTS, max_size=6))
    elif field == "entry":  # one size or stride changed: more often gets past reading, into planning and running
        values = draw(st.sampled_from([v for v in (tensor.get("shape"), tensor.get("stride")) if v] or [[0]]))
        values[draw(st.integers(0, len(values) - 1))] = draw(INTS)
    elif field == "dtype":
        tensor[field] = draw(st.sampled_from([*TENSOR_DTYPES, "s8", "u8", "f8_e4m3", ""]))
    elif field == "layout_type":
        tensor[field] = draw(st.sampled_from(["strided", "any", "undef", "opaque"]))
    else:
        tensor[field] = draw(st.sampled_from([t.get("id") for t in _tensors(doc)] + [99, -1]))


def _mutate_inputs(draw: st.DrawFn, doc: dict[str, Any]) -> None:
    """Wrong input counts: drop an input, repeat one, or add an extra tensor."""
    op = draw(st.sampled_from(doc["graph"]))
    action = draw(st.sampled_from(["drop", "repeat", "extra", "outputs"]))
    if action == "drop" and op["inputs"]:
        op["inputs"].pop(draw(st.integers(0, len(op["inputs"]) - 1)))
    elif action == "repeat" and op["inputs"]:
        op["inputs"].append(copy.deepcopy(draw(st.sampled_from(op["inputs"]))))
    elif action == "extra":
        op["inputs"].append({"id": 77, "dtype": "f32", "shape": draw(st.lists(st.integers(1, 4), max_size=5))})
    else:
        op["outputs"].append(copy.deepcopy(op["outputs"][0]))


def _mutate_kind(draw: st.DrawFn, doc: dict[str, Any]) -> None:
    """Another op kind of the family, or an unknown one."""
    op = draw(st.sampled_from(doc["graph"]))
    op["kind"] = draw(st.one_of(st.sampled_from([*OPS, "ReLU", "MatMul", "convolution", ""]), TEXT))


def _mutate_topology(draw: st.DrawFn, doc: dict[str, Any]) -> None:
    """Duplicate op ids, a tensor produced twice, or a cycle (an op reading a later op's output)."""
    ops = doc["graph"]
    action = draw(st.sampled_from(["duplicate op", "same id", "same output", "cycle"]))
    if action == "duplicate op":
        ops.append(copy.deepcopy(draw(st.sampled_from(ops))))
    elif action == "same id":
        ops[-1]["id"] = ops[0].get("id")   # an earlier mutation may have removed it
    elif action == "same output":
        ops[-1]["outputs"][0]["id"] = ops[0]["outputs"][0].get("id")
    elif ops[0]["inputs"]:
        ops[0]["inputs"][0]["id"] = ops[-1]["outputs"][0].get("id")


MUTATIONS: list[Callable[[st.DrawFn, dict[str, Any]], None]] = [
    _mutate_field, _mutate_attr, _mutate_tensor, _mutate_tensor, _mutate_inputs, _mutate_kind, _mutate_topology]


@st.composite
def graph_documents(draw: st.DrawFn) -> tuple[str, int]:
    """(file text, number of mutations): an example, mutated 0-3 times; or bytes-like garbage."""
    name = draw(st.sampled_from(sorted(GRAPHS)))
    doc = copy.deepcopy(GRAPHS[name])
    count = draw(st.integers(0, 3))
    for _ in range(count):
        if isinstance(doc, dict) and isinstance(doc.get("graph"), list) and doc["graph"] and all(
                isinstance(op, dict) and isinstance(op.get("attrs"), dict) and isinstance(op.get("inputs"), list)
                and isinstance(op.get("outputs"), list) and op["outputs"] and all(isinstance(t, dict) for t in
                                                                                    (*op["inputs"], *op["outputs"]))
                for op in doc["graph"]):
            draw(st.sampled_from(MUTATIONS))(draw, doc)
        else:
            _mutate_field(draw, {"doc": doc})
    text = json.dumps(doc)
    if draw(st.integers(0, 5)) == 0:  # truncated JSON
        return text[:draw(st.integers(0, len(text) - 1))], 1
    return text, count


@st.composite
def descriptors(draw: st.DrawFn) -> str:
    """benchdnn conv descriptors: tiny sizes on 1-3 spatial axes (sometimes absurd values or
    inconsistent axes), in any order, with or without ``_`` and a name; or garbage."""
    if (text := _garbage(draw, "0123456789_gmbicdhwoksp\"n")) is not None:
        return text
    ranges = {"g": (0, 2), "mb": (0, 2), "ic": (0, 4), "oc": (1, 4), "k": (1, 3), "i": (1, 7), "o": (1, 7),
              "s": (0, 3), "p": (0, 2), "d": (0, 1)}
    ranges = {key: (max(low, 1), high) if low == 0 and draw(st.integers(0, 9)) else (low, high)  # zeros rarely
              for key, (low, high) in ranges.items()}
    axes = "dhw"[3 - draw(st.integers(1, 3)):]
    odd = draw(st.integers(0, 4)) == 0  # fields on any axis, absurd values more often
    keys = ["g", "mb", "ic", "oc", *(f"{p}{a}" for p in "iokspd" for a in ("dhw" if odd else axes))]
    fields = []
    for key in keys:
        if key in ("ic", "oc") or (key[0] in "ik" and not odd) or draw(st.integers(0, 2)) == 0:
            low, high = ranges[key if key in ranges else key[0]]
            value = draw(st.integers(low, high)) if draw(st.integers(0, 29 if not odd else 2)) else draw(HUGE) % 10**13
            fields.append(f"{key}{abs(value)}")
    text = draw(st.sampled_from(["", "_"])).join(draw(st.permutations(fields)))
    return text + draw(st.sampled_from(["", 'n"fuzz"', "n", 'n"[/x] $\\x$"', "n1x1"]))


# --- the tests ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli-fuzz")


@fuzz(60)
@given(document=graph_documents(), options=graph_options())
def test_graph_files(workdir: Path, document: tuple[str, int], options: dict[str, str]) -> None:
    """A mutated graph file with random rewrites: a documented exit code, failures name the file."""
    text, mutations = document
    case = workdir / "case.json"
    case.write_text(text)
    outcome = invoke(["graph", "--seed=1", *(f"--{k}={v}" for k, v in options.items()), f"--case={case}"])
    assert (outcome.code == 2) == (not parses(GRAPH, options)), outcome.output
    for reason in outcome.failed:
        assert reason.startswith(str(case)), outcome.output
    if not mutations and not options:
        assert outcome.code == 0, outcome.output


@fuzz(30)
@given(data=st.binary(max_size=64))
def test_graph_file_bytes(workdir: Path, data: bytes) -> None:
    """Random bytes as a graph file (or a batch file): one failed case that names the file."""
    path = workdir / "bytes.json"
    path.write_bytes(data)
    outcome = invoke(["graph", f"--case={path}"])
    assert outcome.code == 1 and outcome.failed[0].startswith(str(path)), outcome.output
    path = workdir / "bytes.batch"
    path.write_bytes(data)
    outcome = invoke(["graph", f"--batch={path}", f"--case={EXAMPLES / 'conv_fwd_nxc_f32.json'}"])
    assert len(outcome.passed) >= 1 and all(str(path) in r for r in outcome.failed), outcome.output


@fuzz(60)
@given(options=graph_options(), name=st.sampled_from(sorted(GRAPHS)))
def test_graph_options(options: dict[str, str], name: str) -> None:
    """Random and garbage --in-shapes/--op-attrs/--mb/--dt on a valid file: exit 2 exactly when an
    option does not parse; a rewrite the graph cannot take fails naming the file and the option."""
    case = EXAMPLES / name
    outcome = invoke(["graph", "--seed=2", *(f"--{k}={v}" for k, v in options.items()), f"--case={case}"])
    assert (outcome.code == 2) == (not parses(GRAPH, options)), outcome.output
    if outcome.code == 2:
        assert any(f"--{k}" in outcome.output for k in options), outcome.output
    for reason in outcome.failed:
        assert reason.startswith(f"{case}: "), outcome.output


CONV_OPTIONS = st.fixed_dictionaries({}, optional={
    "dir": _mostly(st.sampled_from([*DIRECTIONS, "bwd_d", "BWD_WB"])),
    "dt": _mostly(st.sampled_from(["f32", "bf16", "f16", "f64"])),
    "tag": _mostly(st.sampled_from(["nxc", "ncx", "NCX", "abcd"])), "mb": MB})


@fuzz(80)
@given(descs=st.lists(descriptors(), min_size=1, max_size=3), options=CONV_OPTIONS)
def test_conv_descriptors(descs: list[str], options: dict[str, str]) -> None:
    """Random descriptors and options: exit 2 exactly when an option is bad; failures name the
    descriptor; every descriptor is a counted case."""
    outcome = invoke(["conv", "--seed=3", *(f"--{k}={v}" for k, v in options.items()), "--", *descs])
    assert (outcome.code == 2) == (not parses(CONV, options)), outcome.output
    if outcome.code != 2:
        assert len(outcome.passed) + len(outcome.failed) == len(descs)
        assert all(any(printable(shorten(d, MAX_NAME_CHARS)) in r for d in descs) for r in outcome.failed), outcome.output


@fuzz(15)
@given(descs=st.lists(descriptors(), min_size=1, max_size=2),
       template=st.one_of(st.sampled_from(["def", "csv", "perf,%name%,%Gops%", "%nope%"]),
                          TEXT.filter(lambda t: "%" not in t)))
def test_conv_performance_mode(descs: list[str], template: str) -> None:
    """P mode: perf lines for passing cases, FAILED lines for the others; a bad template exits 2."""
    try:
        check_template(template)
    except ValueError:
        valid = False
    else:
        valid = True
    args = ["conv", "--mode=P", "--fix-times-per-prb=1", f"--perf-template={template}", "--", *descs]
    outcome = invoke(args, perf=True)
    assert (outcome.code == 2) == (not valid), outcome.output


def _batch_line(draw: st.DrawFn, driver: Driver) -> tuple[str, bool]:
    """One batch line and whether it is a known-good case."""
    good = "--reset --case=good.json" if driver is GRAPH else "--reset ic2ih4oc2oh4kh3ph1"
    options = draw(graph_options()) if driver is GRAPH else draw(CONV_OPTIONS)
    choices = [
        (good, True),
        (" ".join(shlex.quote(f"--{k}={v}") for k, v in options.items()), False),
        ("--case=missing.json" if driver is GRAPH else "--batch=missing", False),
        ("--batch=missing.batch", False), ("--batch=main.batch", False), ("--batch=nested.batch", False),
        ("--case=bad.json" if driver is GRAPH else draw(descriptors()), False),
        ('--dt="f32', False), ("# a comment", False), ("", False), ("--unknown=1 --reset", False),
        (draw(TEXT), False)]
    return draw(st.sampled_from(choices))


@fuzz(40)
@given(data=st.data(), driver=st.sampled_from([GRAPH, CONV]), bad=graph_documents())
def test_batch_files(workdir: Path, data: st.DataObject, driver: Driver, bad: tuple[str, int]) -> None:
    """Batches mixing good and bad lines, nested, missing and self-including batch files: every
    good line still runs and passes; every failure names a batch file and line."""
    folder = workdir / "batch"
    folder.mkdir(exist_ok=True)
    (folder / "good.json").write_text(json.dumps(GRAPHS["conv_fwd_nxc_f32.json"]))
    (folder / "bad.json").write_text(bad[0])
    lines = {name: [_batch_line(data.draw, driver) for _ in range(data.draw(st.integers(0, 6)))]
             for name in ("main.batch", "nested.batch")}
    for name, content in lines.items():
        (folder / name).write_text("\n".join(line for line, _ in content) + "\n")
    outcome = invoke([driver.name, "--seed=4", f"--batch={folder / 'main.batch'}"])
    good = sum(is_good for _, is_good in lines["main.batch"])
    if outcome.code == 2:  # only options, comments and blank lines
        assert good == 0 and "nothing to run" in outcome.output, outcome.output
        return
    assert len(outcome.passed) >= good, outcome.output
    for reason in outcome.failed:
        assert re.match(rf"{re.escape(str(folder))}/(main|nested)\.batch:\d+: ", reason), (reason, outcome.output)


_NASTY = [
    ["graph", "--batch={tmp}/bytes.batch", f"--case={EXAMPLES / 'conv_fwd_nxc_f32.json'}"],
    ["graph", "--case={tmp}/deep.json", "--case={tmp}/[bold]x[red].json", "--mb=100000000000"],
    ["conv", "--mode=P", "--fix-times-per-prb=1", "--plot={tmp}/no/such/folder.png", "ic1ih1oc1kh1"],
    ["conv", "--dir=BWD_W", 'ic2ih4oc2kh3n"[/x] $\\frac$"', "ic2ih100000000000oc2kh3", "g3ic4ih4oc4kh3"],
    ["graph", "--in-shapes=0:2x2x2x2x2x2x2x2", "--op-attrs=0:strides:0", "--case={tmp}/missing.json"],
]


@pytest.mark.parametrize("args", _NASTY, ids=lambda a: a[0] + ":" + a[-1].rsplit("/", 1)[-1][:20])
def test_subprocess_exit_codes(tmp_path: Path, args: list[str]) -> None:
    """A real process: exit code 0, 1 or 2 and no traceback on either stream."""
    (tmp_path / "bytes.batch").write_bytes(b"\xff\xfe--case=a.json\n")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    (tmp_path / "[bold]x[red].json").write_text(json.dumps(GRAPHS["conv_fwd_nxc_f32.json"]))
    result = subprocess.run([sys.executable, "-m", "convgrad", *(a.format(tmp=tmp_path) for a in args)],
                            capture_output=True, text=True, timeout=120, check=False,
                            env=subprocess_env())
    assert result.returncode in (0, 1, 2), result
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    if result.returncode != 2:
        assert _SUMMARY.search(result.stdout), result.stdout


_FWD = EXAMPLES / "conv_fwd_nxc_f32.json"
_BWD_FILTERS = EXAMPLES / "backprop_filters_ncx_f16_1d.json"
#: Defects the fuzzing found, as (arguments, text the output must hold, exit code).
FOUND = [
    (["graph", "--batch={tmp}/bytes.batch"], "bytes.batch:1: byte 1 (0xff) is not UTF-8 text", 1),
    (["graph", "--case={tmp}/bytes.json"], "bytes.json: line 1, byte 1 (0xff) is not UTF-8 text: expected a JSON file",
     1),
    (["graph", "--case=/dev/zero", "--batch=/dev/zero"], "/dev/zero (not a regular file (a character device))", 1),
    (["graph", "--case={tmp}/deep.json"], "deep.json: not usable JSON (maximum recursion depth", 1),
    (["graph", "--case={tmp}/digits.json"], "digits.json: not usable JSON (Exceeds the limit", 1),
    (["graph", "--mb=100000000", f"--case={_FWD}"], f"{_FWD}: the case needs 876 GiB of memory", 1),
    (["conv", "ic1ih5oc1kh3ph9999999999sh9999999999"], "sizes beyond int64 cannot be allocated", 1),
    (["graph", "--in-shapes=0:0x9223372036854775808x14x8", f"--case={_FWD}"], "sizes beyond int64 cannot be allocated", 1),
    (["graph", "--op-attrs=0:groups:3", f"--case={_FWD}"], f"({_FWD}: op 0 'conv_fwd' (Convolution)", 1),
    (["graph", "--dt=0:bf16", f"--case={_FWD}"], "op 0 'conv_fwd' (Convolution): Convolution: input 'weights' has", 1),
    (["graph", "--in-shapes=1:-", f"--case={_BWD_FILTERS}"],
     "inputs {'input_forward': [3, 4, 17], 'output_delta': []}", 1),
    (["graph", "--op-attrs=0:groups:0", f"--case={EXAMPLES / 'conv_bwd_weights_nxc_bf16_shape_input.json'}"],
     "attribute 'groups' = 0: expected a positive integer", 1),
    (["graph", "--op-attrs=1:weights_format:", f"--case={EXAMPLES / 'training_step_ncx_grouped_f32.json'}"],
     "attribute 'weights_format' = '': expected one of 'OIX', 'XIO'", 1),
    (["graph", "--case={tmp}/int_dst_shape.json"], "attribute 'dst_shape' = 1 (int): expected", 1),
    (["graph", "--case={tmp}/no_inputs.json"], "input 'input_forward' is required but was not given", 1),
    (["graph", "--case={tmp}/s32_output.json"], "output tensor 2 has dtype s32: expected one of f32", 1),
    (["conv", 'ic2ih4oc2kh3n"[/x]"'], "tests:1 passed:1 skipped:0 failed:0", 0),
    (["conv", "--mode=P", "--fix-times-per-prb=1", "--plot={tmp}/a.png", 'ic2ih4oc2kh3n"$\\x$"'], "plot: ", 0),
    (["conv", "--mode=P", "--plot={tmp}/missing/a.png", "ic2ih4oc2kh3"], "does not exist or is not writable", 2),
    (["graph", "--batch={tmp}/missing.batch"], "missing.batch (No such file or directory)) __REPRO: convgrad graph --mode=C --engine=", 1),
    (["graph", "--mb=²", f"--case={_FWD}"], "--mb: '²': expected a non-negative integer", 2),
    (["conv", "--dir=bwd_w", "--dt=BF16", "--tag=NCX", "ic2ih4oc2kh3"], "0:PASSED", 0),
]


@pytest.mark.parametrize("args, expected, code", FOUND, ids=[" ".join(a[0:2])[:40] for a, _, _ in FOUND])
def test_found_by_fuzzing(tmp_path: Path, args: list[str], expected: str, code: int) -> None:
    """Each defect the fuzzing found, fixed: the exit code and a message that says where and why."""
    (tmp_path / "bytes.batch").write_bytes(b"\xff\xfe--case=a.json\n")
    (tmp_path / "bytes.json").write_bytes(b"\xff{")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    (tmp_path / "digits.json").write_text('{"graph": ' + "9" * 5000 + "}")
    (tmp_path / "no_inputs.json").write_text(json.dumps(
        {"graph": [{**GRAPHS[_BWD_FILTERS.name]["graph"][0], "inputs": []}]}))
    op = GRAPHS["conv_bwd_data_ncx_channels_last_f32.json"]["graph"][0]
    (tmp_path / "int_dst_shape.json").write_text(json.dumps(
        {"graph": [{**op, "attrs": {**op["attrs"], "dst_shape": {"type": "s64", "value": 1}}}]}))
    op = GRAPHS[_BWD_FILTERS.name]["graph"][0]
    (tmp_path / "s32_output.json").write_text(json.dumps({"graph": [{**op, "outputs": [{**op["outputs"][0],
                                                                                        "dtype": "s32"}]}]}))
    outcome = invoke([a.format(tmp=tmp_path) for a in args], perf="--mode=P" in args)
    assert outcome.code == code and expected in outcome.output, outcome.output


# --- hostile files and tokens for both commands (issue 25) -------------------------------------

HOSTILE = st.one_of(
    st.text(max_size=12),  # any character: controls, lone surrogates, separators, format characters
    st.sampled_from(["\x1b]0;pwned\x07\x1b[2J", "\ud800", "$(touch pwned)", "`touch pwned`", ";touch pwned", "'", '"',
                     "\\", "\ufeff", "\u202e", "9" * 30, "9" * 5000, "-1", str(2**70), "#", "--reset", "", "a b"]))
HOSTILE_JSON = st.recursive(
    st.none() | st.booleans() | INTS | st.sampled_from([2**64, 2**70, -(2**70)]) | st.floats() | HOSTILE,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(HOSTILE, inner, max_size=3), max_leaves=8)
_UNSAFE = ("Cc", "Cf", "Cs")  # categories that must never be printed raw (newlines end lines)


@st.composite
def hostile_documents(draw: st.DrawFn) -> str:
    """An example graph with 1-4 fields (any field, at any depth) replaced by random JSON values,
    or keys replaced by random text."""
    doc = copy.deepcopy(GRAPHS[draw(st.sampled_from(sorted(GRAPHS)))])
    for _ in range(draw(st.integers(1, 4))):
        nodes = _nodes(doc)
        if not nodes:
            break
        container, key = draw(st.sampled_from(nodes))
        if isinstance(container, dict) and draw(st.booleans()):
            container[draw(HOSTILE)] = container.pop(key)
        else:
            container[key] = draw(HOSTILE_JSON)
    return json.dumps(doc, ensure_ascii=draw(st.booleans()))


def _hostile_line(draw: st.DrawFn, driver: Driver) -> bytes:
    """A batch line: hostile option tokens (quoted or not), random text or bytes, or a good case."""
    knob = st.sampled_from([*driver.knobs, "batch", "case" if driver is GRAPH else "reset"])
    token = st.one_of(st.builds(lambda k, v: f"--{k}={v}", knob, HOSTILE), HOSTILE)
    line = draw(st.one_of(
        st.lists(token, max_size=3).map(lambda ts: " ".join(shlex.quote(t) for t in ts)),
        st.lists(token, max_size=3).map(" ".join),
        st.just("--reset --case=good.json" if driver is GRAPH else "--reset ic2ih4oc2kh3"),
        st.just("--batch=hostile.batch")))
    data = line.encode("utf-8", "surrogatepass" if draw(st.booleans()) else "replace")  # surrogatepass: not UTF-8
    return draw(st.one_of(st.just(data), st.binary(max_size=24)))


@fuzz(25)
@given(data=st.data(), driver=st.sampled_from([GRAPH, CONV]), document=hostile_documents())
def test_hostile_inputs(workdir: Path, data: st.DataObject, driver: Driver, document: str) -> None:
    """Both commands on hostile files (random JSON values in any field of a case file, random
    bytes and tokens in a batch file that may include itself) and hostile option values and
    arguments: a documented exit code, no traceback, nothing unprintable printed raw, every repro a
    command that bash runs as one convgrad command and nothing else, in bounded time."""
    folder = workdir / "hostile"
    folder.mkdir(exist_ok=True)
    (folder / "good.json").write_text(json.dumps(GRAPHS["conv_fwd_nxc_f32.json"]))
    (folder / "case.json").write_text(document, encoding="utf-8", errors="surrogatepass")
    lines = [_hostile_line(data.draw, driver) for _ in range(data.draw(st.integers(0, 5)))]
    (folder / "hostile.batch").write_bytes(b"\n".join(lines) + b"\n")
    options = [f"--{name}={data.draw(HOSTILE)}" for name in data.draw(st.lists(st.sampled_from(sorted(driver.knobs)),
                                                                               max_size=2, unique=True))]
    targets = ([f"--case={folder / 'case.json'}", f"--case={data.draw(HOSTILE)}"] if driver is GRAPH
               else ["--", *data.draw(st.lists(st.one_of(descriptors(), HOSTILE, HOSTILE.map(
                   lambda name: f'ic2ih4oc2kh3n"{name}"')), min_size=1, max_size=2))])
    start = time.perf_counter()
    outcome = invoke([driver.name, "--seed=6", *options, f"--batch={folder / 'hostile.batch'}", *targets])
    assert time.perf_counter() - start < 60
    raw = [c for c in outcome.output if c != "\n" and unicodedata.category(c) in _UNSAFE]
    assert not raw, (raw, outcome.output)
    repros = [m[3] for m in _CASE.findall(outcome.output)]
    paste = folder / "paste"
    paste.mkdir(exist_ok=True)
    script = 'convgrad() { printf "%s\\n" "$1"; }; ' + "".join(f"{r}\n" for r in repros)
    pasted = subprocess.run(["bash", "-c", script], capture_output=True, cwd=paste, timeout=30, check=False)
    assert pasted.returncode == 0 and pasted.stdout.decode().split() == [driver.name] * len(repros), repros
    assert not any(paste.iterdir()), repros  # pasting the repros ran nothing
