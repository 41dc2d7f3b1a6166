"""The ``convgrad`` command line."""

from __future__ import annotations

import sys

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="convgrad")
def main() -> None:
    """convgrad: oneDNN Graph convolution-gradient ops, spec-exact, in NumPy."""


@main.command()
@click.option("--mb", default=4, show_default=True, help="Minibatch of the layer.")
@click.option("--seed", type=int, default=None, help="Random seed (default: fresh each run).")
def demo(mb: int, seed: int | None) -> None:
    """Compute and verify the gradients of a real ResNet-50 layer."""
    from .demo import run

    sys.exit(0 if run(mb=mb, seed=seed) else 1)
