"""Downsets, operator clustering, the DP over downsets, refinement, RaNNC's DP and the forward view."""

import itertools

import numpy as np
import pytest

from conftest import make_graph, random_dag
from tag.exact.clustering import cluster_operators, is_convex, quotient_edges
from tag.exact.downsets import (
    DownsetLimitError,
    downsets,
    is_downset,
    membership,
    predecessor_masks,
    subset_matrix,
    unique_topological_order,
)
from tag.exact.partition import (
    cuts_to_stages,
    downset_tables,
    dp_over_downsets,
    partition_objective,
    partition_parmesan,
    partition_pipedream,
    refine_partition,
)
from tag.exact.rannc import BlockCosts, form_stage, rannc_dp, range_bytes, rannc_stage_times
from tag.exact.stage_graph import (
    ForwardGraph,
    PartitionError,
    assign_owners,
    build_stage_graph,
    inflight_micro_batches,
)
from tag.grouping.acyclic import dag_order
from tag.graph.opgraph import ROLE_BACKWARD, ROLE_FORWARD, ROLE_INPUT, ROLE_OPTIMIZER


def _edges(edges):
    return np.array([a for a, _ in edges], dtype=np.int64), np.array([b for _, b in edges], dtype=np.int64)


def _random_instance(rng, n, p=None):
    edges = random_dag(rng, n, p=float(rng.uniform(0.15, 0.7)) if p is None else p)
    return _edges(edges)


# ------------------------------------------------------------------------------------------- downsets


@pytest.mark.parametrize("seed", range(12))
def test_downsets_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 11))
    src, dst = _random_instance(rng, n)
    preds = predecessor_masks(n, src, dst)
    brute = sorted((m for m in range(1 << n) if is_downset(m, preds)), key=lambda m: (bin(m).count("1"), m))
    assert downsets(n, src, dst, limit=1 << 12) == brute


@pytest.mark.parametrize("k", [1, 5, 48, 70])
def test_chain_has_k_plus_one_downsets(k):
    rng = np.random.default_rng(k)
    perm = rng.permutation(k)  # a chain whose node ids are shuffled
    src, dst = perm[:-1], perm[1:]
    masks = downsets(k, src, dst, limit=k + 1)
    assert len(masks) == k + 1
    assert unique_topological_order(k, src, dst).tolist() == perm.tolist()
    members = membership(masks, k)  # multi-word masks when k > 64
    assert members.sum(axis=1).tolist() == list(range(k + 1))
    subset = subset_matrix(masks, k)
    assert np.array_equal(subset, np.tril(np.ones((k + 1, k + 1), bool), -1))


def test_non_unique_order_and_diamond():
    src, dst = _edges([(0, 1), (0, 2), (1, 3), (2, 3)])
    assert unique_topological_order(4, src, dst) is None
    assert downsets(4, src, dst) == [0b0, 0b1, 0b11, 0b101, 0b111, 0b1111]


def test_downset_limit_names_the_count():
    with pytest.raises(DownsetLimitError, match=r"more than 100 downsets \(enumeration reached \d+"):
        downsets(12, [], [], limit=100)  # 12 unrelated nodes: 4096 downsets
    with pytest.raises(DownsetLimitError, match="more than 10 downsets"):
        downsets(20, np.arange(19), np.arange(1, 20), limit=10)  # the chain path checks too


# ------------------------------------------------------------------------------------------- DP vs brute force


def _brute_force(n, src, dst, cost, static, act, weight, scale, inflight, capacity):
    """Least max eq. (3) stage time over all assignments of n nodes to S non-empty stages with every
    edge going forward, and memory within capacity (the chains of downsets, enumerated directly)."""
    num_stages = len(inflight)
    grid = np.stack(np.unravel_index(np.arange(num_stages ** n), (num_stages,) * n), axis=1).reshape(-1, n)
    ok = (grid[:, src] <= grid[:, dst]).all(axis=1)
    grid = grid[ok]
    best = np.inf
    onehot = grid[:, :, None] == np.arange(num_stages)[None, None, :]  # [A, n, S]
    nonempty = onehot.any(axis=1).all(axis=1)
    compute = np.einsum("ans,n->as", onehot, cost)
    cross = grid[:, src] != grid[:, dst]  # [A, E]
    w = weight[None, :] * cross
    into = np.einsum("aes,ae->as", onehot[:, dst, :], w)
    out = np.einsum("aes,ae->as", onehot[:, src, :], w)
    times = compute + scale * (into + out)
    memory = np.einsum("ans,n->as", onehot, static) + inflight[None, :] * (np.einsum("ans,n->as", onehot, act) + into)
    feasible = nonempty & (memory <= capacity).all(axis=1)
    if feasible.any():
        best = times.max(axis=1)[feasible].min()
    return best


def test_dp_equals_brute_force_on_random_dags():
    rng = np.random.default_rng(2024)
    checked = infeasible = 0
    while checked < 120:
        n = int(rng.integers(2, 13))
        stages = int(rng.integers(1, min(4, n) + 1))
        if stages ** n > 1e5:
            continue
        src, dst = _random_instance(rng, n)
        cost, static, act = rng.uniform(0.1, 1.0, n), rng.uniform(0.0, 1.0, n), rng.uniform(0.0, 1.0, n)
        weight = rng.uniform(0.0, 1.0, src.size)
        scale = float(rng.choice([0.0, 0.3, 2.0]))
        inflight = inflight_micro_batches(stages, int(rng.integers(1, 5)), str(rng.choice(["1f1b", "gpipe"])))
        capacity = float(rng.uniform(1.0, 6.0)) if rng.random() < 0.7 else np.inf
        masks = downsets(n, src, dst, limit=1 << 13)
        tables = downset_tables(masks, n, cost, static, act, src, dst, weight, scale)
        value, cuts = dp_over_downsets(tables.stage_time, tables.memory_fixed, tables.memory_per_micro_batch,
                                       inflight, capacity)
        expected = _brute_force(n, src, dst, cost, static, act, weight, scale, inflight, capacity)
        if np.isinf(expected):
            assert cuts is None and np.isinf(value)
            infeasible += 1
        else:
            assert value == pytest.approx(expected, rel=1e-9, abs=1e-12)
            stage = cuts_to_stages(cuts, tables.members)
            assert (stage >= 0).all() and len(set(stage.tolist())) == stages
            assert (stage[src] <= stage[dst]).all()
            assert partition_objective(stage, cost, src, dst, weight, scale, stages).max() == pytest.approx(value)
        checked += 1
    assert 0 < infeasible < checked  # both branches were exercised


def test_dp_single_stage_and_hand_chain():
    # chain 0 -> 1 -> 2 -> 3 with costs 1, 2, 3, 4 and no comm: two stages best split {0,1,2} | {3}.
    src, dst = np.arange(3), np.arange(1, 4)
    cost = np.array([1.0, 2.0, 3.0, 4.0])
    masks = downsets(4, src, dst)
    tables = downset_tables(masks, 4, cost, np.zeros(4), np.zeros(4), src, dst, np.zeros(3), 0.0)
    value, cuts = dp_over_downsets(tables.stage_time, tables.memory_fixed, tables.memory_per_micro_batch,
                                   np.ones(2), np.inf)
    assert value == 6.0 and cuts_to_stages(cuts, tables.members).tolist() == [0, 0, 0, 1]
    value, _ = dp_over_downsets(tables.stage_time, tables.memory_fixed, tables.memory_per_micro_batch,
                                np.ones(1), np.inf)
    assert value == 10.0


# ------------------------------------------------------------------------------------------- clustering


@pytest.mark.parametrize("alpha", [0.01, 1.0, 100.0])
@pytest.mark.parametrize("seed", range(8))
def test_clustering_keeps_hyper_ops_convex(seed, alpha):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    src, dst = _random_instance(rng, n, p=0.15)
    k = int(rng.integers(1, n))
    group = cluster_operators(n, src, dst, node_cost=rng.uniform(0, 1, n), edge_comm=rng.uniform(0, 1, src.size),
                              num_clusters=k, alpha=alpha)
    count = int(group.max()) + 1
    assert sorted(set(group.tolist())) == list(range(count)) and count >= k
    for g in range(count):
        assert is_convex(group == g, n, src, dst)
    q_src, q_dst = quotient_edges(group, src, dst)
    assert (q_src < q_dst).all()  # ids are a topological order of the hyper-op DAG


def test_clustering_alpha_trades_balance_for_cut():
    # chain 0 -> 1 -> 2; the heavy edge 1 -> 2 carries most bytes, nodes 0 and 1 are the lightest.
    src, dst = np.array([0, 1]), np.array([1, 2])
    kwargs = dict(node_cost=np.array([1.0, 1.0, 5.0]), edge_comm=np.array([0.1, 10.0]), num_clusters=2)
    assert cluster_operators(3, src, dst, alpha=0.01, **kwargs).tolist() == [0, 0, 1]
    assert cluster_operators(3, src, dst, alpha=100.0, **kwargs).tolist() == [0, 1, 1]


def test_clustering_respects_memory_and_convexity():
    # 0 -> 1 -> 2 and 0 -> 2: fusing 0 and 2 alone is not convex; memory forbids fusing 1 with anything.
    src, dst = np.array([0, 1, 0]), np.array([1, 2, 2])
    group = cluster_operators(3, src, dst, node_cost=np.ones(3), edge_comm=np.array([0.0, 0.0, 100.0]),
                              num_clusters=1, alpha=100.0, node_memory=np.array([1.0, 5.0, 1.0]), memory_limit=5.5)
    assert group.tolist() == [0, 1, 2]


# ------------------------------------------------------------------------------------------- refinement


@pytest.mark.parametrize("seed", range(6))
def test_refinement_never_worsens_and_stays_valid(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 60))
    src, dst = _random_instance(rng, n, p=0.08)
    cost, static, act = rng.uniform(0, 1, n), rng.uniform(0, 1, n), rng.uniform(0, 0.1, n)
    weight = rng.uniform(0, 1, src.size)
    stages = 4
    start = np.zeros(n, dtype=np.int64)  # contiguous chunks of a topological order
    start[dag_order(n, src, dst)] = np.minimum(np.arange(n) * stages // n, stages - 1)
    inflight = inflight_micro_batches(stages, 4)
    capacity = 1e9
    before = partition_objective(start, cost, src, dst, weight, 0.1, stages).max()
    refined, moves = refine_partition(start, cost, static, act, src, dst, weight, inflight=inflight,
                                      capacity=capacity, comm_scale=0.1)
    after = partition_objective(refined, cost, src, dst, weight, 0.1, stages).max()
    assert after <= before + 1e-12
    assert (refined[src] <= refined[dst]).all()
    assert sorted(set(refined.tolist())) == list(range(stages))
    assert 0 <= moves <= 100


# ------------------------------------------------------------------------------------------- forward view


def _tiny_training_graph():
    """x -> lin1 -> relu -> lin2 -> loss, with hand-written backward and optimizer ops."""
    names = ["x", "w1", "w2", "lin1", "relu", "lin2", "loss",
             "seed", "lin2_dx", "lin2_dw", "relu_bw", "lin1_dw", "adam_w1", "adam_w2"]
    role = [ROLE_INPUT] * 3 + [ROLE_FORWARD] * 4 + [ROLE_BACKWARD] * 5 + [ROLE_OPTIMIZER] * 2
    ix = {name: i for i, name in enumerate(names)}
    edges = [("x", "lin1"), ("w1", "lin1"), ("lin1", "relu"), ("relu", "lin2"), ("w2", "lin2"), ("lin2", "loss"),
             ("loss", "seed"), ("seed", "lin2_dx"), ("w2", "lin2_dx"), ("seed", "lin2_dw"), ("relu", "lin2_dw"),
             ("lin2_dx", "relu_bw"), ("lin1", "relu_bw"), ("relu_bw", "lin1_dw"), ("x", "lin1_dw"),
             ("lin1_dw", "adam_w1"), ("w1", "adam_w1"), ("lin2_dw", "adam_w2"), ("w2", "adam_w2")]
    graph = make_graph([(ix[a], ix[b]) for a, b in edges], n=len(names), role=role,
                       param_bytes=[0, 400, 400] + [0] * 11)
    graph.names[:] = names
    graph.__dict__.pop("_names_to_index", None)
    graph.kinds[1] = graph.kinds[2] = "parameter"
    return graph, ix


def test_owners_follow_the_forward_op_they_differentiate():
    graph, ix = _tiny_training_graph()
    owner = assign_owners(graph)
    expect = {"x": "lin1", "w1": "lin1", "w2": "lin2", "seed": "loss", "lin2_dx": "lin2", "lin2_dw": "lin2",
              "relu_bw": "relu", "lin1_dw": "lin1", "adam_w1": "lin1", "adam_w2": "lin2"}
    for op, forward in expect.items():
        assert graph.names[owner[ix[op]]] == forward, op


def test_pipedream_names_pair_backward_with_forward():
    from pathlib import Path

    from tag.graph.pipedream import load_pipedream

    profile = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles" / "vgg16.graph.txt"
    if not profile.is_file():
        pytest.skip("PipeDream profiles not found")
    graph = load_pipedream(profile)
    owner = assign_owners(graph)
    for i, name in enumerate(graph.names):
        stem, _, suffix = name.rpartition(".")
        if suffix in ("backward", "optimizer"):
            assert graph.names[owner[i]] == f"{stem}.forward"


def test_forward_graph_sums_and_stage_graph():
    graph, ix = _tiny_training_graph()
    fg = ForwardGraph.from_graph(graph, ["v100-16gb"])
    assert fg.num_nodes == 4 and fg.param_bytes.sum() == 800
    assert (fg.edge_src < fg.edge_dst).all()
    sg = build_stage_graph(fg, np.array([0, 0, 1, 1]), replicas=2, micro_batches=4)
    assert sg.num_stages == 2 and sg.param_bytes.tolist() == [400, 400]
    assert sg.edge_src.tolist() == [0] and sg.edge_dst.tolist() == [1]
    assert sg.edge_bytes[0] == pytest.approx(4.0 / 8)  # relu -> lin2 and relu -> lin2_dw (not forward): 4 B / (M·R)
    assert sg.assignment[ix["adam_w2"]] == 1 and sg.assignment[ix["x"]] == 0
    with pytest.raises(PartitionError, match="goes from stage 1 back to 0"):
        build_stage_graph(fg, np.array([1, 0, 1, 1]))


def test_forward_graph_on_a_traced_model():
    from tag.graph.resolve import resolve_model

    graph = resolve_model("bert-small", tiny=True)
    fg = ForwardGraph.from_graph(graph, ["v100-16gb"])
    assert (fg.owner >= 0).all()
    assert fg.param_bytes.sum() == pytest.approx(graph.total_param_bytes())
    ratio = fg.backward_time(1.0).sum() / fg.forward_time(1.0).sum()
    assert 1.0 < ratio < 3.5


# ------------------------------------------------------------------------------------------- drivers


def test_parmesan_without_clustering_is_the_exact_optimum():
    rng = np.random.default_rng(7)
    graph = make_graph(random_dag(rng, 9, p=0.35), n=9, flops=rng.uniform(1e9, 1e10, 9).tolist())
    fg = ForwardGraph.from_graph(graph, ["v100-16gb"])
    result = partition_parmesan(fg, stages=3, bandwidth=1e6, num_hyper_ops=fg.num_nodes, refine=False)
    cost = fg.compute_time(1.0)
    weight = fg.edge_bytes(1.0)
    expected = _brute_force(fg.num_nodes, fg.edge_src, fg.edge_dst, cost, np.zeros(9), np.zeros(9), weight,
                            2 / 1e6, np.ones(3), np.inf)
    assert result.dp_cost == pytest.approx(expected)
    assert result.max_stage_time == pytest.approx(expected)


def test_pipedream_chunks_are_contiguous_and_optimal():
    rng = np.random.default_rng(3)
    graph = make_graph(random_dag(rng, 10, p=0.3), n=10, flops=rng.uniform(1e9, 1e10, 10).tolist())
    fg = ForwardGraph.from_graph(graph, ["v100-16gb"])
    result = partition_pipedream(fg, stages=3, bandwidth=1e7)
    stage = result.forward_stage
    assert (np.diff(stage) >= 0).all()  # contiguous in the forward (topological) order
    cost, weight = fg.compute_time(1.0), fg.edge_bytes(1.0)
    best = np.inf
    for a, b in itertools.combinations(range(1, 10), 2):
        split = np.repeat([0, 1, 2], [a, b - a, 10 - b])
        best = min(best, partition_objective(split, cost, fg.edge_src, fg.edge_dst, weight, 2 / 1e7, 3).max())
    assert result.max_stage_time == pytest.approx(best)


def test_partition_errors():
    fg = ForwardGraph.from_graph(make_graph([(0, 1), (1, 2)]), ["v100-16gb"])
    with pytest.raises(PartitionError, match="into 4 non-empty stages"):
        partition_parmesan(fg, stages=4, bandwidth=1e9)
    with pytest.raises(PartitionError, match="stages must be a positive integer"):
        partition_parmesan(fg, stages=0, bandwidth=1e9)
    with pytest.raises(PartitionError, match="fits device memory"):
        partition_pipedream(fg, stages=2, bandwidth=1e9, capacity=1.0)


# ------------------------------------------------------------------------------------------- RaNNC


def _blocks(rng, n, *, ratio=None, comm=True):
    fwd = rng.uniform(0.1, 1.0, n)
    bwd = fwd * ratio if ratio is not None else rng.uniform(0.1, 2.0, n)
    src = np.array([i for i in range(n - 1)] + ([0] if n > 2 else []), dtype=np.int64)
    dst = np.array([i + 1 for i in range(n - 1)] + ([n - 1] if n > 2 else []), dtype=np.int64)
    weight = rng.uniform(0, 1, src.size) if comm else np.zeros(src.size)
    return BlockCosts(fwd_fixed=rng.uniform(0, 0.05, n), fwd_scaled=fwd, bwd_fixed=np.zeros(n), bwd_scaled=bwd,
                      static=rng.uniform(0, 1, n), act_fixed=np.zeros(n), act_scaled=rng.uniform(0, 2, n),
                      edge_src=src, edge_dst=dst, edge_fixed=np.zeros(src.size), edge_scaled=weight, batch_size=32)


def _rannc_brute(blocks, stages, devices, micro_batches, capacity, comm_scale):
    n = blocks.num_blocks
    tf, tb, mf, ma = rannc_stage_times(blocks, copies=1, micro_batches=micro_batches, max_devices=devices,
                                       comm_scale=comm_scale)
    inflight = inflight_micro_batches(stages, micro_batches)
    best = np.inf
    for cut in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cut, n)
        for split in itertools.combinations(range(1, devices), stages - 1):
            counts = np.diff((0, *split, devices))
            f = [tf[bounds[i], bounds[i + 1], counts[i]] for i in range(stages)]
            b = [tb[bounds[i], bounds[i + 1], counts[i]] for i in range(stages)]
            m = [mf[bounds[i], bounds[i + 1], counts[i]] + inflight[i] * ma[bounds[i], bounds[i + 1], counts[i]]
                 for i in range(stages)]
            if max(m) <= capacity:
                best = min(best, max(f) + max(b))
    return best


@pytest.mark.parametrize("seed", range(15))
def test_rannc_dp_equals_brute_force_when_backward_is_proportional(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    blocks = _blocks(rng, n, ratio=2.0, comm=False)
    stages = int(rng.integers(1, min(n, 3) + 1))
    devices = int(rng.integers(stages, stages + 4))
    micro_batches = int(rng.choice([1, 2, 4]))
    capacity = float(rng.uniform(1.0, 5.0))
    solution = rannc_dp(blocks, stages=stages, devices=devices, micro_batches=micro_batches, capacity=capacity)
    expected = _rannc_brute(blocks, stages, devices, micro_batches, capacity, 0.0)
    if np.isinf(expected):
        assert solution is None
    else:
        assert solution.value == pytest.approx(expected)
        assert sum(solution.devices) == devices and solution.bounds[0] == 0 and solution.bounds[-1] == n


@pytest.mark.parametrize("seed", range(10))
def test_rannc_dp_general_is_consistent(seed):
    """With unproportional backward times the kept-pair DP is RaNNC's heuristic: its value is that of
    the solution it returns, and never below the brute-force optimum."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 7))
    blocks = _blocks(rng, n)
    stages, devices = 2, int(rng.integers(2, 6))
    solution = rannc_dp(blocks, stages=stages, devices=devices, micro_batches=2, comm_scale=0.2)
    tf, tb, _, _ = rannc_stage_times(blocks, copies=1, micro_batches=2, max_devices=devices, comm_scale=0.2)
    b, d = solution.bounds, solution.devices
    value = max(tf[b[i], b[i + 1], d[i]] for i in range(stages)) + max(tb[b[i], b[i + 1], d[i]] for i in range(stages))
    assert solution.value == pytest.approx(value)
    assert solution.value >= _rannc_brute(blocks, stages, devices, 2, np.inf, 0.2) - 1e-12


def test_range_bytes():
    # edges 0->1 (1 B), 0->2 (2 B), 1->2 (4 B): range [1, 2) receives 1 B and sends 4 B.
    x = range_bytes(3, np.array([0, 0, 1]), np.array([1, 2, 2]), np.array([1.0, 2.0, 4.0]))
    assert x[2, 2] - x[1, 2] == 4.0  # sent by block 1 to later blocks
    assert x[1, 1] - x[1, 2] == 1.0  # received by block 1 from earlier blocks
    zeros = np.zeros(3)
    blocks = BlockCosts(zeros, zeros, zeros, zeros, zeros, zeros, zeros, np.array([0, 0, 1]), np.array([1, 2, 2]),
                        np.array([1.0, 2.0, 4.0]), np.zeros(3), batch_size=8)
    t_fwd, t_bwd, _, per_micro_batch = rannc_stage_times(blocks, copies=1, micro_batches=1, max_devices=1,
                                                         comm_scale=1.0)
    assert (t_fwd[1, 2, 1], t_bwd[1, 2, 1], per_micro_batch[1, 2, 1]) == (4.0, 1.0, 1.0)
    assert (t_fwd[0, 2, 1], t_bwd[0, 2, 1]) == (6.0, 0.0)  # blocks 0-1 send 0->2 and 1->2
    assert np.isinf(t_fwd[2, 1, 1]) and np.isinf(t_fwd[0, 1, 0])  # empty range, no device


def test_form_stage_prefers_fewest_nodes_and_uses_evaluate():
    blocks = _blocks(np.random.default_rng(0), 6)
    seen = []

    def evaluate(solution):
        seen.append(solution)
        return -solution.micro_batches  # prefer many micro-batches

    solution = form_stage(blocks, nodes=2, devices_per_node=2, evaluate=evaluate)
    assert solution.copies == 2 and sum(solution.devices) == 2  # n = 1 node per pipeline copy already fits
    assert solution.micro_batches == max(s.micro_batches for s in seen)
    with pytest.raises(PartitionError, match="no feasible"):
        form_stage(blocks, nodes=1, devices_per_node=2, capacity=1e-9)
