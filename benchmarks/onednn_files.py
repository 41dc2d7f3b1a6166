"""Run oneDNN's own conv-driver input files through ``convgrad conv`` and record the counts.

    python benchmarks/onednn_files.py --inputs ONEDNN/tests/benchdnn/inputs/conv [--out FILE] [FILE ...]

Each file runs as a oneDNN user runs it (``convgrad conv --batch=FILE`` from that folder, the
fast engine checked against the reference engine, in a process of its own); the summary line
(``tests:T passed:P skipped:S failed:F``), the wall time and the failed lines are appended to
``--out`` (benchmarks/ONEDNN-FILES.md) as a table row.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

FILES = ("harness_conv_regression_general", "harness_conv_tags", "harness_conv_auto",
         "harness_conv_dw_bfloat16_nxc", "harness_conv_dw_float16_nxc", "harness_conv_deepbench",
         "harness_conv_dilated_3d")
_SUMMARY = re.compile(r"tests:(\d+) passed:(\d+) skipped:(\d+) failed:(\d+)")


def _cpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "?"
    model = re.search(r"model name\s*:\s*(.*)", text)
    flags = set(re.search(r"flags\s*:\s*(.*)", text).group(1).split()) if "flags" in text else set()
    isa = "avx512_bf16" if "avx512_bf16" in flags else "avx512" if "avx512f" in flags else \
        "avx2" if "avx2" in flags else "sse"
    return f"{model.group(1).strip() if model else '?'} ({isa})"


def run(inputs: Path, name: str, extra: list[str]) -> tuple[str, float, list[str]]:
    """The summary line, seconds and failed lines of one file."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "convgrad", "conv", "--engine=fast", *extra, f"--batch={name}"],
                         cwd=inputs, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    found = _SUMMARY.search(out.stdout)
    failed = [line for line in out.stdout.splitlines() if re.match(r"\d+:FAILED", line)]
    return (found.group(0) if found else f"no summary (exit {out.returncode}): {out.stderr[-300:]}"), seconds, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=Path, required=True, help="oneDNN's tests/benchdnn/inputs/conv")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("ONEDNN-FILES.md"))
    parser.add_argument("--extra", default="", help="options put before --batch, e.g. --mb=1")
    parser.add_argument("files", nargs="*", default=list(FILES))
    args = parser.parse_args()
    extra = args.extra.split()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    rows = []
    for name in args.files:
        summary, seconds, failed = run(args.inputs, name, extra)
        row = f"| {name} | {' '.join(extra) or '-'} | {summary} | {seconds / 60:.1f} | {stamp}, {_cpu()} |"
        print(row, *failed[:20], sep="\n", flush=True)
        rows.append(row)
        with args.out.open("a") as out:
            out.write(row + "\n")


if __name__ == "__main__":
    main()
