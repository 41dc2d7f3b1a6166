"""convgrad.jax: values and gradients (jax.grad under jax.jit, second order) against
jax.lax.conv_general_dilated with the same padding pairs; vmap, low precision and errors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import convgrad  # noqa: E402
import convgrad.jax as cj  # noqa: E402
from oracle import resolve_pads  # noqa: E402


@dataclass(frozen=True)
class Case:
    transposed: bool
    size: tuple[int, ...]
    kernel: tuple[int, ...]
    cin: int = 2
    cout: int = 3
    strides: tuple[int, ...] | None = None
    dilations: tuple[int, ...] | None = None
    pads: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    auto_pad: str = "none"
    groups: int = 1
    data_format: str = "NXC"
    weights_format: str | None = None
    output_padding: tuple[int, ...] | None = None
    n: int = 2

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def wformat(self) -> str:
        return self.weights_format or ("XOI" if self.transposed else "XIO")

    @property
    def attrs(self) -> dict:
        pb, pe = self.pads or (None, None)
        attrs = dict(strides=self.strides or (1,) * self.rank, pads_begin=pb, pads_end=pe, dilations=self.dilations,
                     groups=self.groups, auto_pad=self.auto_pad, data_format=self.data_format,
                     weights_format=self.wformat)
        return dict(attrs, output_padding=self.output_padding) if self.transposed else attrs

    def inputs(self, dtype=jnp.float32):
        rng = np.random.default_rng()
        def draw(shape):
            return jnp.asarray(rng.uniform(0.25, 1.0, shape) * rng.choice([-1.0, 1.0], shape), dtype)
        cin_w, cout_w = (self.cin, self.cout // self.groups) if self.transposed else (self.cout, self.cin // self.groups)
        x = draw((self.n, self.cin, *self.size) if self.data_format == "NCX" else (self.n, *self.size, self.cin))
        w = draw((*self.kernel, cout_w, cin_w) if self.wformat[0] == "X" else (cin_w, cout_w, *self.kernel))
        return x, w, draw((self.cout,))

    def ours(self, x, w, b):
        return (cj.conv_transpose if self.transposed else cj.convolution)(x, w, b, **self.attrs)

    def reference(self, x, w, b):
        """jax.lax.conv_general_dilated with explicit padding pairs; a ConvTranspose as the
        convolution of the src dilated by the strides (lhs_dilation) with the flipped, per-group
        transposed weights."""
        strides = self.strides or (1,) * self.rank
        dilations = self.dilations or (1,) * self.rank
        pb, pe = resolve_pads("ConvTranspose" if self.transposed else "Convolution", self.auto_pad, self.size,
                              self.kernel, strides, dilations, *(self.pads or ((0,) * self.rank,) * 2))
        spatial = "DHW"[3 - self.rank:]
        data = "NC" + spatial if self.data_format == "NCX" else "N" + spatial + "C"
        if self.wformat[0] == "X":  # (*K, B, A) -> (A, B, *K)
            w = jnp.transpose(w, (self.rank + 1, self.rank, *range(self.rank)))
        if not self.transposed:
            y = jax.lax.conv_general_dilated(x, w, strides, list(zip(pb, pe)), rhs_dilation=dilations,
                                             dimension_numbers=(data, "OI" + spatial, data),
                                             feature_group_count=self.groups)
        else:
            g = self.groups
            w = w.reshape(g, w.shape[0] // g, *w.shape[1:]).swapaxes(1, 2)  # (G, O/G, I/G, *K)
            w = jnp.flip(w.reshape(-1, *w.shape[2:]), axis=tuple(range(2, 2 + self.rank)))
            extra = self.output_padding or (0,) * self.rank
            eff = [(k - 1) * d + 1 for k, d in zip(self.kernel, dilations)]
            padding = [(e - 1 - b_, e - 1 - a + p) for e, b_, a, p in zip(eff, pb, pe, extra)]
            y = jax.lax.conv_general_dilated(x, w, (1,) * self.rank, padding, lhs_dilation=strides,
                                             rhs_dilation=dilations, dimension_numbers=(data, "OI" + spatial, data),
                                             feature_group_count=g)
        return y + (b.reshape(-1, *(1,) * self.rank) if self.data_format == "NCX" else b)


CASES = [
    Case(False, (7,), (3,), strides=(2,), pads=((1,), (0,))),
    Case(False, (5, 6), (2, 3), cin=4, cout=4, groups=2, dilations=(2, 1), pads=((0, 2), (1, 0)),
         data_format="NCX", weights_format="OIX"),
    Case(False, (4, 3, 5), (2, 2, 3), strides=(2, 1, 2), auto_pad="same_upper", n=1),
    Case(False, (6, 5), (3, 2), strides=(2, 2), dilations=(1, 2), auto_pad="same_lower", data_format="NCX"),
    Case(True, (4,), (3,), strides=(2,), output_padding=(1,), pads=((0,), (1,))),
    Case(True, (3, 4), (2, 3), cin=4, cout=2, groups=2, dilations=(2, 1), pads=((1, 0), (0, 2)),
         data_format="NCX", weights_format="IOX"),
    Case(True, (2, 3, 2), (3, 2, 2), strides=(2, 1, 2), auto_pad="same_upper", n=1),
    Case(True, (3, 3), (3, 3), strides=(2, 2), auto_pad="same_lower", data_format="NCX", output_padding=(1, 0)),
]
IDS = [f"{'T' if c.transposed else 'C'}{c.rank}d-{c.data_format}-{c.wformat}-{c.auto_pad}-g{c.groups}" for c in CASES]


def assert_close(got, want, rtol=1e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=rtol * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grad_under_jit_equals_the_vjp_of_lax_conv(case: Case) -> None:
    x, w, b = case.inputs()
    shape = jax.eval_shape(case.reference, x, w, b).shape
    cot = jnp.asarray(np.random.default_rng().uniform(-1, 1, shape), jnp.float32)

    @jax.jit  # one compilation for both sides (JAX compiles every eager op on its own)
    def both(x, w, b, cot):
        want, vjp = jax.vjp(case.reference, x, w, b)
        grads = jax.grad(lambda *a: jnp.sum(case.ours(*a) * cot), argnums=(0, 1, 2))(x, w, b)
        return (case.ours(x, w, b), *grads), (want, *vjp(cot))

    for got, expected in zip(*both(x, w, b, cot)):
        assert got.dtype == expected.dtype
        assert_close(got, expected)


@pytest.mark.parametrize("case", [CASES[1], CASES[5]], ids=[IDS[1], IDS[5]])
def test_second_order_gradients_equal_lax(case: Case) -> None:
    x, w, b = case.inputs()

    def curvature(function):
        loss = lambda x, w: jnp.sum(jnp.tanh(function(x, w, b)))  # noqa: E731
        return jax.grad(lambda x, w: jnp.sum(jax.grad(loss, argnums=1)(x, w) ** 2), argnums=(0, 1))(x, w)

    got, want = jax.jit(lambda: (curvature(case.ours), curvature(case.reference)))()
    for got, want in zip(got, want):
        assert_close(got, want, rtol=1e-4)


def test_vmap_over_a_batch_of_calls() -> None:
    """vmap runs the callback once per element (vmap_method="sequential"), values and gradients."""
    case = CASES[5]
    x, w, b = case.inputs()
    xs, ws = jnp.stack([x, 2 * x, -x]), jnp.stack([w, w + 1, 3 * w])

    def batched(function):
        values = jax.vmap(function, in_axes=(0, 0, None))(xs, ws, b)
        grads = jax.vmap(jax.grad(lambda x, w: jnp.sum(function(x, w, b) ** 2), argnums=1), in_axes=(0, None))(xs, w)
        return values, grads

    got, want = jax.jit(lambda: (batched(case.ours), batched(case.reference)))()
    for g, e in zip(got, want):
        assert g.shape[0] == 3
        assert_close(g, e)


@pytest.mark.parametrize("dtype,tol", [(jnp.bfloat16, 2 ** -7), (jnp.float16, 2 ** -10)])
def test_low_precision_follows_f32(dtype, tol) -> None:
    case = CASES[1]
    low = case.inputs(dtype)
    high = tuple(a.astype(jnp.float32) for a in low)

    @jax.jit
    def run(*inputs):
        return case.ours(*inputs), *jax.grad(lambda *a: jnp.sum(case.ours(*a)), argnums=(0, 1, 2))(*inputs)

    for got, want in zip(run(*low), run(*high)):
        assert got.dtype == dtype
        assert_close(got, want, rtol=4 * tol)


def test_f64_with_x64_enabled() -> None:
    case = CASES[0]
    with jax.enable_x64(True):
        x, w, b = case.inputs(jnp.float64)
        got = jax.grad(lambda w: jnp.sum(case.ours(x, w, b) ** 2))(w)
        want = jax.grad(lambda w: jnp.sum(case.reference(x, w, b) ** 2))(w)
        assert got.dtype == jnp.float64
        assert_close(got, want, rtol=1e-12)


def test_convgrad_errors_pass_through() -> None:
    case = CASES[0]
    x, w, b = case.inputs()
    attrs = case.attrs
    with pytest.raises(convgrad.AttributeValueError, match="Convolution: attribute 'dilations' = \\[0\\]"):
        cj.convolution(x, w, b, **dict(attrs, dilations=[0]))
    with pytest.raises(convgrad.UnknownAttributeError, match="attribute 'output_padding'"):
        cj.convolution(x, w, output_padding=[1], **attrs)
    with pytest.raises(convgrad.ShapeError, match="input 'bias' has shape \\[2\\]: expected \\[3\\]"):
        jax.jit(lambda x: cj.convolution(x, w, b[:2], **attrs))(x)
    with pytest.raises(convgrad.DTypeError, match="input 'weights' has dtype f16: expected f32"):
        cj.convolution(x, w.astype(jnp.float16), **attrs)
    with pytest.raises(convgrad.DTypeError, match="has dtype int32: expected one of f32, bf16, f16, f64"):
        cj.convolution(x.astype(jnp.int32), w.astype(jnp.int32), **attrs)
    # NumPy inputs are taken as jax arrays.
    assert_close(cj.convolution(np.asarray(x), np.asarray(w), **attrs), case.reference(x, w, 0 * b))


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_readme_snippets_run() -> None:
    """The README's "Inside PyTorch and JAX" examples run as printed."""
    import re
    from pathlib import Path

    pytest.importorskip("torch")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Inside PyTorch and JAX"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["w"].grad.shape == (3, 3, 16, 32) and namespace["b"].grad.shape == (32,)
    assert namespace["dweights"].shape == (3, 3, 16, 32) and namespace["per_example"].shape == (4, 3, 3, 16, 32)
