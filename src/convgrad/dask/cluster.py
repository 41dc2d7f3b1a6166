"""A batch's cases as tasks on a ``dask.distributed`` cluster (``--scheduler=local:N|ADDRESS``).

Each case is one task (:func:`convgrad.driver.run_case`, with the same seed as without a
cluster), so lines, summary and exit code are those of a run in one process. Results come back
in batch order. At most as many cases are in flight as the cluster has worker threads, so a
worker that dies (killed, out of memory) takes only the cases it was running with it: each
becomes FAILED with the reason (``KilledWorker``) and the rest of the batch runs on.

``local:N`` starts a ``LocalCluster`` of N single-threaded worker processes on this machine, with
``allowed-failures`` 0: a case whose worker dies is not tried on another worker (an out-of-memory
case would only take that one down too). An ``ADDRESS`` (``tcp://host:8786``) connects to a
running scheduler, whose own ``distributed.scheduler.allowed-failures`` applies (dask's default
3: a case that kills its worker is tried on three more before it fails).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import dask
from distributed import Client, Future, LocalCluster, as_completed
from distributed.scheduler import KilledWorker

from ..batch import Case
from ..driver import Driver, Result, RunSettings, fail, new_result, run_case

__all__ = ["parse_scheduler", "connect", "run_cases"]

_LOCAL = re.compile(r"local:([0-9]+)")
#: How long to wait for a scheduler at an address.
CONNECT_TIMEOUT = "10s"


def parse_scheduler(text: str) -> int | str:
    """The number of local workers of ``local:N`` (N >= 1), or a scheduler address; ValueError if neither."""
    match = _LOCAL.fullmatch(text)
    if match:
        if int(match.group(1)) < 1:
            raise ValueError(f"{text!r}: local:N needs at least one worker")
        return int(match.group(1))
    if text.startswith("local") or not text.strip() or any(c.isspace() for c in text):
        raise ValueError(f"{text!r}: expected local:N (N worker processes here) or a scheduler address "
                         "such as tcp://host:8786")
    return text


@contextmanager
def connect(spec: str) -> Iterator[Client]:
    """A client of the cluster ``spec`` names (a local cluster is started here and closed after)."""
    target = parse_scheduler(spec)
    if isinstance(target, str):
        with Client(target, timeout=CONNECT_TIMEOUT) as client:
            yield client
        return
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with LocalCluster(n_workers=target, threads_per_worker=1, processes=True, dashboard_address=None,
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            yield client


def _threads(client: Client) -> int:
    return max(1, sum(client.nthreads().values()))


def _collect(future: Future, pending: Result) -> Result:
    """The case's result from its task; a dead worker (or a lost task) fails the case."""
    try:
        return future.result()
    except KilledWorker as exc:
        return fail(pending, f"the worker running it died (KilledWorker: {str(exc).split('. ')[0]})")
    except Exception as exc:  # the cluster went away, a result could not be sent back...
        return fail(pending, f"cluster error: {type(exc).__name__}: {exc}")


def run_cases(client: Client, driver: Driver, settings: RunSettings, cases: Iterable[Case]) -> Iterator[Result]:
    """The results of ``cases``, in order, each run as a task on ``client``'s cluster."""
    run = uuid.uuid4().hex[:8]
    queue = iter(enumerate(cases))
    futures = as_completed()
    pending: dict[str, Result] = {}
    done: dict[int, Result] = {}

    def submit() -> None:
        for index, case in queue:
            key = f"convgrad-case-{index}-{run}"
            pending[key] = new_result(driver, settings, case, index)
            futures.add(client.submit(run_case, driver, settings, case, index, key=key, pure=False))
            return

    for _ in range(_threads(client)):
        submit()
    following = 0
    for future in futures:
        result = _collect(future, pending.pop(future.key))
        done[result.index] = result
        submit()
        while following in done:
            yield done.pop(following)
            following += 1
