import dataclasses
import gc
import math
from types import SimpleNamespace

import numpy as np
import pytest

from tag.cluster import Machine, build_cluster, gpu_type, resolve_cluster
from tag.graph.resolve import resolve_model
from tag.grouping import group_ops
from tag.search import (
    DP_NCCL,
    NO_PARENT,
    OOM_REWARD,
    ROOT,
    SINGLE_DEVICE_COMPUTE,
    UNVISITED,
    LeafEvaluation,
    PlacementEnv,
    PlacementState,
    SearchError,
    Tree,
    acceptance_probability,
    backup,
    expand,
    frozen_gc,
    metropolis_step,
    mcmc_search,
    mcts_search,
    placement_candidates,
    propose,
    puct_scores,
    select,
    select_action,
    uniform_batch_evaluator,
    uniform_evaluator,
)
from tag.strategy import ALLREDUCE, Strategy, candidate_actions, restricted_actions

# --------------------------------------------------------------------------------------- a toy environment


class SequenceEnv:
    """L levels of A actions; the plan is a sequence, undecided places filled with the first decision
    (0 at the root). Time = 1 + mismatches with ``target``; sequences containing ``oom_action`` do not fit;
    ``invalid`` actions are masked."""

    def __init__(self, target, num_actions, *, invalid=(), oom_action=None):
        self.target = tuple(target)
        self.A = num_actions
        self.invalid = set(invalid)
        self.oom_action = oom_action
        self.num_simulations = 0
        self.seen = set()
        self.reference_time = self._time(self.fill(()))
        self.reference_name = "zeros"

    def fill(self, state):
        head = state[0] if state else 0
        return tuple(state) + (head,) * (len(self.target) - len(state))

    def _time(self, plan):
        return 1.0 + sum(a != b for a, b in zip(plan, self.target))

    def root(self):
        return ()

    def num_actions(self, state):
        return self.A if len(state) < len(self.target) else 0

    def valid_actions(self, state):
        return np.array([a not in self.invalid for a in range(self.num_actions(state))], dtype=bool)

    def step(self, state, action):
        return state + (action,)

    def score(self, plan):
        if plan not in self.seen:
            self.seen.add(plan)
            self.num_simulations += 1
        time = self._time(plan)
        feasible = self.oom_action not in plan
        value = self.reference_time / time - 1 if feasible else OOM_REWARD
        return LeafEvaluation(value, plan, time, feasible)

    def evaluate(self, state):
        return self.score(self.fill(state))

    def observe(self, state):
        # what the uniform evaluators read of a state: its candidate options
        return SimpleNamespace(state=state, options=np.zeros(self.num_actions(state), np.int8))

    def baseline(self):
        return self.score(self.fill(()))


# --------------------------------------------------------------------------------------- PUCT and the tree


def test_puct_scores_follow_the_equation():
    q = np.array([0.5, 0.9, 0.0])
    prior = np.array([0.5, 0.3, 0.2])
    visits = np.array([2, 1, 0])
    root3 = math.sqrt(3)
    expected = [0.5 + 0.5 * root3 / 3, 0.9 + 0.3 * root3 / 2, 0.0 + 0.2 * root3 / 1]
    np.testing.assert_allclose(puct_scores(q, prior, visits, c=1.0), expected)


def hand_tree():
    """Root with three actions (priors .5 .3 .2): a0 visited twice (values .4, .6), a1 once (.9), a2 never.
    The root's own evaluation was .4, so root: N = 4, value sum 2.3, Q = .575. Values seen span [.4, .9]."""
    tree = Tree.empty("root")
    expand(tree, ROOT, np.array([0.5, 0.3, 0.2]), np.ones(3, bool))
    a0 = tree.add_node(ROOT, 0, "a0")
    a1 = tree.add_node(ROOT, 1, "a1")
    for node, value in ((ROOT, 0.4), (a0, 0.4), (a0, 0.6), (a1, 0.9)):
        backup(tree, node, value)
    return tree, a0, a1


def test_hand_built_tree_counts():
    tree, a0, a1 = hand_tree()
    assert tree.visits[:3].tolist() == [4, 2, 1]
    np.testing.assert_allclose(tree.value_sum[:3], [2.3, 1.0, 0.9])
    assert (tree.min_value, tree.max_value) == (0.4, 0.9)
    assert tree.child[tree.edges(ROOT)].tolist() == [a0, a1, UNVISITED]
    assert tree.child_visits(ROOT).tolist() == [2, 1, 0]


@pytest.mark.parametrize("c, expected", [(0.5, 1), (1.0, 1), (10.0, 2)])
def test_select_action_picks_the_highest_puct_score(c, expected):
    # Q normalised by min .4, max .9: a0 mean .5 -> .2; a1 mean .9 -> 1; a2 unvisited takes the root's
    # mean .575 -> .35. sqrt(sum N) = sqrt(3).
    tree, _, _ = hand_tree()
    root3 = math.sqrt(3)
    u = [0.2 + c * 0.5 * root3 / 3, 1.0 + c * 0.3 * root3 / 2, 0.35 + c * 0.2 * root3]
    assert int(np.argmax(u)) == expected  # c=.5: (.34, 1.13, .52); c=1: (.49, 1.26, .70); c=10: (3.09, 3.60, 3.81)
    assert select_action(tree, ROOT, c=c, rng=np.random.default_rng(0)) == expected


def test_first_play_reduction_lowers_unvisited_children():
    tree, _, _ = hand_tree()
    # c=10 picks the unvisited a2 (3.81 against 3.60); valued at .35 - 1 it scores 2.81 and a1 wins.
    assert select_action(tree, ROOT, c=10.0, rng=np.random.default_rng(0), fpu_reduction=1.0) == 1


def test_select_masks_invalid_and_exhausted_actions():
    tree, a0, a1 = hand_tree()
    tree.valid[tree.edge(ROOT, 1)] = False
    assert select_action(tree, ROOT, c=1.0, rng=np.random.default_rng(0)) == 2
    tree.exhausted[a0] = True
    tree.valid[tree.edge(ROOT, 2)] = False
    assert select_action(tree, ROOT, c=1.0, rng=np.random.default_rng(0)) == -1


def test_fresh_vertex_goes_to_the_largest_prior():
    tree = Tree.empty(())
    expand(tree, ROOT, np.array([0.1, 0.6, 0.3]), np.ones(3, bool))
    backup(tree, ROOT, 0.0)
    assert select_action(tree, ROOT, c=1.0, rng=np.random.default_rng(0)) == 1


def test_select_creates_the_child_it_reaches():
    env = SequenceEnv((1, 2), 3)
    tree = Tree.empty(env.root())
    expand(tree, ROOT, np.array([0.2, 0.5, 0.3]), np.ones(3, bool))
    backup(tree, ROOT, 0.0)
    leaf = select(tree, env, c=1.0, rng=np.random.default_rng(0))
    assert leaf == 1 and tree.states[leaf] == (1,) and tree.parent[leaf] == ROOT and tree.depth[leaf] == 1
    assert tree.child[tree.edge(ROOT, 1)] == leaf and not tree.expanded(leaf)


def test_backup_adds_along_the_path_only():
    tree = Tree.empty("r")
    expand(tree, ROOT, np.full(2, 0.5), np.ones(2, bool))
    a = tree.add_node(ROOT, 0, "a")
    b = tree.add_node(ROOT, 1, "b")
    expand(tree, a, np.full(2, 0.5), np.ones(2, bool))
    aa = tree.add_node(a, 1, "aa")
    backup(tree, aa, 0.7)
    backup(tree, aa, -1.0)
    backup(tree, a, 0.25)
    assert tree.path(aa) == [ROOT, a, aa] and tree.actions_to(aa) == [0, 1]
    assert tree.parent[ROOT] == NO_PARENT
    assert tree.visits[[ROOT, a, b, aa]].tolist() == [3, 3, 0, 2]
    np.testing.assert_allclose(tree.value_sum[[ROOT, a, b, aa]], [-0.05, -0.05, 0.0, -0.3])
    assert (tree.min_value, tree.max_value) == (-1.0, 0.7)
    assert tree.mean_value(aa) == pytest.approx(-0.15)


def test_expand_masks_and_renormalises_priors():
    tree = Tree.empty(())
    expand(tree, ROOT, np.array([0.5, 0.25, 0.25]), np.array([True, False, True]))
    np.testing.assert_allclose(tree.prior[tree.edges(ROOT)], [2 / 3, 0, 1 / 3])
    tree = Tree.empty(())
    expand(tree, ROOT, np.array([0.0, 1.0, 0.0]), np.array([True, False, True]))  # no mass on valid actions
    np.testing.assert_allclose(tree.prior[tree.edges(ROOT)], [0.5, 0, 0.5])
    with pytest.raises(SearchError, match="3 candidate actions"):
        expand(Tree.empty(()), ROOT, np.ones(2) / 2, np.ones(3, bool))
    with pytest.raises(SearchError, match="non-negative"):
        expand(Tree.empty(()), ROOT, np.array([-0.5, 1.5]), np.ones(2, bool))


def test_tree_grows_past_its_initial_capacity():
    tree = Tree.empty(0)
    expand(tree, ROOT, np.full(3000, 1 / 3000), np.ones(3000, bool))
    for a in range(200):
        tree.add_node(ROOT, a, a)
    assert tree.num_nodes == 201 and tree.num_edge_slots == 3000
    assert tree.child[tree.edges(ROOT)][:200].tolist() == list(range(1, 201))


# --------------------------------------------------------------------------------------- MCTS on the toy


def test_mcts_finds_the_known_optimum():
    env = SequenceEnv((3, 1, 4, 1, 5), 6)  # 6^5 = 7776 complete plans
    result = mcts_search(env, uniform_evaluator, max_iterations=400, seed=1, target_visits=None)
    assert result.best == (3, 1, 4, 1, 5) and result.best_time == 1.0
    assert result.best_speedup == pytest.approx(env.reference_time)
    assert result.num_iterations <= 400 and result.first_beat_iteration is not None


def test_mcts_never_selects_invalid_actions_and_explores_a_small_tree_fully():
    env = SequenceEnv((1, 0, 1), 3, invalid={2})  # 2^3 = 8 complete plans, 1 + 2 + 4 + 8 vertices
    result = mcts_search(env, uniform_evaluator, max_iterations=1000, target_visits=1)
    tree = result.tree
    assert tree.num_nodes == 15 and result.num_iterations == 15 and tree.exhausted[ROOT]
    assert 2 not in tree.action[: tree.num_nodes]
    assert result.best == (1, 0, 1)
    # every terminal vertex once; every other vertex: its own evaluation plus its children's visits
    for node in range(tree.num_nodes):
        expected = 1 + tree.child_visits(node).sum()
        assert tree.visits[node] == expected


def test_oom_plans_are_never_returned_when_a_feasible_one_was_simulated():
    # The target itself contains the OOM action: the fastest plan does not fit.
    env = SequenceEnv((2, 2, 1), 3, oom_action=2)
    result = mcts_search(env, uniform_evaluator, max_iterations=1000)
    assert result.best_feasible and 2 not in result.best
    assert result.best_time == 3.0  # without action 2, places 0 and 1 always mismatch
    assert min(env._time(plan) for plan in env.seen) < 3.0  # faster OOM plans were simulated


def test_mcts_batched_with_virtual_loss():
    env = SequenceEnv((3, 1, 4, 1, 5), 6)
    calls = []

    def batch(states):
        calls.append(len(states))
        return uniform_batch_evaluator(states)

    result = mcts_search(env, batch_evaluator=batch, batch_size=4, max_iterations=400, seed=0, target_visits=None)
    assert result.best == (3, 1, 4, 1, 5)
    assert max(calls) > 1 and result.num_iterations == 400
    tree = result.tree
    assert tree.visits[ROOT] == 400  # every virtual loss was taken back
    for node in range(tree.num_nodes):
        assert tree.visits[node] == 1 + tree.child_visits(node).sum()


def test_frozen_gc_freezes_for_the_search_and_hands_back():
    """The search runs with the objects alive at its start frozen, and leaves nothing frozen behind; a freeze
    held outside is left alone."""
    assert gc.get_freeze_count() == 0
    seen = []

    class Watching(SequenceEnv):
        def evaluate(self, state):
            seen.append(gc.get_freeze_count())
            return super().evaluate(state)

    mcts_search(Watching((1, 0, 1), 2), max_iterations=5)
    assert min(seen) > 0 and gc.get_freeze_count() == 0
    with frozen_gc():
        outer = gc.get_freeze_count()
        assert outer > 0
        with frozen_gc():
            pass
        assert gc.get_freeze_count() == outer
        real, gc.get_freeze_count = gc.get_freeze_count, None  # nested, it must not walk the frozen objects
        try:
            with frozen_gc():
                pass
        finally:
            gc.get_freeze_count = real
        assert gc.get_freeze_count() == outer
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        held = gc.get_freeze_count()
        with frozen_gc():
            pass
        assert gc.get_freeze_count() == held
    finally:
        gc.unfreeze()


def test_mcts_progress_and_budget_checks():
    env = SequenceEnv((3, 1, 4, 1, 5), 6)
    seen = []
    result = mcts_search(env, uniform_evaluator, max_iterations=50, progress=seen.append)
    assert [p.iteration for p in seen] == list(range(1, 51))
    speedups = [p.best_speedup for p in seen]
    assert speedups == sorted(speedups) and seen[-1].best_speedup == result.best_speedup
    assert seen[-1].fraction() == 1.0
    with pytest.raises(ValueError, match="budget"):
        mcts_search(env, uniform_evaluator)
    with pytest.raises(ValueError, match="batch_evaluator"):
        mcts_search(env, uniform_evaluator, batch_size=2, max_iterations=5)
    result = mcts_search(SequenceEnv((3, 1, 4, 1, 5), 6), uniform_evaluator, max_simulations=30)
    assert result.num_simulations == 30


# --------------------------------------------------------------------------------------- placement


@pytest.fixture(scope="module")
def vgg():
    graph = resolve_model("vgg19", tiny=True)
    cluster = resolve_cluster("tag-testbed")
    return group_ops(graph, num_groups=6, gpus=cluster), cluster


@pytest.fixture(scope="module")
def tight(vgg):
    """Two V100s and two copies of a V100 with too little memory for DP-NCCL."""
    group_graph, _ = vgg
    v100 = gpu_type("v100-32gb")
    small = dataclasses.replace(v100, name="v100-small", memory_bytes=350e3)  # DP-NCCL needs ~464 kB
    cluster = build_cluster("tight", [Machine(v100, 2, 100e9), Machine(small, 2, 100e9)], network_bandwidth=12.5e9)
    return group_graph, cluster


def test_candidates_switch_to_restricted_on_big_clusters(vgg):
    _, cluster = vgg
    masks, options = placement_candidates(cluster)
    full = candidate_actions(cluster)
    assert np.array_equal(masks, full[0]) and np.array_equal(options, full[1])
    masks, options = placement_candidates(cluster, max_device_groups=4)
    restricted = restricted_actions(cluster)
    assert np.array_equal(masks, restricted[0]) and np.array_equal(options, restricted[1])


def test_placement_fill_rule_and_observation(vgg):
    group_graph, cluster = vgg
    env = PlacementEnv(group_graph, cluster)
    assert env.reference_name == DP_NCCL and env.num_simulations == 0
    assert env.strategy(()) == Strategy.data_parallel(6, cluster, option=ALLREDUCE)
    assert env.evaluate(()).value == 0.0 and env.evaluate(()).time == env.reference_time
    order = group_graph.order_by_compute()
    a, b = 3, 17
    one = env.strategy((a,))
    assert (one.placement == env.masks[a]).all() and (one.option == env.options[a]).all()
    two = env.strategy((a, b))
    assert (two.placement[order[1]] == env.masks[b]).all() and two.option[order[1]] == env.options[b]
    rest = np.delete(np.arange(6), order[1])
    assert (two.placement[rest] == env.masks[a]).all() and (two.option[rest] == env.options[a]).all()
    state = env.observe((a, b))
    assert isinstance(state, PlacementState) and state.strategy == two
    assert state.decided.tolist() == [g in order[:2] for g in range(6)] and state.next_group == order[2]
    assert state.feedback is not None and state.feedback.group_makespan.shape == (6,)
    assert len(state.options) == len(state.masks) == env.num_candidates
    terminal = env.observe(tuple(range(6)))
    assert terminal.next_group == -1 and len(terminal.options) == 0
    assert env.num_actions(tuple(range(6))) == 0
    with pytest.raises(SearchError):
        env.step(tuple(range(6)), 0)


def test_mcts_is_never_worse_than_dp_nccl_and_is_deterministic(vgg):
    group_graph, cluster = vgg
    states = []

    def recording(state):
        states.append(state)
        assert state.feedback is not None
        return np.full(len(state.options), 1.0 / len(state.options))

    runs = [mcts_search(PlacementEnv(group_graph, cluster), recording, max_iterations=60, seed=7, target_visits=5)
            for _ in range(2)]
    first, second = runs
    assert first.best == second.best and first.best_time == second.best_time
    assert [h[:1] + h[2:] for h in first.history] == [h[:1] + h[2:] for h in second.history]
    assert first.best_feasible and first.best_time <= first.reference_time
    assert isinstance(first.best, Strategy)
    assert first.history[0].iteration == 0 and first.history[0].best_speedup == 1.0
    assert first.best_speedup > 1.0  # a tiny model on 16 GPUs: DP-NCCL is all-reduce bound
    beat = next(h.iteration for h in first.history if h.best_speedup > 1.0)
    assert first.first_beat_iteration == beat
    assert first.num_simulations <= 60 and states


def test_training_targets_are_distributions_over_the_candidates(vgg):
    group_graph, cluster = vgg
    env = PlacementEnv(group_graph, cluster)
    result = mcts_search(env, max_iterations=40, target_visits=5, seed=0)
    tree = result.tree
    well_visited = [n for n in range(tree.num_nodes) if tree.visits[n] >= 5 and tree.num_edges[n] > 0]
    assert result.targets and len(result.targets) == len(well_visited)
    for target in result.targets:
        assert isinstance(target.state, PlacementState) and target.visits >= 5
        assert target.policy.shape == (len(target.state.options),) == (env.num_candidates,)
        assert target.policy.sum() == pytest.approx(1.0) and (target.policy >= 0).all()
    root = result.targets[0]
    assert root.state.decided.sum() == 0 and root.visits == 40
    np.testing.assert_allclose(root.policy, tree.child_visits(ROOT) / 39)


def test_no_oom_plan_returned_on_a_memory_tight_cluster(tight):
    group_graph, cluster = tight
    env = PlacementEnv(group_graph, cluster)
    assert not env.baseline().feasible and env.baseline().value == OOM_REWARD
    assert env.reference_name == SINGLE_DEVICE_COMPUTE
    assert env.reference_time == pytest.approx(group_graph.compute_table(cluster).sum(axis=0).min())
    result = mcts_search(env, max_iterations=40, seed=0)
    assert env.num_oom > 0  # OOM plans were simulated ...
    assert result.best_feasible  # ... and a feasible one is returned
    assert env.simulate(result.best).feasible and result.best_speedup > 0
    mcmc = mcmc_search(PlacementEnv(group_graph, cluster), max_iterations=40, seed=0)
    assert mcmc.best_feasible and mcmc.reference_name == SINGLE_DEVICE_COMPUTE


# --------------------------------------------------------------------------------------- MCMC


def test_acceptance_probability():
    assert acceptance_probability(1.0, True, 0.9, True, alpha=20) == 1.0
    assert acceptance_probability(1.0, True, 1.1, True, alpha=20) == pytest.approx(math.exp(-2.0))
    assert acceptance_probability(2.0, True, 2.5, True, alpha=4) == pytest.approx(math.exp(-1.0))
    assert acceptance_probability(1.0, True, 0.5, False, alpha=20) == 0.0  # never into OOM
    assert acceptance_probability(1.0, False, 5.0, True, alpha=20) == 1.0  # always out of it
    assert acceptance_probability(1.0, False, 1.2, False, alpha=5) == pytest.approx(math.exp(-1.0))


def test_metropolis_step_accepts_worse_plans_with_probability_exp_minus_alpha_delta():
    alpha = 10.0
    current = LeafEvaluation(0.0, "current", 1.0, True)
    worse = LeafEvaluation(-0.1, "worse", 1.1, True)  # Δ = 0.1
    better = LeafEvaluation(0.1, "better", 0.9, True)
    p = math.exp(-alpha * 0.1)
    rng, draws = np.random.default_rng(123), np.random.default_rng(123)
    accepted = 0
    for _ in range(5000):
        moved = metropolis_step(current, worse, alpha=alpha, rng=rng)
        assert (moved is worse) == (draws.random() < p)  # one draw per worse proposal, accept iff below p
        accepted += moved is worse
        assert metropolis_step(current, better, alpha=alpha, rng=rng) is better  # no draw consumed
    assert accepted / 5000 == pytest.approx(p, abs=0.02)
    oom = LeafEvaluation(OOM_REWARD, "oom", 0.5, False)
    assert metropolis_step(current, oom, alpha=0.0, rng=rng) is current


def test_propose_moves_one_group_to_another_candidate(vgg):
    group_graph, cluster = vgg
    masks, options = placement_candidates(cluster)
    start = Strategy.data_parallel(6, cluster)
    rng = np.random.default_rng(0)
    for _ in range(20):
        moved = propose(start, masks, options, rng)
        changed = np.flatnonzero((moved.placement != start.placement).any(axis=1) | (moved.option != start.option))
        assert len(changed) == 1


def test_mcmc_is_seeded_and_never_worse_than_dp_nccl(vgg):
    group_graph, cluster = vgg
    runs = [mcmc_search(PlacementEnv(group_graph, cluster), max_iterations=40, seed=3) for _ in range(2)]
    assert runs[0].best == runs[1].best and runs[0].num_simulations == runs[1].num_simulations
    result = runs[0]
    assert result.method == "mcmc" and result.targets == [] and result.tree is None
    assert result.best_feasible and result.best_time <= result.reference_time
    assert result.num_iterations == 40 and result.history[0].iteration == 0


def test_mcmc_stops_when_the_candidate_space_is_spent(vgg):
    group_graph, cluster = vgg
    one_device = cluster.subset([0], name="one")
    env = PlacementEnv(group_graph, one_device)
    assert env.num_candidates == 1
    result = mcmc_search(env, max_simulations=5)
    assert result.num_simulations == 0 and result.num_iterations == 10_000
    assert result.best == env.dp_nccl


def test_time_budget():
    env = SequenceEnv(tuple(range(8)) * 4, 8)
    result = mcts_search(env, uniform_evaluator, time_limit_s=0.2, target_visits=None)
    assert 0.2 <= result.search_time_s < 1.0 and result.num_iterations > 10


def test_impact_order_adds_the_allreduce_estimate_to_compute(vgg):
    from tag.search.placement import group_order

    group_graph, cluster = vgg
    assert np.array_equal(group_order(group_graph, cluster, "compute"), group_graph.order_by_compute())
    n = cluster.num_devices
    slowest = cluster.bandwidth[~np.eye(n, dtype=bool)].min()
    impact = group_graph.compute_table(cluster).mean(axis=1) + 2 * (n - 1) / n * group_graph.param_bytes / slowest
    order = group_order(group_graph, cluster, "impact")
    assert sorted(order.tolist()) == list(range(group_graph.num_groups))
    assert np.all(np.diff(impact[order]) <= 0)


def test_root_fill_keeps_dp_nccl_for_undecided_groups(vgg):
    group_graph, cluster = vgg
    env = PlacementEnv(group_graph, cluster, fill="root")
    first = env.order[0]
    strategy = env.strategy((0,))  # action 0: the first candidate mask and option
    dp = Strategy.data_parallel(group_graph.num_groups, cluster, option=ALLREDUCE)
    others = np.arange(group_graph.num_groups) != first
    assert np.array_equal(strategy.placement[others], dp.placement[others])
    assert np.array_equal(strategy.option[others], dp.option[others])
    with pytest.raises(SearchError):
        PlacementEnv(group_graph, cluster, fill="last")


def test_a_plan_beats_the_reference_only_by_more_than_rounding():
    from tag.search import BEAT_RTOL, LeafEvaluation, beats_reference
    from tag.search.result import Tracker

    reference = 0.25
    env = SimpleNamespace(reference_time=reference, reference_name="DP-NCCL", num_simulations=0,
                          baseline=lambda: LeafEvaluation(0.0, "dp", reference, True))
    tracker = Tracker(env, max_iterations=10, max_simulations=None, time_limit_s=None, progress=None)
    same_tasks_reordered = reference * (1 - 4e-16)  # what a DP-like plan reached through the tree can give
    assert not beats_reference(same_tasks_reordered, reference)
    tracker.record(LeafEvaluation(0.0, "reordered", same_tasks_reordered, True), iteration=3)
    assert tracker.first_beat_iteration is None
    tracker.record(LeafEvaluation(0.0, "oom", reference / 2, False), iteration=4)  # faster, but does not fit
    assert tracker.first_beat_iteration is None
    faster = reference * (1 - 10 * BEAT_RTOL)
    assert beats_reference(faster, reference)
    tracker.record(LeafEvaluation(0.0, "faster", faster, True), iteration=5)
    assert tracker.first_beat_iteration == 5
