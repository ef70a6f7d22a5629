"""The prebuilt graphs in datasets/ exist for every zoo model and match a fresh trace."""

import pytest

from tag.graph import load_graph
from tag.graph.resolve import prebuilt_path
from tag.graph.tracer import trace_zoo
from tag.models import MODELS
from tag.strategy import graph_fingerprint


@pytest.mark.parametrize("name", list(MODELS))
def test_prebuilt_graph_exists_and_is_complete(name):
    graph = load_graph(prebuilt_path(name))
    assert graph.meta["model"] == name
    assert graph.batch_size == MODELS[name].batch_size
    counts = graph.count_by_role()
    assert all(counts[role] > 0 for role in ("forward", "backward", "optimizer"))


@pytest.mark.parametrize("name", list(MODELS))
def test_prebuilt_tiny_graph_matches_a_fresh_trace(name):
    """Regenerate with `python scripts/build_datasets.py` when the tracer or the zoo changes."""
    assert graph_fingerprint(load_graph(prebuilt_path(name, tiny=True))) == graph_fingerprint(trace_zoo(name, tiny=True))
