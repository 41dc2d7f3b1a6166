"""The engine's cache of temporaries (:mod:`convgrad.engines.fast.workspace`): blocks handed out
within a call never alias each other, return to the cache when the call ends, come back zeroed
where asked, stay within the cache's bound; and no strategy's result lies in a cached block (a
result kept from one call is unchanged by the next calls, which reuse the blocks)."""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
import pytest

import convgrad as cg
from convgrad.dtypes import bfloat16
from convgrad.engines import fast
from convgrad.engines.fast import workspace

from oracle import fresh_rng

MB = 1 << 20


def test_blocks_within_a_call_are_distinct_and_reused_by_the_next_call() -> None:
    workspace.clear()
    with workspace.call():
        a, b = workspace.empty(3 * MB, np.uint8), workspace.empty(3 * MB // 4, np.float32)
        assert not np.shares_memory(a, b)
        a.fill(7)
        first = {a.__array_interface__["data"][0], b.__array_interface__["data"][0]}
    assert workspace.cached_bytes() >= 6 * MB
    with workspace.call():
        with workspace.call():                                     # nested: one call
            c = workspace.zeros(3 * MB // 2, np.uint16)
        assert c.__array_interface__["data"][0] in first and not c.any()   # reused, zeroed
        d = workspace.empty(3 * MB, np.uint8)
        assert not np.shares_memory(c, d)
    for outside in (workspace.empty(16, np.float32), workspace.empty(2 * MB, np.uint8)):   # outside a call: fresh
        assert not any(np.shares_memory(outside, block) for block in workspace._free)


@pytest.mark.parametrize("nbytes", [4096, 5000, 3 * MB + 12])
def test_arrays_start_on_a_cache_line(nbytes: int) -> None:
    """Temporaries and results from 4 KiB start on a 64-byte boundary (kernels load 64-byte vectors)."""
    workspace.clear()
    with workspace.call():
        made = [workspace.empty(nbytes // 4, np.float32), workspace.zeros(nbytes, np.uint8),
                workspace.result((nbytes // 2,), np.uint16), workspace.result((nbytes // 4,), np.float32, fill=True)]
    made.append(workspace.empty(nbytes, np.uint8))
    assert all(a.__array_interface__["data"][0] % workspace.ALIGN == 0 for a in made)


@pytest.mark.parametrize("nbytes", [4096, 3 * MB + 12])
@pytest.mark.parametrize("offset", [16, 48])
def test_results_start_at_the_offset_asked_for(nbytes: int, offset: int) -> None:
    """A result asked ``offset`` bytes past a line starts there (a depthwise result placed like
    its source), small or lent; a lent one goes back to the cache when freed."""
    workspace.clear()
    for fill in (False, True):
        out = workspace.result((nbytes // 4,), np.float32, fill=fill, offset=offset)
        assert out.shape == (nbytes // 4,) and out.flags.c_contiguous and (not fill or not out.any())
        assert out.__array_interface__["data"][0] % workspace.ALIGN == offset
        out[...] = 1                                           # all of it writable
        del out
    cached = workspace.cached_bytes()
    assert cached == 0 if nbytes < fast.TUNING.workspace_min_bytes else cached >= nbytes + offset


def test_the_cache_keeps_at_most_its_bound(monkeypatch) -> None:
    workspace.clear()
    monkeypatch.setattr(workspace, "TUNING", dataclasses.replace(workspace.TUNING, workspace_cache_bytes=8 * MB))
    with workspace.call():
        for size in (2, 4, 6):
            workspace.empty(size * MB, np.uint8)
    assert workspace.cached_bytes() <= 8 * MB
    assert sorted(b.nbytes // MB for b in workspace._free) == [2, 4]        # the largest went
    workspace.clear()
    assert workspace.cached_bytes() == 0


@pytest.mark.parametrize("strategy", [None, *fast.STRATEGIES, "frame", "output_rows", "pointwise"])
@pytest.mark.parametrize("dtype", [np.float32, bfloat16])
@pytest.mark.parametrize("kernel", [1, 3])
def test_no_result_lies_in_a_cached_block(strategy: str | None, dtype, kernel: int) -> None:
    """Every task's result, kept, is unchanged after the same calls run again on other data
    (which take the blocks the first calls gave back): large enough for the cache (1 MiB)."""
    rng, seed = fresh_rng()
    attrs = dict(strides=1, pads_begin=kernel // 2, pads_end=kernel // 2)

    def calls(scale: float) -> list[np.ndarray]:
        x = (rng.standard_normal((8, 40, 40, 64)) * scale).astype(dtype)
        dy = (rng.standard_normal((8, 40, 40, 64)) * scale).astype(dtype)
        w = (rng.standard_normal((kernel, kernel, 64, 64)) * scale).astype(dtype)
        with fast.forced_strategy(strategy):
            return [cg.convolution(x, w, **attrs), cg.convolution_backward_data(dy, w, x.shape, **attrs),
                    cg.convolution_backward_weights(x, dy, w.shape, **attrs)]

    workspace.clear()
    kept = calls(1.0)
    copies = [k.copy() for k in kept]
    calls(-3.0)
    if strategy == "jit" and kernel == 3:          # padded copies, position pairs: cached
        assert workspace.cached_bytes() > 0
    for got, want, task in zip(kept, copies, ("forward", "data", "weights")):
        np.testing.assert_array_equal(got, want, err_msg=f"{task} {strategy} seed={seed}")


def _lent(a: np.ndarray) -> bool:
    """Whether ``a``'s memory is a block lent by the cache."""
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a, workspace._Lease)


def test_results_are_lent_and_come_back_when_freed() -> None:
    """A large result lies on a cached block lent to it: the block is not reused while the result
    or any view of it (a tensor made from it, a slice) lives, and is back in the cache once the
    last one is freed; the next result of that size takes it (its pages already touched)."""
    workspace.clear()
    a = workspace.result((512, 1024), np.float32, fill=True)
    assert a.shape == (512, 1024) and a.flags.c_contiguous and not a.any()
    address = a.__array_interface__["data"][0]
    view = a[3:7]
    del a
    assert workspace.cached_bytes() == 0                       # the view still holds the block
    b = workspace.result((512, 1024), np.float32)
    assert not np.shares_memory(b, view)
    del view
    assert workspace.cached_bytes() >= 2 * MB
    c = workspace.result((1024, 1024), np.uint16)
    assert c.__array_interface__["data"][0] == address         # the freed block, reused
    small = workspace.result((4, 4), np.float32)
    assert not _lent(small) and _lent(c)                       # below workspace_min_bytes: fresh
    del b, c


def test_engine_results_recycle_their_memory() -> None:
    """An engine result freed by its caller gives its block back: a later call of the same
    problem takes it instead of fresh pages (a 51 MB GEMM result faulted in by two threads took
    20-90 ms instead of 20)."""
    rng, _ = fresh_rng()
    x = rng.standard_normal((4, 32, 32, 64)).astype(np.float32)
    w = rng.standard_normal((1, 1, 64, 256)).astype(np.float32)
    workspace.clear()
    first = cg.convolution(x, w)
    address = first.__array_interface__["data"][0]
    want = first.copy()
    del first
    second = cg.convolution(x, w)
    assert second.__array_interface__["data"][0] == address
    np.testing.assert_array_equal(second, want)


def test_freed_results_stay_within_the_cache_bound(monkeypatch) -> None:
    """Results freed while no engine call runs are held only up to the cache's bound (the rest
    goes back to the allocator, as plain arrays would), not all of them until the next call."""
    workspace.clear()
    monkeypatch.setattr(workspace, "TUNING", dataclasses.replace(workspace.TUNING, workspace_cache_bytes=8 * MB))
    results = [workspace.result((MB,), np.float32) for _ in range(6)]   # 6 blocks of 4 MiB
    del results
    assert sum(b.nbytes for b in workspace._returned) <= 8 * MB
    assert workspace.cached_bytes() <= 8 * MB
    workspace.clear()


def test_a_part_of_a_call_gives_its_blocks_to_the_next_part() -> None:
    """Temporaries of one part of a call (one GEMM of several) go back to the cache when the part
    ends: the call's next part takes the same block, not a second one; outside a part they stay
    taken until the call ends."""
    workspace.clear()
    with workspace.call():
        with workspace.part():
            first = workspace.empty(3 * MB, np.uint8)
            address = first.__array_interface__["data"][0]
        del first
        with workspace.part():
            again = workspace.empty(3 * MB, np.uint8)
            assert again.__array_interface__["data"][0] == address
            held = workspace.empty(3 * MB, np.uint8)
            assert not np.shares_memory(again, held)
        kept = workspace.empty(3 * MB, np.uint8)      # outside a part: its own block until the call ends
        with workspace.part():
            inner = workspace.empty(3 * MB, np.uint8)
            assert not np.shares_memory(inner, kept)
    assert workspace.cached_bytes() >= 6 * MB


def test_line_empty_gives_compiled_arrays_a_cache_line() -> None:
    """Arrays made in compiled code by :func:`workspace.line_empty` (numba's own ``np.empty``
    aligns to 32 bytes: half start off a line) start on a line, hold ``count`` values and take
    what is written to them; every dtype the kernels use."""
    @numba.njit
    def made(sizes, dtype_probe):
        out = np.empty((sizes.size, 3), np.int64)
        for i in range(sizes.size):
            view = workspace.line_empty(sizes[i], dtype_probe.dtype)
            view[:] = 7
            out[i, 0] = view.ctypes.data % workspace.ALIGN
            out[i, 1] = view.size
            out[i, 2] = (view == 7).sum()
        return out
    sizes = np.arange(1, 90, dtype=np.int64)
    for dtype in (np.float32, np.uint16, np.uint32):
        got = made(sizes, np.zeros(1, dtype))
        assert (got[:, 0] == 0).all(), (dtype, got[:, 0])
        assert (got[:, 1] == sizes).all() and (got[:, 2] == sizes).all(), dtype
