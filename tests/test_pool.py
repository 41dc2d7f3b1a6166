"""One thread pool, safe under fork and threads (:mod:`convgrad.engines.fast.pool`): a child
forked after its parent ran parallel gradients computes correct gradients (GNU OpenMP would
terminate it), and calls from several Python threads at once give the serial results."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import convgrad as cg
from convgrad.engines.fast import pool

_FORK = textwrap.dedent("""
    import os, sys
    import numpy as np
    import convgrad as cg
    from convgrad.engines.fast import pool
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 12, 12, 16)).astype(np.float32)
    dy = rng.standard_normal((4, 12, 12, 32)).astype(np.float32)
    w = rng.standard_normal((3, 3, 16, 32)).astype(np.float32)
    def grads():
        return (cg.convolution_backward_data(dy, w, [4, 12, 12, 16], pads_begin=1, pads_end=1),
                cg.convolution_backward_weights(x, dy, [3, 3, 16, 32], pads_begin=1, pads_end=1))
    want = grads()                       # the parent runs parallel kernels first
    print(pool.layer(), flush=True)
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            got = grads()
            ok = all(np.array_equal(a, b) for a, b in zip(got, want))
            os._exit(0 if ok else 3)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
    print(codes)
    sys.exit(max(abs(c) for c in codes))
""")


def test_a_forked_child_computes_correct_gradients():
    run = subprocess.run([sys.executable, "-c", _FORK], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split()[0] == "workqueue", run.stdout
    assert "Terminating" not in run.stderr


def test_concurrent_callers_get_the_serial_results():
    rng = np.random.default_rng()
    cases = []
    for c in (8, 16, 24, 40):
        x = rng.standard_normal((2, 10, 10, c)).astype(np.float32)
        dy = rng.standard_normal((2, 10, 10, 2 * c)).astype(np.float32)
        cases.append((x, dy, c))

    def call(case):
        x, dy, c = case
        return cg.convolution_backward_weights(x, dy, [3, 3, c, 2 * c], pads_begin=1, pads_end=1)

    want = [call(case) for case in cases]
    with ThreadPoolExecutor(4) as executor:
        got = list(executor.map(call, cases * 3))
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, want[i % len(cases)])


def test_the_lock_is_reentrant():
    with pool.serial(), pool.serial():
        assert cg.convolution(np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 2, 2), np.float32)).shape == (1, 4, 4, 2)
