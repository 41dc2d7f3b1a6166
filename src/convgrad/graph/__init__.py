"""oneDNN Graph JSON cases: reading (:mod:`.model`), benchdnn rewrites (:mod:`.rewrite`), shape
re-inference (:mod:`.plan`), execution, checking and timing (:mod:`.run`), and benchdnn conv
descriptors as one-op graphs (:mod:`.conv`)."""

from __future__ import annotations

from .conv import DIRECTIONS, descriptor_graph
from .model import Graph, GraphError, GraphOp, LogicalTensor, load_graph, parse_graph
from .plan import Plan, Step, plan_graph
from .rewrite import parse_dt, parse_in_shapes, parse_mb, parse_op_attrs, parse_op_kind, rewrite
from .run import OpCheck, check, execute, make_inputs, time_plan

__all__ = ["Graph", "GraphError", "GraphOp", "LogicalTensor", "load_graph", "parse_graph", "Plan", "Step",
           "plan_graph", "parse_dt", "parse_in_shapes", "parse_mb", "parse_op_attrs", "parse_op_kind", "rewrite", "OpCheck",
           "check", "execute", "make_inputs", "time_plan", "DIRECTIONS", "descriptor_graph"]
