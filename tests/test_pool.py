"""One thread pool, safe under fork and threads (:mod:`convgrad.engines.fast.pool`): a child
forked after its parent ran parallel gradients computes correct gradients, in parallel (GNU
OpenMP's pool does not survive a fork: the child's calls run on a thread of its own), and calls
from several Python threads at once give the serial results."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
import threading
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import convgrad as cg
from convgrad.engines.fast import pool

_FORK = textwrap.dedent("""
    import os, sys, warnings
    import numba
    import numpy as np
    {preamble}
    import convgrad as cg
    from convgrad.engines.fast import pool
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 12, 12, 16)).astype(np.float32)
    dy = rng.standard_normal((4, 12, 12, 32)).astype(np.float32)
    w = rng.standard_normal((3, 3, 16, 32)).astype(np.float32)
    def grads():
        return (cg.convolution_backward_data(dy, w, [4, 12, 12, 16], pads_begin=1, pads_end=1),
                cg.convolution_backward_weights(x, dy, [3, 3, 16, 32], pads_begin=1, pads_end=1),
                cg.convolution(x, w, pads_begin=1, pads_end=1))
    @numba.njit(parallel=True)
    def threads_used(n):
        seen = np.zeros(n, np.int64)
        for i in numba.prange(64 * n):
            seen[numba.get_thread_id()] = 1
        return seen.sum()
    want = grads()                       # the parent runs parallel kernels first
    print(pool.layer(), flush=True)
    def child(depth):
        got = grads()
        ok = all(np.array_equal(a, b) for a, b in zip(got, want))
        parallel = pool.run(threads_used, numba.get_num_threads()) == numba.get_num_threads()
        code = 0 if ok and parallel else (3 if not ok else 4)
        if code == 0 and depth < 2:      # a grandchild, forked from the child
            pid = os.fork()
            if pid == 0:
                child(depth + 1)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        os._exit(code)
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            warnings.simplefilter("error")
            child(1)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
    print(codes)
    sys.exit(max(abs(c) for c in codes))
""")


@pytest.mark.parametrize("preamble", ["", "import torch  # PyTorch's GNU OpenMP loaded first"])
def test_a_forked_child_computes_correct_gradients_in_parallel(preamble):
    if preamble:
        pytest.importorskip("torch")
    run = subprocess.run([sys.executable, "-c", _FORK.format(preamble=preamble)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split()[0] in ("omp", "workqueue"), run.stdout
    assert "Terminating" not in run.stderr


@pytest.mark.parametrize("first", ["torch", "convgrad"])
def test_the_layer_is_gnu_openmp_beside_pytorch(first):
    """numba's OpenMP layer runs beside PyTorch imported either way; imported first (where the
    system has a libgomp for numba), PyTorch binds to the same libgomp."""
    pytest.importorskip("torch")
    if first == "convgrad" and not ctypes.util.find_library("gomp"):
        pytest.skip("no system libgomp: numba's OpenMP layer loads only beside PyTorch's")
    order = "import torch, convgrad as cg, numpy as np\n" if first == "torch" else \
        "import convgrad as cg, numpy as np, torch\n"
    script = (order +
              "cg.convolution(np.ones((2, 32, 32, 32), np.float32), np.ones((3, 3, 32, 32), np.float32))\n"
              "torch.relu(torch.ones(1 << 20))\n"
              "from convgrad.engines.fast import pool\n"
              "maps = {line.split()[-1] for line in open('/proc/self/maps') if 'libgomp' in line}\n"
              "print(pool.layer(), len(maps))\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    layer, libraries = run.stdout.split()
    assert layer == "omp", run.stdout
    if first == "convgrad":
        assert libraries == "1", run.stdout


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


def test_the_lock_is_reentrant_and_run_nests():
    with pool.serial(), pool.serial():
        assert cg.convolution(np.ones((1, 4, 4, 2), np.float32), np.ones((1, 1, 2, 2), np.float32)).shape == (1, 4, 4, 2)
    assert pool.run(pool.run, sum, (1, 2)) == 3


def test_a_large_blas_call_stops_openblas_threads_and_blas_still_works(monkeypatch, rng):
    """After a ``gemm`` plan of at least ``TUNING.quiet_blas_flops`` FLOPs the engine stops
    OpenBLAS's spinning threads (:func:`pool.quiet_blas`) at once; after a smaller one only
    before the next plan on numba's threads (``jit``), within ``TUNING.blas_spin_seconds``, and
    not before another ``gemm`` plan; NumPy's BLAS computes correct products afterwards (its
    next call starts them again)."""
    import dataclasses
    from convgrad.engines import fast
    from convgrad.engines.fast import Plan, forced_plan
    calls = []
    real_quiet = pool.quiet_blas

    def quiet():
        calls.append(1)
        pool._blas_ended[0] = None

    monkeypatch.setattr(pool, "quiet_blas", quiet)
    x = rng.standard_normal((4, 20, 20, 16)).astype(np.float32)
    dy = rng.standard_normal((4, 20, 20, 32)).astype(np.float32)
    flops = 2 * 4 * 20 * 20 * 32 * 16 * 9
    want = cg.convolution_backward_weights(x, dy, [3, 3, 16, 32], pads_begin=1, pads_end=1, engine="reference")
    pool._blas_ended[0] = None
    steps = (("gemm", flops, 60.0, 1), ("gemm", flops + 1, 60.0, 0), ("gemm", flops + 1, 60.0, 0),
             ("jit", flops, 60.0, 1), ("jit", flops, 60.0, 0), ("gemm", flops + 1, 60.0, 0),
             ("jit", flops, 0.0, 0))                     # spinning past the window: asleep, left alone
    for strategy, threshold, window, quieted in steps:
        calls.clear()
        monkeypatch.setattr(fast, "TUNING", dataclasses.replace(fast.TUNING, quiet_blas_flops=threshold))
        monkeypatch.setattr(pool, "TUNING", dataclasses.replace(pool.TUNING, blas_spin_seconds=window))
        with forced_plan(Plan(strategy)):
            got = cg.convolution_backward_weights(x, dy, [3, 3, 16, 32], pads_begin=1, pads_end=1)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
        assert len(calls) == quieted, (strategy, threshold, window)
    monkeypatch.undo()
    assert pool.quiet_blas is real_quiet
    pool.quiet_blas()                   # the real one: OpenBLAS's threads stopped where NumPy has it
    assert not pool.blas_spinning() or threading.active_count() > 1   # another thread: left alone
    a, b = rng.standard_normal((300, 200)), rng.standard_normal((200, 100))
    np.testing.assert_allclose(a @ b, np.einsum("ik,kj->ij", a, b), rtol=1e-12, atol=1e-12)


def test_quiet_blas_finds_numpys_openblas_and_leaves_it_alone_beside_other_threads(monkeypatch):
    """NumPy's OpenBLAS is among the libraries shut down (where NumPy's BLAS is OpenBLAS); with
    another Python thread alive (it could be inside a BLAS call) nothing is shut down."""
    if "openblas" in str(np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})).lower():
        assert pool._openblas_shutdowns(), "NumPy's OpenBLAS not found among the mapped libraries"
    stopped = []
    monkeypatch.setattr(pool, "_openblas_shutdowns", lambda: [lambda: stopped.append(1)])
    alone = threading.active_count()        # earlier tests in this process may have left threads
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    pool.quiet_blas()
    assert stopped == [1]
    monkeypatch.undo()
    monkeypatch.setattr(pool, "_openblas_shutdowns", lambda: [lambda: stopped.append(1)])
    with ThreadPoolExecutor(1) as other:
        other.submit(lambda: None).result()
        assert threading.active_count() > alone
        pool.quiet_blas()
    assert stopped == [1]


_SPIN = textwrap.dedent("""
    import os, time
    import numba, numpy as np
    from convgrad.engines.fast import pool
    @numba.njit(parallel=True)
    def work(a):
        for i in numba.prange(a.size):
            a[i] = np.sqrt(a[i] + i)
    a = np.ones(1 << 20)
    for _ in range(3):
        pool.run(work, a)
    start = time.process_time()
    time.sleep(0.05)                     # numba's threads spin or sleep now
    print(time.process_time() - start, "GOMP_SPINCOUNT" in os.environ, pool.layer())
""")


def test_numbas_threads_stop_spinning_soon_after_a_call():
    """After a parallel call numba's OpenMP threads spin ``TUNING.omp_spin_count`` rounds, not
    libgomp's 300,000 (which slowed a BLAS call right after ours by a fifth): the CPU time the
    process takes while it sleeps after a call is far below that with libgomp's count set by the
    user (whose setting wins); the variable is not left for child processes."""
    def spin_seconds(**env: str) -> float:
        import os
        clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
        run = subprocess.run([sys.executable, "-c", _SPIN], capture_output=True, text=True, timeout=300,
                             env={**clean, **env})
        assert run.returncode == 0, run.stderr
        seconds, inherited, layer = run.stdout.split()
        if layer != "omp":
            pytest.skip(f"numba's {layer} layer: no GNU OpenMP threads")
        assert inherited == "False" or env, run.stdout
        return float(seconds)

    # the least of a few runs against the most: on a busy host (the other test worker on the
    # second core) libgomp's threads may not be scheduled to spin at all in one 50 ms sleep
    ours, long_spin = spin_seconds(), spin_seconds(GOMP_SPINCOUNT="300000")
    for _ in range(3):
        if ours < 0.5 * long_spin:
            break
        ours, long_spin = min(ours, spin_seconds()), max(long_spin, spin_seconds(GOMP_SPINCOUNT="300000"))
    assert ours < 0.5 * long_spin, (ours, long_spin)
