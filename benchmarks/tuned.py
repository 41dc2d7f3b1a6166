"""Tune a suite with the plan cache and check the outcome: ``convgrad tune``'s time, and each
layer's default plan against its tuned plan, timed again in sequence (each call right after a
call of the layers beside it in the list, on their tuned plans) in alternating rounds
(:func:`convgrad.engines.fast.tune.measure`).

    python benchmarks/tuned.py                          # ResNet-50, both gradients, f32, mb 16
    python benchmarks/tuned.py --suite 3d_unet --dtype f32 bf16 --output benchmarks/TUNED.md

The tuned plans go to a fresh cache file (``--cache``, default a temporary one), so the user's
own cache is neither read nor changed. Writes ``benchmarks/TUNED.md`` (``--output``): the CPU,
its kernel family, the tuning time, and per layer and gradient the default and tuned plans with
their medians; "tuned / default" above 1 would mean tuning made a layer slower.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import DEFAULT_MB, SUITES, load_suite  # noqa: E402

TASKS = {"bwd_d": "backward_data", "bwd_w": "backward_weights", "fwd": "forward"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=list(SUITES), default="resnet_50")
    parser.add_argument("--task", nargs="+", choices=list(TASKS), default=["bwd_d", "bwd_w"])
    parser.add_argument("--dtype", nargs="+", choices=["f32", "bf16", "f16"], default=["f32"])
    parser.add_argument("--mb", type=int, help="minibatch (default: the suite's, 16 or 1)")
    parser.add_argument("--runs", type=int, default=10, help="timed calls per plan in the check (at least)")
    parser.add_argument("--block-ms", type=float, default=200.0, help="tuning time per plan (as convgrad tune)")
    parser.add_argument("--cache", type=Path, help="plan cache file to fill (default: a temporary one)")
    parser.add_argument("--output", type=Path, default=HERE / "TUNED.md")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    cache = args.cache or Path(tempfile.mkdtemp(prefix="convgrad-plans-")) / "plans.json"
    os.environ["CONVGRAD_PLANS"] = str(cache)
    import numpy as np

    from convgrad.dtypes import DATA_DTYPES
    from convgrad.engines.fast import Features, isa, plan_cache, tune
    from convgrad.tune_command import describe_plan

    descs = load_suite(args.suite, args.mb or DEFAULT_MB[args.suite], False)
    problems = [(d, task, dt) for d in descs for task in args.task for dt in args.dtype]
    start = time.perf_counter()
    tuned = []
    for d, task, dt in problems:
        f = Features.of(d, TASKS[task], DATA_DTYPES[dt], False)
        tuned.append((d, task, dt, tune.tune(f, block_seconds=args.block_ms / 1e3)))
        print(f"tuned {d.name} {task} {dt}: {describe_plan(tuned[-1][3].chosen)}", flush=True)
    for i, (d, task, dt, t) in enumerate(tuned):  # as convgrad tune: each changed plan beside its neighbours' plans
        around = [tuned[j][3].features for j in (i - 1, i + 1) if 0 <= j < len(tuned)]
        tuned[i] = (d, task, dt, tune.confirm(t, block_seconds=args.block_ms / 1e3, context=around))
        if tuned[i][3].chosen != t.chosen:
            print(f"reverted {d.name} {task} {dt}: {describe_plan(t.chosen)}", flush=True)
    tuning_s = time.perf_counter() - start

    rows = []
    for i, (d, task, dt, t) in enumerate(tuned):
        f = t.features
        rng = np.random.default_rng(0)
        arrays = tune.inputs(f, rng)
        around = tuple((o.features, tune.inputs(o.features, rng)) for o in (tuned[j][3] for j in (i - 1, i + 1)
                                                                            if 0 <= j < len(tuned)))
        plans = [t.default] + ([t.chosen] if t.chosen != t.default else [])
        timings = tune.measure(plans, f, arrays, min_runs=args.runs, block_seconds=args.runs * 0.02,
                               context=around)
        base, best = timings[0], timings[-1]
        rows.append((d.name, task, dt, describe_plan(t.default), base.median_ms, describe_plan(t.chosen),
                     best.median_ms, best.score, f.geometry.flops))
        print(f"{d.name} {task} {dt}: default {base.median_ms:.2f} ms, tuned {best.median_ms:.2f} ms "
              f"({best.score:.3f})", flush=True)

    ratios = [r[7] for r in rows]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cpu = plan_cache.machine()
    lines = [f"# Plans tuned on this machine: {args.suite}", "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
             f"- machine: {cpu['cpu']} ({cpu['cpu_name']}), {os.cpu_count()} cores, {platform.system()}; "
             f"kernel family (ISA): {isa.family()}; threads: {cpu['threads']}; load average at the end: {load:.1f}",
             f"- command: `python benchmarks/tuned.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
             f"- tuning {len(problems)} problems (`convgrad tune`, {args.block_ms:.0f} ms per plan): "
             f"{tuning_s:.0f} s",
             f"- tuned / default time: geomean {statistics.geometric_mean(ratios):.3f}, max {max(ratios):.3f} "
             f"({sum(r[3] != r[5] for r in rows)} of {len(rows)} plans changed; timed again in sequence, "
             f"each call after a call of the layers beside it on their tuned plans, the two plans in "
             f"{tune.ROUNDS} alternating rounds of at least {args.runs / tune.ROUNDS:.0f} calls; the ratio: "
             f"the median of the rounds' ratios)", "",
             "| layer | grad | dtype | default plan | ms | GFLOP/s | tuned plan | ms | GFLOP/s | tuned / default |",
             "|---|---|---|---|---:|---:|---|---:|---:|---:|"]
    for name, task, dt, dp, base, cp, best, ratio, flops in rows:
        lines.append(f"| {name} | {task} | {dt} | {dp} | {base:.2f} | {flops / base / 1e6:.1f} | {cp} | {best:.2f} | "
                     f"{flops / best / 1e6:.1f} | {ratio:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
