"""tag: plan distributed DNN training on heterogeneous GPU clusters.

The public surface. :func:`plan_fastest` (``tag.planners``) asks every plan family (TAG placement, data
parallelism, sequential and graph pipelines) and returns the fastest plan with its distance to the compute
bound. Sub-packages (``tag.graph``, ``tag.cluster``, ``tag.cost``, ``tag.sim``, ``tag.strategy``,
``tag.models``) hold the rest. Names that need torch (the model zoo and the tracer)
are imported on first use, so that commands which do not trace start quickly.
"""

from __future__ import annotations

import importlib
from typing import Any

from tag.cluster import Cluster, GPUType, gpu_type, list_presets, load_cluster, resolve_cluster
from tag.cost import CostModel, allreduce_time, fits, ps_time, training_memory_bytes, transfer_time
from tag.errors import (
    ClusterError,
    GraphError,
    ModelError,
    ProfileError,
    SchemaError,
    SpecError,
    TagError,
    UnitError,
)
from tag.graph import OpGraph, load_graph, save_graph
from tag.graph.pipedream import load_pipedream
from tag.graph.resolve import resolve_model
from tag.sim import OOMError, SimulationResult, TaskGraph, TaskGraphBuilder, simulate, simulate_fast
from tag.strategy import Plan, Strategy, load_plan, save_plan

__version__ = "0.1.0"

_LAZY = {
    "get_model": "tag.models",
    "list_models": "tag.models",
    "MODELS": "tag.models",
    "ModelSpec": "tag.models",
    "trace": "tag.graph.tracer",
    "trace_zoo": "tag.graph.tracer",
    "load_user_function": "tag.graph.tracer",
    # the planners layer (tag.planners): every plan family behind one call
    "plan_fastest": "tag.planners",
    "FastestPlan": "tag.planners",
    "compute_bound": "tag.planners",
    "FAMILIES": "tag.planners",
    "make_mapper": "tag.planners",
}

__all__ = [
    "Cluster", "GPUType", "gpu_type", "list_presets", "load_cluster", "resolve_cluster",
    "CostModel", "allreduce_time", "fits", "ps_time", "training_memory_bytes", "transfer_time",
    "TagError", "GraphError", "SchemaError", "ClusterError", "SpecError", "UnitError", "ModelError", "ProfileError",
    "OpGraph", "load_graph", "save_graph", "load_pipedream", "resolve_model",
    "TaskGraph", "TaskGraphBuilder", "simulate", "simulate_fast", "SimulationResult", "OOMError",
    "Strategy", "Plan", "load_plan", "save_plan",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tag' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
