"""A ResNet-50-shaped training step through ``convgrad.torch`` against the same model on
``torch.nn.Conv2d`` (issue 31's judge): the bottleneck blocks (1x1 / 3x3 / 1x1 and the 1x1
projection shortcut) of ResNet-50's stages 2 and 3, ``--blocks`` per stage, mb ``--mb``, forward
+ backward + SGD update. Each library and layout runs in its own process after a warm-up, same
weights and inputs (from one seed); the first step's loss must agree to the dtype's rounding.
``--convert`` adds the torch.nn model after ``convgrad.torch.convert(model)`` (issue 33), in
channels_last and NCHW memory.

    python benchmarks/train_step.py [--mb 16] [--steps 6] [--dtype f32 bf16] [--blocks 2] [--convert]

Prints each run's median step time, PyTorch's best layout, and the ratios (PyTorch's best time
over convgrad's: above 1 is faster than PyTorch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

#: (input channels, bottleneck width, output channels, input size, stride of the first block)
STAGES = ((64, 64, 256, 56, 1), (256, 128, 512, 56, 2))


def _layers(blocks: int) -> list[tuple[str, int, int, int, int]]:
    """(name, in, out, kernel, stride) of every convolution, in model order."""
    out = []
    for s, (cin, width, cout, _, stride) in enumerate(STAGES, start=2):
        for b in range(blocks):
            first = b == 0
            c = cin if first else cout
            st = stride if first else 1
            out += [(f"res{s}.{b}.a", c, width, 1, 1), (f"res{s}.{b}.b", width, width, 3, st),
                    (f"res{s}.{b}.c", width, cout, 1, 1)]
            if first:
                out.append((f"res{s}.{b}.proj", c, cout, 1, st))
    return out


def _worker(lib: str, layout: str, dtype_name: str, mb: int, steps: int, blocks: int) -> dict:
    import torch

    torch.manual_seed(0)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    layers = _layers(blocks)
    weights = {name: torch.randn(o, i, k, k) * (2.0 / (i * k * k)) ** 0.5 for name, i, o, k, _ in layers}
    x0 = torch.randn(mb, STAGES[0][0], STAGES[0][3], STAGES[0][3])

    if lib in ("torch", "converted"):
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        convs = torch.nn.ModuleDict({name.replace(".", "_"): torch.nn.Conv2d(i, o, k, stride=s, padding=k // 2, bias=False)
                                     for name, i, o, k, s in layers})
        for name, *_ in layers:
            convs[name.replace(".", "_")].weight.data.copy_(weights[name])
        convs = convs.to(dtype=dtype, memory_format=fmt)
        x = x0.to(dtype=dtype).contiguous(memory_format=fmt)
        if lib == "converted":
            import convgrad.torch as ct
            convs = ct.convert(convs, inplace=True)
    else:
        import convgrad.torch as ct
        convs = torch.nn.ModuleDict({name.replace(".", "_"): ct.Conv(i, o, k, strides=s, pads_begin=k // 2,
                                                                      pads_end=k // 2, bias=False, dtype=dtype)
                                     for name, i, o, k, s in layers})
        for name, *_ in layers:                     # OIHW -> XIO (HWIO)
            convs[name.replace(".", "_")].weight.data.copy_(weights[name].permute(2, 3, 1, 0).to(dtype))
        x = x0.to(dtype=dtype).permute(0, 2, 3, 1).contiguous()        # NHWC data (NXC)

    def forward(h):
        for s in range(2, 2 + len(STAGES)):
            for b in range(blocks):
                c = lambda part: convs[f"res{s}_{b}_{part}"]  # noqa: E731
                y = torch.relu(c("b")(torch.relu(c("a")(h))))
                y = c("c")(y)
                h = torch.relu(y + (c("proj")(h) if b == 0 else h))
        return h

    opt = torch.optim.SGD(convs.parameters(), lr=1e-3)
    times, first_loss = [], None
    for step in range(steps + 2):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = forward(x).float().square().mean()
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if first_loss is None:
            first_loss = float(loss.detach())
        if step >= 2:
            times.append(elapsed)
    return {"lib": lib, "layout": layout, "dtype": dtype_name, "step_s": statistics.median(times),
            "loss": first_loss, "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--dtype", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16"])
    ap.add_argument("--convert", action="store_true", help="also the torch.nn model after convgrad.torch.convert")
    ap.add_argument("--worker", nargs=3, metavar=("LIB", "LAYOUT", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_worker(*args.worker, args.mb, args.steps, args.blocks)))
        return
    flops = sum(2 * args.mb * i * o * k * k * (STAGES[0][3] // (2 if n.startswith("res3") else 1)) ** 2
                for n, i, o, k, s in _layers(args.blocks)) * 3 / 1e9
    print(f"ResNet-50 stages 2-3, {args.blocks} bottleneck blocks each ({len(_layers(args.blocks))} convolutions), "
          f"mb {args.mb}, ~{flops:.0f} GFLOP of convolutions per step")
    configurations = [("torch", "channels_last"), ("torch", "nchw"), ("convgrad", "nxc")]
    if args.convert:
        configurations += [("converted", "channels_last"), ("converted", "nchw")]
    for dtype in args.dtype:
        runs = []
        for lib, layout in configurations:
            out = subprocess.run([sys.executable, __file__, "--worker", lib, layout, dtype, "--mb", str(args.mb),
                                  "--steps", str(args.steps), "--blocks", str(args.blocks)],
                                 capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = runs[-1]
            print(f"  {dtype:4} {lib:9} {layout:13} step {r['step_s'] * 1e3:8.1f} ms  loss {r['loss']:.6g}", flush=True)
        best = min((r for r in runs if r["lib"] == "torch"), key=lambda r: r["step_s"])
        tol = 1e-4 if dtype == "f32" else 5e-2
        for ours in (r for r in runs if r["lib"] != "torch"):
            agree = abs(ours["loss"] - best["loss"]) <= tol * abs(best["loss"])
            print(f"  {dtype}: {ours['lib']} {ours['layout']} / PyTorch best ({best['layout']}) = "
                  f"{best['step_s'] / ours['step_s']:.2f}x; losses agree to {tol:g}: {agree}")


if __name__ == "__main__":
    main()
