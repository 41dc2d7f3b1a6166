"""``convgrad graph|conv --scheduler=...``: a batch's cases as tasks on a dask.distributed cluster,
with the same lines, summary and exit code as in one process, and a worker that dies mid-case
failing only that case."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("distributed")

import cloudpickle  # noqa: E402
from click.testing import CliRunner  # noqa: E402

import dask_support  # noqa: E402
from convgrad.cli import main  # noqa: E402
from dask_support import KillOnTask, client, cluster  # noqa: E402,F401

BATCH = """\
--dir=FWD_B mb2ic8ih10oc8oh10kh3ph1n"first"
--dir=BWD_W --dt=bf16 mb3ic4ih12oc6oh6kh3sh2ph1n"second"
--tag=ncx --dir=BWD_D mb2ic6iw9oc4ow9kw3pw1n"third"
--dir=NOPE mb2ic6iw9oc4ow9kw3pw1
"""


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def lines(output: str) -> list[str]:
    """The per-case lines and the summary line (not the table)."""
    return [line for line in output.splitlines() if re.match(r"\d+:(PASSED|FAILED)|tests:", line)]


def test_a_local_cluster_gives_the_same_output(tmp_path):
    batch = tmp_path / "cases.batch"
    batch.write_text(BATCH)
    alone = run("conv", f"--batch={batch}", "--seed=7")
    spread = run("conv", f"--batch={batch}", "--seed=7", "--scheduler=local:2")
    assert alone.exit_code == spread.exit_code == 1  # the --dir=NOPE line
    assert lines(spread.stdout) == lines(alone.stdout)
    assert lines(alone.stdout)[-1] == "tests:4 passed:3 skipped:0 failed:1"


def test_a_dead_worker_fails_its_case_and_the_batch_goes_on(tmp_path, cluster, client):
    """The worker running case 1 ends its process mid-case (as an out-of-memory kill would):
    line 1 is FAILED with KilledWorker, the other cases pass, the exit code is 1."""
    batch = tmp_path / "cases.batch"
    batch.write_text(BATCH.rsplit("\n", 2)[0] + "\n")  # the three good cases
    cloudpickle.register_pickle_by_value(dask_support)
    client.register_plugin(KillOnTask("convgrad-case-1-"))
    try:
        result = run("conv", f"--batch={batch}", f"--scheduler={cluster.scheduler_address}")
    finally:
        client.unregister_worker_plugin(KillOnTask.name)
        cloudpickle.unregister_pickle_by_value(dask_support)
    out = lines(result.stdout)
    assert result.exit_code == 1
    assert out[0].startswith("0:PASSED") and out[2].startswith("2:PASSED"), out
    assert re.match(r"1:FAILED \(.*second.*the worker running it died \(KilledWorker", out[1]), out[1]
    assert out[-1] == "tests:3 passed:2 skipped:0 failed:1"


@pytest.mark.parametrize("value", ["local:0", "local:two", "", "two words", "no-port"])
def test_bad_scheduler_is_a_usage_error(value):
    result = run("graph", "--case=x.json", f"--scheduler={value}")
    assert result.exit_code == 2 and "--scheduler" in result.output


def test_help_names_the_option():
    assert "--scheduler" in run("conv", "--help").stdout
