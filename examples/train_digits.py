"""Train a small CNN on scikit-learn's bundled 8x8 digits twice: with convgrad's convolutions
(``convgrad.torch.Conv``: channels-last data, XIO weights, auto_pad="same_upper") and with
PyTorch's own (``torch.nn.Conv2d`` on NCHW, the asymmetric same_upper pad by ``F.pad``). Same
initial weights, same batches, same optimizer: the loss curves agree to float32 rounding.

    python examples/train_digits.py [--epochs 5] [--batches N] [--seed 0] [--threads 1] [--plot curves.png]

The layers are tiny, so both run on one thread by default (--threads): PyTorch's OpenMP threads
keep spinning after each op and starve the BLAS threads of the NumPy op that follows; on the
shared 2-core machine (load average 6) a step took 0.43 s with 2 threads each, 0.03 s with one.

Needs torch and scikit-learn (``pip install 'convgrad[torch]' scikit-learn``; matplotlib for
--plot). The digits ship with scikit-learn: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from threadpoolctl import threadpool_limits

import convgrad.torch as ct


class TorchNet(torch.nn.Module):
    """conv 3x3 (1->8, same) - ReLU - conv 3x3 stride 2 (8->16, same_upper: pads 0 before, 1 after) - ReLU - linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2)
        self.fc = torch.nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, 1, 8, 8)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(F.pad(x, (0, 1, 0, 1))))
        return self.fc(x.flatten(1))


class ConvgradNet(torch.nn.Module):
    """The same network on convgrad's ops, channels-last (NXC data, XIO weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ct.Conv(1, 8, 3, auto_pad="same_upper")
        self.conv2 = ct.Conv(8, 16, 3, strides=2, auto_pad="same_upper")
        self.fc = torch.nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, 1, 8, 8), taken as NXC (N, 8, 8, 1)
        x = F.relu(self.conv1(x.movedim(1, -1)))
        x = F.relu(self.conv2(x))
        return self.fc(x.movedim(-1, 1).flatten(1))  # the same feature order as TorchNet

    def load_from(self, net: TorchNet) -> None:
        """Copy TorchNet's parameters: OIHW weights become XIO (HWIO)."""
        with torch.no_grad():
            for mine, theirs in ((self.conv1, net.conv1), (self.conv2, net.conv2)):
                mine.weight.copy_(theirs.weight.permute(2, 3, 1, 0))
                mine.bias.copy_(theirs.bias)
            self.fc.load_state_dict(net.fc.state_dict())


def train(epochs: int = 5, batches: int | None = None, seed: int = 0, batch_size: int = 64,
          lr: float = 0.05, threads: int = 1) -> dict[str, list[float]]:
    """Train both networks on the same batches, PyTorch and BLAS limited to ``threads`` threads;
    per-step losses, per-epoch mean losses and test accuracies."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            return _train(epochs, batches, seed, batch_size, lr)
    finally:
        torch.set_num_threads(previous)


def _train(epochs: int, batches: int | None, seed: int, batch_size: int, lr: float) -> dict[str, list[float]]:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8) in [0, 1]
    x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.25, random_state=seed)
    x_train, x_test = torch.from_numpy(x_train), torch.from_numpy(x_test)
    y_train, y_test = torch.from_numpy(y_train), torch.from_numpy(y_test)

    torch.manual_seed(seed)
    nets = {"torch": TorchNet(), "convgrad": ConvgradNet()}
    nets["convgrad"].load_from(nets["torch"])
    optimizers = {k: torch.optim.SGD(n.parameters(), lr=lr, momentum=0.9) for k, n in nets.items()}
    history: dict[str, list[float]] = {f"{k}_{what}": [] for k in nets for what in ("loss", "epoch_loss", "accuracy")}
    order = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        permutation = torch.randperm(len(x_train), generator=order)
        steps = list(permutation.split(batch_size))[:batches]
        epoch = {k: 0.0 for k in nets}
        for index in steps:
            for k, net in nets.items():
                loss = F.cross_entropy(net(x_train[index]), y_train[index])
                optimizers[k].zero_grad()
                loss.backward()
                optimizers[k].step()
                history[f"{k}_loss"].append(loss.item())
                epoch[k] += loss.item() / len(steps)
        for k, net in nets.items():
            with torch.no_grad():
                accuracy = (net(x_test).argmax(1) == y_test).float().mean().item()
            history[f"{k}_epoch_loss"].append(epoch[k])
            history[f"{k}_accuracy"].append(accuracy)
    return history


def plot(history: dict[str, list[float]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(2, 1))
    top.plot(history["torch_loss"], label="torch.nn.Conv2d", linewidth=3, alpha=0.5)
    top.plot(history["convgrad_loss"], label="convgrad.torch.Conv", linewidth=1)
    top.set_ylabel("training loss (cross-entropy)")
    top.set_title("8x8 digits: the same CNN with PyTorch's and convgrad's convolutions")
    top.legend()
    difference = np.abs(np.subtract(history["torch_loss"], history["convgrad_loss"]))
    bottom.semilogy(np.maximum(difference, 1e-10))
    bottom.set_ylabel("|difference| (0 drawn at 1e-10)")
    bottom.set_xlabel("step (batch of 64)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batches", type=int, default=None, help="at most this many batches per epoch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="threads for PyTorch and BLAS (default 1)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw both loss curves and their difference")
    args = parser.parse_args(argv)
    history = train(args.epochs, args.batches, args.seed, threads=args.threads)
    print(f"{'epoch':>5} {'loss torch':>12} {'loss convgrad':>14} {'|diff|':>9} {'acc torch':>10} {'acc convgrad':>13}")
    for e, row in enumerate(zip(history["torch_epoch_loss"], history["convgrad_epoch_loss"],
                                history["torch_accuracy"], history["convgrad_accuracy"]), 1):
        print(f"{e:>5} {row[0]:>12.6f} {row[1]:>14.6f} {abs(row[0] - row[1]):>9.2e} {row[2]:>10.4f} {row[3]:>13.4f}")
    steps = np.abs(np.subtract(history["torch_loss"], history["convgrad_loss"]))
    print(f"max |loss difference| over {len(steps)} steps: {steps.max():.3e} "
          f"(epoch means: {max(abs(a - b) for a, b in zip(history['torch_epoch_loss'], history['convgrad_epoch_loss'])):.3e})")
    if args.plot:
        plot(history, args.plot)
        print(f"plot: {args.plot}")
    return history


if __name__ == "__main__":
    main(sys.argv[1:])
