"""The grid of Convolution / ConvTranspose cases the framework tests (test_torch_interop.py,
test_jax_interop.py) run: 1D/2D/3D, groups, dilations, asymmetric pads, every auto_pad mode,
both data layouts and both weights layouts, with random non-zero data in the case's layouts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracle import resolve_pads


@dataclass(frozen=True)
class Case:
    transposed: bool
    size: tuple[int, ...]
    kernel: tuple[int, ...]
    cin: int = 2
    cout: int = 3
    strides: tuple[int, ...] | None = None
    dilations: tuple[int, ...] | None = None
    pads_begin: tuple[int, ...] | None = None
    pads_end: tuple[int, ...] | None = None
    auto_pad: str = "none"
    groups: int = 1
    data_format: str = "NXC"
    weights_format: str | None = None
    output_padding: tuple[int, ...] | None = None
    bias: bool = True
    n: int = 2

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def kind(self) -> str:
        return "ConvTranspose" if self.transposed else "Convolution"

    @property
    def wformat(self) -> str:
        return self.weights_format or ("XOI" if self.transposed else "XIO")

    @property
    def id(self) -> str:
        return f"{'T' if self.transposed else 'C'}{self.rank}d-{self.data_format}-{self.wformat}-{self.auto_pad}-g{self.groups}"

    @property
    def attrs(self) -> dict:
        """The op's keyword attributes (omitted ones left out)."""
        attrs = dict(strides=self.strides or (1,) * self.rank, pads_begin=self.pads_begin, pads_end=self.pads_end,
                     dilations=self.dilations, groups=self.groups, auto_pad=self.auto_pad,
                     data_format=self.data_format, weights_format=self.wformat, output_padding=self.output_padding)
        return {k: v for k, v in attrs.items() if v is not None}

    def geometry(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """Strides, dilations and the resolved pads (the oracle's own auto_pad rules)."""
        strides, dilations = self.strides or (1,) * self.rank, self.dilations or (1,) * self.rank
        zeros = (0,) * self.rank
        pb, pe = resolve_pads(self.kind, self.auto_pad, self.size, self.kernel, strides, dilations,
                              self.pads_begin or zeros, self.pads_end or zeros)
        return strides, dilations, pb, pe

    def weights_ab(self) -> tuple[int, int]:
        """(A, B) of the weights: (out, in/groups) for a convolution, (in, out/groups) transposed."""
        return (self.cin, self.cout // self.groups) if self.transposed else (self.cout, self.cin // self.groups)

    def arrays(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Random non-zero f64 src, weights, bias in the case's layouts."""
        def draw(shape):
            return rng.uniform(0.25, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
        a, b = self.weights_ab()
        x = draw((self.n, self.cin, *self.size) if self.data_format == "NCX" else (self.n, *self.size, self.cin))
        w = draw((*self.kernel, b, a) if self.wformat[0] == "X" else (a, b, *self.kernel))
        return x, w, draw((self.cout,)) if self.bias else None


CASES = [
    Case(False, (7,), (3,), strides=(2,), pads_begin=(1,), pads_end=(0,)),
    Case(False, (5, 6), (2, 3), cin=4, cout=4, groups=2, dilations=(2, 1), pads_begin=(0, 2), pads_end=(1, 0),
         data_format="NCX", weights_format="OIX"),
    Case(False, (4, 3, 5), (2, 2, 3), strides=(2, 1, 2), auto_pad="same_upper", weights_format="OIX", n=1),
    Case(False, (6, 5), (3, 2), strides=(2, 2), dilations=(1, 2), auto_pad="same_lower", data_format="NCX"),
    Case(False, (6, 6), (3, 3), cin=3, cout=6, groups=3, strides=(1, 2), auto_pad="valid", bias=False),
    Case(True, (4,), (3,), strides=(2,), output_padding=(1,), pads_begin=(0,), pads_end=(1,)),
    Case(True, (3, 4), (2, 3), cin=4, cout=2, groups=2, dilations=(2, 1), pads_begin=(1, 0), pads_end=(0, 2),
         data_format="NCX", weights_format="IOX"),
    Case(True, (2, 3, 2), (3, 2, 2), strides=(2, 1, 2), auto_pad="same_upper", weights_format="IOX", n=1),
    Case(True, (3, 3), (3, 3), strides=(2, 2), auto_pad="same_lower", data_format="NCX", output_padding=(1, 0)),
]
IDS = [c.id for c in CASES]
GROUPED = [CASES[1], CASES[6]]  # a grouped, dilated, asymmetric NCX case of each kind
