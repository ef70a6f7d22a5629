import gzip
import json

import numpy as np
import pytest

from conftest import make_graph, random_dag
from tag.errors import GraphError, SchemaError
from tag.graph import SCHEMA_VERSION, graph_from_json, graph_to_json, load_graph, save_graph


def test_csr_matches_edge_list(diamond):
    assert sorted(diamond.successors(0).tolist()) == [1, 2]
    assert diamond.predecessors(3).tolist() == [1, 2]
    assert diamond.in_degree().tolist() == [0, 1, 1, 2]
    assert diamond.out_degree().tolist() == [2, 1, 1, 0]


@pytest.mark.parametrize("seed", range(20))
def test_csr_and_topological_order_on_random_dags(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    edges = random_dag(rng, n)
    graph = make_graph(edges, n=n)
    for op in range(n):
        assert sorted(graph.successors(op).tolist()) == sorted(b for a, b in edges if a == op)
        assert sorted(graph.predecessors(op).tolist()) == sorted(a for a, b in edges if b == op)
    position = np.empty(n, dtype=int)
    position[graph.topological_order()] = np.arange(n)
    assert all(position[a] < position[b] for a, b in edges)


def test_cycle_is_named():
    graph = make_graph([(0, 1), (1, 2), (2, 1), (2, 3)])
    with pytest.raises(GraphError, match=r"cycle: 'op[12]' -> 'op[12]' -> 'op[12]'"):
        graph.topological_order()
    assert not graph.is_dag()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(edges=[(0, 5)], n=2), "not an op"),
        (dict(edges=[(0, 1)], flops=[1.0, -2.0]), "flops must be a finite non-negative"),
        (dict(edges=[(0, 1)], edge_bytes=[-1.0]), "bytes must be a finite non-negative"),
        (dict(edges=[(0, 0)], n=1), "edge to itself"),
        (dict(edges=[(0, 1)], split=[0, 7]), "split class out of range"),
    ],
)
def test_bad_graphs_raise(kwargs, message):
    with pytest.raises(GraphError, match=message):
        make_graph(**kwargs)


def test_contract_sums_and_merges_edges():
    # 0 -> 1 -> 3, 0 -> 2 -> 3 with groups {0,1} {2,3}: edges 0->2 and 1->3 cross, merged to one.
    graph = make_graph([(0, 1), (0, 2), (1, 3), (2, 3)], flops=[1.0, 2.0, 3.0, 4.0], split=[0, 1, 0, 2],
                       edge_bytes=[1.0, 2.0, 4.0, 8.0], param_bytes=[0.0, 5.0, 0.0, 7.0])
    groups = graph.contract([0, 0, 1, 1])
    assert groups.num_ops == 2
    assert groups.flops.tolist() == [3.0, 7.0]
    assert groups.param_bytes.tolist() == [5.0, 7.0]
    assert groups.edge_src.tolist() == [0] and groups.edge_dst.tolist() == [1]
    assert groups.edge_bytes.tolist() == [2.0 + 4.0]
    assert groups.split.tolist() == [1, 2]  # most restrictive member: sum, none


def test_contract_rejects_cyclic_quotient_and_gaps(diamond):
    with pytest.raises(GraphError, match="cycle"):
        diamond.contract([0, 1, 0, 0])  # group 0 = {0,2,3}, group 1 = {1}: 0->1->0
    with pytest.raises(GraphError, match="no ops"):
        diamond.contract([0, 0, 2, 2])


def test_subgraph_keeps_internal_edges(diamond):
    sub = diamond.subgraph([0, 1, 3])
    assert sub.names == ["op0", "op1", "op3"]
    assert sorted(zip(sub.edge_src.tolist(), sub.edge_dst.tolist())) == [(0, 1), (1, 2)]
    mask_sub = diamond.subgraph(np.array([True, True, False, True]))
    assert mask_sub.names == sub.names


def test_with_batch_size_scales_only_batch_scaled_ops():
    graph = make_graph([(0, 1)], batch_scaled=[False, True], edge_bytes=[4.0])
    doubled = graph.with_batch_size(8)
    assert doubled.flops.tolist() == [10.0, 40.0]
    assert doubled.edge_bytes.tolist() == [4.0]  # producer op0 is not batch-scaled
    assert doubled.batch_size == 8


def test_networkx_export(diamond):
    g = diamond.to_networkx()
    assert g.number_of_nodes() == 4 and g.number_of_edges() == 4
    assert g.nodes[0]["split"] == "concat" and g.edges[0, 1]["bytes"] == 4.0


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_json_round_trip(tmp_path, diamond, suffix):
    diamond.measured_time[1] = 0.25
    diamond.meta["model"] = "diamond"
    path = tmp_path / f"g{suffix}"
    save_graph(diamond, path)
    back = load_graph(path)
    assert back.names == diamond.names
    for column in ("role", "flops", "bytes_accessed", "output_bytes", "param_bytes", "batch_scaled", "split",
                   "edge_src", "edge_dst", "edge_bytes"):
        np.testing.assert_array_equal(getattr(back, column), getattr(diamond, column))
    np.testing.assert_array_equal(np.isnan(back.measured_time), np.isnan(diamond.measured_time))
    assert back.measured_time[1] == 0.25 and back.meta["model"] == "diamond"
    assert not list(tmp_path.glob(".*tmp"))  # atomic write leaves no temporary behind


def _doc(diamond):
    return json.loads(json.dumps(graph_to_json(diamond)))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), "unsupported schema_version"),
        (lambda d: d.update(format="other"), "field 'format'"),
        (lambda d: d["ops"].pop("flops"), "missing field 'flops'"),
        (lambda d: d["ops"]["flops"].pop(), "ops.flops has 3 entries, expected 4"),
        (lambda d: d["ops"]["role"].__setitem__(2, "sideways"), r"ops.role\[2\] is 'sideways'"),
        (lambda d: d["ops"]["flops"].__setitem__(0, "many"), r"ops.flops\[0\]"),
        (lambda d: d["edges"]["dst"].__setitem__(0, 99), "not an op"),
        (lambda d: d["edges"].update(src=[1, 2, 3, 3], dst=[2, 3, 1, 0]), "cycle"),
        (lambda d: d.update(batch_size="big"), "batch_size"),
    ],
)
def test_schema_errors_name_the_field(diamond, mutate, message):
    doc = _doc(diamond)
    mutate(doc)
    with pytest.raises((SchemaError, GraphError), match=message):
        graph_from_json(doc)


def test_load_rejects_garbage(tmp_path):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b"{not json"))
    with pytest.raises(SchemaError, match="not a valid JSON"):
        load_graph(bad)
    with pytest.raises(SchemaError, match="no such graph file"):
        load_graph(tmp_path / "missing.json")


def test_partial_sums_do_not_grow_with_the_batch():
    # op0 (concat activation) -> op1 (weight gradient: sum) -> op2 (optimizer, not batch-scaled)
    graph = make_graph([(0, 1), (1, 2)], split=[0, 1, 2], batch_scaled=[True, True, False], edge_bytes=[8.0, 100.0])
    assert graph.edge_batch_scaled.tolist() == [True, False]
    doubled = graph.with_batch_size(8)
    assert doubled.edge_bytes.tolist() == [16.0, 100.0]
    assert doubled.output_bytes.tolist() == [8.0, 4.0, 4.0]  # only the concat output grows
    assert doubled.flops.tolist() == [20.0, 40.0, 30.0]  # compute of batch-scaled ops grows


def test_explicit_edge_scaling_survives_json_and_contraction(tmp_path):
    graph = make_graph([(0, 1), (1, 2)], edge_bytes=[8.0, 100.0])
    graph.edge_batch_scaled[:] = [False, True]
    save_graph(graph, tmp_path / "g.json")
    assert load_graph(tmp_path / "g.json").edge_batch_scaled.tolist() == [False, True]
    assert graph.contract([0, 0, 1]).edge_batch_scaled.tolist() == [True]


def test_with_batch_size_drops_stale_executor_records():
    graph = make_graph([(0, 1)])
    graph.args = [{"target": "aten.test"}] * 2
    rescaled = graph.with_batch_size(16)
    assert rescaled.args is None
    assert rescaled.meta["batch_size"] == 16 and rescaled.meta["rescaled_from_batch"] == 4
    with pytest.raises(GraphError, match="batch_size"):
        graph.with_batch_size(0)
