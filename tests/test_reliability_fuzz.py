"""Fuzzing the library API (issue 5): every call returns a result that matches the reference
engine, or raises a ConvgradError; never another exception, never a crash or hang, and the
inputs are never modified.

Bounded in the suite; ``make fuzz`` (``CONVGRAD_FUZZ_EXAMPLES=5000``) runs it long. Add
``--hypothesis-show-statistics`` to see the outcome counts (``event`` lines).
"""

from __future__ import annotations

import faulthandler
import re
import time
from typing import Any

import numpy as np
from hypothesis import event, given
from hypothesis import strategies as st
from reliability_support import (Case, HugeCase, assert_close, examples, fingerprint, fuzz_settings, hostile,
                                 huge_cases, valid_cases)

import convgrad as cg

#: A single call that takes longer than this is a hang: the worker dumps its stacks and exits.
HANG_SECONDS = 60


def _outcome(call: Any) -> np.ndarray | cg.ConvgradError:
    """The call's result, or the convgrad error it raised (anything else fails the test)."""
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    try:
        result = call()
    except cg.ConvgradError as exc:
        assert str(exc), "a convgrad error must say what is wrong"
        event(f"error: {type(exc).__name__}")
        return exc
    finally:
        faulthandler.cancel_dump_traceback_later()
    event("result")
    return result


def _run_checked(op: cg.Op, inputs: list[Any]) -> np.ndarray | cg.ConvgradError:
    """Run ``op`` on ``inputs`` with the default engine; a result must match the reference engine
    and the inferred shape and dtype, and the inputs must be unchanged either way."""
    before = [fingerprint(v) for v in inputs]
    outcome = _outcome(lambda: op(*inputs))
    assert [fingerprint(v) for v in inputs] == before, "an input was modified"
    if isinstance(outcome, np.ndarray):
        problem = op.prepare(*inputs)[0]  # infer would read a list as a shape ([] a 0-d one)
        assert outcome.shape == problem.output_shape and outcome.dtype == problem.dtype
        try:
            want = op(*inputs, engine="reference")
        except cg.ResourceError:  # the f64 reference pads the whole input: it may need far more
            return outcome
        assert_close(outcome, want, cg.dtypes.dtype_name(problem.dtype))
    return outcome


#: Valid problems compile kernel variants of their own (52 s at 100 in a cold suite on a Zen 3, 2
#: cores): the default suite draws 30, ``make test-all`` 100, ``make fuzz`` 5000.
@fuzz_settings(examples(30, 100))
@given(valid_cases())
def test_valid_problems_match_the_reference(case: Case) -> None:
    result = _run_checked(case.op(), case.inputs)
    assert isinstance(result, np.ndarray), f"a valid problem was refused: {result}"
    assert result.shape == case.output_shape
    declared = [a.shape if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in case.inputs]
    assert case.op().infer(*declared, dtype=case.dtype).output_shape == case.output_shape


_MUTATIONS = ["drop", "extra", "hostile_input", "resize", "retype", "transpose", "hostile_attr",
              "unknown_attr", "drop_attr", "swap"]


def _mutate(case: Case, data: st.DataObject) -> tuple[dict[str, Any], list[Any]]:
    """One random corruption of a valid case: of its inputs or of its attributes."""
    attrs, inputs = dict(case.attrs), list(case.inputs)
    how = data.draw(st.sampled_from(_MUTATIONS), label="mutation")
    event(f"mutation: {how}")
    index = data.draw(st.integers(0, max(0, len(inputs) - 1)), label="input index")
    target = inputs[index] if inputs else None
    if how == "drop" and inputs:
        inputs[index] = None
    elif how == "extra":
        inputs.extend(data.draw(st.lists(hostile, min_size=1, max_size=3), label="extra inputs"))
    elif how == "hostile_input" and inputs:
        inputs[index] = data.draw(hostile, label="hostile input")
    elif how == "resize" and isinstance(target, np.ndarray) and target.ndim:
        axis = data.draw(st.integers(0, target.ndim - 1), label="axis")
        size = data.draw(st.sampled_from([0, 1, target.shape[axis] + 1, max(0, target.shape[axis] - 1)]))
        shape = list(target.shape)
        shape[axis] = size
        inputs[index] = np.ones(shape, dtype=target.dtype)
    elif how == "retype" and isinstance(target, np.ndarray):
        dtype = data.draw(st.sampled_from(["f4", "f8", "f2", "i4", "i8", "?", "c8", "O", ">f4", "u1"]))
        inputs[index] = target.astype(dtype)
    elif how == "transpose" and isinstance(target, np.ndarray):
        inputs[index] = target.T
    elif how in ("hostile_attr", "drop_attr"):
        name = data.draw(st.sampled_from(sorted(attrs)), label="attribute")
        if how == "drop_attr":
            del attrs[name]
        else:
            attrs[name] = data.draw(st.one_of(hostile, st.lists(st.integers(-3, 2**64), max_size=13)))
    elif how == "unknown_attr":
        attrs[data.draw(st.sampled_from(["foo", "Strides", "stride", "", "weights_shape ", "kind"]))] = 1
    elif how == "swap" and len(inputs) > 1:
        inputs[0], inputs[1] = inputs[1], inputs[0]
    return attrs, inputs


#: A corrupted problem that stays valid runs, and compiles its variants (39 s of a cold suite at 500
#: on a Zen 3): the default suite draws 250, ``make test-all`` 500, ``make fuzz`` 5000.
@fuzz_settings(examples(250, 500))
@given(valid_cases(max_rank=2), st.data())
def test_corrupted_problems_fail_cleanly(case: Case, data: st.DataObject) -> None:
    attrs, inputs = _mutate(case, data)
    op = _outcome(lambda: cg.Op(case.kind, **attrs))
    if isinstance(op, cg.Op):
        _run_checked(op, inputs)
        _outcome(lambda: op.infer(*inputs))


@fuzz_settings(examples(300, 800))  # no kernels to compile: every example costs its own time (800: 15 s cold)
@given(st.sampled_from(sorted(cg.OPS)), st.dictionaries(st.sampled_from(
    ["strides", "pads_begin", "pads_end", "dilations", "auto_pad", "groups", "data_format", "weights_format",
     "filter_format", "output_padding", "dst_shape", "weights_shape", "filter_shape", "alpha", "beta", "min", "max",
     "use_dst", "mode", "auto_broadcast", "shape", "special_zero", "order", "dtype", "bogus"]), hostile, max_size=6),
    st.lists(hostile, max_size=4), st.booleans())
def test_hostile_values_everywhere(kind: str, attrs: dict[str, Any], inputs: list[Any], lenient: bool) -> None:
    before = [fingerprint(v) for v in inputs]
    op = _outcome(lambda: cg.Op(kind, lenient=lenient, **attrs))
    if isinstance(op, cg.Op):
        _outcome(lambda: op.infer(*inputs))
        _run_checked(op, inputs)
    function = getattr(cg, cg.OPS[kind].function)
    _outcome(lambda: function(*inputs, **attrs))
    assert [fingerprint(v) for v in inputs] == before, "an input was modified"


@fuzz_settings(400)
@given(hostile, hostile, st.lists(hostile, max_size=3))
def test_hostile_op_kinds_engines_and_dtypes(kind: Any, engine: Any, shapes: list[Any]) -> None:
    _outcome(lambda: cg.Op(kind))
    _outcome(lambda: cg.Op("Convolution", kind, strides=[1]))  # as the attribute mapping
    try:
        _outcome(lambda: cg.set_memory_budget(kind))
    finally:
        cg.set_memory_budget(None)
    op = cg.Op("ConvolutionBackwardWeights", strides=[1], pads_begin=[0], pads_end=[0], dilations=[1])
    _outcome(lambda: op.infer(*shapes, dtype=engine))
    _outcome(lambda: op(np.ones((1, 3, 2), np.float32), np.ones((1, 3, 2), np.float32), [1, 2, 2], engine=engine))


#: A refusal of an absurd problem must come well within this (it takes milliseconds; work
#: proportional to the sizes would take hours). 1 s failed once on a loaded 2-core host (1.15 s,
#: passing when Hypothesis ran the example again: a scheduling pause, not the refusal's work).
REFUSAL_SECONDS = 3.0


def _timed(call: Any) -> tuple[Any, float]:
    """The call's result or convgrad error, and its seconds (a hang fails via ``_outcome``)."""
    start = time.perf_counter()
    outcome = _outcome(call)
    return outcome, time.perf_counter() - start


@fuzz_settings(300)
@given(huge_cases(), st.sampled_from(["fast", "reference"]))
def test_absurd_sizes_fail_at_once_naming_the_tensor(case: HugeCase, engine: str) -> None:
    """Huge kernels, huge declared shapes and channel counts on zero-stride broadcast views, huge
    shape tensors: the call fails in well under a second with a size error (ShapeError) or a memory
    error (ResourceError) that names one of the op's tensors and gives numbers; shape inference
    alone (``infer``) is as quick, and the inputs are untouched."""
    event(f"way: {case.way}")
    before = [fingerprint(v) for v in case.inputs]
    outcome, seconds = _timed(lambda: case.op()(*case.inputs, engine=engine))
    assert isinstance(outcome, (cg.ResourceError, cg.ShapeError)), f"{case.way}: {outcome!r}"
    message = str(outcome)
    assert any(f"'{name}'" in message for name in case.names) and re.search(r"\[\d|\d values", message), message
    assert seconds < REFUSAL_SECONDS, f"{seconds:.2f} s to refuse: {message}"
    inferred, seconds = _timed(lambda: case.op().infer(*case.inputs))
    assert seconds < REFUSAL_SECONDS, f"{seconds:.2f} s to infer"
    assert isinstance(inferred, (cg.Problem, cg.ShapeError)), repr(inferred)
    assert [fingerprint(v) for v in case.inputs] == before, "an input was modified"
