"""The cases behind tests/data/amx_tdpbf16ps.npz: one tile product (16x1 block, 16 pairs) per call.

    python benchmarks/tile_cases.py make cases.npz          # anywhere: the operands
    python benchmarks/tile_cases.py run cases.npz out.npz   # on an AMX CPU: the tiles' and the dot's sums

Six cases of 400 calls: random normals; one pair, one product and two pairs non-zero (wide
exponents); operands and accumulators near the bottom of the range; signed zeros. The test file
keeps the first 24 calls of each with both results (tests/test_tiles.py fits the model to them).
"""
import sys
import numpy as np

def bits(x):
    import ml_dtypes
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)

def make(path):
    rng = np.random.default_rng(7)
    cases = {}
    n = 400
    # 1. random normal everything
    cases["normal"] = (bits(rng.standard_normal((n, 16, 32))), bits(rng.standard_normal((n, 16, 32))),
                       rng.standard_normal((n, 16, 16)).astype(np.float32))
    # 2. one pair nonzero (pair 0), wide exponents
    a = bits(rng.standard_normal((n, 16, 32)) * 2.0 ** rng.integers(-20, 20, (n, 16, 32))); a[:, :, 2:] = 0
    b = bits(rng.standard_normal((n, 16, 32)) * 2.0 ** rng.integers(-20, 20, (n, 16, 32))); b[:, 2:, :] = 0
    cases["one_pair"] = (a, b, (rng.standard_normal((n, 16, 16)) * 2.0 ** rng.integers(-10, 10, (n, 16, 16))).astype(np.float32))
    # 3. one product only (even element of pair 0)
    a1 = a.copy(); a1[:, :, 1] = 0
    cases["one_product"] = (a1, b, cases["one_pair"][2])
    # 4. two pairs nonzero (pairs 0 and 5)
    a = bits(rng.standard_normal((n, 16, 32)) * 2.0 ** rng.integers(-12, 12, (n, 16, 32)))
    keep = np.zeros(32, bool); keep[[0, 1, 10, 11]] = True; a[:, :, ~keep] = 0
    b = bits(rng.standard_normal((n, 16, 32)) * 2.0 ** rng.integers(-12, 12, (n, 16, 32))); b[:, [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], :] = 0
    cases["two_pairs"] = (a, b, (rng.standard_normal((n, 16, 16)) * 2.0 ** rng.integers(-8, 8, (n, 16, 16))).astype(np.float32))
    # 5. near the bottom of the range: denormal inputs / products / accumulators
    e = rng.integers(0, 3, (n, 16, 32)) * (rng.random((n, 16, 32)) < 0.4) + rng.integers(55, 75, (n, 16, 32)) * (rng.random((n, 16, 32)) >= 0.4)
    sp = lambda e: ((rng.integers(0, 2, e.shape) << 15) | (e << 7) | rng.integers(0, 128, e.shape)).astype(np.uint16)
    c = np.where(rng.random((n, 16, 16)) < 0.5, rng.standard_normal((n, 16, 16)) * 1e-38, rng.standard_normal((n, 16, 16)) * 1e-36).astype(np.float32)
    cases["tiny"] = (sp(e), sp(np.clip(e + 0, 0, 255)), c)
    # 6. signed zeros: c = +-0, products +-0 or underflowing
    a = sp(rng.integers(0, 60, (n, 16, 32))); b = sp(rng.integers(0, 60, (n, 16, 32)))
    c = np.where(rng.random((n, 16, 16)) < 0.5, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
    cases["zeros"] = (a, b, c)
    np.savez(path, **{f"{k}_{j}": v for k, t in cases.items() for j, v in zip("abc", t)})

def run(path, out):
    from convgrad.engines.fast import microkernel
    d = np.load(path)
    z = np.zeros(1, np.int64)
    res = {}
    for mode, tag in ((microkernel.TILES, "tiles"), (microkernel.DOT, "dot")):
        call = microkernel.kernel_call(16, 16, 1, mode)
        for name in sorted({k[:-2] for k in d.files}):
            a, b, c = d[name + "_a"], d[name + "_b"], d[name + "_c"]
            got = c.copy()
            for i in range(a.shape[0]):
                g = got[i].reshape(-1)
                call(g, 0, 16, np.ascontiguousarray(a[i]).reshape(-1), 0, 32, 2, np.ascontiguousarray(b[i]).reshape(-1), 0, 32, z, z, 1, 16, 1)
            res[f"{name}_{tag}"] = got
    np.savez(out, **res)

if __name__ == "__main__":
    make(sys.argv[2]) if sys.argv[1] == "make" else run(sys.argv[2], sys.argv[3])
