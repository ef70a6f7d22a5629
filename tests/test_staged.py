"""The memory-fitting staged plan (tag.search.staged): layer positions, the run DP against brute force, and
plans that fit where every data-parallel plan runs out of memory."""

import dataclasses
import itertools

import numpy as np
import pytest

from tag.cluster import Machine, build_cluster, gpu_type
from tag.compiler import evaluate_strategy
from tag.graph.resolve import resolve_model
from tag.grouping import GroupGraph, group_ops
from tag.planner import PlanConfig, plan_training
from tag.search import PlacementEnv, layer_positions, staged_strategy
from tag.search.staged import _cut, _Runs, group_memory
from tag.strategy import Strategy

from conftest import make_graph

FORWARD, BACKWARD, OPTIMIZER, INPUT = 1, 2, 3, 0


def small_cluster(memory_bytes: float, machines: int = 2, per_machine: int = 2):
    small = dataclasses.replace(gpu_type("v100-32gb"), name="v100-small", memory_bytes=memory_bytes)
    return build_cluster("small", [Machine(small, per_machine, 100e9) for _ in range(machines)],
                         network_bandwidth=12.5e9)


def test_layer_positions_keep_a_layers_backward_and_update_with_its_forward():
    # x(0) → f1(1) → f2(2) → f3(3); backward b3(4) reads f2's output and starts the gradient chain,
    # b2(5) reads b3 and f1, b1(6) reads b2 and the input x; w(7) is f2's weight, updated by o2(8) from b2.
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (2, 4), (4, 5), (1, 5), (5, 6), (0, 6), (7, 2), (7, 8), (5, 8)]
    role = [INPUT, FORWARD, FORWARD, FORWARD, BACKWARD, BACKWARD, BACKWARD, INPUT, OPTIMIZER]
    graph = make_graph(edges, role=role)
    gg = GroupGraph.from_assignment(graph, np.arange(graph.num_ops))
    position = layer_positions(gg)
    assert position[[1, 2, 3]].tolist() == [0, 1, 2]  # forward ops in topological order
    assert position[4] == 2  # reads f3 (2) and f2 (1): the latest forward op it reads
    assert position[5] == 0  # reads f1 (0) and b3 (2): a forward read decides
    assert position[6] == 0  # reads b2 (0) and x (no position yet): the earliest known input
    assert position[8] == 0  # the update sits with the gradient it applies (b2)
    assert position[7] == 1  # the weight sits with the forward op that reads it, f2, not with its update
    assert position[0] == 0  # the input with f1


def _brute_force(runs: _Runs, budget: np.ndarray) -> float:
    """Every split of the positions into contiguous runs, each on its own non-empty set of device groups."""
    size = runs.prefix_params.shape[0]
    num_device_groups = len(budget)
    best = np.inf

    def extend(start: int, used: int, total: float) -> None:
        nonlocal best
        if start == size - 1:
            best = min(best, total)
            return
        for end in range(start + 1, size):
            for mask in range(1, 1 << num_device_groups):
                if mask & used:
                    continue
                cost = runs.cost(mask, budget)[start, end]
                if np.isfinite(cost):
                    extend(end, used | mask, total + cost)

    extend(0, 0, 0.0)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_run_dp_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    graph = resolve_model("vgg19", tiny=True)
    cluster = small_cluster(1e9, machines=3, per_machine=int(rng.integers(1, 3)))
    gg = group_ops(graph, num_groups=5, gpus=cluster, seed=seed)
    persistent = rng.uniform(0, 100, gg.num_groups)
    activations = rng.uniform(0, 200, gg.num_groups)
    members = [np.flatnonzero(cluster.device_group == m) for m in range(cluster.num_device_groups)]
    runs = _Runs(gg, cluster, members, rng.permutation(gg.num_groups), persistent, activations)
    budget = rng.uniform(80, 400, cluster.num_device_groups)
    cut = _cut(runs, budget)
    expected = _brute_force(runs, budget)
    if not np.isfinite(expected):
        assert cut is None
        return
    assert cut is not None
    masks = [mask for mask, _, _ in cut]
    assert all(a & b == 0 for a, b in itertools.combinations(masks, 2))  # disjoint device groups
    assert [first for _, first, _ in cut][0] == 0 and cut[-1][2] == gg.num_groups
    assert all(cut[k][2] == cut[k + 1][1] for k in range(len(cut) - 1))  # contiguous
    assert sum(runs.cost(mask, budget)[first, end] for mask, first, end in cut) == pytest.approx(expected)


@pytest.fixture(scope="module")
def vgg_tight():
    """Four devices whose memory holds neither data parallelism nor the model on one device group."""
    graph = resolve_model("vgg19", tiny=True)
    cluster = small_cluster(350e3)
    return group_ops(graph, num_groups=12, gpus=cluster), cluster


def test_staged_plan_fits_where_data_parallelism_and_one_device_group_do_not(vgg_tight):
    gg, cluster = vgg_tight
    dp = evaluate_strategy(gg, Strategy.data_parallel(gg.num_groups, cluster), cluster, feedback=False)
    assert not dp.feasible
    for m in range(cluster.num_device_groups):
        one = np.zeros((gg.num_groups, cluster.num_device_groups), dtype=bool)
        one[:, m] = True
        alone = Strategy.from_cluster(cluster, one, np.zeros(gg.num_groups, dtype=np.int8))
        assert not evaluate_strategy(gg, alone, cluster, feedback=False).feasible
    staged = staged_strategy(gg, cluster)
    assert staged is not None
    result = evaluate_strategy(gg, staged, cluster, feedback=False)
    assert result.feasible and np.all(result.peak_memory <= result.memory_capacity)
    assert staged.placement.sum(axis=0).min() > 0  # both device groups hold a run
    persistent, _ = group_memory(gg)
    assert persistent.sum() > 0


def test_staged_is_none_when_nothing_can_fit(vgg_tight):
    gg, _ = vgg_tight
    assert staged_strategy(gg, small_cluster(20e3)) is None


def test_staged_fill_and_planner_return_a_feasible_plan(vgg_tight):
    gg, cluster = vgg_tight
    env = PlacementEnv(gg, cluster, fill="staged")
    assert env.strategy(env.root()) == staged_strategy(gg, cluster)
    assert env.evaluate(env.root()).feasible
    graph = gg.op_graph
    outcome = plan_training(graph, cluster, config=PlanConfig(num_groups=12, max_iterations=30))
    assert all(b.oom for b in outcome.baselines)
    assert outcome.result.feasible
    assert outcome.speedup_over() == {"dp-nccl": None, "dp-nccl-p": None, "horovod": None}
