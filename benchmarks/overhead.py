"""Per-call cost of small, repeated calls (issue 32's judge): the warm per-call time of a tiny
problem (mb 1, 8x8, 4 -> 4 channels, 3x3, pad 1) through each of convgrad's front ends, printed
beside PyTorch's own call of the same work, and their ratio (target: within 2x).

    python benchmarks/overhead.py [--calls 2000] [--repeats 7] [--threads 2] [--markdown]

Pairs (convgrad | PyTorch):

- functional data / weights gradient (NumPy in and out) | ``torch.ops.aten.convolution_backward``
  with only that gradient asked for;
- a reused ``cg.Op`` (data gradient) | the same aten call;
- ``convgrad.torch.convolution`` forward | ``F.conv2d``;
- ``convgrad.torch`` forward + ``.backward()`` through autograd | ``F.conv2d`` forward + backward;
- ``convgrad.jax.convolution`` under ``jax.jit`` (forward, and value-and-grad) | ``F.conv2d``
  forward, forward + backward; and the same beside JAX's own ``jax.lax.conv_general_dilated``
  under ``jax.jit`` (XLA's CPU convolution);
- the floors under ``jax.jit``: an XLA FFI call (:mod:`convgrad.xla_ffi`) whose host function
  returns a ready array, and one of the compiled target whose kernel does nothing | ``F.conv2d``.

Each pair runs in one process, each call in its own block after a warm-up, blocks alternating;
the median over ``--repeats`` blocks of ``--calls`` calls is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

SHAPE = dict(n=1, size=8, channels=4, kernel=3, pad=1)


def _time(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _pair(ours: Callable[[], object], theirs: Callable[[], object], calls: int, repeats: int) -> tuple[float, float]:
    """Median seconds per call of each, blocks alternating after a warm-up."""
    for fn in (ours, theirs):
        _time(fn, max(50, calls // 20))
    a, b = [], []
    for _ in range(repeats):
        a.append(_time(ours, calls))
        b.append(_time(theirs, calls))
    return statistics.median(a), statistics.median(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    import convgrad as cg
    import convgrad.torch as ct

    torch.set_num_threads(args.threads)
    n, s, c, k, p = (SHAPE[key] for key in ("n", "size", "channels", "kernel", "pad"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, s, s, c), np.float32)             # NXC
    w = rng.standard_normal((k, k, c, c), np.float32)             # XIO
    dy = rng.standard_normal((n, s, s, c), np.float32)
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()     # NCHW for PyTorch
    wt = torch.from_numpy(w).permute(3, 2, 0, 1).contiguous()     # OIHW
    dyt = torch.from_numpy(dy).permute(0, 3, 1, 2).contiguous()
    conv_args = ([1, 1], [p, p], [1, 1], False, [0, 0], 1)        # stride, padding, dilation, transposed, out pad, groups

    def aten(mask: list[bool]) -> Callable[[], object]:
        return lambda: torch.ops.aten.convolution_backward(dyt, xt, wt, None, *conv_args, mask)

    op = cg.Op("ConvolutionBackwardData", strides=[1, 1], pads_begin=[p, p], pads_end=[p, p], dilations=[1, 1])
    x_shape = np.array(x.shape, np.int32)
    xn, wn = torch.from_numpy(x), torch.from_numpy(w)                # NXC, XIO: convgrad's layout, made once
    xg, wg = xn.clone().requires_grad_(), wn.clone().requires_grad_()
    xtg, wtg = xt.clone().requires_grad_(), wt.clone().requires_grad_()

    def ours_autograd() -> None:
        ct.convolution(xg, wg, pads_begin=p, pads_end=p).sum().backward()

    def torch_autograd() -> None:
        F.conv2d(xtg, wtg, padding=p).sum().backward()

    pairs: list[tuple[str, Callable[[], object], str, Callable[[], object]]] = [
        ("functional data gradient", lambda: cg.convolution_backward_data(dy, w, x_shape, pads_begin=p, pads_end=p),
         "aten.convolution_backward (data)", aten([True, False, False])),
        ("functional weights gradient",
         lambda: cg.convolution_backward_weights(x, dy, [k, k, c, c], pads_begin=p, pads_end=p),
         "aten.convolution_backward (weights)", aten([False, True, False])),
        ("reused cg.Op (data gradient)", lambda: op(dy, w, x_shape),
         "aten.convolution_backward (data)", aten([True, False, False])),
        ("convgrad.torch.convolution", lambda: ct.convolution(xn, wn, pads_begin=p, pads_end=p),
         "F.conv2d", lambda: F.conv2d(xt, wt, padding=p)),
        ("convgrad.torch forward + backward", ours_autograd, "F.conv2d forward + backward", torch_autograd),
    ]
    try:
        import jax

        import convgrad.jax as cj

        xj, wj = jax.numpy.asarray(x), jax.numpy.asarray(w)
        fwd = jax.jit(lambda a, b: cj.convolution(a, b, pads_begin=p, pads_end=p))
        grad = jax.jit(jax.value_and_grad(lambda a, b: cj.convolution(a, b, pads_begin=p, pads_end=p).sum(),
                                          argnums=(0, 1)))
        import numba

        from convgrad.xla_ffi import host_target, kernel_params, kernel_target

        def lax_conv(a: jax.Array, b: jax.Array) -> jax.Array:
            return jax.lax.conv_general_dilated(a, b, (1, 1), [(p, p), (p, p)],
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))

        out = np.zeros(x.shape, np.float32)
        empty = host_target(lambda a, b: out, "empty")
        floor = jax.jit(lambda a, b: jax.ffi.ffi_call(empty, jax.ShapeDtypeStruct(x.shape, np.float32),
                                                      vmap_method="sequential")(a, b))
        @numba.njit
        def nothing(a: int, b: int, out: int, params: int) -> None:  # pragma: no cover - compiled
            pass

        nothing_params = jax.numpy.asarray(kernel_params(nothing, np.zeros(1, np.int32)))
        compiled_floor = jax.jit(lambda a, b: jax.ffi.ffi_call(kernel_target(), jax.ShapeDtypeStruct(x.shape, np.float32),
                                                               vmap_method="sequential")(a, b, nothing_params))
        lax_fwd = jax.jit(lax_conv)
        lax_grad = jax.jit(jax.value_and_grad(lambda a, b: lax_conv(a, b).sum(), argnums=(0, 1)))
        pairs += [("convgrad.jax under jax.jit", lambda: fwd(xj, wj).block_until_ready(),
                   "F.conv2d", lambda: F.conv2d(xt, wt, padding=p)),
                  ("convgrad.jax value_and_grad, jit",
                   lambda: jax.block_until_ready(grad(xj, wj)), "F.conv2d forward + backward", torch_autograd),
                  ("(floor) an empty host call under jax.jit", lambda: floor(xj, wj).block_until_ready(),
                   "F.conv2d", lambda: F.conv2d(xt, wt, padding=p)),
                  ("(floor) an empty compiled call, jax.jit", lambda: compiled_floor(xj, wj).block_until_ready(),
                   "F.conv2d", lambda: F.conv2d(xt, wt, padding=p)),
                  ("convgrad.jax under jax.jit", lambda: fwd(xj, wj).block_until_ready(),
                   "jax.lax.conv under jax.jit", lambda: lax_fwd(xj, wj).block_until_ready()),
                  ("convgrad.jax value_and_grad, jit", lambda: jax.block_until_ready(grad(xj, wj)),
                   "jax.lax.conv value_and_grad, jit", lambda: jax.block_until_ready(lax_grad(xj, wj)))]
    except ImportError:
        print("(JAX not installed: its pairs are skipped)")

    rows = []
    for name, ours, peer, theirs in pairs:
        a, b = _pair(ours, theirs, args.calls, args.repeats)
        rows.append((name, a * 1e6, peer, b * 1e6, a / b))
    if args.markdown:
        print("| convgrad call | µs | peer call | µs | ratio (target <= 2) |")
        print("|---|---:|---|---:|---:|")
        for name, a, peer, b, r in rows:
            print(f"| {name} | {a:.1f} | {peer} | {b:.1f} | {r:.2f}x |")
    else:
        for name, a, peer, b, r in rows:
            print(f"{name:36} {a:8.1f} us   {peer:38} {b:8.1f} us   {r:5.2f}x")


if __name__ == "__main__":
    main()
