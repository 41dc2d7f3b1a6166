"""oneDNN Graph JSON reading, benchdnn rewrites, shape re-inference and strided inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from convgrad.graph import (GraphError, check, load_graph, make_inputs, parse_dt, parse_in_shapes, parse_op_attrs,
                            plan_graph, rewrite)
from convgrad.graph.model import dense_strides

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _plan(name: str, **rewrites):
    return plan_graph(rewrite(load_graph(EXAMPLES / name), **rewrites))


def test_parse_in_shapes_forms():
    assert parse_in_shapes("0:2x3x4x5*acdb+1:acdb+2:-+3:0") == {
        0: ((2, 3, 4, 5), "acdb"), 1: (None, "acdb"), 2: ((), None), 3: ((0,), None)}
    for bad in ("0:2x3*abd", "x:2x3", "0:2xx3", "0:", "0:2x3*abc"):
        with pytest.raises(ValueError):
            parse_in_shapes(bad)


def test_parse_op_attrs_and_dt():
    assert parse_op_attrs("0:strides:2x2*auto_pad:SAME_UPPER+3:groups:2") == {
        0: {"strides": "2x2", "auto_pad": "SAME_UPPER"}, 3: {"groups": "2"}}
    assert parse_dt("bf16") == {None: "bf16"} and parse_dt("0:f16+2:bf16") == {0: "f16", 2: "bf16"}
    with pytest.raises(ValueError):
        parse_dt("s8")


def test_tags_give_strides():
    assert dense_strides((2, 3, 4, 5), (0, 2, 3, 1)) == (60, 1, 15, 3)
    plan = _plan("conv_fwd_nxc_f32.json", in_shapes=parse_in_shapes("0:1x14x14x8*adbc"))
    assert plan.tensors[0].stride == dense_strides((1, 14, 14, 8), (0, 3, 1, 2))


def test_new_input_shape_flows_through_the_training_step():
    plan = _plan("training_step_nxc_f32.json", in_shapes=parse_in_shapes("0:3x7x9x16"),
                 op_attrs=parse_op_attrs("0:strides:2x2+1:strides:2x2+2:strides:2x2"), dt=parse_dt("f16"))
    shapes = {tid: t.shape for tid, t in plan.tensors.items()}
    assert shapes[2] == (3, 4, 5, 32)            # dst of the forward conv, re-inferred
    assert shapes[3] == (3, 7, 9, 16)            # diff_src fits the new diff_dst
    assert plan.steps[1].op.attrs["dst_shape"] == (3, 7, 9, 16)  # dst_shape attribute follows
    assert plan.shape_values[4] == (3, 3, 16, 32)                # weights_shape input resolved
    assert {t.dtype for t in plan.tensors.values()} == {"f16", "s32"}


def test_mb_changes_only_data_inputs_and_keeps_memory_order():
    plan = _plan("training_step_ncx_grouped_f32.json", mb=5)
    assert plan.tensors[0].shape == (5, 8, 9, 9) and plan.tensors[0].stride == dense_strides((5, 8, 9, 9),
                                                                                             (0, 2, 3, 1))
    assert plan.tensors[1].shape == (8, 2, 3, 3)  # weights keep their first axis
    assert plan.tensors[4].shape == (8, 2, 3, 3)


def test_shape_input_follows_channel_rewrites():
    plan = _plan("conv_bwd_weights_nxc_bf16_shape_input.json", in_shapes=parse_in_shapes("0:2x9x9x6+1:2x9x9x10"))
    assert plan.shape_values[2] == (3, 3, 3, 10)  # XIO: kernel kept, ICg = 6 / groups 2, OC = 10


def test_diff_src_size_fits_a_rewritten_diff_dst():
    plan = _plan("conv_bwd_data_ncx_channels_last_f32.json", in_shapes=parse_in_shapes("0:1x16x5x5"))
    assert plan.steps[0].output.shape == (1, 8, 10, 10)  # SAME_UPPER, stride 2: I = S * O


def test_strided_inputs_are_real_views():
    plan = _plan("conv_bwd_weights_ncx_padded_strides_f32.json")
    x = make_inputs(plan, np.random.default_rng(0))[0]
    assert x.strides == tuple(4 * s for s in (832, 160, 16, 1)) and not np.isnan(x).any()
    assert np.all(x != 0)
    plan = _plan("conv_bwd_data_ncx_channels_last_f32.json")
    diff_dst = make_inputs(plan, np.random.default_rng(0))[0]
    assert diff_dst.shape == (2, 16, 8, 8) and diff_dst.strides[1] == 4


def test_rewrite_errors_name_the_problem():
    graph = load_graph(EXAMPLES / "training_step_nxc_f32.json")
    with pytest.raises(GraphError, match="tensor 2 is produced by an op"):
        rewrite(graph, in_shapes=parse_in_shapes("2:1x2x3x4"))
    with pytest.raises(GraphError, match="op 7 is not in the graph"):
        rewrite(graph, op_attrs=parse_op_attrs("7:groups:1"))
    with pytest.raises(GraphError, match="attribute 'strides' = 'a': expected a list"):
        rewrite(graph, op_attrs=parse_op_attrs("0:strides:a"))


def test_conv_transpose_gradients_take_every_diff_dst_size_of_the_range():
    """oneDNN's own graph case (auto_pad valid, stride 2, 3x3): diff_src 7 from a diff_dst of 16,
    one more than S*(I-1) + EK; rewritten diff_dst sizes re-infer diff_src, and the fast engine
    matches the reference on them."""
    plan = _plan("conv_transpose_bwd_data_ncx_bf16_3d.json", in_shapes=parse_in_shapes("0:2x6x16x5x16"),
                 op_attrs=parse_op_attrs("0:auto_pad:VALID"))
    assert plan.steps[0].output.shape == (2, 4, 7, 4, 7)
    for diff_dst in ("0:2x6x5x5x5", "0:2x6x6x5x6"):  # S*(I-1) + EK - PB - PE and one more: I = 3
        plan = _plan("conv_transpose_bwd_data_ncx_bf16_3d.json", in_shapes=parse_in_shapes(diff_dst))
        assert plan.steps[0].output.shape == (2, 4, 3, 4, 3)
        assert all(c.ok for c in check(plan, "fast", make_inputs(plan, np.random.default_rng(1))))
    for size in (9, 10):  # src 5x5, stride 2, 3x3, pads 1: 9 and 10 (the file's, with output_padding 1)
        plan = _plan("conv_transpose_bwd_weights_nxc_f16_shape_input.json",
                     in_shapes=parse_in_shapes(f"1:2x{size}x{size}x4"))
        assert plan.shape_values[2] == (3, 3, 4, 6)
        assert all(c.ok for c in check(plan, "fast", make_inputs(plan, np.random.default_rng(2))))
    with pytest.raises(GraphError, match=r"'diff_dst' has spatial size \[11, 11\]: expected a size from \[9, 9\] "
                                         r"to \[10, 10\]"):
        _plan("conv_transpose_bwd_weights_nxc_f16_shape_input.json", in_shapes=parse_in_shapes("1:2x11x11x4"))
