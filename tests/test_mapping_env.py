"""The mapping environment (tag.search.mapping_env): the shared MCTS places stage replicas on devices."""

import numpy as np
import pytest

from tag.exact.heuristics import cs_map
from tag.exact.mapping import assignment_lower_bound, choose_instantiation, max_stage_time
from tag.search import SearchError, mcts_search
from tag.search.mapping_env import MappingEnv, uniform_mapping_evaluator

from test_mapping import brute_force, random_problem


def test_root_fill_is_the_cs_map_and_values_are_bound_over_time():
    problem = random_problem(np.random.default_rng(0), 6, 3, 2)
    env = MappingEnv(problem)
    mode = choose_instantiation(problem)
    assert np.array_equal(env.mapping(env.root()), cs_map(problem))
    assert env.reference_time == max_stage_time(problem, cs_map(problem), mode)
    bound = assignment_lower_bound(problem, mode)
    leaf = env.evaluate(env.root())
    assert leaf.value == pytest.approx(bound / leaf.time) and 0 < leaf.value <= 1
    assert leaf.feasible


def test_slots_follow_stages_and_the_fill_takes_free_devices_in_order():
    problem = random_problem(np.random.default_rng(1), 7, 3, 2)
    env = MappingEnv(problem)
    assert sorted(env.slot_stage.tolist()) == [0, 0, 1, 1, 2, 2]
    assert env.slot_replica.tolist() == [0, 1, 0, 1, 0, 1]
    state = env.step(env.step(env.root(), 5), 2)  # slot 0 → device 5, slot 1 → device 2
    mapping = env.mapping(state)
    first = env.slot_stage[0]
    assert mapping[first].tolist() == [5, 2]
    rest = [mapping[s, r] for s, r in zip(env.slot_stage[2:], env.slot_replica[2:])]
    assert rest == [0, 1, 3, 4]  # the free devices, ascending
    valid = env.valid_actions(state)
    assert valid.tolist() == [True, True, False, True, True, False, True]
    with pytest.raises(SearchError, match="not free"):
        env.step(state, 5)
    observation = env.observe(state)
    assert observation.next_slot == 2 and observation.assigned[:2].tolist() == [5, 2]
    assert uniform_mapping_evaluator(observation).sum() == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(8))
def test_mcts_finds_the_optimum_of_small_instances(seed):
    rng = np.random.default_rng(100 + seed)
    num_devices = int(rng.integers(3, 6))
    num_stages = int(rng.integers(1, 3))
    replicas = int(rng.integers(1, num_devices // num_stages + 1))
    problem = random_problem(rng, num_devices, num_stages, replicas, chain=bool(seed % 2))
    env = MappingEnv(problem)
    result = mcts_search(env, uniform_mapping_evaluator, max_iterations=400, seed=seed)
    optimum = brute_force(problem, env.instantiation)
    assert result.best_time == pytest.approx(optimum, rel=1e-12)
    assert result.best_time <= env.reference_time  # never worse than the CS map it starts from


def test_mcts_mapper_places_a_pipeline_and_reports_its_bound():
    from tag.cluster import resolve_cluster
    from tag.exact import plan_pipeline
    from tag.planners.mappers import make_mapper
    from tag.graph.resolve import resolve_model

    graph = resolve_model("vgg19", tiny=True)
    cluster = resolve_cluster("tag-testbed")
    plan = plan_pipeline(graph, cluster, stages=2, replicas=2, mapper=make_mapper("mcts", mcts_iterations=200))
    devices = sorted(d for row in plan.mapping for d in row)
    assert len(devices) == 4 and len(set(devices)) == 4
    assert plan.lower_bound is not None and plan.lower_bound <= plan.max_stage_time * (1 + 1e-12)
    exact = plan_pipeline(graph, cluster, stages=2, replicas=2, mapper=make_mapper("exact", time_limit=30))
    assert exact.proven_optimal and exact.max_stage_time <= plan.max_stage_time * (1 + 1e-12)


def test_mcts_early_stops_on_a_value_or_after_patience():
    """stop_value: no iteration runs once the best value (the CS map's, at the start) reaches it;
    patience: the search ends that many iterations after its last improvement; without them it spends
    its whole budget, and passing None changes nothing."""
    problem = random_problem(np.random.default_rng(3), 8, 2, 3)
    env = MappingEnv(problem)
    plain = mcts_search(env, uniform_mapping_evaluator, max_iterations=60, seed=1)
    same = mcts_search(MappingEnv(problem), uniform_mapping_evaluator, max_iterations=60, seed=1, stop_value=None,
                       patience=None)
    assert plain.num_iterations == same.num_iterations == 60 and np.array_equal(plain.best, same.best)
    stopped = mcts_search(MappingEnv(problem), uniform_mapping_evaluator, max_iterations=60, seed=1,
                          stop_value=env.baseline().value)
    assert stopped.num_iterations == 0
    patient = mcts_search(MappingEnv(problem), uniform_mapping_evaluator, max_iterations=60, seed=1, patience=3)
    assert patient.num_iterations == patient.history[-1].iteration + 3 < 60
    assert [p.iteration for p in patient.history] == [p.iteration for p in plain.history][:len(patient.history)]
    for bad in ({"patience": 0}, {"patience": 1.5}, {"stop_value": float("nan")}):
        with pytest.raises(ValueError):
            mcts_search(MappingEnv(problem), uniform_mapping_evaluator, max_iterations=5, **bad)
