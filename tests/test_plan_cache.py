"""The plan cache, the tuner and ``convgrad tune`` (engine v3: plans measured on this machine)."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import convgrad as cg
from convgrad.cli import main
from convgrad.dtypes import DATA_DTYPES
from convgrad.engines.fast import Features, Plan, candidates, default_plan, plan_cache, select, tune
from convgrad.engines.fast.plan import forced
from convgrad.problem import ConvGeometry

GEOMETRY = ConvGeometry(2, 1, 16, 24, (9, 10), (9, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1))


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty cache directory and a process state that has read nothing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CONVGRAD_PLANS", raising=False)
    monkeypatch.delenv("CONVGRAD_AUTOTUNE", raising=False)
    plan_cache._loaded.clear()
    plan_cache._warned.clear()
    yield tmp_path / "cache" / "convgrad" / "plans.json"
    plan_cache._loaded.clear()
    plan_cache._warned.clear()


def features(task: str = "backward_data", dtype: str = "f32", channels_first: bool = False,
             g: ConvGeometry = GEOMETRY) -> Features:
    return Features.of(g, task, DATA_DTYPES[dtype], channels_first)


def other_plan(f: Features) -> Plan:
    """A candidate plan of ``f`` that is not its default (the problem has several)."""
    plans = [p for p in candidates(f) if p != default_plan(f)]
    assert plans, f"no second candidate for {f}"
    return plans[0]


def test_cache_file_honours_xdg_cache_home(fresh_cache: Path) -> None:
    assert plan_cache.cache_file() == fresh_cache


def test_round_trip_in_this_and_a_new_process(fresh_cache: Path) -> None:
    f = features()
    plan = other_plan(f)
    assert plan_cache.lookup(f) is None
    assert select(f) == default_plan(f)
    plan_cache.store(f, plan, 1.5, 2.0)
    assert plan_cache.lookup(f) == plan and select(f) == plan
    data = json.loads(fresh_cache.read_text())
    (slot,) = data["machines"].values()
    assert slot["plans"][f.key()]["plan"] == plan.to_json() and slot["plans"][f.key()]["ms"] == 1.5
    code = ("from convgrad.engines.fast import Features, plan_cache, Plan; from convgrad.problem import ConvGeometry;"
            "import numpy as np, json, sys;"
            f"g = ConvGeometry(*{(GEOMETRY.n, GEOMETRY.groups, GEOMETRY.ic, GEOMETRY.oc)}, {GEOMETRY.in_size},"
            f"{GEOMETRY.out_size}, {GEOMETRY.kernel}, {GEOMETRY.strides}, {GEOMETRY.dilations}, {GEOMETRY.pads_begin},"
            f"{GEOMETRY.pads_end}); f = Features.of(g, 'backward_data', np.dtype('float32'), False, shared={f.shared});"
            "print(json.dumps(plan_cache.lookup(f).to_json()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy(),
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert Plan.from_json(json.loads(out.stdout)) == plan


def test_other_problems_keep_the_default() -> None:
    f = features()
    plan_cache.store(f, other_plan(f))
    for g in (features("backward_weights"), features(dtype="bf16"), features(channels_first=True),
              features(g=replace(GEOMETRY, n=3))):
        assert plan_cache.lookup(g) is None and select(g) == default_plan(g)


def test_plans_off_and_a_named_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_cache: Path) -> None:
    f = features()
    plan = other_plan(f)
    plan_cache.store(f, plan)
    monkeypatch.setenv("CONVGRAD_PLANS", "off")
    assert plan_cache.lookup(f) is None and select(f) == default_plan(f)
    tuned = tune.tune(features("backward_weights"), min_runs=1, block_seconds=0.001, pause=0)
    assert tuned.chosen is not None and len(plan_cache.entries()) == 1  # measured, not stored
    named = tmp_path / "elsewhere" / "mine.json"
    monkeypatch.setenv("CONVGRAD_PLANS", str(named))
    assert plan_cache.cache_file() == named and plan_cache.lookup(f) is None
    plan_cache.store(f, plan)
    assert named.is_file() and plan_cache.lookup(f) == plan


@pytest.mark.parametrize("content", [b"\x00\xffnot json", b'{"format": "convgrad-plans", "version": 1, "mach',
                                     b"[1, 2, 3]", b'{"format": "convgrad-plans", "version": 99, "machines": {}}',
                                     b'{"format": "convgrad-plans", "version": 1, "machines": {"x": 5}}',
                                     b"[" * 100_000])
def test_a_corrupt_file_is_ignored_with_one_warning(fresh_cache: Path, content: bytes) -> None:
    fresh_cache.parent.mkdir(parents=True)
    fresh_cache.write_bytes(content)
    f = features()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert plan_cache.lookup(f) is None and select(f) == default_plan(f)
        x = np.random.default_rng(1).standard_normal((2, 9, 10, 16), np.float32)
        w = np.random.default_rng(2).standard_normal((3, 3, 16, 24), np.float32)
        y = cg.convolution(x, w, strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1])
    assert y.shape == (2, 9, 10, 24)
    messages = [w for w in caught if issubclass(w.category, plan_cache.PlanCacheWarning)]
    assert len(messages) == 1 and str(fresh_cache) in str(messages[0].message)
    plan = other_plan(f)
    plan_cache.store(f, plan)           # tuning rewrites it
    assert plan_cache.lookup(f) == plan


def test_an_entry_that_is_not_a_plan_is_ignored(fresh_cache: Path) -> None:
    f = features()
    plan_cache.store(f, other_plan(f))
    data = json.loads(fresh_cache.read_text())
    (slot,) = data["machines"].values()
    slot["plans"][f.key()]["plan"] = {"strategy": "no such strategy", "params": {}}
    fresh_cache.write_text(json.dumps(data))
    with pytest.warns(plan_cache.PlanCacheWarning, match="not a plan"):
        assert plan_cache.lookup(f) is None
    assert select(f) == default_plan(f)


def test_a_foreign_machine_key_is_never_used(fresh_cache: Path) -> None:
    f = features()
    plan = other_plan(f)
    info = plan_cache.machine()
    for change in ({"cpu": "Some Other CPU"}, {"features": ["avx2"] if "avx512f" in info["features"] else
                                               ["avx512f"]}, {"convgrad": "0.0.1"}, {"threads": info["threads"] + 7},
                   {"family": "portable"}):
        foreign = {**info, **change}
        data = {"format": "convgrad-plans", "version": 1,
                "machines": {plan_cache.machine_key(foreign): {**foreign, "plans": {f.key(): {"plan": plan.to_json()}}}}}
        fresh_cache.parent.mkdir(parents=True, exist_ok=True)
        fresh_cache.write_text(json.dumps(data))
        assert plan_cache.lookup(f) is None, change
        (entry,) = plan_cache.entries()
        assert not entry.current and entry.plan == plan


@pytest.mark.parametrize("value, on", [("", True), ("on", True), ("1", True), ("/some/file.json", True),
                                       ("off", False), ("0", False), ("false", False), ("no", False),
                                       (" OFF ", False), ("False", False)])
def test_convgrad_plans_turns_the_cache_off(value: str, on: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVGRAD_PLANS", value)
    assert plan_cache.enabled() is on


def test_the_file_and_its_entries_written_out(fresh_cache: Path) -> None:
    """The file's structure key for key (sorted keys, one slot per machine), and ``entries()``:
    every field, this machine's first whatever the keys' order, a slot without ``plans`` and an
    entry that is not an object (listed with no plan, after one warning)."""
    f1, f2 = features(), features("backward_weights")
    info = plan_cache.machine()
    here = plan_cache.machine_key(info)
    foreign = {**info, "cpu": "0 Foreign CPU"}  # its key sorts before this machine's
    there = plan_cache.machine_key(foreign)
    fresh_cache.parent.mkdir(parents=True)
    fresh_cache.write_text(json.dumps({"format": "convgrad-plans", "version": 1, "machines": {
        here: dict(info),  # this machine's slot, without "plans" yet
        there: {**foreign, "plans": {"p2": {"plan": other_plan(f1).to_json(), "ms": 3.0}, "p1": 7}}}}))
    plan_cache.store(f1, other_plan(f1), 1.5, 2.0)
    plan_cache.store(f2, default_plan(f2))
    text = fresh_cache.read_text(encoding="utf-8")
    data = json.loads(text)
    assert text == json.dumps(data, indent=1, sort_keys=True)
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00"
    mine = data["machines"][here]
    assert set(mine) == set(info) | {"plans"} and all(mine[k] == v for k, v in info.items())
    assert mine["plans"][f1.key()].keys() == {"plan", "ms", "default_ms", "tuned"}
    assert mine["plans"][f1.key()]["default_ms"] == 2.0 and re.fullmatch(stamp, mine["plans"][f1.key()]["tuned"])
    assert mine["plans"][f2.key()]["ms"] is None and mine["plans"][f2.key()]["default_ms"] is None
    with pytest.warns(plan_cache.PlanCacheWarning, match="an entry is not a plan .*expected an object, got int"):
        listed = plan_cache.entries()
    assert [(e.machine, e.problem, e.current) for e in listed] == sorted([(here, f1.key(), True),
                                                                           (here, f2.key(), True)]) + [
        (there, "p1", False), (there, "p2", False)]
    by_problem = {e.problem: e for e in listed}
    assert (by_problem[f1.key()].plan, by_problem[f1.key()].ms, by_problem[f1.key()].default_ms) == (other_plan(f1),
                                                                                                      1.5, 2.0)
    assert by_problem[f1.key()].tuned == mine["plans"][f1.key()]["tuned"]
    assert (by_problem["p1"].plan, by_problem["p1"].ms, by_problem["p1"].tuned) == (None, None, "")
    assert (by_problem["p2"].plan, by_problem["p2"].ms, by_problem["p2"].default_ms) == (other_plan(f1), 3.0, None)


def test_an_unreadable_file_is_named_with_its_error(fresh_cache: Path) -> None:
    fresh_cache.parent.mkdir(parents=True)
    fresh_cache.write_bytes(b'{"format": ')
    with pytest.warns(plan_cache.PlanCacheWarning) as caught:
        assert plan_cache.lookup(features()) is None
    assert str(caught[0].message).startswith(f"plan cache {fresh_cache}: cannot be read (JSONDecodeError: Expecting "
                                              "value: line 1 column 12 (char 11)); ignored")


def _store_many(path: str, first: int, count: int) -> None:
    os.environ["CONVGRAD_PLANS"] = path
    for n in range(first, first + count):
        g = replace(GEOMETRY, n=n)
        f = Features.of(g, "backward_data", np.dtype(np.float32), False)
        plan_cache.store(f, default_plan(f), float(n))


def test_two_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.json")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_store_many, args=(path, 1 + 20 * j, 20)) for j in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    data = json.loads(Path(path).read_text())
    (slot,) = data["machines"].values()
    assert len(slot["plans"]) == 40
    assert sorted(e["ms"] for e in slot["plans"].values()) == [float(n) for n in range(1, 41)]
    assert not list(tmp_path.glob("*.tmp"))


def test_tune_times_every_candidate_and_stores_the_winner() -> None:
    f = features()
    tuned = tune.tune(f, min_runs=2, block_seconds=0.01, pause=0)
    assert [t.plan for t in tuned.timings][0] == default_plan(f)
    assert {t.plan for t in tuned.timings} == set(candidates(f)) | {default_plan(f)}
    assert all(t.runs >= 2 and t.median_ms > 0 for t in tuned.timings)
    best = min(tuned.timings, key=lambda t: t.median_ms)
    assert tuned.chosen in (best.plan, tuned.default)
    assert plan_cache.lookup(f) == tuned.chosen
    kept = tune.tune(f, min_runs=2, block_seconds=0.01, pause=0, margin=1.0)  # nothing beats it by 100%
    assert kept.chosen == kept.default and plan_cache.lookup(f) == kept.default


def test_tune_times_each_call_in_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a context, every timed call of a candidate comes right after a call of each context
    problem, and those run on their own plans (not the candidate's)."""
    f, other = features("backward_data"), features("backward_weights")
    calls: list[tuple[str, object]] = []
    run = tune._run

    def record(problem, g, arrays):
        calls.append((problem.task, forced()))
        run(problem, g, arrays)

    monkeypatch.setattr(tune, "_run", record)
    tuned = tune.tune(f, min_runs=2, block_seconds=0.0, pause=0, context=[other], store=False)
    timed = sum(t.runs for t in tuned.timings)
    assert [task for task, _ in calls].count("backward_weights") == timed
    for i, (task, plan) in enumerate(calls):
        if task == "backward_weights":
            assert plan is None and calls[i + 1][0] == "backward_data" and calls[i + 1][1] is not None
    assert calls[0][0] == "backward_data"                   # the warm-up call of the first plan


def test_tune_scores_plans_round_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round times every plan (the order rotated by one each round), and a plan's score is
    its time over the default's in the same rounds: a slow spell of the host during the first
    calls (the default's, in the first round) does not choose a plan no faster than the default,
    and a plan 1.5x faster in every round is chosen with a score of 2/3."""
    f = features()
    plans = list(dict.fromkeys([default_plan(f), *candidates(f)]))
    assert len(plans) >= 2
    clock, order = [0.0], []
    cost = {p: 1.0 for p in plans}

    def fake_run(problem, g, arrays):
        plan = forced()
        order.append(plan)
        clock[0] += cost.get(plan, 1.0) * (10.0 if len(order) <= len(plans) + 2 else 1.0)  # warm-ups, then a spell

    monkeypatch.setattr(tune, "_run", fake_run)
    monkeypatch.setattr(tune.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(tune.time, "sleep", lambda s: None)
    timed = tune.measure(plans, f, (None, None), min_runs=tune.ROUNDS, block_seconds=0.0)
    rounds = [order[len(plans) + r * len(plans):len(plans) + (r + 1) * len(plans)] for r in range(tune.ROUNDS)]
    assert all(sorted(map(str, r)) == sorted(map(str, plans)) for r in rounds)
    assert [r[0] for r in rounds] == [plans[r % len(plans)] for r in range(tune.ROUNDS)]
    assert [t.score for t in timed] == [1.0] * len(plans)
    assert tune.tune(f, store=False, min_runs=tune.ROUNDS, block_seconds=0.0).chosen == default_plan(f)
    cost[plans[1]] = 2 / 3
    tuned = tune.tune(f, store=False, min_runs=tune.ROUNDS, block_seconds=0.0)
    assert tuned.chosen == plans[1] and tuned.timing(plans[1]).score == pytest.approx(2 / 3)
    assert tuned.speedup == pytest.approx(1.5)


def test_confirm_keeps_or_reverts_a_changed_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan chosen by :func:`tune.tune` is timed against the default again: kept (and cached)
    while it still wins, reverted to the default (cached) once it loses; the default needs no
    second look."""
    f = features()
    plans = list(dict.fromkeys([default_plan(f), *candidates(f)]))
    clock, cost = [0.0], {p: 1.0 for p in plans}
    cost[plans[1]] = 0.5

    def fake_run(problem, g, arrays):
        clock[0] += cost.get(forced(), 1.0)

    monkeypatch.setattr(tune, "_run", fake_run)
    monkeypatch.setattr(tune.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(tune.time, "sleep", lambda s: None)
    tuned = tune.tune(f, min_runs=tune.ROUNDS, block_seconds=0.0)
    assert tuned.chosen == plans[1] and plan_cache.lookup(f) == plans[1]
    kept = tune.confirm(tuned, min_runs=tune.ROUNDS, block_seconds=0.0)
    assert kept.chosen == plans[1] and kept.timing(plans[1]).score == pytest.approx(0.5)
    cost[plans[1]] = 1.2                                           # beside its neighbours' new plans, slower
    reverted = tune.confirm(tuned, min_runs=tune.ROUNDS, block_seconds=0.0)
    assert reverted.chosen == default_plan(f) and plan_cache.lookup(f) == default_plan(f)
    assert reverted.timing(plans[1]).score == pytest.approx(1.2) and reverted.speedup == 1.0
    assert tune.confirm(reverted) is reverted


def test_autotune_tunes_a_new_problem_at_its_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVGRAD_AUTOTUNE", "1")
    f = features("backward_weights")
    assert plan_cache.entries() == []
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 9, 10, 16), np.float32)
    dy = rng.standard_normal((2, 9, 10, 24), np.float32)
    dw = cg.convolution_backward_weights(x, dy, [3, 3, 16, 24], strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1])
    ref = cg.convolution_backward_weights(x, dy, [3, 3, 16, 24], strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1],
                                          engine="reference")
    np.testing.assert_allclose(dw, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert plan_cache.lookup(f) is not None
    assert [e.problem for e in plan_cache.entries()] == [f.key()]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``convgrad tune ARGS`` in this process (click's runner: exit code, stdout and stderr apart;
    an exception escaping the command fails the test): its plans compile once with this file's
    other tests, not again in a new Python per call (2-3 s each just to start and import)."""
    result = CliRunner().invoke(main, ["tune", *args], catch_exceptions=False)
    return subprocess.CompletedProcess(["convgrad", "tune", *args], result.exit_code, result.stdout, result.stderr)


def _cli_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m convgrad tune ARGS`` in a new process."""
    return subprocess.run([sys.executable, "-m", "convgrad", "tune", *args], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=300)


def test_convgrad_tune_shapes_show_and_clear(tmp_path: Path, fresh_cache: Path) -> None:
    shapes = tmp_path / "shapes"
    shapes.write_text('# two layers\nmb2ic16ih10oc24oh10kh3ph1n"a"\n\nmb2ic8ih7oc8oh7kh1ph0n"b:1x1"  # comment\n')
    out = _cli(f"--shapes={shapes}", "--dir=BWD_D", "--block-ms=5")   # one direction: 58 s cold for two
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(":TUNED ") == 2 and "Traceback" not in out.stderr
    assert str(fresh_cache) in out.stdout
    data = json.loads(fresh_cache.read_text())
    (slot,) = data["machines"].values()
    assert len(slot["plans"]) == 2
    show = _cli_process("--show")                       # the command, and the file, in a new process
    assert show.returncode == 0 and "2 plans for it" in show.stdout and "Traceback" not in show.stderr
    cleared = _cli("--clear")
    assert cleared.returncode == 0 and "removed 2 plans" in cleared.stdout
    assert "0 plans for it" in _cli("--show").stdout


def test_convgrad_tune_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("--dir=BWD_D\nmb2ic16ih10oc24oh10kh3ph1n\"ok\"\nic0oc4\n")
    out = _cli(f"--shapes={bad}", "--dir=BWD_D", "--block-ms=5")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"{bad}:1:" in out.stdout and "give options on its command line" in out.stdout
    assert f"{bad}:3:" in out.stdout and out.stdout.count(":TUNED ") == 1
    for args in (("--dir=SIDEWAYS", "ic4ih4oc4oh4kh1"), ("--dt=f8", "ic4ih4oc4oh4kh1"), ()):
        usage = _cli(*args)
        assert usage.returncode == 2 and "Traceback" not in usage.stderr, args
    missing = _cli(f"--shapes={tmp_path / 'none'}")
    assert missing.returncode == 1 and "no such file" in missing.stdout.lower()
    hostile = tmp_path / "hostile"
    hostile.write_text('ic4ih4oc4oh4kh1n"\x1b]0;pwned\x07"\n')
    out = _cli(f"--shapes={hostile}", "--dir=BWD_D", "--block-ms=5")
    assert out.returncode == 0 and "\x1b" not in out.stdout + out.stderr and "\\x1b]0;pwned" in out.stdout


def test_autotune_context_is_the_previous_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """An autotuned problem is timed after the process's previous problem (its neighbour)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 9, 10, 16), np.float32)
    dy = rng.standard_normal((2, 9, 10, 24), np.float32)
    cg.convolution_backward_weights(x, dy, [3, 3, 16, 24], strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1])
    assert tune._previous == [features("backward_weights")]
    seen: list[tuple] = []
    monkeypatch.setattr(tune, "tune", lambda f, **kw: seen.append(tuple(kw["context"])) or tune.Tuned(
        f, (tune.Timing(default_plan(f), 1.0, 1.0, 1),), default_plan(f), default_plan(f)))
    monkeypatch.setenv("CONVGRAD_AUTOTUNE", "1")
    tune.autotuned(features("backward_data"))
    assert seen == [(features("backward_weights"),)]


def test_a_file_written_elsewhere_is_seen_within_the_poll_time(fresh_cache: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm call stats the cache file at most every POLL_SECONDS (this process's own writes at
    once): another process's rewrite is taken after that time, not before."""
    monkeypatch.setattr(plan_cache, "POLL_SECONDS", 3600.0)
    plan_cache._polls.clear()
    f = features()
    plan = other_plan(f)
    before = plan_cache.state()
    plan_cache.store(f, plan, 1.5, 2.0)                  # this process: seen at once
    written = plan_cache.state()
    assert written != before and written[0][1] is not None
    data = fresh_cache.read_bytes()
    fresh_cache.write_bytes(data + b"\n")                # "another process" rewrites it (size changes)
    assert plan_cache.state() == written                 # within the poll time: the stamp seen last
    plan_cache._polls.clear()                            # the poll time over
    assert plan_cache.state()[0][2] == len(data) + 1
