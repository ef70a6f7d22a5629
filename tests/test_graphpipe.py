"""GraphPipe: SP decomposition, the stage partitioner against the sequential DP and brute force, the
static scheduler's in-flight counts and orders (C4), and graph-pipeline plans through the simulator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import make_graph, random_dag

from tag.cluster import gpu_type
from tag.cluster.build import Machine, build_cluster
from tag.exact.partition import COMM_CROSSINGS, partition_pipedream
from tag.exact.pipeline import plan_pipeline, simulate_pipeline
from tag.exact.schedules import BACKWARD, FORWARD, Action, stage_orders
from tag.exact.stage_graph import ForwardGraph, PartitionError, build_stage_graph
from tag.graphpipe import (
    GraphPartition,
    SPError,
    block_graph,
    check_schedule,
    contract_dangling,
    depth_frontier,
    graph_stage_orders,
    inflight_samples,
    partition_graphpipe,
    plan_graph_pipeline,
    simulate_graph_pipeline,
    sp_decompose,
    stage_inflight,
    unit_time_schedule_dag,
)
from tag.graphpipe.pipeline import _iteration_estimate

V100 = gpu_type("v100-16gb")


def _tree(n, edges, **kwargs):
    src = [a for a, _ in edges]
    dst = [b for _, b in edges]
    return sp_decompose(n, src, dst, **kwargs)


# ------------------------------------------------------------------------------------------- SP


@pytest.mark.parametrize("n, edges, expected", [
    (1, [], "0"),
    (3, [(0, 1), (1, 2), (0, 2)], "S(0, 1, 2)"),  # a transitive (residual) edge keeps a chain
    (4, [(0, 1), (0, 2), (1, 3), (2, 3)], "S(0, P(1, 2), 3)"),  # diamond
    (4, [(0, 1), (2, 3)], "P(S(0, 1), S(2, 3))"),  # two independent chains
    (6, [(0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 5)], "S(0, P(S(1, 3), S(2, 4)), 5)"),
    (7, [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (3, 5), (4, 6), (5, 6)], "S(0, P(1, 2), 3, P(4, 5), 6)"),
])
def test_sp_decomposition_of_hand_built_graphs(n, edges, expected):
    tree = _tree(n, edges)
    assert tree.describe() == expected
    assert tree.is_series_parallel
    assert sorted(tree.nodes[tree.root].members.tolist()) == list(range(n))


def test_the_n_graph_is_linearised_at_its_cheapest_cut():
    # a -> c, b -> c, b -> d: an "N"; the cut {a, b} | {c, d} orders one incomparable pair, a < d
    tree = _tree(4, [(0, 2), (1, 2), (1, 3)])
    assert not tree.is_series_parallel
    assert tree.describe() == "S(P(0, 1), P(2, 3))"
    assert tree.fallbacks == [{"nodes": [0, 1, 2, 3], "action": "linearise", "cut": 2, "false_dependencies": 1}]


def test_the_n_graph_merged_becomes_one_leaf_inside_its_context():
    # s -> N -> t: only the prime region is merged, the series around it stays
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (2, 4), (3, 5), (4, 5)]
    tree = _tree(6, edges, fallback="merge")
    assert tree.describe() == "S(0, {1,2,3,4}, 5)"
    linear = _tree(6, edges)
    assert linear.describe() == "S(0, P(1, 2), P(3, 4), 5)"


def test_sp_rejects_cycles_and_bad_fallbacks():
    with pytest.raises(SPError, match="cycle"):
        _tree(3, [(0, 1), (1, 2), (2, 0)])
    with pytest.raises(SPError, match="fallback"):
        _tree(2, [(0, 1)], fallback="magic")


@pytest.mark.parametrize("seed", range(20))
def test_series_children_are_totally_ordered_and_parallel_ones_independent(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 12))
    edges = random_dag(rng, n, 0.35)
    tree = _tree(n, edges)
    reach = np.zeros((n, n), dtype=bool)
    for a, b in edges:
        reach[a, b] = True
    for k in range(n):  # Floyd-Warshall closure, independent of the module's
        reach |= reach[:, [k]] & reach[[k], :]
    added = 0
    for node in tree.nodes:
        groups = [tree.nodes[c].members for c in node.children]
        for x, y in itertools.combinations(range(len(groups)), 2):
            block = reach[np.ix_(groups[x], groups[y])]
            if node.kind == "parallel":
                assert not block.any() and not reach[np.ix_(groups[y], groups[x])].any()
            elif node.kind == "series":
                added += int((~block).sum())
    assert added == sum(f["false_dependencies"] for f in tree.fallbacks) or tree.fallbacks


def test_contract_dangling_folds_extra_sinks_and_constant_sources():
    # 0 -> 1 -> 2 (the loss); 1 -> 3 is read only by backward; constant 4 -> 2
    group = contract_dangling(5, [0, 1, 1, 4], [1, 2, 3, 2], constant=np.array([0, 0, 0, 0, 1], bool))
    assert group[3] == group[1] and group[4] == group[2]
    assert len(set(group.tolist())) == 3 and group[0] < group[1] < group[2]


# ------------------------------------------------------------------------------------------- partitioner


def _chain_graph(rng, n, *, params=False):
    flops = (rng.uniform(1, 10, n) * 1e12).tolist()
    param = (rng.uniform(0, 1, n) * 1e8).tolist() if params else None
    graph = make_graph([(i, i + 1) for i in range(n - 1)], n=n, flops=flops,
                       edge_bytes=(rng.uniform(0.5, 5, n - 1) * 1e8).tolist(), param_bytes=param)
    return ForwardGraph.from_graph(graph, [V100])


@pytest.mark.parametrize("seed", range(12))
def test_on_a_chain_the_graph_partitioner_matches_the_sequential_dp(seed):
    """GraphPipe App. A.3: with one replica per stage and a chain, the least bottleneck over at most S
    stages equals PipeDream's DP minimised over the stage count."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 10))
    fg = _chain_graph(rng, n)
    stages, micro_batches, bandwidth = int(rng.integers(1, n + 1)), 2, 10e9
    part = partition_graphpipe(fg, num_devices=stages, micro_batches=micro_batches, bandwidth=bandwidth,
                               max_replicas=1, max_chain=64, fill_idle=False)
    sequential = min(partition_pipedream(fg, stages=s, micro_batches=micro_batches, bandwidth=bandwidth).dp_cost
                     for s in range(1, stages + 1))
    assert part.target == pytest.approx(sequential, rel=1e-9)
    assert part.max_stage_time == pytest.approx(sequential, rel=1e-9)
    assert (np.diff(part.forward_stage) >= 0).all()  # contiguous stages of the chain
    assert part.edge_src.tolist() == list(range(part.num_stages - 1))


def _brute_force_chain(fg, num_devices, micro_batches, bandwidth):
    """Least bottleneck over every contiguous cut of the chain and every replica count per stage."""
    n = fg.num_nodes
    fixed = fg.fwd_fixed[:, 0] + fg.bwd_fixed[:, 0]
    scaled = fg.fwd_scaled[:, 0] + fg.bwd_scaled[:, 0]
    edge = {(int(a), int(b)): (f, s) for a, b, f, s in zip(fg.edge_src, fg.edge_dst, fg.edge_fixed, fg.edge_scaled)}
    best = np.inf
    for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, n), k) for k in range(n)):
        bounds = [0, *cuts, n]
        segments = list(zip(bounds[:-1], bounds[1:]))
        for replicas in itertools.product(range(1, num_devices + 1), repeat=len(segments)):
            if sum(replicas) > num_devices:
                continue
            worst = 0.0
            for (a, b), d in zip(segments, replicas):
                f = 1.0 / (micro_batches * d)
                t = fixed[a:b].sum() + f * scaled[a:b].sum()
                for key in ((a - 1, a), (b - 1, b)):
                    if key in edge:
                        t += COMM_CROSSINGS / bandwidth * (edge[key][0] + f * edge[key][1])
                t += 2.0 * (d - 1) / d * fg.param_bytes[a:b].sum() / bandwidth / micro_batches
                worst = max(worst, t)
            best = min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(10))
def test_partitioner_with_replicas_matches_brute_force_on_small_chains(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 6))
    fg = _chain_graph(rng, n, params=True)
    devices = int(rng.integers(1, 5))
    part = partition_graphpipe(fg, num_devices=devices, micro_batches=1, bandwidth=5e9, max_chain=64,
                               fill_idle=False)
    assert part.target == pytest.approx(_brute_force_chain(fg, devices, 1, 5e9), rel=1e-9)
    assert part.replicas.sum() <= devices


def _fork_join_graph(branches=2, length=2, flops=4e12):
    """0 -> `branches` chains of `length` ops -> join -> head."""
    edges, k = [], 1
    ends = []
    for _ in range(branches):
        prev = 0
        for _ in range(length):
            edges.append((prev, k))
            prev, k = k, k + 1
        ends.append(prev)
    join = k
    edges += [(e, join) for e in ends] + [(join, join + 1)]
    n = join + 2
    weights = [flops] * n
    weights[0] = weights[join] = weights[join + 1] = flops / 50
    return make_graph(edges, n=n, flops=weights, edge_bytes=[1e6] * len(edges))


def test_branches_become_parallel_stages_and_the_join_shares_a_branch_stage():
    fg = ForwardGraph.from_graph(_fork_join_graph(branches=2, length=2), [V100])
    part = partition_graphpipe(fg, num_devices=2, micro_batches=4, bandwidth=10e9, max_replicas=1)
    # two devices, two equal branches: one stage per branch, the light fork and join ride along
    assert part.num_stages == 2
    branch_of = part.forward_stage
    assert branch_of[1] == branch_of[2] != branch_of[3] == branch_of[4]
    assert part.edge_src.size == 1 and part.inflight.max() == 2
    sequential = partition_pipedream(fg, stages=2, micro_batches=4, bandwidth=10e9).dp_cost
    assert part.target <= sequential * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_depth_frontier_dominates_every_sequential_chain(seed):
    """GPP ⊇ SPP: on a chain, for every stage count S the frontier holds a point at most S deep whose
    bottleneck is at most PipeDream's least bottleneck over at most S stages; the front is Pareto."""
    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(3, 9))
    fg = _chain_graph(rng, n)
    devices, micro_batches, bandwidth = int(rng.integers(2, n + 1)), 4, 10e9
    front = depth_frontier(fg, num_devices=devices, micro_batches=micro_batches, bandwidth=bandwidth,
                           max_replicas=1, max_chain=64)
    targets, depths = [t for t, _ in front], [d for _, d in front]
    assert targets == sorted(targets) and depths == sorted(set(depths), reverse=True)
    for s in range(1, devices + 1):
        sequential = min(partition_pipedream(fg, stages=k, micro_batches=micro_batches, bandwidth=bandwidth).dp_cost
                         for k in range(1, s + 1))
        assert min(t for t, d in front if d <= s) <= sequential * (1 + 1e-9)
    for target, depth in front:  # each point rebuilds to a plan of that depth at that bottleneck
        part = partition_graphpipe(fg, num_devices=devices, micro_batches=micro_batches, bandwidth=bandwidth,
                                   max_replicas=1, max_chain=64, max_depth=depth, fill_idle=False)
        assert part.target == target and part.num_stages == depth


def _random_fork_join(rng):
    """A stem, 2-3 branches of 1-3 ops of random work, a join and a head."""
    branches, edges, ends, k = int(rng.integers(2, 4)), [], [], 1
    for _ in range(branches):
        prev = 0
        for _ in range(int(rng.integers(1, 4))):
            edges.append((prev, k))
            prev, k = k, k + 1
        ends.append(prev)
    edges += [(e, k) for e in ends] + [(k, k + 1)]
    flops = (rng.uniform(0.2, 5, k + 2) * 1e12).tolist()
    return make_graph(edges, n=k + 2, flops=flops, edge_bytes=(rng.uniform(1, 50, len(edges)) * 1e6).tolist())


@pytest.mark.parametrize("seed", range(6))
def test_graph_plan_is_never_worse_than_the_sequential_plan(seed):
    """Both plans scored by one simulator with the same micro-batch and memory rules: the graph
    planner's search space holds the sequential one, so it never loses."""
    rng = np.random.default_rng(300 + seed)
    graph = _random_fork_join(rng)
    cluster = _cluster(int(rng.integers(2, 5)))
    graph_plan = plan_graph_pipeline(graph, cluster)
    sequential = plan_pipeline(graph, cluster, partitioner="pipedream", auto=True)
    assert graph_plan.result.feasible
    assert graph_plan.iteration_time <= sequential.iteration_time * (1 + 1e-9)


@pytest.mark.parametrize("share", [1.0, 0.5, 0.25])
def test_tail_share_holds_each_stage_step_to_its_share_of_the_steady_state(share):
    fg = _chain_graph(np.random.default_rng(5), 6)
    micro_batches = 4
    fg.optimizer_time = 0.5 * fg.compute_time(1.0, 0)[:, None]  # [F, 1] steps as long as half the passes
    options = dict(num_devices=3, micro_batches=micro_batches, bandwidth=10e9, fill_idle=False)
    part = partition_graphpipe(fg, tail_share=share, **options)
    assert (part.once_time > 0).all()
    assert (part.once_time <= share * micro_batches * part.target * (1 + 1e-9)).all()
    # stage_time stays the amortised cost, passes + step / M, whatever the share
    assert (part.stage_time <= part.target * (1 + 1e-9)).all()
    assert part.target >= partition_graphpipe(fg, **options).target * (1 - 1e-9)


def test_tail_share_must_be_a_share():
    fg = _chain_graph(np.random.default_rng(5), 4)
    for share in (0.0, 1.5):
        with pytest.raises(PartitionError, match="tail_share"):
            partition_graphpipe(fg, num_devices=2, micro_batches=2, bandwidth=10e9, tail_share=share)


def test_iteration_estimate_puts_each_step_after_its_last_backward_pass():
    """Two stages, M = 4, passes 1 and 2 s per micro-batch, steps 3 and 5 s, backward half the passes:
    the passes fill (4 + 2 - 1)·2 = 10 s; the entry's step adds 3, the exit's step starts one backward
    hop (0.5·2 = 1 s) before the entry's last backward ends, so it adds 5 - 1 = 4: 14 s."""
    once = np.array([3.0, 5.0])
    part = GraphPartition(np.array([0, 1]), np.array([1, 1]), np.array([0]), np.array([1]), np.array([2, 1]),
                          np.array([1.0, 2.0]) + once / 4, once, 4, 2.0, [0, 1])
    assert _iteration_estimate(part, backward_share=0.5) == pytest.approx(14.0)


def _mixed_cluster(rng):
    """Two machines of different GPU generations, fast inside, slow between: 2-5 devices."""
    fast, slow = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    return build_cluster("mixed", [Machine("v100-16gb", fast, 50e9), Machine("1080ti", slow, 12e9)],
                         network_bandwidth=float(rng.uniform(1e9, 10e9)))


@pytest.mark.parametrize("seed", range(6))
def test_the_sequential_plans_are_simulated_so_the_graph_plan_never_loses(seed):
    """By construction, on branched graphs over mixed GPU generations: every sequential partitioner's
    plan, with chain and with data stage edges, is a candidate as it is (its own schedule and simulated
    iteration) and as a graph of its stages, so the graph plan is never slower than any of them, nor
    than the graph-only search; a sequential plan that wins keeps its partitioner's name."""
    rng = np.random.default_rng(400 + seed)
    graph = _random_fork_join(rng)
    cluster = _mixed_cluster(rng)
    plan = plan_graph_pipeline(graph, cluster)
    graph_only = plan_graph_pipeline(graph, cluster, sequential=())
    sequential = {f"{name}:{links}": plan_pipeline(graph, cluster, partitioner=name, auto=True, links=links)
                  for name in ("pipedream", "parmesan", "rannc") for links in ("chain", "data")}
    fastest = min(graph_only.iteration_time, *(p.iteration_time for p in sequential.values()))
    assert plan.iteration_time <= fastest * (1 + 1e-9)
    assert plan.info["chosen"] in ("graphpipe", *sequential, *(f"{label}-graph" for label in sequential))
    rows = {row["method"]: row for row in plan.info["search"]}
    for label, seq in sequential.items():
        assert rows[label]["iteration_time_s"] == pytest.approx(seq.iteration_time, rel=1e-9)
        assert rows[label]["stages"] == seq.num_stages
    as_is = plan.info["chosen"] in sequential
    assert plan.partitioner == (plan.info["chosen"].split(":")[0] if as_is else "graphpipe")
    assert {row["method"] for row in graph_only.info["search"]} == {"graphpipe"}


@pytest.mark.parametrize("seed", range(4))
def test_plans_given_to_the_graph_planner_set_its_floor_and_replay_as_they_are(seed):
    """The pipeline family's mapped plans (exact mapper, any placement) given to the graph planner: its
    plan is never slower than any of them, and when one wins as it is, its plan file's replay (the
    sequential schedule) simulates the same iteration."""
    from tag.exact import replay_pipeline
    from tag.planners.mappers import make_mapper

    rng = np.random.default_rng(500 + seed)
    graph = _random_fork_join(rng)
    cluster = _mixed_cluster(rng)
    given = [plan_pipeline(graph, cluster, partitioner=name, auto=True, mapper=make_mapper("exact", time_limit=2))
             for name in ("parmesan", "pipedream", "rannc")]
    plan = plan_graph_pipeline(graph, cluster, sequential=(), sequential_plans=given)
    assert plan.iteration_time <= min(p.iteration_time for p in given) * (1 + 1e-9)
    # the search alone cannot beat a given plan it holds, so forcing a tie makes one win as it is
    tie = plan_graph_pipeline(graph, cluster, sequential=(), sequential_plans=given, slack=0.0, micro_batches=1)
    winner = tie if tie.partitioner != "graphpipe" else plan
    if winner.partitioner != "graphpipe":
        sg = winner.stage_graph
        again = replay_pipeline(graph, cluster, forward_assignment=sg.forward_assignment,
                                replicas=sg.replicas.tolist(), micro_batches=sg.micro_batches,
                                mapping=winner.mapping, schedule=winner.schedule,
                                links=sg.info.get("links", "data"))
        assert again.iteration_time == pytest.approx(winner.iteration_time, rel=1e-9)


def test_a_time_limit_stops_the_graph_search_with_the_plans_it_was_given():
    """A limit too short for any search still returns the best plan given to it."""
    rng = np.random.default_rng(9)
    graph = _random_fork_join(rng)
    cluster = _mixed_cluster(rng)
    given = plan_pipeline(graph, cluster, partitioner="parmesan", auto=True)
    plan = plan_graph_pipeline(graph, cluster, sequential_plans=[given], time_limit_s=1e-9)
    assert plan.info["stopped_at_limit"]
    assert plan.iteration_time <= given.iteration_time * (1 + 1e-9)
    assert [row["method"] for row in plan.info["search"]] == ["parmesan:data"]
    with pytest.raises(PartitionError, match="time_limit_s"):
        plan_graph_pipeline(graph, cluster, time_limit_s=0)


def test_partitioner_reports_memory_infeasibility():
    fg = ForwardGraph.from_graph(_fork_join_graph(), [V100])
    with pytest.raises(PartitionError, match="fits device memory"):
        partition_graphpipe(fg, num_devices=2, micro_batches=2, bandwidth=10e9, capacity=1.0)


# ------------------------------------------------------------------------------------------- scheduler


def test_table2_in_flight_samples():
    assert inflight_samples(1, 2, 1, 2, 4) == 6  # row 7, the default: i_y + b
    assert inflight_samples(2, 2, 3, 2, 4) == 8  # row 1: max{b} < k_x b_x < k_y b_y -> i_y + 2 max{b}
    assert inflight_samples(1, 4, 2, 4, 0) == 4  # row 2: max{b} = k_x b_x < k_y b_y -> i_y + max{b}
    assert inflight_samples(8, 1, 2, 2, 0) == 8  # row 3: i_y + k_x b_x - k_y b_y + 2 b_y
    assert inflight_samples(4, 1, 1, 2, 1) == 5  # row 4: i_y + k_x b_x
    assert inflight_samples(4, 2, 3, 1, 0) == 9  # row 5: i_y + k_x b_x - k_y b_y + 2 b_x
    assert inflight_samples(2, 2, 2, 1, 3) == 7  # row 6: i_y + k_x b_x
    assert inflight_samples(2, 2, 4, 1, 0) == 4  # row 8: i_y + 2 max{b}


def test_in_flight_counts_of_a_fork_join_of_stages():
    # 0 -> 1 -> 2 -> 4 and 0 -> 3 -> 4: the long branch sets stage 0's count
    edges = ([0, 1, 2, 0, 3], [1, 2, 4, 3, 4])
    assert stage_inflight(5, *edges).tolist() == [4, 3, 2, 2, 1]
    assert stage_inflight(5, *edges, micro_batches=2).tolist() == [2, 2, 2, 2, 1]
    # diamond of stages 0 -> {1, 2} -> 3: parallel stages hold what one sequential stage would
    assert stage_inflight(4, [0, 0, 1, 2], [1, 2, 3, 3]).tolist() == [3, 2, 2, 1]
    # the same four stages as a chain hold one more at the front
    assert stage_inflight(4, [0, 1, 2], [1, 2, 3]).tolist() == [4, 3, 2, 1]
    # two micro-batch sizes, 2F2B (Table 2 row 2): the sink holds k·b = 8 samples (2 micro-batches of 4),
    # stage 0 (b = 2) holds 8 + max{2, 4} = 12 samples, 6 of its micro-batches
    assert stage_inflight(2, [0], [1], micro_batch_sizes=[2, 4], ks=[2, 2]).tolist() == [6, 2]


@pytest.mark.parametrize("micro_batches", [1, 2, 5])
def test_on_a_chain_the_orders_are_1f1b(micro_batches):
    counts = stage_inflight(4, [0, 1, 2], [1, 2, 3], micro_batches=micro_batches)
    assert graph_stage_orders(counts, micro_batches) == stage_orders(4, micro_batches, "1f1b")


@pytest.mark.parametrize("seed", range(25))
def test_every_schedule_respects_c4_and_the_stage_dag(seed):
    rng = np.random.default_rng(seed)
    num_stages = int(rng.integers(1, 9))
    edges = random_dag(rng, num_stages, 0.4)
    src, dst = [a for a, _ in edges], [b for _, b in edges]
    micro_batches = int(rng.integers(1, 7))
    counts = stage_inflight(num_stages, src, dst, micro_batches=micro_batches)
    orders = graph_stage_orders(counts, micro_batches)
    assert check_schedule(orders, src, dst, micro_batches) == []
    times = unit_time_schedule_dag(orders, src, dst, forward=rng.uniform(0.5, 2, num_stages).tolist(),
                                   backward=rng.uniform(0.5, 2, num_stages).tolist())
    for m in range(micro_batches):
        for a, b in edges:  # forward a before forward b; backward b before backward a
            assert times[Action(a, FORWARD, m)][1] <= times[Action(b, FORWARD, m)][0] + 1e-12
            assert times[Action(b, BACKWARD, m)][1] <= times[Action(a, BACKWARD, m)][0] + 1e-12
    for s, order in enumerate(orders):  # never more in flight than the count
        held = np.cumsum([1 if a.kind == FORWARD else -1 for a in order])
        assert held.max() == counts[s]


def test_check_schedule_flags_c4_violations_and_deadlocks():
    bad = [[Action(0, BACKWARD, 0), Action(0, FORWARD, 0)]]
    assert any("before F0" in p for p in check_schedule(bad, [], [], 1))
    # stage 0 waits for a backward before it sends the forward stage 1 needs
    stuck = [[Action(0, FORWARD, 0), Action(0, BACKWARD, 0), Action(0, FORWARD, 1), Action(0, BACKWARD, 1)],
             [Action(1, FORWARD, 1), Action(1, BACKWARD, 1), Action(1, FORWARD, 0), Action(1, BACKWARD, 0)]]
    assert check_schedule(stuck, [0], [1], 2)


# ------------------------------------------------------------------------------------------- plans


def _cluster(devices=4):
    return build_cluster("test", [Machine("v100-16gb", devices, 50e9)])


def test_chain_plan_compiles_like_the_sequential_pipeline():
    rng = np.random.default_rng(7)
    fg = _chain_graph(rng, 6)
    cluster = _cluster(3)
    sg = build_stage_graph(fg, [0, 0, 1, 1, 2, 2], micro_batches=4)
    mapping = [[0], [1], [2]]
    _, sequential = simulate_pipeline(sg, cluster, mapping)
    _, graph = simulate_graph_pipeline(sg, cluster, mapping)
    assert graph.iteration_time == pytest.approx(sequential.iteration_time, rel=1e-12)
    assert graph.peak_memory.tolist() == pytest.approx(sequential.peak_memory.tolist())


def test_plan_graph_pipeline_on_a_fork_join_model():
    graph = _fork_join_graph(branches=2, length=3)
    plan = plan_graph_pipeline(graph, _cluster(2), micro_batches=4)
    out = plan.as_dict()
    for key in ("stages", "replicas", "mapping", "stage_edges", "max_stage_time_s", "iteration_time_s",
                "solve_time_s", "inflight", "depth"):
        assert key in out
    assert out["stages"] == 2 and out["depth"] == 2 and out["feasible"]
    flat = [d for row in out["mapping"] for d in row]
    assert sorted(flat) == [0, 1]
    fg = ForwardGraph.from_graph(graph, [V100])
    stage = plan.partition.forward_stage
    assert (stage[fg.edge_src] <= stage[fg.edge_dst]).all()
    # both branches run at once: the iteration is shorter than one device doing both in turn
    single = plan_graph_pipeline(graph, _cluster(2), num_devices=1, micro_batches=4)
    assert plan.iteration_time < 0.75 * single.iteration_time


@pytest.mark.slow
def test_plan_graph_pipeline_on_the_tiny_zoo_models():
    from tag.graph.resolve import resolve_model

    for name in ("candle-uno", "dlrm"):
        graph = resolve_model(name, tiny=True)
        plan = plan_graph_pipeline(graph, _cluster(4))
        assert plan.result.feasible and plan.iteration_time > 0
        assert check_schedule(plan.orders, plan.stage_graph.edge_src, plan.stage_graph.edge_dst,
                              plan.stage_graph.micro_batches) == []


def test_block_graph_of_a_multi_branch_graph_has_a_parallel_node():
    fg = ForwardGraph.from_graph(_fork_join_graph(branches=3, length=2), [V100])
    bg = block_graph(fg)
    assert "parallel" in bg.kind and bg.sp_tree.is_series_parallel
