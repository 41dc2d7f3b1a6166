"""The warm path of repeated calls (issue 32): what a first call established (parsed attributes,
shape inference, the plan, the memory estimate) is reused only where everything it depends on is
unchanged, so nothing gets through warm that a cold call refuses, and results are the same.

- every invalid call of tests/test_errors.py, replayed after warming with its valid neighbour
  (same shapes; for the Op API the same Op object), gives the cold call's error, word for word;
- results are bit-identical cold and warm, for each strategy;
- the memo follows what the plan depends on: a forced strategy, ``CONVGRAD_STRATEGY``, a plan
  stored in the plan cache, the thread count, an attribute changed on a built Op;
- memos stay bounded, and threads calling at once get the serial results.
"""

from __future__ import annotations

import threading
import warnings

import numba
import numpy as np
import pytest

import convgrad as cg
from convgrad import functional, interop
from convgrad.attributes import attributes_key, value_key
from convgrad.dtypes import bfloat16
from convgrad.engines import fast
from convgrad.engines.fast import plan as plan_module
from convgrad.engines.fast import plan_cache
from convgrad.memo import Memo

from oracle import fresh_rng
from test_errors import ERRORS, _base, _call


def _cold() -> None:
    """Forget everything the warm path remembers."""
    functional._ops.clear()
    interop._plain.clear()
    plan_module._planned.clear()


def _error(api: str, kind: str, attrs: dict, inputs: list) -> tuple[type, str]:
    with pytest.raises(cg.ConvgradError) as info:
        _call(api, kind, dict(attrs), list(inputs))
    return type(info.value), str(info.value)


@pytest.mark.parametrize("name,kind,mutate,api", [(e[0], e[1], e[2], api) for e in ERRORS for api in e[5]],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_invalid_calls_fail_warm_as_cold(name: str, kind: str, mutate, api: str) -> None:
    valid_attrs, valid_inputs = _base(kind)
    attrs, inputs = dict(valid_attrs), list(valid_inputs)
    mutate(attrs, inputs)
    _cold()
    cold = _error(api, kind, attrs, inputs)
    for _ in range(2):                                    # the valid neighbour, twice: warm
        _call(api, kind, dict(valid_attrs), list(valid_inputs))
    assert _error(api, kind, attrs, inputs) == cold
    if api == "op" and repr(attrs) == repr(valid_attrs):
        op = cg.Op(kind, **valid_attrs)                   # an input mutation: the same Op, warm then invalid
        op(*valid_inputs)
        with pytest.raises(cold[0]) as info:
            op(*inputs)
        assert str(info.value) == cold[1]
    _call(api, kind, dict(valid_attrs), list(valid_inputs))   # and the valid call still works after it


ATTRS = dict(strides=2, pads_begin=1, pads_end=[1, 0])


def _problem(rng: np.random.Generator, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.standard_normal((2, 9, 7, 16)).astype(dtype)
    dy = rng.standard_normal((2, 5, 3, 8)).astype(dtype)     # strides 2, pads 1 / [1, 0]
    w = rng.standard_normal((3, 3, 16, 8)).astype(dtype)
    return x, dy, w


@pytest.mark.parametrize("strategy", [None, *fast.STRATEGIES])
@pytest.mark.parametrize("dtype", [np.float32, bfloat16, np.float64])
def test_results_are_identical_cold_and_warm(strategy: str | None, dtype) -> None:
    rng, seed = fresh_rng()
    x, dy, w = _problem(rng, dtype)
    calls = [lambda: cg.convolution_backward_data(dy, w, np.array(x.shape), **ATTRS),
             lambda: cg.convolution_backward_weights(x, dy, list(w.shape), **ATTRS),
             lambda: cg.convolution(x, w, **ATTRS)]
    with fast.forced_strategy(strategy):
        for call in calls:
            _cold()
            cold = call()
            warm = [call() for _ in range(3)]
            for got in warm:
                np.testing.assert_array_equal(got.view(np.uint8), cold.view(np.uint8), err_msg=f"seed {seed}")


def _recorded_call(monkeypatch):
    """A data-gradient call, and the strategies each run of it took (its first run done)."""
    rng, _ = fresh_rng()
    x, dy, w = _problem(rng, np.float32)
    ran: list[str] = []
    planned, warm = fast.planned, fast.warm

    def spy(*args, tune=False, **kwargs):
        hit = planned(*args, tune=tune, **kwargs)
        if tune:
            ran.append(hit[1].strategy)
        return hit

    def warm_spy(*args):             # a repeated call runs the plan it finds here
        hit = warm(*args)
        if hit is not None:
            ran.append(hit[1].strategy)
        return hit
    serial = fast.FastEngine._serial

    def serial_spy(hit, *args):      # a call bound to its plan (execution.execute's warm runs) runs it here
        run = serial(hit, *args)

        def recorded(a, b):
            ran.append(hit[1].strategy)
            return run(a, b)
        return recorded
    monkeypatch.setattr(fast, "planned", spy)
    monkeypatch.setattr(fast, "warm", warm_spy)
    monkeypatch.setattr(fast.FastEngine, "_serial", staticmethod(serial_spy))

    def call() -> None:
        cg.convolution_backward_data(dy, w, np.array(x.shape), **ATTRS)
    call()
    return call, ran, (x, dy, w)


def test_the_plan_follows_forced_strategies_and_the_environment(monkeypatch) -> None:
    call, ran, _ = _recorded_call(monkeypatch)
    default = ran[-1]
    for strategy in fast.STRATEGIES:
        with fast.forced_strategy(strategy):
            call()
            assert ran[-1] == strategy
        monkeypatch.setenv("CONVGRAD_STRATEGY", strategy)
        call()
        assert ran[-1] == strategy
        monkeypatch.delenv("CONVGRAD_STRATEGY")
        call()
        assert ran[-1] == default


def test_the_plan_follows_the_plan_cache_and_the_thread_count(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CONVGRAD_PLANS", str(tmp_path / "plans.json"))
    call, ran, (x, dy, w) = _recorded_call(monkeypatch)
    default = ran[-1]
    other = next(s for s in ("gemm", "direct") if s != default)
    g = cg.Op("ConvolutionBackwardData", lenient=True, **ATTRS).infer(
        dy, w, np.array(x.shape)).geometry
    plan_cache.store(fast.Features.of(g, "backward_data", np.float32, False), fast.Plan(other))
    call()
    assert ran[-1] == other                      # stored by this process: taken at the next call
    plan_cache.clear()
    call()
    assert ran[-1] == default
    threads = numba.get_num_threads()
    if threads > 1:                              # plans are cached per thread count
        plan_cache.store(fast.Features.of(g, "backward_data", np.float32, False), fast.Plan(other))
        try:
            numba.set_num_threads(1)
            call()
            assert ran[-1] == default            # the stored plan is for the other thread count
        finally:
            numba.set_num_threads(threads)
        call()
        assert ran[-1] == other


def test_an_attribute_changed_on_a_built_op_is_seen() -> None:
    rng, _ = fresh_rng()
    x, dy, w = _problem(rng, np.float32)
    op = cg.Op("ConvolutionBackwardWeights", strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 0], dilations=[1, 1])
    first = op(x, dy, np.array(w.shape))
    op.attrs["pads_end"] = (0, 0)                # now dy is the wrong size: refused, not served warm
    with pytest.raises(cg.errors.ShapeError):
        op(x, dy, np.array(w.shape))
    op.attrs["pads_end"] = (1, 0)
    np.testing.assert_array_equal(op(x, dy, np.array(w.shape)), first)


def test_attribute_keys_are_type_exact() -> None:
    assert len({value_key(v) for v in (1, True, 1.0, np.int64(1), [1], (1,), "1")}) == 7
    assert value_key(np.array([1, 2])) is None and value_key([1, np.array(2)]) is None
    assert attributes_key({"strides": [1, 1], "groups": 1}) == attributes_key({"strides": [1, 1], "groups": 1})
    assert attributes_key({"strides": np.array([1, 1])}) is None
    # an array-valued attribute is parsed afresh, and a bool where an int is expected refused both times
    rng, _ = fresh_rng()
    x, dy, w = _problem(rng, np.float32)
    for _ in range(2):
        cg.convolution_backward_data(dy, w, np.array(x.shape), strides=np.array([2, 2]), pads_begin=1, pads_end=[1, 0])
        with pytest.raises(cg.errors.AttributeTypeError):
            cg.convolution_backward_data(dy, w, np.array(x.shape), strides=[2, True], pads_begin=1, pads_end=[1, 0])


def test_memos_stay_bounded() -> None:
    memo: Memo[int, int] = Memo(8)
    for i in range(100):
        memo.put(i, i)
        assert len(memo) <= 8
    assert memo.get(99) == 99
    rng, _ = fresh_rng()
    x = rng.standard_normal((1, 6, 6, 2)).astype(np.float32)
    for pad in range(functional._ops.size + 10):     # each a new attribute set
        cg.convolution(x, np.ones((1, 1, 2, 2), np.float32), pads_begin=[pad, 0], pads_end=0)
        assert len(functional._ops) <= functional._ops.size


def test_threads_calling_at_once_get_the_serial_results() -> None:
    rng, seed = fresh_rng()
    problems = [_problem(rng, np.float32) for _ in range(4)]
    attrs = [ATTRS, dict(strides=2, pads_begin=[1, 0], pads_end=[1, 0]),   # the last two: shape errors
             dict(strides=2, pads_begin=1, pads_end=1), dict(strides=2, pads_begin=0, pads_end=1)]

    def run(i: int) -> np.ndarray:
        x, dy, w = problems[i]
        try:
            return cg.convolution_backward_weights(x, dy, list(w.shape), **attrs[i])
        except cg.errors.ShapeError as exc:
            return np.array(str(exc))
    serial = [run(i) for i in range(4)]
    results: dict[tuple[int, int], np.ndarray] = {}

    def worker(t: int) -> None:
        for r in range(20):
            i = (t + r) % 4
            results[t, r] = run(i)
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (t, r), got in results.items():
        np.testing.assert_array_equal(got, serial[(t + r) % 4], err_msg=f"seed {seed}")


def test_one_call_reads_the_plan_cache_once_and_forced_plans_live(monkeypatch) -> None:
    """An API call's memory estimate and run share one reading of the process's state (the plan
    cache's file stamp costs a system call); a plan forced inside the call still counts."""
    rng, _ = fresh_rng()
    dy = rng.standard_normal((2, 9, 9, 8)).astype(np.float32)
    w = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    call = lambda: cg.convolution_backward_data(dy, w, [2, 9, 9, 8], pads_begin=1, pads_end=1)  # noqa: E731
    call()
    reads = []
    state = plan_cache.state
    monkeypatch.setattr(plan_cache, "state", lambda: reads.append(1) or state())
    for _ in range(3):
        call()
    assert len(reads) == 3
    with plan_module.one_call():
        outer = plan_module.context()
        with fast.forced_plan(fast.Plan.of("direct")):
            assert plan_module.context() != outer and plan_module.context()[-1] == fast.Plan.of("direct")
        assert plan_module.context() == outer
    assert len(reads) == 4


def test_a_warm_op_call_skips_resolution_but_not_the_memory_budget(monkeypatch) -> None:
    """A repeated call of the same signature (shapes, dtypes, strides, shape values, attributes
    as they are now) reuses the resolved problem and its memory estimate, without resolving its
    inputs again; the budget is read at every call, so a lowered budget refuses it warm as cold;
    another signature is resolved afresh."""
    rng, _ = fresh_rng()
    x, dy, w = _problem(rng, np.float32)
    op = cg.Op("ConvolutionBackwardData", strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 0], dilations=[1, 1])
    first = op(dy, w, list(x.shape))
    cold_error = None
    with monkeypatch.context() as m:
        m.setattr(cg.Op, "prepare", lambda self, *inputs: pytest.fail("a warm call resolved its inputs again"))
        np.testing.assert_array_equal(op(dy, w, list(x.shape)), first)
        with pytest.raises(pytest.fail.Exception):                 # a new signature: resolved
            op(dy, w, tuple(x.shape))
        cg.set_memory_budget(1000)
        try:
            with pytest.raises(cg.errors.ResourceError) as warm:
                op(dy, w, list(x.shape))
        finally:
            cg.set_memory_budget(None)
    cg.set_memory_budget(1000)
    try:
        with pytest.raises(cg.errors.ResourceError) as cold:
            cg.Op("ConvolutionBackwardData", strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 0],
                  dilations=[1, 1])(dy, w, list(x.shape))
        cold_error = str(cold.value)
    finally:
        cg.set_memory_budget(None)
    assert str(warm.value) == cold_error
    np.testing.assert_array_equal(op(dy, w, list(x.shape)), first)


def test_an_op_with_a_warm_memo_pickles_and_its_copy_starts_cold() -> None:
    """dask ships Op objects to its workers: a used Op pickles, and its copy computes the same
    result with an empty memo of the same bound."""
    import pickle
    rng, _ = fresh_rng()
    x, dy, w = _problem(rng, np.float32)
    op = cg.Op("ConvolutionBackwardData", strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 0], dilations=[1, 1])
    first = op(dy, w, list(x.shape))
    assert op._warm is not None and len(op._warm) == 1
    copy = pickle.loads(pickle.dumps(op))
    assert copy._warm is not None and len(copy._warm) == 0 and copy._warm.size == op._warm.size
    np.testing.assert_array_equal(copy(dy, w, list(x.shape)), first)


@pytest.mark.parametrize("as_type", [np.array, list, tuple])
def test_shape_inputs_are_keyed_on_their_values(as_type) -> None:
    """A shape input (here the data gradient's dst_shape, two sizes valid for one dy) is part of
    the warm key by its values, whether a list, a tuple or a NumPy array of the same shape."""
    rng, _ = fresh_rng()
    _, dy, w = _problem(rng, np.float32)
    op = cg.Op("ConvolutionBackwardData", strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 0], dilations=[1, 1])
    for _ in range(2):
        for rows in (9, 10):
            shape = as_type([2, rows, 7, 16])
            assert op(dy, w, shape).shape == (2, rows, 7, 16)
    with pytest.raises(cg.errors.ShapeError):
        op(dy, w, as_type([2, 12, 7, 16]))


@pytest.mark.parametrize("loops", ["general", "flat"])
@pytest.mark.parametrize("dtype", [np.float32, bfloat16])
def test_repeated_serial_calls_run_outside_the_pool_with_the_cold_results(monkeypatch, loops: str, dtype) -> None:
    """A warm call of a serial ``direct`` plan skips the pool and NumPy's errstate: the same bits
    as the cold call, NaN and Inf propagated without a warning under strict NumPy settings."""
    rng, seed = fresh_rng()
    x = rng.standard_normal((1, 8, 8, 4)).astype(dtype)
    w = rng.standard_normal((3, 3, 4, 4)).astype(dtype)
    dy = rng.standard_normal((1, 8, 8, 4)).astype(dtype)
    x[0, 2, 3, 1], dy[0, 5, 1, 2], w[1, 1, 0, 0] = np.inf, np.nan, 3e38
    attrs = dict(strides=1, pads_begin=1, pads_end=1)
    calls = [lambda: cg.convolution_backward_data(dy, w, np.array(x.shape), **attrs),
             lambda: cg.convolution_backward_weights(x, dy, list(w.shape), **attrs),
             lambda: cg.convolution(x, w, **attrs)]
    pooled = []
    run = fast.pool.run
    monkeypatch.setattr(fast.pool, "run", lambda *args: pooled.append(args[1]) or run(*args))
    with fast.forced_plan(fast.Plan("direct", (("loops", loops),))), np.errstate(all="raise"), \
            warnings.catch_warnings():
        warnings.simplefilter("error")
        for call in calls:
            _cold()
            cold = call()
            before = len(pooled)
            warm = [call() for _ in range(2)]
            assert len(pooled) == before, "a warm serial call went through the pool"
            for got in warm:
                np.testing.assert_array_equal(got.view(np.uint8), cold.view(np.uint8), err_msg=f"seed {seed}")
    assert len(pooled) == len(calls)                     # each cold call did run in the pool


def test_a_repeated_small_call_runs_its_bound_function(monkeypatch) -> None:
    """From the second call of a signature on, a small call skips the engine's per-call layers:
    it runs the function ``FastEngine.bind`` made for it, kept per engine state, with the cold
    call's bits; a change of that state (a plan forced afterwards) is seen at the next call."""
    rng, seed = fresh_rng()
    x = rng.standard_normal((1, 8, 8, 4)).astype(np.float32)
    w = rng.standard_normal((3, 3, 4, 4)).astype(np.float32)
    call = lambda: cg.convolution(x, w, pads_begin=1, pads_end=1)  # noqa: E731
    _cold()
    cold = call()
    call()                                               # the second call binds
    layers: list[str] = []
    run = fast.FastEngine._run
    monkeypatch.setattr(fast.FastEngine, "_run", staticmethod(lambda g, task, *args: layers.append(task)
                                                             or run(g, task, *args)))
    for _ in range(3):
        np.testing.assert_array_equal(call().view(np.uint32), cold.view(np.uint32), err_msg=f"seed {seed}")
    assert layers == []
    with fast.forced_strategy("gemm"):
        np.testing.assert_allclose(call(), cold, rtol=1e-5, atol=1e-5, err_msg=f"seed {seed}")
    assert layers == ["forward"]                         # the forced plan ran through the engine
    np.testing.assert_array_equal(call().view(np.uint32), cold.view(np.uint32), err_msg=f"seed {seed}")
    assert layers == ["forward"]


def test_a_repeated_pooled_call_runs_bound_in_the_pool(monkeypatch) -> None:
    """A repeated call whose plan runs in the pool (here the depthwise kernels' weights gradient)
    is bound too: from the second call on it skips the engine's per-call layers
    (``FastEngine._run``: no plan looked up again) yet runs in the pool, with the cold call's bits;
    a plan forced afterwards is seen at the next call."""
    rng, seed = fresh_rng()
    x = rng.standard_normal((4, 12, 12, 64)).astype(np.float32)
    dy = rng.standard_normal((4, 12, 12, 64)).astype(np.float32)
    call = lambda: cg.convolution_backward_weights(x, dy, [3, 3, 1, 64], groups=64, pads_begin=1,  # noqa: E731
                                                   pads_end=1, data_format="NXC", weights_format="XIO")
    _cold()
    cold = call()
    call()                                               # the second call binds
    layers: list[str] = []
    pooled: list[str] = []
    run, in_pool = fast.FastEngine._run, fast.pool.run
    monkeypatch.setattr(fast.FastEngine, "_run", staticmethod(lambda g, task, *args: layers.append(task)
                                                             or run(g, task, *args)))
    monkeypatch.setattr(fast.pool, "run", lambda fn, *args: pooled.append(args[1]) or in_pool(fn, *args))
    for _ in range(3):
        np.testing.assert_array_equal(call().view(np.uint32), cold.view(np.uint32), err_msg=f"seed {seed}")
    assert layers == [] and pooled == ["backward_weights"] * 3
    with fast.forced_strategy("gemm"):
        np.testing.assert_allclose(call(), cold, rtol=1e-4, atol=1e-3, err_msg=f"seed {seed}")
    assert layers == ["backward_weights"]                # the forced plan ran through the engine


def test_the_environment_is_read_anew_at_every_call(monkeypatch, tmp_path) -> None:
    """``env`` and ``raw_values`` (what the engine state is built from) follow every change made
    through ``os.environ``: set, changed, deleted; the plan cache's state follows its variables
    after a first reading of them."""
    from convgrad.environment import env, raw_values
    names = ("CONVGRAD_TEST_VARIABLE", "HOME")
    monkeypatch.delenv(names[0], raising=False)
    first = raw_values(names)
    assert env(names[0]) is None and first[0] is None
    for value in ("1", "two", ""):
        monkeypatch.setenv(names[0], value)
        assert env(names[0]) == value
        assert raw_values(names) != first and raw_values(names)[1:] == first[1:]
    monkeypatch.delenv(names[0])
    assert env(names[0]) is None and raw_values(names) == first
    monkeypatch.setenv("CONVGRAD_PLANS", str(tmp_path / "a.json"))
    a = plan_cache.state()
    monkeypatch.setenv("CONVGRAD_PLANS", str(tmp_path / "b.json"))
    b = plan_cache.state()
    assert a is not None and b is not None and a[0][0].endswith("a.json") and b[0][0].endswith("b.json")
    monkeypatch.setenv("CONVGRAD_AUTOTUNE", "1")
    assert plan_cache.state()[2] is True
    monkeypatch.setenv("CONVGRAD_PLANS", "off")
    assert plan_cache.state() is None
