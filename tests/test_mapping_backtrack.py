"""The learned mapper's backtracking search (tag.policy.mapping.backtrack) and its bisection over targets
(tag.planners.learned_mapper._backtrack_pass): against brute force on small problems, and by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_mapping import brute_force, random_problem

from tag.exact.mapping import ALLREDUCE, P2P, max_stage_time
from tag.planners.learned_mapper import _backtrack_pass, _threshold_pass, learned_mapping
from tag.policy.mapping import MappingDecoder, MappingInstance, MappingPolicy, MappingPolicyConfig, search_order
from tag.policy.mapping.backtrack import _components, _ring_closes, _rings_fit, backtrack, limited_discrepancy
from tag.search import MappingEnv

SMALL = MappingPolicyConfig(hidden=16, heads=2, num_layers=2)


def _small_problems(count: int, seed: int):
    """Random problems of 4–7 devices with rings of 2–3 replicas (every stage with parameters) or chains."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        devices = int(rng.integers(4, 8))
        stages = int(rng.integers(1, 3))
        replicas = int(rng.integers(2, devices // stages + 1))
        problem = random_problem(rng, devices, stages, replicas, latency=bool(rng.random() < 0.3),
                                 types=int(rng.integers(1, 3)))
        yield problem, (ALLREDUCE if rng.random() < 0.6 else P2P), int(rng.integers(1000))


def _search(problem, mode, policy_seed):
    torch.manual_seed(policy_seed)
    policy = MappingPolicy(SMALL)
    decoder = MappingDecoder(policy, MappingInstance.build(problem, mode, *search_order(problem)))
    env = MappingEnv(problem, instantiation=mode, fill=decoder.complete)
    return decoder, env


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("order", ["dfs", "lds"])
def test_backtracking_finds_a_map_within_the_optimum_and_proves_none_below(seed, order):
    """Unlimited dives and width: under the brute-force optimum either order finds a map no slower (it
    is complete); just below it, it searches the whole tree and finds none (its pruning never cuts a
    feasible map)."""
    for problem, mode, policy_seed in _small_problems(5, seed):
        optimum = brute_force(problem, mode)
        decoder, env = _search(problem, mode, policy_seed)
        evaluate = lambda devices: env.evaluate(tuple(devices)).time  # noqa: E731
        search = backtrack if order == "dfs" else (
            lambda *args, **kw: limited_discrepancy(*args, width=problem.num_devices, **kw))
        found = search(decoder, optimum * (1 + 1e-9), evaluate, dives=10 ** 6)
        assert found.devices is not None and found.time <= optimum * (1 + 1e-9) and not found.exhausted
        assert sorted(set(found.devices)) == sorted(found.devices)  # a device at most once
        below = search(decoder, optimum * (1 - 1e-6), evaluate, dives=10 ** 6)
        assert below.exhausted and (below.devices is None or below.time >= optimum * (1 - 1e-12))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("order", ["dfs", "lds"])
def test_a_search_cut_short_by_its_dives_never_claims_exhaustion(seed, order):
    """A few dives (1, 2, 3, 5) under bounds at, just above and just below the brute-force optimum:
    ``exhausted`` only when the bound is below the optimum (no map within it) and the same search with
    unlimited dives also ends exhausted after no more dives than the budget."""
    for problem, mode, policy_seed in _small_problems(5, seed):
        optimum = brute_force(problem, mode)
        decoder, env = _search(problem, mode, policy_seed)
        evaluate = lambda devices: env.evaluate(tuple(devices)).time  # noqa: E731
        search = backtrack if order == "dfs" else (
            lambda *args, **kw: limited_discrepancy(*args, width=problem.num_devices, **kw))
        for bound in (optimum * (1 - 1e-6), optimum * (1 + 1e-9), optimum * 1.5):
            full = search(decoder, bound, evaluate, dives=10 ** 6)
            for dives in (1, 2, 3, 5):
                cut = search(decoder, bound, evaluate, dives=dives)
                assert cut.dives <= dives
                if cut.exhausted:
                    assert bound < optimum and (cut.devices is None or cut.time > bound)
                    assert full.exhausted and full.dives <= dives, (dives, full.dives)
                if bound >= optimum:
                    assert not cut.exhausted
    # a deadline already past stops before any dive: nothing tried, nothing proved
    result = limited_discrepancy(decoder, optimum * (1 - 1e-6), evaluate, dives=10 ** 6, deadline=0.0)
    assert result.dives == 0 and not result.exhausted


def test_limited_discrepancy_tries_one_discrepancy_before_two():
    """Below the optimum (nothing to find), the search dives from the empty prefix for zero
    discrepancies, then again and from each slot of that dive with its next device (width 2: one per
    slot, earlier slots first) for one, and only then from the empty prefix for two."""
    problem = random_problem(np.random.default_rng(3), 8, 2, 4)
    decoder, env = _search(problem, ALLREDUCE, 0)
    bound = brute_force(problem, ALLREDUCE) * (1 - 1e-6)
    dives = []
    original = decoder.dive
    decoder.dive = lambda devices, bound: dives.append((list(devices), original(devices, bound=bound))) or dives[-1][1]
    limited_discrepancy(decoder, bound, lambda devices: env.evaluate(tuple(devices)).time, dives=200, width=2)
    prefixes = [prefix for prefix, _ in dives]
    assert prefixes[0] == prefixes[1] == [] and [] in prefixes[2:]
    root = dives[0][1][0]  # the devices the first dive decided
    level_one = prefixes[2:prefixes.index([], 2)]
    assert level_one and all(p[:-1] == root[:len(p) - 1] and p[-1] != root[len(p) - 1] for p in level_one)
    assert [len(p) for p in level_one] == sorted({len(p) for p in level_one})  # one device per slot, in order


@pytest.mark.parametrize("seed", range(3))
def test_backtrack_pass_never_loses_and_reaches_the_optimum_with_dives_enough(seed):
    """From the threshold pass's leaf, the bisection keeps a valid map no slower than it, within
    (1 − resolution)^-2 of the brute-force optimum when every target is searched to the end, and never
    runs more dives than its budget."""
    from tag.planners.learned_mapper import BACKTRACK_RESOLUTION

    for problem, mode, policy_seed in _small_problems(5, 10 + seed):
        optimum = brute_force(problem, mode)
        decoder, env = _search(problem, mode, policy_seed)
        greedy = env.evaluate(env.root())
        start = _threshold_pass(env, decoder, greedy, 0.5 * optimum, np.inf)
        best = _backtrack_pass(env, decoder, start, 0.5 * optimum, np.inf, 10 ** 6)
        assert optimum * (1 - 1e-12) <= best.time <= start.time <= greedy.time
        assert best.time <= optimum / (1 - BACKTRACK_RESOLUTION) ** 2 * (1 + 1e-12)
        dives = []
        original = decoder.dive
        decoder.dive = lambda devices, bound: dives.append(bound) or original(devices, bound=bound)
        _backtrack_pass(env, decoder, greedy, 0.5 * optimum, np.inf, 7)
        assert len(dives) <= 7


@pytest.mark.parametrize("mode", [P2P, ALLREDUCE])
def test_learned_mapper_with_backtracking_is_valid_and_no_worse_than_without(mode):
    for problem, _, policy_seed in _small_problems(6, 20):
        torch.manual_seed(policy_seed)
        policy = MappingPolicy(SMALL)
        plain = learned_mapping(problem, policy, instantiation=mode, iterations=0, discrepancies=0, backtrack_dives=0)
        searched = learned_mapping(problem, policy, instantiation=mode, iterations=0, discrepancies=0)
        flat = searched.reshape(-1).tolist()
        assert searched.shape == (problem.num_stages, problem.num_replicas) and len(set(flat)) == len(flat)
        assert brute_force(problem, mode) * (1 - 1e-12) <= max_stage_time(problem, searched, mode) \
            <= max_stage_time(problem, plain, mode) * (1 + 1e-12)


def _graph(count: int, edges: list[tuple[int, int]]) -> np.ndarray:
    adjacent = np.zeros((count, count), dtype=bool)
    for a, b in edges:
        adjacent[a, b] = adjacent[b, a] = True
    return adjacent


def test_components_and_colours_by_hand():
    # a path 0-1-2 (bipartite), a triangle 3-4-5 (not), a lone 6
    label, colour, bipartite = _components(_graph(7, [(0, 1), (1, 2), (3, 4), (4, 5), (3, 5)]))
    assert label.tolist() == [0, 0, 0, 1, 1, 1, 2] and bipartite.tolist() == [True, False, True]
    assert colour[[0, 1, 2]].tolist() == [0, 1, 0]


def test_rings_fit_counts_devices_and_colours_by_hand():
    free = np.ones(8, dtype=bool)
    square = [(0, 1), (1, 2), (2, 3), (3, 0)]
    two_squares = _graph(8, square + [(a + 4, b + 4) for a, b in square])
    assert _rings_fit(two_squares, free, 4, 2) and not _rings_fit(two_squares, free, 4, 3)
    assert not _rings_fit(two_squares, free, 3, 1)  # a bipartite graph has no odd cycle
    star = _graph(8, [(0, 1), (0, 2), (0, 3)])  # one centre of one colour, three leaves of the other
    assert not _rings_fit(star, free, 4, 1)
    path = _graph(8, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7)])  # colours 4 and 4
    assert _rings_fit(path, free, 4, 2) and not _rings_fit(path, free, 6, 2)


def test_an_open_ring_closes_only_through_enough_free_devices_of_alternating_colours():
    ring = _graph(6, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)])  # a path, bipartite
    free = np.array([False, True, True, True, True, False])  # 0 first, 5 last: 1..4 free
    assert _ring_closes(ring, free, 0, 5, 4)  # 5-4-3-2-1-0
    assert not _ring_closes(ring, free, 0, 5, 3)  # the colours of a path of three do not fit
    assert not _ring_closes(ring, free, 0, 5, 5)  # not enough free devices
    free[2] = False
    assert not _ring_closes(ring, free, 0, 5, 2)  # 5-4-3 and 1-0 do not meet


def test_a_width_below_one_is_refused():
    from tag.policy.errors import PolicyError

    problem = random_problem(np.random.default_rng(1), 6, 2, 3)
    decoder, env = _search(problem, ALLREDUCE, 0)
    for search in (backtrack, limited_discrepancy):
        with pytest.raises(PolicyError, match="width"):
            search(decoder, 1.0, lambda devices: 0.0, dives=5, width=0)
