"""AMX tiles against the vector kernels on this CPU: the rate of each bf16 kernel with its panels
in L1 (one and two threads), and which model of TDPBF16PS's rounding the tiles follow.

    python benchmarks/tile_probe.py [--seconds 0.3]

Prints GFLOP/s of the f32 FMA kernel (the register-only peak's neighbour), the bf16 dot kernel
(``vdpbf16ps``) and each tile block at two reduction depths (the tile configuration is loaded
once per kernel call), then the share of lanes that match each model of the tiles' sums over
operands near the bottom of the range (engines/fast/tiles.py: even product first, each rounded
once, denormals flushed). Needs the ``amx_bf16`` family (exits 2 where the host lacks it).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from convgrad.engines.fast import isa, microkernel, tiles  # noqa: E402


@functools.cache
def _spin(rows: int, vecs: int, mode: int, bf16: bool):
    @numba.njit(parallel=True)
    def spin(c, a, b, depth, reps, threads):  # pragma: no cover - compiled
        vw = vecs * 16
        lanes = 2 if bf16 else 1
        one = np.zeros(1, np.int64)
        for p in numba.prange(threads):
            for _ in range(reps):
                microkernel.run(16, rows, vecs, mode, c, p * rows * vw, vw, a, p * rows * depth * lanes,
                                depth * lanes, lanes, b, p * depth * vw * lanes, vw * lanes, one, one, 1, depth, 1)
    return spin


def rate(rows: int, vecs: int, mode: int, bf16: bool, depth: int, threads: int, seconds: float) -> float:
    """GFLOP/s of one kernel with its panels in L1 on ``threads`` threads at once."""
    lanes = 2 if bf16 else 1
    rng = np.random.default_rng(0)
    c = np.zeros(threads * rows * vecs * 16, np.float32)
    kind = np.uint16 if bf16 else np.float32
    a = (rng.integers(0x3F00, 0x3F80, threads * rows * depth * lanes) if bf16
         else rng.standard_normal(threads * rows * depth)).astype(kind)
    b = (rng.integers(0x3F00, 0x3F80, threads * depth * vecs * 16 * lanes) if bf16
         else rng.standard_normal(threads * depth * vecs * 16)).astype(kind)
    spin = _spin(rows, vecs, mode, bf16)
    return microkernel._best_rate(lambda reps: spin(c, a, b, depth, reps, threads),
                                  2 * rows * vecs * 16 * depth * lanes * threads, seconds)


def models(samples: int = 64) -> dict[str, float]:
    """Share of lanes where the native tiles equal each model (16x1 block, 16 pairs a call)."""
    import test_kernels as tk
    from test_tiles import _tile_model
    rng = np.random.default_rng(1)
    hits: dict[str, int] = {}
    total = 0
    call = microkernel.kernel_call(16, 16, 1, microkernel.TILES)
    for _ in range(samples):
        p = tk._bf16_case(rng, 16, 16, 1, k=16)
        p["a"], p["b"] = tk._special_bits(rng, p["a"].size), tk._special_bits(rng, p["b"].size)
        got = p["c"].copy()
        call(got, *list(p.values())[1:])
        fused = _fused_model(p)
        for name, want in (("even first (ours)", _tile_model(p, 16, 1)), ("odd first", _tile_model(p, 16, 1, (1, 0))),
                           ("pair summed exactly, one rounding", fused)):
            hits[name] = hits.get(name, 0) + int(np.sum(got.view(np.uint32) == want.view(np.uint32)))
        total += got.size
    return {name: n / total for name, n in hits.items()}


def _fused_model(p: dict) -> np.ndarray:
    """Each pair's two products and the accumulator summed exactly (f64 is exact enough for
    bf16 products of moderate range), rounded once to f32, denormals flushed."""
    import test_kernels as tk
    c = p["c"].copy()
    a, b = tk._f32(p["a"]), tk._f32(p["b"])
    for r in range(16):
        at = p["coff"] + r * p["ldc"]
        acc = tk._daz(c[at:at + 16].astype(np.float64))
        for t in range(p["ntaps"]):
            for i in range(p["k"]):
                ai = p["aoff"] + p["ta"][t] + r * p["lda"] + i * p["astep"]
                pairs = b[p["boff"] + p["tb"][t] + i * p["bstep"]:][:32].reshape(16, 2).astype(np.float64)
                s = acc + tk._daz(np.float64(a[ai])) * tk._daz(pairs[:, 0]) \
                    + tk._daz(np.float64(a[ai + 1])) * tk._daz(pairs[:, 1])
                acc = tk._daz(s.astype(np.float32).astype(np.float64))
        c[at:at + 16] = acc.astype(np.float32)
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.3)
    args = ap.parse_args()
    if isa.family() != "amx_bf16" or not isa.tiles_permitted():
        print(f"family {isa.family()}: no AMX tiles here")
        sys.exit(2)
    for threads in (1, 2):
        print(f"threads {threads}: f32 FMA 14x2 {rate(14, 2, 0, False, 256, threads, args.seconds):.0f} GFLOP/s, "
              f"bf16 dot 14x2 {rate(14, 2, microkernel.DOT, True, 256, threads, args.seconds):.0f}", flush=True)
        for rows, vecs in tiles.TILE_BLOCKS:
            got = [rate(rows, vecs, microkernel.TILES, True, depth, threads, args.seconds) for depth in (32, 256)]
            print(f"threads {threads}: tiles {rows}x{vecs}: 32 pairs a call {got[0]:.0f}, 256 pairs {got[1]:.0f} GFLOP/s",
                  flush=True)
    for name, share in models().items():
        print(f"tiles vs model {name}: {100 * share:.1f} % of lanes equal")


if __name__ == "__main__":
    main()
