"""Exact stage-to-device mapping (Parmesan §V): brute force agreement, bounds, hand cases, heuristics."""

import itertools
import math
from typing import NamedTuple

import numpy as np
import pytest

from tag.cluster import resolve_cluster
from tag.exact import _mapping_kernel as kernel
from tag.exact import mapping as mapping_module
from tag.exact.heuristics import cs_map, p2p_map, random_map
from tag.exact.mapping import (
    MappingError,
    MappingProblem,
    StageTimer,
    assignment_lower_bound,
    choose_instantiation,
    initial_lower_bound,
    max_stage_time,
    search_tables,
    solve_mapping,
    stage_times,
)

MODES = ("p2p", "allreduce")


# --------------------------------------------------------------------------------------- helpers


def random_problem(rng: np.random.Generator, num_devices: int, num_stages: int, replicas: int, *,
                   latency: bool = False, chain: bool = True, types: int = 1) -> MappingProblem:
    """A random instance: symmetric bandwidths, random times and bytes, a chain or a random stage DAG."""
    upper = np.triu(rng.uniform(1.0, 100.0, (num_devices, num_devices)), 1)
    bandwidth = upper + upper.T
    lat = None
    if latency:
        upper = np.triu(rng.uniform(0.0, 0.05, (num_devices, num_devices)), 1)
        lat = upper + upper.T
    if chain:
        edges = [(s, s + 1) for s in range(num_stages - 1)]
    else:  # any direction, some pairs twice: the bytes of a pair add up
        edges = [(a, b) if rng.random() < 0.5 else (b, a)
                 for a in range(num_stages) for b in range(a + 1, num_stages) if rng.random() < 0.6]
        edges += [edges[0][::-1]] if edges and rng.random() < 0.5 else []
    return MappingProblem(
        stage_time=rng.uniform(0.0, 2.0, (num_stages, types)),
        edge_src=[a for a, _ in edges], edge_dst=[b for _, b in edges],
        edge_bytes=rng.uniform(0.0, 100.0, len(edges)),
        param_bytes=rng.uniform(0.0, 100.0, num_stages) * (rng.random(num_stages) < 0.8),
        num_replicas=replicas, bandwidth=bandwidth, latency=lat,
        device_type=rng.integers(0, types, num_devices) if types > 1 else None,
    )


def brute_force(problem: MappingProblem, mode: str) -> float:
    """Least max stage time over every injective mapping, eqs. (6)–(9) written out independently."""
    num_stages, replicas, num_devices = problem.num_stages, problem.num_replicas, problem.num_devices
    perms = np.array(list(itertools.permutations(range(num_devices), num_stages * replicas)))
    dev = perms.reshape(len(perms), num_stages, replicas)  # [P, S, R]
    times = problem.stage_time[np.arange(num_stages)[None, :, None], problem.device_type[dev]]
    bandwidth, latency = problem.bandwidth, problem.latency
    if mode == "p2p":
        pair_bytes: dict[tuple[int, int], float] = {}
        for a, b, nbytes in zip(problem.edge_src, problem.edge_dst, problem.edge_bytes):
            key = (min(a, b), max(a, b))
            pair_bytes[key] = pair_bytes.get(key, 0.0) + nbytes
        for (a, b), nbytes in pair_bytes.items():
            if nbytes > 0:
                x, y = dev[:, a], dev[:, b]
                cost = latency[x, y] + nbytes / bandwidth[x, y]
                times[:, a] += cost
                times[:, b] += cost
    elif replicas >= 2:
        x, y = dev, np.roll(dev, -1, axis=2)
        hop = (2 * (replicas - 1) * latency[x, y]
               + 2 * (replicas - 1) / replicas * problem.param_bytes[None, :, None] / bandwidth[x, y])
        hop[:, problem.param_bytes == 0] = 0.0
        times = times + hop.max(axis=2, keepdims=True)
    return float(times.max(axis=(1, 2)).min())


def is_valid(problem: MappingProblem, mapping: np.ndarray) -> bool:
    flat = np.asarray(mapping).reshape(-1)
    return (np.asarray(mapping).shape == (problem.num_stages, problem.num_replicas)
            and len(set(flat.tolist())) == len(flat) and flat.min() >= 0 and flat.max() < problem.num_devices)


def _instances(count: int, seed: int):
    rng = np.random.default_rng(seed)
    for n in range(count):
        num_devices = int(rng.integers(2, 9))
        num_stages = int(rng.integers(1, num_devices + 1))
        replicas = int(rng.integers(1, num_devices // num_stages + 1))
        yield n, random_problem(rng, num_devices, num_stages, replicas, latency=bool(rng.random() < 0.3),
                                chain=bool(rng.random() < 0.6), types=int(rng.integers(1, 3)))


RANDOM_INSTANCES = list(_instances(60, seed=7))


# --------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("mode", MODES)
def test_exact_mapping_equals_brute_force(mode):
    shapes = set()
    for n, problem in RANDOM_INSTANCES:
        optimum = brute_force(problem, mode)
        result = solve_mapping(problem, instantiation=mode, time_limit=30.0)
        assert result.proven_optimal and result.gap == 0.0, n
        assert is_valid(problem, result.mapping), n
        assert result.max_stage_time == pytest.approx(optimum, rel=1e-12, abs=1e-15), n
        assert max_stage_time(problem, result.mapping, mode) == result.max_stage_time, n
        assert result.lower_bound == result.max_stage_time
        shapes.add((problem.num_stages, problem.num_replicas))
    assert len(shapes) >= 8  # several (S, R)


@pytest.mark.parametrize("mode", MODES)
def test_lower_bounds_never_exceed_the_optimum(mode):
    for n, problem in RANDOM_INSTANCES:
        optimum = brute_force(problem, mode)
        initial = initial_lower_bound(problem, mode)
        assignment = assignment_lower_bound(problem, mode)
        assert initial <= assignment <= optimum * (1 + 1e-12), n


def _stage_times_pair_by_pair(problem: MappingProblem, devices: np.ndarray, mode: str) -> np.ndarray:
    """stage_times as it was first written: eq. (8) added one pair at a time per stage."""
    times = problem.stage_time[np.arange(problem.num_stages)[:, None], problem.device_type[devices]].copy()
    if mode in ("p2p", "full"):
        pairs, pair_bytes = problem.stage_pairs()
        for s, neighbours in enumerate(kernel.stage_adjacency(problem.num_stages, pairs)):
            for k, other in neighbours:
                x, y = devices[s], devices[other]
                times[s] = times[s] + (problem.latency[x, y] + pair_bytes[k] / problem.bandwidth[x, y])
    if mode in ("allreduce", "full") and problem.num_replicas >= 2:
        replicas, ring_next = problem.num_replicas, np.roll(devices, -1, axis=1)
        hops = (2.0 * (replicas - 1) * problem.latency[devices, ring_next] + 2.0 * (replicas - 1) / replicas
                * problem.param_bytes[:, None] / problem.bandwidth[devices, ring_next])
        hops[problem.param_bytes == 0] = 0.0
        times = times + hops.max(axis=1, keepdims=True)
    return times


def test_stage_timer_equals_adding_pair_by_pair_bit_for_bit():
    """StageTimer's rounds (round j adds every stage's j-th pair) give the times of adding one pair at a
    time, to the last bit, on chains and on random stage graphs with hubs, every instantiation."""
    rng = np.random.default_rng(3)
    problems = [problem for _, problem in RANDOM_INSTANCES]
    problems += [random_problem(rng, 16, 8, 2, latency=True, chain=False, types=2) for _ in range(4)]
    degrees = set()
    for problem in problems:
        pairs, _ = problem.stage_pairs()
        degrees.add(max((len(a) for a in kernel.stage_adjacency(problem.num_stages, pairs)), default=0))
        for mode in ("p2p", "allreduce", "full"):
            timer = StageTimer(problem, mode)
            for _ in range(3):
                devices = rng.permutation(problem.num_devices)[:problem.num_stages * problem.num_replicas]
                devices = devices.reshape(problem.num_stages, problem.num_replicas)
                expected = _stage_times_pair_by_pair(problem, devices, mode)
                np.testing.assert_array_equal(timer.times(devices), expected)
                np.testing.assert_array_equal(stage_times(problem, devices, mode), expected)
                assert timer.max_time(devices) == max_stage_time(problem, devices, mode) == expected.max()
    assert max(degrees) >= 4  # some stage adds four or more pairs


def test_p2p_vertex_bound_puts_adjacent_stages_on_distinct_devices():
    """eq. (10) per device: the least eq. (6) time over every placement of the adjacent stages on distinct
    other devices, written out by brute force (with latency, where no sorting gives it)."""
    for n, problem in RANDOM_INSTANCES[:30]:
        tables = search_tables(problem)
        compute = problem.compute_time()
        for s, neighbours in enumerate(kernel.stage_adjacency(problem.num_stages, tables.pair_stages)):
            links = [k for k, _ in neighbours]
            for x in range(problem.num_devices):
                others = [d for d in range(problem.num_devices) if d != x]
                least = min((compute[s, x] + sum(tables.transfer[k, x, y] for k, y in zip(links, ys))
                             for ys in itertools.permutations(others, len(links))), default=math.inf)
                assert tables.p2p_bound[s, x] <= least, (n, s, x)
                assert tables.p2p_bound[s, x] == pytest.approx(least, rel=1e-12), (n, s, x)


def test_a_hub_stage_is_bound_to_a_mesh_device_with_room_for_its_neighbours():
    """Four adjacent stages one hop from a hub fit only around the centre of a 3×3 mesh (with latency,
    the independent cheapest links would allow a corner too): the bound rules out the corner, so the
    search starts at the centre and proves the bound optimal at once."""
    cluster = resolve_cluster("mesh2d:3x3")
    problem = MappingProblem.from_cluster(cluster, stage_time=[1.0, 0.0, 0.0, 0.0, 0.0], edge_src=[0, 0, 0, 0],
                                          edge_dst=[1, 2, 3, 4], edge_bytes=[1e6] * 4, param_bytes=[0.0] * 5,
                                          replicas=1)
    tables = search_tables(problem)
    centre, corner = 4, 0
    independent = tables.compute[0] + tables.transfer.min(axis=2).sum(axis=0)  # [D]
    assert independent[corner] == pytest.approx(independent[centre])
    assert tables.p2p_bound[0, corner] > tables.p2p_bound[0, centre] == pytest.approx(independent[centre])
    result = solve_mapping(problem, instantiation="p2p", time_limit=10.0)
    assert result.proven_optimal and result.mapping[0, 0] == centre
    assert result.max_stage_time == pytest.approx(assignment_lower_bound(problem, "p2p"), rel=1e-12)


def test_rings_that_only_one_hop_links_allow_are_built_first():
    """Parmesan Table III's hard mesh cell in small: on an 8×8 mesh, four stages' rings must use one-hop
    links only (8-cycles of the grid, such as 2×4 blocks, tiling it), four others may go anywhere. Every stage may use every device,
    so the search orders the rings by their allowed hops; built after the loose ones, the tight rings
    face a region no tiling fits, and the search thrashes."""
    cluster = resolve_cluster("mesh2d:8x8")
    problem = MappingProblem.from_cluster(cluster, stage_time=[0.01] * 8, edge_src=[], edge_dst=[], edge_bytes=[],
                                          param_bytes=[1e6, 2e6, 3e6, 4e6, 1e8, 1.01e8, 1.02e8, 1.03e8], replicas=8)
    result = solve_mapping(problem, instantiation="allreduce", time_limit=10.0)
    assert result.proven_optimal and result.nodes < 1000
    assert result.max_stage_time == assignment_lower_bound(problem, "allreduce")
    one_hop = cluster.bandwidth[0, 1]  # devices 0 and 1: neighbours in the first row
    tight = result.mapping[4:]
    assert (cluster.bandwidth[tight, np.roll(tight, -1, axis=1)] == one_hop).all()


@pytest.mark.parametrize("mode, search", [
    ("p2p", kernel.search_p2p_stages), ("p2p", kernel.search_p2p_chains), ("allreduce", kernel.search_allreduce),
])
def test_inner_search_decides_every_target_like_brute_force(mode, search):
    """Algorithm 2 alone, in each assignment order: FOUND exactly when the target is at least the optimum."""
    for n, problem in RANDOM_INSTANCES[:40]:
        # The optimum as the library adds it up (the brute force may differ in the last bit).
        optimum = solve_mapping(problem, instantiation=mode).max_stage_time
        assert optimum == pytest.approx(brute_force(problem, mode), rel=1e-12, abs=1e-15)
        tables = search_tables(problem)
        for target in (optimum * 0.9, math.nextafter(optimum, 0.0), optimum, optimum * 1.5):
            decision = search(tables, target, deadline=math.inf)
            assert decision.status == (kernel.FOUND if target >= optimum else kernel.INFEASIBLE), (n, target)
            if decision.status == kernel.FOUND:
                assert is_valid(problem, decision.mapping)
                assert max_stage_time(problem, decision.mapping, mode) <= target


@pytest.mark.parametrize("mode", MODES)
def test_bisection_without_a_candidate_list_is_exact_too(mode, monkeypatch):
    """Where the stage time values are too many to list, Algorithm 1 bisects the interval instead."""
    monkeypatch.setattr(mapping_module, "_CANDIDATE_LIMIT", 0)
    for n, problem in RANDOM_INSTANCES[:20]:
        result = solve_mapping(problem, instantiation=mode, time_limit=30.0)
        assert result.proven_optimal, n
        assert result.max_stage_time == pytest.approx(brute_force(problem, mode), rel=1e-12, abs=1e-15), n


def test_parallel_targets_give_the_same_answer():
    rng = np.random.default_rng(3)
    problem = random_problem(rng, 8, 3, 2, chain=False)
    for mode in MODES:
        one = solve_mapping(problem, instantiation=mode, workers=1)
        two = solve_mapping(problem, instantiation=mode, workers=2)
        assert one.proven_optimal and two.proven_optimal
        assert one.max_stage_time == two.max_stage_time == pytest.approx(brute_force(problem, mode))


# --------------------------------------------------------------------------------------- hand cases


def _three_devices() -> np.ndarray:
    """Devices 0 and 1 joined by a fast link (10), device 2 reached only slowly (1)."""
    return np.array([[0.0, 10.0, 1.0], [10.0, 0.0, 1.0], [1.0, 1.0, 0.0]])


def test_two_stages_take_the_fast_link():
    problem = MappingProblem(stage_time=[0.5, 0.25], edge_src=[0], edge_dst=[1], edge_bytes=[20.0],
                             param_bytes=[0.0, 0.0], num_replicas=1, bandwidth=_three_devices())
    result = solve_mapping(problem, instantiation="p2p")
    assert sorted(result.mapping.ravel().tolist()) == [0, 1]
    assert result.max_stage_time == pytest.approx(0.5 + 20.0 / 10.0)  # eq. (6): compute + M / B
    assert result.proven_optimal
    assert max_stage_time(problem, [[0], [2]], "p2p") == pytest.approx(0.5 + 20.0 / 1.0)


def test_two_stages_on_two_devices_either_way():
    bandwidth = np.array([[0.0, 4.0], [4.0, 0.0]])
    problem = MappingProblem(stage_time=[1.0, 3.0], edge_src=[0], edge_dst=[1], edge_bytes=[8.0],
                             param_bytes=[0.0, 0.0], num_replicas=1, bandwidth=bandwidth)
    assert stage_times(problem, [[1], [0]], "p2p").ravel().tolist() == [3.0, 5.0]
    assert solve_mapping(problem).max_stage_time == 5.0


def test_two_replicas_all_reduce_on_the_fast_pair():
    # One stage, R = 2: eq. (9) gives 2 (R−1)/R · P / B = P / B on the ring's only link.
    problem = MappingProblem(stage_time=[1.0], edge_src=[], edge_dst=[], edge_bytes=[], param_bytes=[30.0],
                             num_replicas=2, bandwidth=_three_devices())
    result = solve_mapping(problem, instantiation="allreduce")
    assert sorted(result.mapping.ravel().tolist()) == [0, 1]
    assert result.max_stage_time == pytest.approx(1.0 + 30.0 / 10.0)
    assert choose_instantiation(problem) == "allreduce"


def test_ring_of_three_is_as_slow_as_its_slowest_hop():
    # 4 devices; R = 3 ring: 2·(2/3)·P/B on the slowest hop. Best ring {0, 1, 3}: hops 8, 6, 4.
    bandwidth = np.array([[0, 8, 1, 4], [8, 0, 2, 6], [1, 2, 0, 1], [4, 6, 1, 0]], dtype=float)
    problem = MappingProblem(stage_time=[0.0], edge_src=[], edge_dst=[], edge_bytes=[], param_bytes=[12.0],
                             num_replicas=3, bandwidth=bandwidth)
    result = solve_mapping(problem)
    assert sorted(result.mapping.ravel().tolist()) == [0, 1, 3]
    assert result.max_stage_time == pytest.approx(2 * 2 / 3 * 12.0 / 4.0)
    assert result.lower_bound == result.max_stage_time


def test_stage_times_with_latency_and_per_type_compute():
    bandwidth = np.array([[0.0, 2.0, 4.0], [2.0, 0.0, 8.0], [4.0, 8.0, 0.0]])
    latency = np.array([[0.0, 0.1, 0.2], [0.1, 0.0, 0.3], [0.2, 0.3, 0.0]])
    problem = MappingProblem(stage_time=[[1.0, 2.0], [3.0, 5.0]], edge_src=[0], edge_dst=[1], edge_bytes=[8.0],
                             param_bytes=[16.0, 0.0], num_replicas=1, bandwidth=bandwidth, latency=latency,
                             device_type=[0, 1, 1])
    # stage 0 on device 1 (type 1), stage 1 on device 2 (type 1): transfer 0.3 + 8/8 = 1.3
    assert stage_times(problem, [[1], [2]], "p2p").ravel() == pytest.approx([2.0 + 1.3, 5.0 + 1.3])
    assert stage_times(problem, [[1], [2]], "allreduce").ravel() == pytest.approx([2.0, 5.0])  # R = 1: no ring
    two = MappingProblem(stage_time=[1.0], edge_src=[], edge_dst=[], edge_bytes=[], param_bytes=[16.0],
                         num_replicas=2, bandwidth=bandwidth, latency=latency)
    # ring of 2 over the link 0-2: 2·(R−1)·α + 2(R−1)/R · P/B = 0.4 + 16/4
    assert stage_times(two, [[0, 2]], "full").ravel() == pytest.approx([5.4, 5.4])


def test_instantiation_follows_the_all_reduce_to_p2p_ratio():
    base = dict(stage_time=[1.0, 1.0], edge_src=[0], edge_dst=[1], num_replicas=2, bandwidth=np.ones((4, 4)))
    # all-reduce bytes: 2 (R−1)/R · ΣP = ΣP for R = 2
    assert choose_instantiation(MappingProblem(edge_bytes=[10.0], param_bytes=[3.0, 3.0], **base)) == "p2p"
    assert choose_instantiation(MappingProblem(edge_bytes=[10.0], param_bytes=[6.0, 6.0], **base)) == "allreduce"
    single = dict(base, num_replicas=1)
    assert choose_instantiation(MappingProblem(edge_bytes=[1.0], param_bytes=[50.0, 50.0], **single)) == "p2p"


# --------------------------------------------------------------------------------------- heuristics


def test_heuristics_give_valid_mappings():
    rng = np.random.default_rng(11)
    for _ in range(30):
        num_devices = int(rng.integers(2, 20))
        num_stages = int(rng.integers(1, num_devices + 1))
        replicas = int(rng.integers(1, num_devices // num_stages + 1))
        problem = random_problem(rng, num_devices, num_stages, replicas, chain=bool(rng.random() < 0.5))
        for mapping in (cs_map(problem), p2p_map(problem), random_map(problem, rng)):
            assert is_valid(problem, mapping)


def test_cs_map_is_stage_major_and_p2p_map_replica_major_on_two_level():
    cluster = resolve_cluster("two-level")  # 4 machines × 4 GPUs
    problem = MappingProblem.from_cluster(cluster, stage_time=[1.0] * 4, edge_src=[0, 1, 2], edge_dst=[1, 2, 3],
                                          edge_bytes=[1e9] * 3, param_bytes=[1e8] * 4, replicas=4)
    assert cs_map(problem).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert p2p_map(problem).tolist() == np.arange(16).reshape(4, 4).T.tolist()  # a chain fills a machine
    single = MappingProblem.from_cluster(cluster, stage_time=[1.0] * 4, edge_src=[0, 1, 2], edge_dst=[1, 2, 3],
                                         edge_bytes=[1e9] * 3, param_bytes=[1e8] * 4, replicas=1)
    assert p2p_map(single).tolist() == cs_map(single).tolist()  # Parmesan: identical when R = 1


# --------------------------------------------------------------------------------------- topologies, limits


class _StageGraph(NamedTuple):
    stage_time: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_bytes: np.ndarray
    param_bytes: np.ndarray
    memory_bytes: np.ndarray


def _stage_graph(num_stages: int, rng: np.random.Generator) -> _StageGraph:
    return _StageGraph(stage_time=rng.uniform(0.05, 0.1, num_stages), edge_src=np.arange(num_stages - 1),
                       edge_dst=np.arange(1, num_stages), edge_bytes=rng.uniform(1e8, 5e8, num_stages - 1),
                       param_bytes=rng.uniform(1e7, 4e8, num_stages), memory_bytes=np.zeros(num_stages))


@pytest.mark.parametrize("address, shape", [
    ("two-level", (4, 4)), ("dgx1x4", (4, 8)), ("mesh2d:4x4", (4, 4)), ("torus2d:4x4", (2, 8)),
    ("random-blk-1:16,seed=1", (4, 4)), ("random-blk-2:16,seed=3", (4, 4)), ("uniform-dist:16,seed=1", (4, 4)),
])
@pytest.mark.parametrize("mode", MODES)
def test_presets_solve_and_beat_or_match_the_heuristics(address, shape, mode):
    cluster = resolve_cluster(address)
    problem = MappingProblem.from_stage_graph(_stage_graph(shape[0], np.random.default_rng(5)), shape[1], cluster)
    assert problem.num_devices == cluster.num_devices
    result = solve_mapping(problem, instantiation=mode, time_limit=5.0)
    assert is_valid(problem, result.mapping)
    assert result.lower_bound <= result.max_stage_time
    for heuristic in (cs_map, p2p_map):
        assert result.max_stage_time <= max_stage_time(problem, heuristic(problem), mode)
    if result.proven_optimal:
        assert result.lower_bound == result.max_stage_time and result.gap == 0.0


def test_from_stage_graph_counts_gradients_and_reads_per_type_times():
    cluster = resolve_cluster("tag-testbed")  # v100-32gb, 1080ti, p100
    graph = _stage_graph(2, np.random.default_rng(0))
    problem = MappingProblem.from_stage_graph(graph, 2, cluster)
    assert problem.edge_bytes == pytest.approx(2 * graph.edge_bytes)  # activations forward, gradients back
    assert problem.stage_time.shape == (2, 1)  # no per-type times given: one time everywhere
    assert MappingProblem.from_stage_graph(graph, 2, cluster, transfers_per_edge=1.0).edge_bytes == \
        pytest.approx(graph.edge_bytes)

    class Typed(NamedTuple):  # a partitioner's StageGraph also times each stage on each GPU type
        stage_time: np.ndarray
        edge_src: np.ndarray
        edge_dst: np.ndarray
        edge_bytes: np.ndarray
        param_bytes: np.ndarray
        forward_time: np.ndarray
        backward_time: np.ndarray
        gpu_types: tuple

    names = ("p100", "1080ti", "v100-32gb", "t4")
    forward = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    typed = Typed(graph.stage_time, graph.edge_src, graph.edge_dst, graph.edge_bytes, graph.param_bytes,
                  forward, 0.5 * forward, names)
    problem = MappingProblem.from_stage_graph(typed, 2, cluster)
    compute = problem.compute_time()  # [S, D]
    for d in range(cluster.num_devices):
        assert compute[:, d] == pytest.approx(1.5 * forward[:, names.index(cluster.gpu(d).name)])


def test_twins_are_machines_of_a_hierarchy():
    tables = search_tables(MappingProblem.from_stage_graph(_stage_graph(4, np.random.default_rng(0)), 4,
                                                           resolve_cluster("two-level")))
    assert tables.twin_class.tolist() == [0] * 4 + [4] * 4 + [8] * 4 + [12] * 4


def test_time_limit_reports_the_best_mapping_and_the_proven_gap():
    # 64 devices in random nodes with a slow network: far from solved in a fraction of a second.
    cluster = resolve_cluster("random-blk-1:64,seed=0")
    problem = MappingProblem.from_stage_graph(_stage_graph(8, np.random.default_rng(1)), 8, cluster)
    result = solve_mapping(problem, instantiation="p2p", time_limit=0.3)
    assert not result.proven_optimal
    assert result.solve_time_s < 2.0
    assert is_valid(problem, result.mapping)
    assert result.max_stage_time == max_stage_time(problem, result.mapping, "p2p")
    assert assignment_lower_bound(problem, "p2p") <= result.lower_bound < result.max_stage_time
    assert result.gap == pytest.approx((result.max_stage_time - result.lower_bound) / result.max_stage_time)
    assert result.gap > 0


def test_no_time_for_a_search_still_returns_the_heuristic_and_bound():
    rng = np.random.default_rng(2)
    problem = random_problem(rng, 12, 3, 4)
    result = solve_mapping(problem, instantiation="allreduce", time_limit=1e-9)
    assert result.searches == 0
    assert result.lower_bound == assignment_lower_bound(problem, "allreduce")
    assert result.gap == pytest.approx((result.max_stage_time - result.lower_bound) / result.max_stage_time)


# --------------------------------------------------------------------------------------- bad input


def test_bad_problems_name_the_field():
    ok = dict(stage_time=[1.0, 1.0], edge_src=[0], edge_dst=[1], edge_bytes=[1.0], param_bytes=[1.0, 1.0],
              num_replicas=2, bandwidth=np.ones((4, 4)))
    with pytest.raises(MappingError, match="need 6 devices"):
        MappingProblem(**dict(ok, num_replicas=3))
    with pytest.raises(MappingError, match="edge_dst"):
        MappingProblem(**dict(ok, edge_dst=[5]))
    with pytest.raises(MappingError, match="bandwidth"):
        MappingProblem(**dict(ok, bandwidth=np.array([[1, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1.0]])))
    with pytest.raises(MappingError, match="param_bytes"):
        MappingProblem(**dict(ok, param_bytes=[1.0, -1.0]))
    with pytest.raises(MappingError, match="to itself"):
        MappingProblem(**dict(ok, edge_dst=[0]))
    with pytest.raises(MappingError, match="lacks field"):
        MappingProblem.from_stage_graph(object(), 1, resolve_cluster("two-level"))
    problem = MappingProblem(**ok)
    with pytest.raises(MappingError, match="more than once"):
        stage_times(problem, [[0, 1], [1, 2]])
    with pytest.raises(MappingError, match="shape"):
        stage_times(problem, [[0, 1, 2]])
    with pytest.raises(MappingError, match="instantiation"):
        solve_mapping(problem, instantiation="ring")
