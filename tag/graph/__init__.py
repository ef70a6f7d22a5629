"""The OpGraph IR and its sources: JSON files, the PyTorch tracer, PipeDream profiles."""

from tag.graph.io import SCHEMA_VERSION, graph_from_json, graph_to_json, load_graph, save_graph
from tag.graph.opgraph import (
    ROLE_BACKWARD,
    ROLE_FORWARD,
    ROLE_INPUT,
    ROLE_OPTIMIZER,
    ROLES,
    SPLIT_CLASSES,
    SPLIT_CONCAT,
    SPLIT_NONE,
    SPLIT_SUM,
    OpGraph,
)

_LAZY = {"trace": "tag.graph.tracer", "trace_zoo": "tag.graph.tracer", "load_user_function": "tag.graph.tracer",
         "load_pipedream": "tag.graph.pipedream", "resolve_model": "tag.graph.resolve"}

__all__ = [
    "OpGraph", "ROLES", "SPLIT_CLASSES", "ROLE_INPUT", "ROLE_FORWARD", "ROLE_BACKWARD", "ROLE_OPTIMIZER",
    "SPLIT_CONCAT", "SPLIT_SUM", "SPLIT_NONE", "SCHEMA_VERSION", "graph_to_json", "graph_from_json",
    "save_graph", "load_graph", *_LAZY,
]


def __getattr__(name: str):
    # The tracer imports torch; load it only when asked for.
    if name not in _LAZY:
        raise AttributeError(f"module 'tag.graph' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
