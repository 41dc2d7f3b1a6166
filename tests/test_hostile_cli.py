"""``convgrad graph`` and ``convgrad conv`` under hostile files and command lines (issue 25): repros
that cannot run anything when pasted, untrusted text printed escaped, no traceback, and time and
memory that grow linearly with the input (limits in docs/cli-guarantees.md).

Each input is generated here, small; bounds on time are generous (the quadratic behaviour they
guard against took minutes to hours on these inputs)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from convgrad.batch import MAX_INCLUDE_DEPTH
from convgrad.cli import DEFAULT_MAX_CASES, main
from convgrad.driver import GRAPH, Result
from convgrad.graph import GraphError, parse_graph
from convgrad.graph import model as graph_model
from convgrad.graph.plan import _order
from convgrad.report import MAX_TABLE_ROWS, Summary
from convgrad.untrusted import MAX_DIGITS, MAX_LINE_CHARS, MAX_TOKEN_CHARS, printable, shell_join, split_line

from reliability_support import fuzz_settings as fuzz

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^tests:(\d+) passed:(\d+) skipped:\d+ failed:(\d+)$", re.M)
CASE = re.compile(r"^(\d+):(PASSED|FAILED \((.*)\)) __REPRO: (.*)$", re.M)
DESCRIPTOR = "ic2ih4oc2kh3"  # a tiny case that passes


def relu_graph(n: int = 1, name: str = "relu", shape: list[int] | None = None) -> dict:
    """A chain of ``n`` ReLU ops on a small tensor (ids: op i reads tensor i, writes i + 1)."""
    shape = shape or [2, 3]
    tensor = {"dtype": "f32", "shape": shape, "stride": [], "layout_type": "strided"}
    return {"graph": [{"id": i, "name": name, "kind": "ReLU", "attrs": {}, "inputs": [{**tensor, "id": i}],
                       "outputs": [{**tensor, "id": i + 1}]} for i in range(n)]}


def write_graph(path: Path, document: dict) -> Path:
    path.write_text(json.dumps(document))
    return path


def run(*args: str, seconds: float = 60) -> tuple[int, str]:
    """The CLI in-process: exit code and output, after the checks every run must pass: a documented
    exit code, no exception, no traceback, no raw control character, in bounded time."""
    start = time.perf_counter()
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code in (0, 1, 2), result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    raw = [c for c in result.output if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs")]
    assert not raw, (raw, result.output)
    assert time.perf_counter() - start < seconds, args
    return result.exit_code, result.output


def subprocess_run(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """A real ``python -m convgrad`` (its real stdout encoding, both streams as bytes)."""
    return subprocess.run([sys.executable, "-m", "convgrad", *args], capture_output=True, timeout=timeout,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **env})


def counts(out: str) -> tuple[int, int, int]:
    match = SUMMARY.search(out)
    assert match, out
    return tuple(map(int, match.groups()))


def bash_words(command: str, cwd: Path) -> list[str]:
    """The words bash passes to ``convgrad`` when ``command`` is pasted (convgrad: a function that
    prints its arguments)."""
    script = 'convgrad() { printf "%s\\0" "$@"; }; ' + command
    result = subprocess.run(["bash", "-c", script], capture_output=True, cwd=cwd, timeout=30, check=True)
    return os.fsdecode(result.stdout).split("\0")[:-1]


# --- 1. repros quote every word ------------------------------------------------------------------

def test_repro_quotes_every_word(tmp_path: Path) -> None:
    """Unparsable values (command substitutions, ``;``, backquotes) and a case file whose name has
    spaces and ``$``: pasted into bash, each repro gives convgrad exactly its words and runs nothing."""
    case = write_graph(tmp_path / "a $(touch pwned0) b.json", relu_graph())
    tokens = ["--mb=$(touch pwned1)", "--dt=f32;touch pwned2", "--in-shapes=0:`touch pwned3`"]
    batch = tmp_path / "hostile.batch"
    batch.write_text("--mb=$(touch pwned4)\n--dt=f32;id\n" + "".join(shlex.quote(t) + "\n" for t in tokens)
                     + f"--case={shlex.quote(case.name)}\n")
    code, out = run("graph", "--seed=5", f"--batch={batch}")
    assert code == 1 and counts(out) == (6, 1, 5), out
    repros = [m[3] for m in CASE.findall(out)]
    offending = ["--mb=$(touch", "--dt=f32;id", *tokens, f"--case={case}"]
    for repro, token in zip(repros, offending, strict=True):
        words = bash_words(repro, tmp_path)
        assert words[:4] == ["graph", "--mode=C", "--engine=fast", words[3]] and words[-1] == token, (repro, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([case.name, batch.name])  # nothing ran


def test_shell_join_round_trips() -> None:
    """Every word, printable or not (escapes, a lone surrogate, a raw byte of a file name), comes
    back from bash as itself; the quoted text holds no control character."""
    words = ["plain", "", "a b", "it's", "$(id)", "`id`", ";id", "\x1b]0;pwned\x07\x1b[2J", "tab\there", "\u202e",
             "caf\u00e9", "\U0001f600", "x\udcffy", "\\n"]
    command = shell_join(words)
    assert printable(command) == command
    assert bash_words("convgrad " + command, ROOT) == [os.fsdecode(os.fsencode(w)) for w in words]


# --- 2, 3. untrusted text reaches the terminal escaped; lone surrogates do not crash -----------

def test_terminal_escapes_are_escaped(tmp_path: Path) -> None:
    """Escape sequences in an op name, an op kind, a file name, a descriptor name, a perf template
    and an option value: printed escaped (on both streams of a real process, also when piped), never raw."""
    title = "\x1b]0;pwned\x07\x1b[2J"
    bad_name = relu_graph(name=title)
    bad_name["graph"][0]["attrs"] = {"alpha": {"type": "f32", "value": 1.0}}  # ReLU has none: fails naming the op
    bad_kind = relu_graph()
    bad_kind["graph"][0]["kind"] = title
    paths = [write_graph(tmp_path / "name.json", bad_name), write_graph(tmp_path / "kind.json", bad_kind),
             write_graph(tmp_path / f"file{title}.json", relu_graph())]
    result = subprocess_run("graph", *(f"--case={p}" for p in paths))  # a real process: both real streams
    out = result.stdout + result.stderr
    assert result.returncode == 1 and b"\x1b" not in out and b"\x07" not in out and b"Traceback" not in out, out
    assert out.count(rb"\x1b]0;pwned\x07\x1b[2J") >= 4, out  # the op name, the kind, the file (line and table)
    timed = ["conv", "--mode=P", "--fix-times-per-prb=1"]
    for args, code in [(["conv", f'{DESCRIPTOR}n"{title}"'], 0),
                       ([*timed, "--perf-template=csv", f'{DESCRIPTOR}n"{title}"'], 0),
                       ([*timed, f"--perf-template=%name%{title}", DESCRIPTOR], 0),
                       (["graph", f"--mb={title}", f"--case={paths[0]}"], 2)]:
        code_got, out_text = run(*args)  # no raw control character (checked by run)
        assert code_got == code and "\\x1b]0;pwned\\x07\\x1b[2J" in out_text, out_text


def test_lone_surrogate_names_do_not_end_the_batch(tmp_path: Path) -> None:
    """An op name and an attribute key "\\ud800" (valid JSON): the case fails naming them, escaped;
    the lines after it run."""
    document = relu_graph(name="\ud800")
    document["graph"][0]["attrs"] = {"\ud800": {"type": "s64", "value": 1}}
    write_graph(tmp_path / "surrogate.json", document)
    write_graph(tmp_path / "good.json", relu_graph())
    batch = tmp_path / "cases.batch"
    batch.write_text("--case=surrogate.json\n--case=good.json\n--case=good.json\n")
    result = subprocess_run("graph", f"--batch={batch}")
    out = result.stdout.decode()
    assert result.returncode == 1 and b"Traceback" not in result.stderr, result
    assert counts(out) == (3, 2, 1) and "op 0 '\\ud800' (ReLU)" in out and "'\\ud800'" in out, out


def test_terminal_that_cannot_show_a_name() -> None:
    """A name the terminal's encoding (latin-1) cannot show is written escaped, not a traceback."""
    result = subprocess_run("conv", f'{DESCRIPTOR}n"caf\u00e9 \U0001f600"', PYTHONIOENCODING="latin-1")
    assert result.returncode == 0 and b"Traceback" not in result.stderr, result
    assert "café \\U0001f600".encode("latin-1") in result.stdout, result.stdout


# --- 4. include chains ------------------------------------------------------------------------------

def test_include_chain_is_cut_at_the_depth_limit(tmp_path: Path) -> None:
    """500 batch files, each including the next: one failed case naming the file nested too deep."""
    for i in range(500):
        (tmp_path / f"{i}.batch").write_text(f"--batch={i + 1}.batch\n" if i < 499 else f"{DESCRIPTOR}\n")
    code, out = run("conv", f"--batch={tmp_path / '0.batch'}")
    assert code == 1 and counts(out) == (1, 0, 1), out
    assert (f"batch file {tmp_path}/{MAX_INCLUDE_DEPTH}.batch is nested {MAX_INCLUDE_DEPTH + 1} levels deep: "
            f"expected at most {MAX_INCLUDE_DEPTH}") in out, out


@pytest.mark.parametrize("driver", ["conv", "graph"])
def test_a_nested_batch_name_with_a_nul_byte_is_a_failed_case(tmp_path: Path, driver: str) -> None:
    """A batch file naming ``--batch=<NUL>`` (a name no file can have): one failed case naming the
    error, the other lines still run; no traceback (found by test_fuzz_cli's hypothesis run)."""
    batch = tmp_path / "hostile.batch"
    batch.write_bytes(b"--batch=\x00\n" + (DESCRIPTOR.encode() + b"\n" if driver == "conv" else b""))
    graph = write_graph(tmp_path / "g.json", relu_graph())
    code, out = run(driver, f"--batch={batch}", *([f"--case={graph}"] if driver == "graph" else []))
    assert code == 1 and "cannot read batch file " in out and "\\x00 (embedded null byte)" in out, out
    assert counts(out)[1] == 1, out  # the good case still passed


# --- 5. op ordering ---------------------------------------------------------------------------------

def _old_order(graph) -> list[int] | None:
    """The ordering rule, written plainly (quadratic): rounds of ready ops in file order."""
    producers = graph.producers()
    done, order, pending = set(), [], list(graph.ops)
    while pending:
        ready = [op for op in pending if all(t.id not in producers or t.id in done for t in op.inputs)]
        if not ready:
            return None
        order += [op.id for op in ready]
        done |= {op.outputs[0].id for op in ready}
        pending = [op for op in pending if op not in ready]
    return order


@fuzz(60)
@given(edges=st.lists(st.lists(st.integers(0, 7), max_size=3), min_size=1, max_size=8), data=st.data())
def test_order_is_the_rounds_rule(edges: list[list[int]], data: st.DataObject) -> None:
    """On random graphs (any op may read any op's output, so also cycles and self-loops): the same
    order as the plain rule, or a cycle error in both."""
    n = len(edges)
    ops = [{"id": 10 + i, "kind": "ReLU", "inputs": [{"id": 100 + (j % n), "dtype": "f32", "shape": [1]}
                                                     for j in reads] + [{"id": i, "dtype": "f32", "shape": [1]}],
            "outputs": [{"id": 100 + i, "dtype": "f32", "shape": [1]}]} for i, reads in enumerate(edges)]
    graph = parse_graph({"graph": data.draw(st.permutations(ops))}, "g.json")
    expected = _old_order(graph)
    if expected is None:
        with pytest.raises(GraphError, match="form a cycle"):
            _order(graph)
    else:
        assert [op.id for op in _order(graph)] == expected


def test_order_is_linear() -> None:
    """20,000 ops in reverse file order (the quadratic sort: minutes) order in well under seconds,
    and a 2,000-op cycle's message stays short."""
    document = relu_graph(20_000)
    document["graph"].reverse()
    graph = parse_graph(document, "chain.json")
    start = time.perf_counter()
    order = _order(graph)
    assert time.perf_counter() - start < 5
    assert [op.id for op in order] == list(range(20_000))
    cycle = relu_graph(2_000)
    cycle["graph"][0]["inputs"][0]["id"] = 2_000
    with pytest.raises(GraphError, match="form a cycle") as info:
        _order(parse_graph(cycle, "cycle.json"))
    assert len(str(info.value)) < 200


# --- 6. lines, words and numbers ------------------------------------------------------------------

@fuzz(200)
@given(st.text(st.sampled_from("ab '\"\\\t\r#\xa0$\x0b"), max_size=16))
def test_split_line_is_shlex(line: str) -> None:
    """The linear splitter gives shlex.split's words, or its error."""
    try:
        expected: object = shlex.split(line)
    except ValueError as exc:
        expected = str(exc)
    try:
        got: object = split_line(line)
    except ValueError as exc:
        got = str(exc)
    assert got == expected


def test_split_line_is_linear() -> None:
    """Lines of a million characters of each kind of word (shlex: 27 s for one 1 MB word) split in
    well under seconds each."""
    for line in ("a" * 10**6, "a " * 500_000, '"' + "a" * 10**6 + '"', "'" + "a" * 10**6 + "'", "\\a" * 500_000,
                 '"' + "\\a" * 500_000 + '"'):
        start = time.perf_counter()
        split_line(line)
        assert time.perf_counter() - start < 5, line[:10]


def test_long_lines_words_and_numbers(tmp_path: Path) -> None:
    """A 1 MB line, a 20,000-character word, a 30-digit --mb: each fails its own line naming the
    limit; the next line runs."""
    batch = tmp_path / "long.batch"
    lines = ["--mb=" + "1" * 10**6, "--case=" + "a" * 20_000, "--mb=" + "9" * 30, DESCRIPTOR]
    batch.write_text("\n".join(lines) + "\n")
    code, out = run("conv", f"--batch={batch}", seconds=30)
    assert code == 1 and counts(out) == (4, 1, 3), out
    assert f"{batch}:1: a line of 1000005 characters: expected at most {MAX_LINE_CHARS}" in out
    assert f"{batch}:2: '--case=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa... (19967 more characters)': a word of 20007 " \
           f"characters: expected at most {MAX_TOKEN_CHARS}" in out
    assert f"{batch}:3: --mb: --mb: a number of 30 digits" in out and f"expected at most {MAX_DIGITS} digits" in out
    assert max(len(line) for line in out.splitlines()) < 3000  # long text is cut


@pytest.mark.parametrize("args, expected, code", [
    (["conv", "ic" + "9" * 5000 + "ih4oc2kh3"], "'ic': a number of 5000 digits", 1),
    (["conv", "--mb=" + "9" * 5000, DESCRIPTOR], "--mb: a number of 5000 digits", 2),
    (["graph", "--in-shapes=0:" + "9" * 5000, "--case=x.json"], "tensor 0: a number of 5000 digits", 2),
    (["graph", "--op-attrs=" + "9" * 5000 + ":groups:1", "--case=x.json"], "id: a number of 5000 digits", 2),
    (["graph", "--op-attrs=0:groups:" + "9" * 5000, f"--case={ROOT / 'examples' / 'conv_fwd_nxc_f32.json'}"],
     "attribute 'groups' = '99999", 1),
])
def test_numbers_with_many_digits(tmp_path: Path, args: list[str], expected: str, code: int) -> None:
    """Numbers longer than Python's 4300-digit limit: named errors, never Python's own message."""
    case = write_graph(tmp_path / "x.json", relu_graph())
    code_got, out = run(*(a.format(case=case) for a in args))
    assert code_got == code and expected in out, out
    assert "int_max_str_digits" not in out and "Exceeds the limit" not in out, out


# --- 7. large batches: streamed, summarized, counted before running -------------------------------

def test_summary_keeps_few_rows() -> None:
    """10,000 results: the table holds the failures only, at most MAX_TABLE_ROWS of them."""
    summary = Summary("C", 10_000)
    for index in range(10_000):
        result = Result(index, GRAPH.reader().case("x.json", {}, "t"), "prb", "repro")
        result.reason = "bad" if index % 3 == 0 else ""
        summary.add(result)
    assert len(summary.rows) == MAX_TABLE_ROWS and all("FAILED" in row[3] for row in summary.rows)
    assert summary.line() == "tests:10000 passed:6666 skipped:0 failed:3334"


def test_large_batch_is_summarized(tmp_path: Path) -> None:
    """3,000 failing lines and a passing one: every line printed, the table lists only failures."""
    batch = tmp_path / "many.batch"
    batch.write_text("--case=missing.json\n" * 3_000 + "--case=good.json\n")
    write_graph(tmp_path / "good.json", relu_graph())
    code, out = run("graph", f"--batch={batch}")
    assert code == 1 and counts(out) == (3_001, 1, 3_000), out
    assert len(re.findall(r"^│ \d+ ", out, re.M)) == MAX_TABLE_ROWS, out[-5000:]
    assert "only failed ones are listed here" in out.replace("\n", " ").replace("  ", " ") or "failed ones" in out


def test_case_count_is_checked_before_running(tmp_path: Path) -> None:
    """20 levels of two-line batch files (a million cases): refused at once with the count; 3 levels
    (8 cases) run only with --max-cases of at least 8."""
    for level in range(20):
        line = f"--batch=level{level + 1}.batch" if level < 19 else DESCRIPTOR
        (tmp_path / f"level{level}.batch").write_text(f"{line}\n{line}\n")
    code, out = run("conv", f"--batch={tmp_path / 'level0.batch'}", seconds=20)
    assert code == 2 and f"hold 1,048,576 cases: expected at most {DEFAULT_MAX_CASES:,}" in out, out
    small = tmp_path / "small"
    small.mkdir()
    for level in range(3):
        line = f"--batch=level{level + 1}.batch" if level < 2 else DESCRIPTOR
        (small / f"level{level}.batch").write_text(f"{line}\n{line}\n")
    code, out = run("conv", "--max-cases=7", f"--batch={small / 'level0.batch'}")
    assert code == 2 and "hold 8 cases: expected at most 7 (--max-cases=N runs more)" in out, out
    code, out = run("conv", "--max-cases=8", f"--batch={small / 'level0.batch'}")
    assert code == 0 and counts(out) == (8, 8, 0), out


# --- 8. timing options --------------------------------------------------------------------------------

@pytest.mark.parametrize("option", ["--max-ms-per-prb=inf", "--max-ms-per-prb=1e308", "--max-ms-per-prb=nan",
                                    "--max-ms-per-prb=-1", "--fix-times-per-prb=1000000000000"])
def test_timing_options_out_of_range(option: str) -> None:
    code, out = run("conv", "--mode=P", option, DESCRIPTOR)
    assert code == 2 and option.split("=")[0] in out and "Error" in out, out


# --- smaller items ----------------------------------------------------------------------------------

def test_fifo_is_refused(tmp_path: Path) -> None:
    """A FIFO as --case and as --batch (nobody writes to it): refused without opening it for reading."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    result = subprocess_run("graph", f"--case={fifo}", f"--batch={fifo}", timeout=60)
    out = result.stdout.decode()
    assert result.returncode == 1 and counts(out) == (2, 0, 2), out
    assert out.count("not a regular file (a FIFO)") == 2, out


def test_non_utf8_line_fails_alone_and_bom_is_skipped(tmp_path: Path) -> None:
    """A byte that is not UTF-8 fails its line (named, with the byte); the other lines run, the
    first one after a UTF-8 BOM too."""
    batch = tmp_path / "mixed.batch"
    batch.write_bytes(b"\xef\xbb\xbf" + DESCRIPTOR.encode() + b"\r\nic2ih4\xffoc2kh3\n" + DESCRIPTOR.encode() + b"\n")
    code, out = run("conv", f"--batch={batch}")
    assert code == 1 and counts(out) == (3, 2, 1), out
    assert f"{batch}:2: byte 7 (0xff) is not UTF-8 text" in out, out


def test_long_values_are_cut(tmp_path: Path) -> None:
    """A 200,000-entry shape with a bad entry: the failure names the field, its line stays short."""
    document = relu_graph(shape=[1] * 199_999 + [-5])
    code, out = run("graph", f"--case={write_graph(tmp_path / 'long.json', document)}")
    assert code == 1 and "graph[0] (op 0 'relu').inputs[0].shape: = [1, 1, 1" in out, out
    assert max(len(line) for line in out.splitlines()) < 1000, out[:2000]


@pytest.mark.parametrize("change, expected", [
    (lambda g: g["graph"][1]["inputs"][0].update(shape=[3, 5]),
     "op 1 'relu'.inputs[0]: tensor 1 is declared f32 [3, 5] here and f32 [2, 3] by op 0 'relu'.outputs[0]"),
    (lambda g: g["graph"][1]["inputs"][0].update(dtype="bf16"), "tensor 1 is declared bf16 [2, 3] here and f32"),
    (lambda g: g["graph"][1]["inputs"].append({"id": 0, "dtype": "f32", "shape": [2, 4]}),
     "op 1 'relu'.inputs[1]: tensor 0 is declared f32 [2, 4] here and f32 [2, 3] by op 0 'relu'.inputs[0]"),
    (lambda g: g["graph"][0]["inputs"][0].update(id=2**70),
     "(op 0 'relu').inputs[0].id: = 1180591620717411303424: expected 0 to 2^64 - 1 (a size_t)"),
    (lambda g: g["graph"][1]["outputs"][0].update(id=-1), ".outputs[0].id: = -1: expected 0 to 2^64 - 1"),
    (lambda g: g["graph"][1].update(id=2**64), "graph[1].id: = 18446744073709551616: expected 0 to 2^64 - 1"),
    (lambda g: g["graph"][1].update(id=0), "graph[1].id: op id 0 is already the id of graph[0]"),
])
def test_tensor_declarations_and_ids(tmp_path: Path, change, expected: str) -> None:
    """A tensor id declared with two shapes or dtypes, ids beyond size_t, duplicate op ids."""
    document = relu_graph(2)
    change(document)
    code, out = run("graph", f"--case={write_graph(tmp_path / 'g.json', document)}")
    assert code == 1 and expected in out, out


def test_op_count_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_model, "MAX_OPS", 5)
    code, out = run("graph", f"--case={write_graph(tmp_path / 'g.json', relu_graph(6))}")
    assert code == 1 and "g.json: graph: has 6 ops: expected at most 5" in out, out
    code, out = run("graph", f"--case={write_graph(tmp_path / 'g.json', relu_graph(5))}")
    assert code == 0, out


def test_limits_are_documented() -> None:
    """docs/cli-guarantees.md states each limit with the value the code uses."""
    from convgrad import cli, report
    from convgrad.batch import MAX_FILE_BYTES
    from convgrad.graph.model import MAX_OPS

    text = (ROOT / "docs" / "cli-guarantees.md").read_text()
    for value in (MAX_LINE_CHARS, MAX_TOKEN_CHARS, DEFAULT_MAX_CASES, MAX_OPS, report.MAX_TABLE_ROWS,
                  report.MAX_PLOT_BARS, report.MAX_REASON_CHARS, cli.MAX_TIMES_PER_PRB, int(cli.MAX_MS_PER_PRB)):
        assert f"{value:,}" in text, value
    assert f"{MAX_DIGITS} digits" in text and f"{MAX_INCLUDE_DEPTH} levels" in text
    assert f"{MAX_FILE_BYTES // 2**20} MiB" in text
