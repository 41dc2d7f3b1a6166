"""The memory budget's derivation (docs/guarantees.md, *Memory budget*) with the files it reads
mocked: half of ``MemAvailable``, bounded by the cgroup's limit (v2, then v1), ``sysconf`` where
there is no /proc/meminfo, 4 GiB when nothing can be read; and the estimate for engines that do
not report their working set. Every expected number is written out here, not computed with
convgrad's own functions or constants."""

from __future__ import annotations

import io
import tracemalloc
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import convgrad as cg
from convgrad import limits
from convgrad.engines.reference import ReferenceEngine

GiB, MiB = 2**30, 2**20
MEMINFO = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\nBuffers: 1 kB\n"
V2 = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current")
V1 = ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A mocked machine: ``files`` (path -> text; absent paths do not exist), ``sysconf`` (name ->
    value, or an exception to raise) and a clock; the default budget is read from them."""
    state: dict[str, Any] = {"files": {}, "sysconf": {}, "clock": [1000.0]}

    def fake_open(path: str, *args: Any, **kwargs: Any) -> io.StringIO:
        if path not in state["files"]:
            raise FileNotFoundError(path)
        return io.StringIO(state["files"][path])

    def fake_sysconf(name: str) -> int:
        value = state["sysconf"].get(name, ValueError(f"unknown {name}"))
        if isinstance(value, Exception):
            raise value
        return value

    monkeypatch.setattr(limits, "open", fake_open, raising=False)
    monkeypatch.setattr(limits, "os", SimpleNamespace(sysconf=fake_sysconf, environ={}))
    monkeypatch.setattr(limits, "time", SimpleNamespace(monotonic=lambda: state["clock"][0]))
    monkeypatch.setattr(limits, "_available", [(0.0, 0)])  # nothing read yet
    limits.set_memory_budget(None)
    yield state
    limits.set_memory_budget(None)


@pytest.mark.parametrize("files,sysconf,budget", [
    # MemAvailable 8,000,000 kB = 8,192,000,000 bytes, no cgroup limit: half of it
    ({"/proc/meminfo": MEMINFO}, {}, 4_096_000_000),
    # cgroup v2: limit 6 GiB, 2 GiB used -> 4 GiB left, below MemAvailable: half of 4 GiB
    ({"/proc/meminfo": MEMINFO, V2[0]: "6442450944\n", V2[1]: "2147483648\n"}, {}, 2 * GiB),
    # cgroup v2 headroom above MemAvailable: MemAvailable wins
    ({"/proc/meminfo": MEMINFO, V2[0]: "68719476736\n", V2[1]: "1024\n"}, {}, 4_096_000_000),
    # cgroup v2 without a limit ("max"): cgroup v1 next, here 1 GiB limit, 256 MiB used -> 768 MiB
    ({"/proc/meminfo": MEMINFO, V2[0]: "max\n", V2[1]: "5\n", V1[0]: "1073741824", V1[1]: "268435456"},
     {}, 384 * MiB),
    # cgroup v1's "no limit" (a page-rounded 2^63): ignored
    ({"/proc/meminfo": MEMINFO, V1[0]: "9223372036854771712\n", V1[1]: "4096\n"}, {}, 4_096_000_000),
    # a limit of 2^60 exactly and more is "no limit"; just below is one
    ({"/proc/meminfo": MEMINFO, V2[0]: str(2**60), V2[1]: "0"}, {}, 4_096_000_000),
    ({"/proc/meminfo": MEMINFO, V2[0]: str(2**33 - 2), V2[1]: "0"}, {}, 4_096_000_000),
    ({"/proc/meminfo": MEMINFO, V2[0]: str(2**32 + 6), V2[1]: "0"}, {}, 2**31 + 3),
    # usage over the limit: nothing left
    ({"/proc/meminfo": MEMINFO, V2[0]: "1000", V2[1]: "5000"}, {}, 0),
    # 2^60 and above are "no limit" even when the usage leaves little below them
    ({"/proc/meminfo": MEMINFO, V2[0]: str(2**60), V2[1]: str(2**60 - 1000)}, {}, 4_096_000_000),
    ({"/proc/meminfo": MEMINFO, V2[0]: str(2**60 + 10), V2[1]: str(2**60)}, {}, 4_096_000_000),
    ({"/proc/meminfo": MEMINFO, V2[0]: str(2**60 - 1), V2[1]: str(2**60 - 1001)}, {}, 500),
    # a limit without a usage file: not usable, so no bound
    ({"/proc/meminfo": MEMINFO, V2[0]: "1000"}, {}, 4_096_000_000),
    # no /proc/meminfo: sysconf's available pages x page size, 1000 x 4096 bytes
    ({}, {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}, 2_048_000),
    # meminfo without MemAvailable, or unreadable: sysconf too
    ({"/proc/meminfo": "MemTotal: 5 kB\n"}, {"SC_AVPHYS_PAGES": 3, "SC_PAGE_SIZE": 4096}, 6144),
    ({"/proc/meminfo": "MemAvailable: lots kB\n"}, {"SC_AVPHYS_PAGES": 3, "SC_PAGE_SIZE": 4096}, 6144),
    ({"/proc/meminfo": "MemAvailable:\n"}, {"SC_AVPHYS_PAGES": 3, "SC_PAGE_SIZE": 4096}, 6144),
    # a line that only starts like the field is another field
    ({"/proc/meminfo": "MemAvailableX: 10 kB\nMemAvailable: 2 kB\n"}, {}, 1024),
    # sysconf bounded by a cgroup too
    ({V2[0]: "4096", V2[1]: "2048"}, {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}, 1024),
    # nothing readable: 4 GiB assumed, half of it
    ({}, {"SC_PAGE_SIZE": 4096}, 2 * GiB),
    ({}, {"SC_AVPHYS_PAGES": OSError("no"), "SC_PAGE_SIZE": 4096}, 2 * GiB),
    ({}, {}, 2 * GiB),
    # nothing readable but a cgroup: 4 GiB bounded by it (3 GiB left -> 1.5 GiB)
    ({V1[0]: str(4 * GiB), V1[1]: str(GiB)}, {}, 3 * GiB // 2),
])
def test_default_budget_derivation(machine: dict[str, Any], files: dict[str, str], sysconf: dict[str, Any],
                                   budget: int) -> None:
    machine["files"].update(files)
    machine["sysconf"].update(sysconf)
    assert cg.memory_budget() == budget


def test_nothing_left_below_the_cgroup_limit(machine: dict[str, Any]) -> None:
    machine["files"].update({"/proc/meminfo": MEMINFO, V1[0]: "4096", V1[1]: "8192"})
    assert limits.available_memory() == 0


def test_odd_available_bytes_round_down(machine: dict[str, Any]) -> None:
    machine["files"]["/proc/meminfo"] = "MemAvailable: 3 kB\n"
    assert cg.memory_budget() == 1536
    machine["sysconf"].update(SC_AVPHYS_PAGES=3, SC_PAGE_SIZE=1)
    del machine["files"]["/proc/meminfo"]
    machine["clock"][0] += 10
    assert cg.memory_budget() == 1


def test_available_memory_is_read_at_most_every_half_second(machine: dict[str, Any]) -> None:
    machine["files"]["/proc/meminfo"] = "MemAvailable: 8 kB\n"
    assert limits.available_memory() == 8192
    machine["files"]["/proc/meminfo"] = "MemAvailable: 16 kB\n"
    machine["clock"][0] += 0.49
    assert limits.available_memory() == 8192  # still the value read 0.49 s ago
    machine["clock"][0] += 0.01
    assert limits.available_memory() == 16384  # 0.5 s after the first read: read again
    assert cg.memory_budget() == 8192


def test_environment_and_call_win_over_the_derivation(machine: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    machine["files"]["/proc/meminfo"] = MEMINFO
    monkeypatch.setenv("CONVGRAD_MEMORY_BUDGET", "3GiB")
    assert cg.memory_budget() == 3 * GiB
    monkeypatch.setenv("CONVGRAD_MEMORY_BUDGET", "")  # empty: not set
    assert cg.memory_budget() == 4_096_000_000
    monkeypatch.setenv("CONVGRAD_MEMORY_BUDGET", "1.5GB")
    cg.set_memory_budget("512MiB")
    assert cg.memory_budget() == 512 * MiB
    cg.set_memory_budget(0)  # zero is a budget, not "unset"
    assert cg.memory_budget() == 0
    cg.set_memory_budget(None)
    assert cg.memory_budget() == 1_500_000_000


# ---------------------------------------------------------------------------------------------
# Engines without workspace_bytes
# ---------------------------------------------------------------------------------------------
class _Plain:
    """An engine without ``workspace_bytes``: the reference engine's three methods only."""

    name = "plain"

    def __init__(self) -> None:
        self._reference = ReferenceEngine()
        self.forward = self._reference.forward
        self.backward_data = self._reference.backward_data
        self.backward_weights = self._reference.backward_weights


#: Convolution of an NXC f32 src (2, 7, 6, 3) with XIO weights (3, 3, 3, 4), pads 1/1 (2-D).
#: Fallback working set: 2 copies x 8 bytes x (zero-padded src 2*9*8*3 = 432 + src 252 + dst
#: 2*7*6*4 = 336 + weights 108 values) = 18,048 bytes; the API's copies of the 336-value result:
#: the engine's (f64 for an engine that does not say, 8 bytes), its rounding to f32 and its copy in
#: the user's layout (2 x 4 bytes) per value = 5,376 bytes. Total 23,424.
_CONV = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1], dilations=[1, 1])
_ESTIMATE = 23_424


def test_estimate_for_an_engine_without_workspace_bytes() -> None:
    rng = np.random.default_rng()
    x, w = rng.standard_normal((2, 7, 6, 3)).astype(np.float32), rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
    op = cg.Op("Convolution", **_CONV)
    assert limits.estimate_bytes(op.infer(x, w), _Plain()) == _ESTIMATE
    try:
        cg.set_memory_budget(_ESTIMATE - 1)
        with pytest.raises(cg.ResourceError, match=f"on the plain engine .*({_ESTIMATE} bytes)"):
            op(x, w, engine=_Plain())
        cg.set_memory_budget(_ESTIMATE)
        np.testing.assert_allclose(op(x, w, engine=_Plain()), op(x, w, engine="reference"), rtol=0, atol=0)
    finally:
        cg.set_memory_budget(None)


def test_estimate_uses_the_engines_own_working_set() -> None:
    class Reporting(_Plain):
        def workspace_bytes(self, g, task, dtype) -> int:
            assert (g.ic, g.oc, task, dtype) == (3, 4, "forward", np.float32)
            return 1000
    op = cg.Op("Convolution", **_CONV)
    problem = op.infer((2, 7, 6, 3), (3, 3, 3, 4))
    assert limits.estimate_bytes(problem, Reporting()) == 1000 + 5376  # + the API's copies of the result


def test_sizes_up_to_int64_pass_and_beyond_fail() -> None:
    """A tensor of 2^60 - 1 values (x 8 bytes: just below 2^63) is inferred; 2^60 is a ShapeError
    naming it. (Op.infer allocates nothing.)"""
    a, b = 2**30 - 1, 2**30 + 1  # a * b = 2^60 - 1
    op = cg.Op("Convolution", strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1])
    assert op.infer((1, a, b, 1), (1, 1, 1, 1)).output_shape == (1, a, b, 1)
    with pytest.raises(cg.ShapeError) as info:
        op.infer((1, 2**30, 2**30, 1), (1, 1, 1, 1))
    assert str(info.value) == (f"Convolution: the 'src' tensor of this problem would have shape [1, {2**30}, {2**30}, "
                               "1]: sizes beyond int64 cannot be allocated or indexed")
    with pytest.raises(cg.ShapeError, match=r"the zero-padded 'src' tensor of this problem would have shape "
                                            rf"\[1, {2**30}, {b}, 1\]"):
        cg.Op("Convolution", strides=[1, 1], pads_begin=[1, 0], pads_end=[0, 0], dilations=[1, 1]).infer(
            (1, a, b, 1), (2, 1, 1, 1))


@pytest.mark.parametrize("kind", ["Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights",
                                  "ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"])
def test_fallback_estimate_is_conservative(kind: str) -> None:
    """The fallback estimate bounds what the reference engine (without its own estimate) really
    allocates, measured with tracemalloc, on a problem of each op with strides, dilations and groups."""
    rng = np.random.default_rng()
    attrs = dict(strides=[2, 1], dilations=[1, 2], pads_begin=[1, 0], pads_end=[2, 1], groups=2)
    conv = cg.Op("Convolution", **attrs)
    x_shape, w_shape = (3, 13, 12, 8), (3, 2, 4, 6)
    y_shape = conv.infer(x_shape, w_shape).output_shape
    d = cg.OPS[kind]
    if d.transposed:
        attrs["output_padding"] = [(13 + 3 - 3) % 2, 0]
    shapes = {"x": x_shape, "y": y_shape, "w": w_shape}
    inputs = [rng.standard_normal(shapes[s.role]).astype(np.float32) if s.role != "shape"
              else np.array(shapes[d.output.role]) for s in d.inputs if s.role != "bias"]
    op = cg.Op(kind, **attrs)
    problem, arrays = op.prepare(*inputs)
    estimate = limits.estimate_bytes(problem, _Plain())
    tracemalloc.start()
    try:
        result = cg.op.execute(problem, arrays, _Plain())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.shape == problem.output_shape and peak <= estimate


# ---------------------------------------------------------------------------------------------
# Sizes for people, and what the budget accepts
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nbytes,text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
                                         (MiB - 1, "1024.0 KiB"), (MiB, "1.0 MiB"), (5 * GiB // 2, "2.5 GiB"),
                                         (3 * 2**40, "3.0 TiB"), (2**50, "1024.0 TiB")])
def test_format_size(nbytes: int, text: str) -> None:
    assert limits.format_size(nbytes) == text


@pytest.mark.parametrize("text,expected", [("7", 7), ("2KiB", 2048), ("1.5 mib", 3 * 2**19), ("2tb", 2 * 10**12),
                                           ("3 TiB", 3 * 2**40), ("1.", 1), ("4g", 4 * 10**9), ("0", 0)])
def test_parse_size_units(text: str, expected: int) -> None:
    assert limits.parse_size(text) == expected


@pytest.mark.parametrize("text", ["5 XiB", "2 GiB GiB", "1,5GB", ".5GB"])
def test_parse_size_refuses_with_the_reason(text: str) -> None:
    with pytest.raises(cg.ResourceError) as info:
        limits.parse_size(text)
    assert str(info.value) == (f"memory size {text!r} is not understood: expected bytes or a number with a unit "
                               "such as 512MiB, 2GiB or 1.5GB")


@pytest.mark.parametrize("value", [-1, 2.5, True, np.bool_(False), "x", [1], np.int64(-3), np.float64(3)])
def test_set_memory_budget_refuses_with_the_reason(value: Any) -> None:
    with pytest.raises(cg.ResourceError) as info:
        cg.set_memory_budget(value)
    if not isinstance(value, str):
        assert str(info.value) == (f"memory budget {value!r}: expected a non-negative number of bytes, a size string "
                                   "such as '2GiB', or None")


@pytest.mark.parametrize("value,budget", [(0, 0), (np.int32(5), 5), (np.uint64(7), 7), ("1KiB", 1024)])
def test_set_memory_budget_accepts(value: Any, budget: int) -> None:
    try:
        cg.set_memory_budget(value)
        assert cg.memory_budget() == budget and type(cg.memory_budget()) is int
    finally:
        cg.set_memory_budget(None)


def test_over_budget_message_word_for_word() -> None:
    op = cg.Op("Convolution", **_CONV)
    x, w = np.ones((2, 7, 6, 3), np.float32), np.ones((3, 3, 3, 4), np.float32)
    try:
        cg.set_memory_budget(100)
        with pytest.raises(cg.ResourceError) as info:
            op(x, w, engine=_Plain())
    finally:
        cg.set_memory_budget(None)
    assert str(info.value) == (
        "Convolution: the result 'dst' [2, 7, 6, 4] (336 values) alone needs about 5.2 KiB (5376 bytes), over the "
        "memory budget of 100 B (100 bytes). Raise it with convgrad.set_memory_budget('...GiB') or the "
        "CONVGRAD_MEMORY_BUDGET environment variable (default: half of the available memory), or split the problem "
        "(e.g. the batch)")
    try:
        cg.set_memory_budget(_ESTIMATE - 1)
        with pytest.raises(cg.ResourceError) as info:
            op(x, w, engine=_Plain())
    finally:
        cg.set_memory_budget(None)
    assert str(info.value).startswith(
        "Convolution: running this problem on the plain engine (tensors 'src' [2, 7, 6, 3] (252 values), 'weights' "
        "[3, 3, 3, 4] (108 values), 'dst' [2, 7, 6, 4] (336 values)) needs about 22.9 KiB (23424 bytes), over the "
        "memory budget of 22.9 KiB (23423 bytes).")


def test_million_values_are_written_in_short() -> None:
    x = np.broadcast_to(np.float32(1), (1, 1000, 1000, 1))
    try:
        cg.set_memory_budget(1000)
        with pytest.raises(cg.ResourceError, match=r"'src' \[1, 1000, 1000, 1\] \(1e\+06 values\), 'weights' "
                                                   r"\[1, 1, 1, 1\] \(1 value\),"):
            cg.convolution(x, np.ones((1, 1, 1, 1), np.float32), strides=[1000, 1000], engine=_Plain())
    finally:
        cg.set_memory_budget(None)


def test_check_memory_takes_the_engines_own_estimate_up_to_the_budget_exactly() -> None:
    """A budget equal to what the call needs passes (the checks are strict ``>``); the engine's
    own ``workspace_bytes`` is what counts (not the conservative fallback), and an engine without
    a name is called '?' in the message."""
    from convgrad.limits import _result_bytes, check_memory, set_memory_budget

    x, w = np.ones((1, 6, 6, 4), np.float32), np.ones((3, 3, 4, 5), np.float32)
    problem, _ = cg.Op("Convolution", strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0],
                       dilations=[1, 1]).prepare(x, w)

    class Lean:
        name = "lean"

        def workspace_bytes(self, g, task, dtype) -> int:
            return 0

    class Anonymous:
        def workspace_bytes(self, g, task, dtype) -> int:
            return 1 << 40

    result = 80 * (8 + 4 + 4)  # dst (1, 4, 4, 5): the engine's f64 result, its f32 rounding, the layout copy
    assert _result_bytes(problem) == result
    try:
        set_memory_budget(result)
        check_memory(problem, Lean())  # needs exactly the budget: passes
        with pytest.raises(cg.ConvgradError, match=r"on the \? engine"):
            check_memory(problem, Anonymous())
        set_memory_budget(result - 1)
        with pytest.raises(cg.ConvgradError, match="the result 'dst'"):
            check_memory(problem, Lean())
    finally:
        set_memory_budget(None)


@pytest.mark.parametrize("dtype, result_dtype, bias, per_value", [
    (np.float32, None, False, 8 + 4 + 4),  # an engine that does not say: f64, rounded to f32, the layout copy
    (np.float32, np.float32, False, 4 + 4),  # an f32 result: no rounding copy
    (np.float32, np.float32, True, 4 * 2 + 4),  # the bias added into a new f32 array
    (ml_dtypes.bfloat16, np.float32, False, 4 + 2 + 2),  # f32 result, rounded to bf16, the layout copy
    (ml_dtypes.bfloat16, np.float32, True, 4 * 2 + 2 + 2),
    (np.float64, np.float64, False, 8 + 8),
])
def test_result_copies_follow_the_engines_result_dtype(dtype, result_dtype, bias, per_value) -> None:
    """The result's copies (80 values of dst (1, 4, 4, 5)) in the engine's ``result_dtype``, bytes
    written out; the estimate and the memory check count them, with the engine's own workspace."""
    from convgrad.limits import check_memory, set_memory_budget

    arrays = [np.ones((1, 6, 6, 4), dtype), np.ones((3, 3, 4, 5), dtype)] + ([np.ones(5, dtype)] if bias else [])
    problem, _ = cg.Op("Convolution", strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0],
                       dilations=[1, 1]).prepare(*arrays)

    class Engine:
        name = "lean"

        def workspace_bytes(self, g, task, dtype) -> int:
            return 100

    def engine_result_dtype(given: Any) -> np.dtype:
        assert given is not None and np.dtype(given) == np.dtype(dtype)  # asked for the problem's dtype
        return np.dtype(result_dtype)

    if result_dtype is not None:
        Engine.result_dtype = staticmethod(engine_result_dtype)
    result = 80 * per_value
    assert limits.estimate_bytes(problem, Engine()) == 100 + result
    try:
        set_memory_budget(result - 1)
        with pytest.raises(cg.ResourceError) as info:
            check_memory(problem, Engine())
        assert f"the result 'dst' [1, 4, 4, 5] (80 values) alone needs about " in str(info.value)
        assert f"({result} bytes), over the memory budget of" in str(info.value)
        set_memory_budget(result + 99)
        with pytest.raises(cg.ResourceError, match=f"running this problem on the lean engine .*\\({result + 100} bytes\\)"):
            check_memory(problem, Engine())
        set_memory_budget(result + 100)
        check_memory(problem, Engine())
    finally:
        set_memory_budget(None)


def test_counts_below_a_million_are_written_out() -> None:
    """Counts from 1 to 999,999 in full in the over-budget message (1e+06 and up in short)."""
    x = np.broadcast_to(np.float32(1), (1, 40, 50, 1))
    try:
        cg.set_memory_budget(40_000)  # the result's 32,000 bytes fit, not the whole call
        with pytest.raises(cg.ResourceError, match=r"'src' \[1, 40, 50, 1\] \(2000 values\), 'weights' "
                                                   r"\[1, 1, 1, 1\] \(1 value\), 'dst' \[1, 40, 50, 1\] \(2000 values\)\)"):
            cg.convolution(x, np.ones((1, 1, 1, 1), np.float32), engine=_Plain())
    finally:
        cg.set_memory_budget(None)


def test_check_bytes_refuses_only_above_the_budget() -> None:
    """``check_bytes`` (the ops around convolutions): strictly above the budget is refused, with
    the op, what needs it and the bytes; at the budget it passes."""
    try:
        cg.set_memory_budget(1000)
        limits.check_bytes("ReLU", "running ReLU on shape [10, 10]", 1000)
        with pytest.raises(cg.ResourceError) as info:
            limits.check_bytes("ReLU", "running ReLU on shape [10, 10]", 1001)
    finally:
        cg.set_memory_budget(None)
    assert str(info.value).startswith("ReLU: running ReLU on shape [10, 10] needs about 1001 B (1001 bytes), over the "
                                      "memory budget of 1000 B (1000 bytes).")
