"""The learned stage-to-device mapper: its GNN, decoder, training and checkpoints (tag.policy.mapping,
tag.training.mapper) and its search (tag.planners.learned_mapper)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_json

from tag.cluster import resolve_cluster
from tag.exact.heuristics import cs_map
from tag.exact.mapping import ALLREDUCE, P2P, MappingProblem, max_stage_time
from tag.policy.errors import PolicyError
from tag.policy.mapping import (
    MappingDecoder,
    MappingInstance,
    MappingPolicy,
    MappingPolicyConfig,
    imitation_loss,
    load_mapping_policy,
    numpy_tables,
    save_mapping_policy,
    search_order,
    shipped_mapping_checkpoint,
    teacher_forced_logits,
)
from tag.policy.mapping.instance import _median_and_reciprocal_median, _ring_hops
from tag.planners.learned_mapper import learned_mapping
from tag.planners.mappers import make_mapper
from tag.search import MappingEnv
from tag.search.errors import SearchError
from tag.training.errors import TrainingError
from tag.training.mapper import MapperTrainConfig, build_examples, train_mapper

SMALL = MappingPolicyConfig(hidden=16, heads=2, num_layers=2)


def _problem(seed: int, stages: int, replicas: int, cluster: str, *, latency: bool = False) -> MappingProblem:
    """A random chain of ``stages`` stages on ``cluster`` (two GPU types when the cluster has them)."""
    rng = np.random.default_rng(seed)
    sub = resolve_cluster(cluster)
    problem = MappingProblem.from_cluster(
        sub, stage_time=rng.uniform(0.5, 1.5, size=stages), edge_src=np.arange(stages - 1),
        edge_dst=np.arange(1, stages), edge_bytes=rng.uniform(1e8, 1e9, size=stages - 1),
        param_bytes=rng.uniform(1e8, 2e9, size=stages), replicas=replicas)
    if latency:  # give every link a latency, to exercise the α terms
        lat = rng.uniform(1e-5, 1e-3, size=problem.bandwidth.shape)
        lat = (lat + lat.T) / 2
        problem = MappingProblem(problem.stage_time, problem.edge_src, problem.edge_dst, problem.edge_bytes,
                                 problem.param_bytes, problem.num_replicas,
                                 np.where(np.isinf(problem.bandwidth), 0.0, problem.bandwidth), lat, problem.device_type)
    return problem


def _instance(problem: MappingProblem, mode: str) -> tuple[MappingEnv, MappingInstance]:
    env = MappingEnv(problem, instantiation=mode)
    return env, MappingInstance.from_env(env)


@pytest.mark.parametrize("mode,cluster,latency", [(P2P, "mesh2d:2x4", False), (ALLREDUCE, "uniform-dist:8,seed=3", True),
                                                  (P2P, "tag-random:seed=3", True), (ALLREDUCE, "mesh2d:4x4", True)])
def test_teacher_forcing_equals_the_step_by_step_decoder(mode, cluster, latency):
    """Training's vectorised logits (torch) are the search's per-step logits (numpy), step for step."""
    torch.manual_seed(0)
    devices = resolve_cluster(cluster).num_devices
    stages = 3 if devices >= 6 else 2
    problem = _problem(1, stages, devices // stages, cluster, latency=latency)
    env, instance = _instance(problem, mode)
    policy = MappingPolicy(SMALL)
    with torch.no_grad():
        policy.crowding.fill_(-0.7)  # its trained sign: prefer devices whose near links are taken
    decoder = MappingDecoder(policy, instance)
    target = np.random.default_rng(2).permutation(devices)[:instance.num_slots]
    with torch.no_grad():
        forced = teacher_forced_logits(policy(instance), instance, target).double().numpy()
    for k in range(instance.num_slots):
        step = decoder.logits(target[:k].tolist())
        free = np.ones(devices, dtype=bool)
        free[target[:k]] = False
        np.testing.assert_allclose(forced[k, free], step[free], rtol=1e-4, atol=1e-4)
        assert (forced[k, ~free] < -1e8).all() and (step[~free] < -1e8).all()


def test_return_cost_is_the_cheapest_way_back_to_replica_0():
    """One stage, a ring of R = 4 on 5 devices, hop seconds 1 on the chain 0-1-2-3 (bandwidth 4), 2 on
    3-4 (bandwidth 2), 4 elsewhere (bandwidth 1), by hand, ring on devices 0, 1, 2, 3: replica r's
    return cost bounds the largest hop of the 4 − r hops back to replica 0's device 0."""
    bandwidth = np.ones((5, 5))
    for i, j, width in ((0, 1, 4), (1, 2, 4), (2, 3, 4), (3, 4, 2)):
        bandwidth[i, j] = bandwidth[j, i] = width
    problem = MappingProblem(np.array([1.0]), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                             np.zeros(0), np.array([4.0 / 1.5]), 4, bandwidth)  # 2(R−1)/R · P = 4 bytes
    instance = MappingInstance.build(problem, ALLREDUCE, [0, 0, 0, 0], [0, 1, 2, 3])
    assert instance.ring_start.tolist() == [0, 0, 0, -1]  # replica 3 pays its closing hop exactly
    seconds = instance.return_costs([0, 1, 2, 3]) * instance.scale
    # replica 0: the second cheapest hop to a free device (the ring leaves to replica 1, returns from 3)
    np.testing.assert_allclose(seconds[0], [4, 1, 1, 2, 4])
    # replica 1, 3 hops back through devices 1-4: 1 s along the chain (2 then 1 then 0, or 2-3-2-1 as a
    # bound), 4 s from device 4 (its hops: 2 s to 3 and 4 s to the rest, but from 3 the way on costs
    # 4 s); on device 1 the closing hop into device 0 must come from another device: 4 s
    np.testing.assert_allclose(seconds[1], [1, 4, 1, 1, 4])
    # replica 2, 2 hops back through devices 2-4 (device 1 holds replica 1): every hop into 0 is 4 s
    # (through free devices only; the old bound went back over device 1 at 1 s)
    np.testing.assert_allclose(seconds[2], [4, 4, 4, 4, 4])
    assert not seconds[3].any()
    # the decoder sees the same return cost: with only β₃ on, a logit is −relu(c + max(P, ret) − T)
    policy = MappingPolicy(SMALL)
    decoder = MappingDecoder(policy, instance)
    decoder.beta = np.array([0.0, 0.0, 0.0, 1.0, 0.0])
    decoder.static[:] = 0.0
    decoder.edge_weight[:] = 0.0
    logits = decoder.logits([0, 1])
    ring = np.maximum(seconds[2], 4.0 / bandwidth[1]) / instance.scale  # max(P, ret), P = the hop from device 1
    before = problem.compute_time()[0, 0] / instance.scale + 1.0 / instance.scale  # T after replica 1
    expected = -np.maximum(problem.compute_time()[0] / instance.scale + ring - before, 0.0)
    np.testing.assert_allclose(logits[2:], expected[2:])


@pytest.mark.parametrize("cluster,mode", [("random-blk-2:16,seed=1", ALLREDUCE), ("tag-random:seed=3", P2P)])
def test_numpy_tables_equal_the_torch_forward(cluster, mode):
    """The inference path (numpy) computes the network's forward pass (torch)."""
    torch.manual_seed(0)
    devices = resolve_cluster(cluster).num_devices
    problem = _problem(6, 4, devices // 4, cluster, latency=True)
    _, instance = _instance(problem, mode)
    policy = MappingPolicy(SMALL)
    with torch.no_grad():
        expected = policy(instance)
    for name, a, b in zip(expected._fields, expected, numpy_tables(policy, instance)):
        np.testing.assert_allclose(b, a.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("cluster,stages,replicas", [("mesh2d:4x4", 4, 4), ("uniform-dist:16,seed=1", 2, 8)])
def test_bounded_decodes_from_the_greedy_prefix_equal_decodes_from_scratch(cluster, stages, replicas):
    """A bounded decode starts where the memoised greedy decode first leaves the bound; a decoder with no
    memo decodes from the first slot: the same map (or None) under every bound."""
    torch.manual_seed(0)
    problem = _problem(4, stages, replicas, cluster, latency=True)
    env, instance = _instance(problem, ALLREDUCE)
    policy = MappingPolicy(SMALL)
    memo = MappingDecoder(policy, instance)
    greedy = memo.complete([])
    top, low = env.evaluate(tuple(greedy)).time, instance.scale  # the scale is the quick lower bound
    results = []
    for i in range(12):
        bound = low * (top / low) ** (i / 11)
        fresh = MappingDecoder(policy, instance).complete([], bound=bound)
        assert memo.complete([], bound=bound) == fresh, i
        results.append(fresh)
    assert results[-1] == greedy and results[0] is None  # the greedy decode's own time passes; the bound fails
    assert any(r is not None and r != greedy for r in results)  # and some bound leaves the greedy decode


def test_instance_medians_and_ring_hops_equal_their_numpy_definitions():
    """The instance's one-partition medians equal np.median of the bandwidths and of their reciprocals bit
    for bit (odd and even counts, ties), and its ring hops equal the sorted unique hops (r, r + 1 mod R)."""
    rng = np.random.default_rng(0)
    for count in (1, 2, 3, 4, 7, 12, 56, 4032):
        for values in (rng.uniform(1e9, 3e11, count), rng.choice([5e9, 2.5e10, 1e11], count)):
            reference, inverse = _median_and_reciprocal_median(values)
            assert reference == float(np.median(values))
            assert 1.0 / inverse == 1.0 / float(np.median(1.0 / values))
    for replicas in range(0, 18):
        if replicas < 2:
            assert _ring_hops(replicas).shape == (0, 2)
            continue
        hops = np.sort(np.stack([np.arange(replicas), (np.arange(replicas) + 1) % replicas], axis=1), axis=1)
        np.testing.assert_array_equal(_ring_hops(replicas), np.unique(hops, axis=0))


def test_an_instance_needs_every_stage_replica_once():
    problem = _problem(3, 2, 4, "random-blk-2:8,seed=1")
    stages, replicas = np.repeat(np.arange(2), 4), np.tile(np.arange(4), 2)
    MappingInstance.build(problem, P2P, stages, replicas)
    for bad_stages, bad_replicas in ((stages[:-1], replicas[:-1]), (stages, np.tile([0, 1, 2, 2], 2)),
                                     (np.where(stages == 1, 2, stages), replicas), (stages, replicas - 1)):
        with pytest.raises(PolicyError, match="every \\(stage, replica\\) once"):
            MappingInstance.build(problem, P2P, bad_stages, bad_replicas)


def test_numpy_tables_follow_the_policy_s_weights_after_updates():
    """The numpy weights are memoised per policy, yet an in-place update (an optimizer step, a loaded state),
    a replaced parameter, a parameter moved to other memory and a replaced module all show in the next
    tables."""
    torch.manual_seed(0)
    problem = _problem(3, 2, 4, "random-blk-2:8,seed=1")
    _, instance = _instance(problem, ALLREDUCE)
    policy = MappingPolicy(SMALL)
    before = numpy_tables(policy, instance).static.copy()
    with torch.no_grad():
        policy.pair_out.bias.add_(1.0)  # in place, as an optimizer step
    np.testing.assert_allclose(numpy_tables(policy, instance).static, before + 1.0, rtol=1e-6)
    policy.pair_out.bias = torch.nn.Parameter(policy.pair_out.bias.detach() + 1.0)  # a new object
    np.testing.assert_allclose(numpy_tables(policy, instance).static, before + 2.0, rtol=1e-6)
    policy.pair_out.bias.data = policy.pair_out.bias.detach() + 1.0  # other memory, the same object
    np.testing.assert_allclose(numpy_tables(policy, instance).static, before + 3.0, rtol=1e-6)
    policy.pair_out = torch.nn.Linear(policy.config.hidden, 1)  # a new module
    with torch.no_grad():
        policy.pair_out.weight.zero_()
        policy.pair_out.bias.fill_(5.0)
    np.testing.assert_array_equal(numpy_tables(policy, instance).static, 5.0)
    with torch.no_grad():
        expected = policy(instance).static.numpy()
    np.testing.assert_allclose(numpy_tables(policy, instance).static, expected, rtol=1e-4, atol=1e-5)


def test_the_network_is_equivariant_to_relabelling_devices():
    """Renumbering the devices renumbers the static scores and the affinities, nothing else."""
    torch.manual_seed(0)
    problem = _problem(3, 2, 4, "random-blk-2:8,seed=1")
    perm = np.random.default_rng(0).permutation(8)
    bandwidth = np.where(np.isinf(problem.bandwidth), 0.0, problem.bandwidth)
    moved = MappingProblem(problem.stage_time, problem.edge_src, problem.edge_dst, problem.edge_bytes,
                           problem.param_bytes, problem.num_replicas, bandwidth[np.ix_(perm, perm)],
                           problem.latency[np.ix_(perm, perm)], problem.device_type[perm])
    policy = MappingPolicy(SMALL)
    _, a = _instance(problem, P2P)
    _, b = _instance(moved, P2P)
    with torch.no_grad():
        ta, tb = policy(a), policy(b)
    np.testing.assert_allclose(tb.static.numpy(), ta.static.numpy()[:, perm], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tb.affinity.numpy(), ta.affinity.numpy()[np.ix_(perm, perm)], rtol=1e-4, atol=1e-5)


def test_greedy_completion_and_fill_extend_the_state():
    torch.manual_seed(0)
    problem = _problem(4, 4, 2, "mesh2d:2x4")
    env, instance = _instance(problem, P2P)
    policy = MappingPolicy(SMALL)
    with torch.no_grad():
        policy.crowding.fill_(-0.7)
    decoder = MappingDecoder(policy, instance)
    full = decoder.complete([5, 2])
    assert full[:2] == [5, 2] and sorted(full) == list(range(8))
    # the fill is the step-by-step argmax of the logits (its crowding updated in place)
    assert full == decoder.reference_complete([5, 2])
    mapping = MappingEnv(problem, instantiation=P2P, fill=decoder.complete).mapping((5, 2))
    assert mapping[env.slot_stage[0], env.slot_replica[0]] == 5
    repeats = MappingEnv(problem, instantiation=P2P, fill=lambda state: list(state) + [0] * (8 - len(state)))
    with pytest.raises(SearchError, match="distinct devices"):
        repeats.mapping((5,))


def _trained_sign_policy(seed: int = 0) -> MappingPolicy:
    torch.manual_seed(seed)
    policy = MappingPolicy(SMALL)
    with torch.no_grad():
        policy.crowding.fill_(-0.7)
    return policy


@pytest.mark.parametrize("mode,cluster", [(ALLREDUCE, "mesh2d:4x4"), (ALLREDUCE, "random-blk-2:16,seed=1"),
                                          (P2P, "tag-random:seed=3")])
def test_memoised_decoder_equals_a_fresh_one_on_every_prefix(mode, cluster):
    """One decoder asked along a search (completions, priors, closing tables shared across prefixes)
    gives what a fresh decoder computes from scratch for each prefix; the greedy decode is Markov."""
    devices = resolve_cluster(cluster).num_devices
    problem = _problem(3, 4, devices // 4, cluster)
    _, instance = _instance(problem, mode)
    policy = _trained_sign_policy()
    shared = MappingDecoder(policy, instance)
    greedy = shared.complete([])
    rng = np.random.default_rng(0)
    for j in range(instance.num_slots):  # every prefix of the greedy decode completes to it
        assert shared.complete(greedy[:j]) == greedy
        assert MappingDecoder(policy, instance).complete(greedy[:j]) == greedy
    for _ in range(12):  # random prefixes, some sharing a device set in another order
        prefix = rng.permutation(devices)[:int(rng.integers(1, instance.num_slots))].tolist()
        for state in (prefix, prefix[::-1]):
            fresh = MappingDecoder(policy, instance)
            assert shared.complete(state) == fresh.complete(state)
            np.testing.assert_array_equal(shared.logits(state), fresh.logits(state))
            np.testing.assert_array_equal(shared.priors(state), fresh.priors(state))


@pytest.mark.parametrize("mode,cluster", [(ALLREDUCE, "mesh2d:4x4"), (ALLREDUCE, "uniform-dist:16,seed=3"),
                                          (P2P, "tag-random:seed=3")])
def test_greedy_kernel_is_the_argmax_of_the_step_by_step_logits_compiled_or_not(mode, cluster, monkeypatch):
    """The compiled completion takes, slot by slot, the device of highest rounded logit that
    :meth:`MappingDecoder.logits` (numpy, as training) gives; run as plain Python, it gives the same."""
    from tag.policy.mapping import decoder as decoder_module
    from tag.policy.mapping import instance as instance_module

    devices = resolve_cluster(cluster).num_devices
    problem = _problem(8, 4, devices // 4, cluster, latency=True)
    _, instance = _instance(problem, mode)
    policy = _trained_sign_policy()
    prefix = [3, 1]
    compiled = MappingDecoder(policy, instance).complete(prefix)
    stepped = list(prefix)
    reference = MappingDecoder(policy, instance)
    while len(stepped) < instance.num_slots:
        stepped.append(int(np.argmax(np.round(reference.reference_logits(stepped), 6))))
    assert compiled == stepped
    for module, name in ((decoder_module, "_greedy_kernel"), (decoder_module, "_slot_step"),
                         (decoder_module, "_return_row"), (decoder_module, "_opening_row"),
                         (instance_module, "_return_row"), (instance_module, "_opening_row")):
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name, getattr(kernel, "py_func", kernel))
    assert MappingDecoder(policy, instance).complete(prefix) == compiled


@pytest.mark.parametrize("mode,cluster", [(ALLREDUCE, "mesh2d:4x4"), (ALLREDUCE, "uniform-dist:16,seed=3"),
                                          (P2P, "tag-random:seed=3")])
def test_compiled_logits_equal_the_numpy_steps_bit_for_bit(mode, cluster):
    """The priors' compiled logits (:func:`_next_logits`) equal the numpy step-by-step ones on every prefix
    of random maps (look-ahead slots, replica 0s and plain slots), and a full map has no next logits."""
    devices = resolve_cluster(cluster).num_devices
    problem = _problem(8, 4, devices // 4, cluster, latency=True)
    _, instance = _instance(problem, mode)
    decoder = MappingDecoder(_trained_sign_policy(), instance)
    rng = np.random.default_rng(0)
    for _ in range(3):
        full = rng.permutation(devices)[:instance.num_slots].tolist()
        for k in range(instance.num_slots):
            np.testing.assert_array_equal(decoder.logits(full[:k]), decoder.reference_logits(full[:k]))
        with pytest.raises(PolicyError, match="no next slot"):
            decoder.logits(full)


@pytest.mark.parametrize("seed", range(6))
def test_fast_decoder_equals_the_reference_on_random_instances(seed):
    """On random problems (cluster family, size, stages, replicas, instantiation, latencies) with random
    weights, the compiled logits equal the reference's bit for bit on random prefixes, and the compiled
    greedy completion is the reference's slot-by-slot argmax, from the empty prefix and from a random one."""
    rng = np.random.default_rng(seed)
    devices = int(rng.choice([8, 12, 16]))
    family = ["uniform-dist", "random-blk-1", "random-blk-2"][seed % 3]
    stages = int(rng.integers(2, 5))
    replicas = int(rng.integers(1, devices // stages + 1))
    problem = _problem(seed, stages, replicas, f"{family}:{devices},seed={seed}", latency=bool(seed % 2))
    mode = P2P if rng.random() < 0.5 else ALLREDUCE
    torch.manual_seed(seed)
    policy = MappingPolicy(SMALL)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    instance = MappingInstance.build(problem, mode, *search_order(problem))
    decoder = MappingDecoder(policy, instance)
    for _ in range(2):
        full = rng.permutation(devices)[:instance.num_slots].tolist()
        for k in range(instance.num_slots):
            np.testing.assert_array_equal(decoder.logits(full[:k]), decoder.reference_logits(full[:k]))
        prefix = full[:int(rng.integers(0, instance.num_slots))]
        assert decoder.complete(prefix) == decoder.reference_complete(prefix)
    assert decoder.complete([]) == decoder.reference_complete([])


def test_search_order_is_the_environment_s_slot_order():
    """The learned mapper builds its instance before its environment: the slots must come in the order
    the environment decides them, on chains and on random stage DAGs."""
    from test_mapping import random_problem

    rng = np.random.default_rng(0)
    for trial in range(20):
        stages = int(rng.integers(1, 7))
        problem = random_problem(rng, 12, stages, int(rng.integers(1, 12 // stages + 1)), chain=trial % 2 == 0)
        env = MappingEnv(problem)
        slot_stage, slot_replica = search_order(problem)
        np.testing.assert_array_equal(slot_stage, env.slot_stage)
        np.testing.assert_array_equal(slot_replica, env.slot_replica)


def test_cached_closing_tables_equal_rebuilt_ones():
    """Two prefixes with the same replica-0 device and the same used set share one closing table, which
    equals the table rebuilt for either; another set gets its own."""
    problem = _problem(4, 2, 8, "mesh2d:4x4")
    _, instance = _instance(problem, ALLREDUCE)
    decoder = MappingDecoder(_trained_sign_policy(), instance)
    look = [k for k in range(instance.num_slots) if 0 < instance.ring_start[k] < k]  # ring 2, replicas ≥ 1
    k, first = look[0], int(instance.ring_start[look[0]])
    prefix = list(range(first)) + [first]
    shuffled = list(range(first))[::-1] + [first]  # same set, same replica 0, other order
    other = list(range(1, first + 1)) + [first + 1]  # another set
    for devices in (prefix, shuffled, other):
        state = devices + [15]
        np.testing.assert_array_equal(decoder._return_cost(k, state),
                                      instance.closing_table(k, state)[instance.hops_left[k] - 1])
    assert len(decoder._closing) == 2


@pytest.mark.parametrize("cluster,stages,replicas", [("mesh2d:4x4", 4, 4), ("random-blk-2:16,seed=1", 2, 8)])
def test_compiled_return_costs_equal_the_numpy_reference(cluster, stages, replicas):
    """return_costs (the compiled rows) equals opening_cost / closing_table row by row, bit for bit."""
    _, instance = _instance(_problem(5, stages, replicas, cluster, latency=True), ALLREDUCE)
    for seed in range(4):
        devices = np.random.default_rng(seed).permutation(16).tolist()
        expected = np.zeros((instance.num_slots, 16))
        for k in np.flatnonzero(instance.ring_start >= 0).tolist():
            expected[k] = (instance.opening_cost(k, devices) if instance.ring_start[k] == k
                           else instance.closing_table(k, devices)[instance.hops_left[k] - 1])
        np.testing.assert_array_equal(instance.return_costs(devices), expected)


def test_return_costs_of_a_two_by_two_mesh_ring_by_hand():
    """A ring of R = 4 on a 2 x 2 mesh (devices 0 1 / 2 3; 1-hop links 78.1 GB/s, the diagonals 2
    hops at 39 GB/s) with replica 0 on device 0 and replica 1 on device 1: replica 2's return cost
    (2 hops back through free devices 2, 3) is the 1-hop link on device 3 (3-2-0) and the 2-hop link
    on device 2 (its only way back is through 3, a diagonal); the cheapest a ring opened on any
    device can pay is its second cheapest link, a 1-hop one."""
    cluster = resolve_cluster("mesh2d:2x2")
    problem = MappingProblem.from_cluster(cluster, stage_time=np.array([1.0]), edge_src=np.zeros(0, dtype=np.int64),
                                          edge_dst=np.zeros(0, dtype=np.int64), edge_bytes=np.zeros(0),
                                          param_bytes=np.array([1e9]), replicas=4)
    instance = MappingInstance.build(problem, ALLREDUCE, [0, 0, 0, 0], [0, 1, 2, 3])
    one, two = (2 * 3 * 1e-6 * hops + 1.5e9 / bandwidth for hops, bandwidth in ((1, 78.1e9), (2, 39.0e9)))
    seconds = instance.return_costs([0, 1, 3, 2]) * instance.scale
    np.testing.assert_allclose(seconds[0], [one] * 4)
    np.testing.assert_allclose(seconds[2, [2, 3]], [two, one])


def _reach(decoder: MappingDecoder, devices: list[int]) -> np.ndarray:
    """[D] the bound a bounded completion holds each device of the next slot to, from the numpy decoder."""
    k, instance = len(devices), decoder.instance
    _, partial = decoder._step(k, devices, decoder._running_time(devices))
    if instance.ring_start[k] < 0:
        return partial
    added = partial - instance.compute[k]
    return np.maximum(partial, instance.compute[k] + np.maximum(added, decoder._return_cost(k, devices)))


@pytest.mark.parametrize("mode,cluster", [(ALLREDUCE, "mesh2d:4x4"), (P2P, "tag-random:seed=3")])
def test_bounded_completion_is_the_argmax_among_devices_within_the_bound(mode, cluster):
    """Under a bound, the compiled completion takes the highest rounded logit among the free devices
    whose reach (numpy) is within it, and gives up (None) where there is none."""
    devices = resolve_cluster(cluster).num_devices
    problem = _problem(8, 4, devices // 4, cluster, latency=True)
    _, instance = _instance(problem, mode)
    policy = _trained_sign_policy()
    greedy = MappingDecoder(policy, instance).complete([])
    for fraction in (1.0, 0.8, 0.6):
        bound = fraction * max_stage_time(problem, _as_mapping(instance, greedy), mode)
        compiled = MappingDecoder(policy, instance).complete([], bound=bound)
        reference = MappingDecoder(policy, instance)
        stepped: list[int] | None = []
        while stepped is not None and len(stepped) < instance.num_slots:
            logits = np.round(reference.reference_logits(stepped), 6)
            logits[_reach(reference, stepped) * instance.scale > bound * (1 + 1e-9)] = -np.inf
            logits[stepped] = -np.inf
            stepped = stepped + [int(np.argmax(logits))] if np.isfinite(logits).any() else None
        assert compiled == stepped
        if compiled is not None:
            assert max_stage_time(problem, _as_mapping(instance, compiled), mode) <= max_stage_time(
                problem, _as_mapping(instance, greedy), mode) or fraction < 1.0


def _as_mapping(instance: MappingInstance, devices: list[int]) -> np.ndarray:
    out = np.empty((instance.problem.num_stages, instance.problem.num_replicas), dtype=np.int64)
    out[instance.slot_stage, instance.slot_replica] = devices
    return out


@pytest.mark.parametrize("mode", [P2P, ALLREDUCE])
def test_running_time_bounds_the_objective_and_bounded_completions_give_up_only_on_slower_maps(mode):
    """T after every slot never exceeds the map's max stage time, and each slot's reach never exceeds
    its stage's time in the finished map, so a bound at or above the greedy completion's time keeps
    it: no device it chose was past the bound."""
    problem = _problem(6, 4, 4, "uniform-dist:16,seed=2", latency=True)
    env, instance = _instance(problem, mode)
    decoder = MappingDecoder(_trained_sign_policy(), instance)
    rng = np.random.default_rng(1)
    for _ in range(10):
        devices = rng.permutation(16).tolist()
        mapping = np.empty((4, 4), dtype=np.int64)
        mapping[env.slot_stage, env.slot_replica] = devices
        assert decoder._running_time(devices) * instance.scale <= max_stage_time(problem, mapping, mode) * (1 + 1e-12)
        prefix = devices[:int(rng.integers(0, 8))]
        full = MappingDecoder(_trained_sign_policy(), instance).complete(prefix)
        seconds = env.score(env.mapping(tuple(full))).time
        for bound in (seconds, 2.0 * seconds):
            assert MappingDecoder(_trained_sign_policy(), instance).complete(prefix, bound=bound) == full


@pytest.mark.parametrize("mode", [P2P, ALLREDUCE])
def test_discrepancy_pass_never_loses_to_the_greedy_decode_and_stops_at_its_budget(mode, monkeypatch):
    monkeypatch.setattr("tag.planners.learned_mapper._threshold_pass", lambda env, decoder, best, *args: best)
    problem = _problem(7, 4, 4, "random-blk-1:16,seed=4")
    policy = _trained_sign_policy()
    greedy = learned_mapping(problem, policy, instantiation=mode, iterations=0, discrepancies=0)
    searched = learned_mapping(problem, policy, instantiation=mode, iterations=0)
    assert max_stage_time(problem, searched, mode) <= max_stage_time(problem, greedy, mode)
    calls = []
    original = MappingDecoder.complete
    monkeypatch.setattr(MappingDecoder, "complete", lambda self, devices, **kw: calls.append(kw.get("bound"))
                        or original(self, devices, **kw))
    learned_mapping(problem, policy, instantiation=mode, iterations=0, discrepancies=5)
    leaves = [bound for bound in calls if bound is not None]  # the pass's leaves (the env's fill has no bound)
    assert len(leaves) == 5 and leaves == sorted(leaves, reverse=True)  # each bounded by the best so far


def test_threshold_pass_climbs_from_the_lower_bound_and_never_loses(monkeypatch):
    """The pass decodes under thresholds rising geometrically from the lower bound towards the greedy
    decode's time, and keeps the greedy leaf unless a decode is faster."""
    from tag.planners.learned_mapper import THRESHOLD_STEPS, _threshold_pass

    problem = _problem(3, 4, 4, "mesh2d:4x4")
    decoder = MappingDecoder(_trained_sign_policy(), MappingInstance.build(problem, ALLREDUCE, *search_order(problem)))
    env = MappingEnv(problem, instantiation=ALLREDUCE, fill=decoder.complete)
    greedy = env.evaluate(env.root())
    bounds = []
    original = MappingDecoder.complete
    monkeypatch.setattr(MappingDecoder, "complete", lambda self, devices, **kw: bounds.append(kw["bound"])
                        or original(self, devices, **kw))
    lower = 0.5 * greedy.time
    best = _threshold_pass(env, decoder, greedy, lower, np.inf)
    assert best.time <= greedy.time and len(bounds) <= THRESHOLD_STEPS
    np.testing.assert_allclose(bounds, [lower * 2.0 ** (i / THRESHOLD_STEPS) for i in range(len(bounds))])
    assert best is greedy or len(bounds) < THRESHOLD_STEPS or best.time < greedy.time


@pytest.mark.parametrize("mode", [P2P, ALLREDUCE])
def test_learned_mapper_is_valid_and_never_worse_than_cs(mode):
    """Even an untrained policy: the CS map is among the search's candidates."""
    torch.manual_seed(0)
    problem = _problem(5, 4, 4, "uniform-dist:16,seed=2")
    mapping = learned_mapping(problem, MappingPolicy(SMALL), instantiation=mode, iterations=8)
    assert mapping.shape == (4, 4) and sorted(mapping.reshape(-1).tolist()) == list(range(16))
    assert max_stage_time(problem, mapping, mode) <= max_stage_time(problem, cs_map(problem), mode) + 1e-12


def test_learned_mapper_skips_the_search_when_the_greedy_decode_meets_the_bound(monkeypatch):
    """Equal links and one GPU type: every mapping meets the quick lower bound, so no MCTS runs."""
    import tag.planners.learned_mapper

    problem = MappingProblem(np.array([1.0, 2.0]), np.array([0]), np.array([1]), np.array([1e8]),
                             np.array([1e9, 1e9]), 3, np.full((6, 6), 1e10))
    monkeypatch.setattr(tag.planners.learned_mapper, "mcts_search", lambda *args, **kwargs: pytest.fail("the search ran"))
    monkeypatch.setattr("tag.planners.learned_mapper._discrepancy_pass", lambda *args: pytest.fail("the pass ran"))
    for mode in (P2P, ALLREDUCE):
        mapping = learned_mapping(problem, MappingPolicy(SMALL), instantiation=mode)
        assert sorted(mapping.reshape(-1).tolist()) == list(range(6))


def test_imitation_lowers_the_loss_on_exact_targets():
    """A few Adam steps on exact mappings of three small problems fit them better (not to zero: devices
    the topology makes equivalent get equal scores from an equivariant network, a floor of log(ties))."""
    torch.manual_seed(0)
    parmesan_and_tag = ("2d mesh", "2d torus", "random_blk_1", "random_blk_2", "uniform_dist", "hierarchical")
    examples = build_examples(3, 1000, devices=(8,), time_limit=2.0, families=parmesan_and_tag)
    assert all(e.proven for e in examples)
    instances = [MappingInstance.build(e.problem, e.instantiation, *_order(e)) for e in examples]
    policy = MappingPolicy(SMALL)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)

    def loss() -> torch.Tensor:
        return sum(imitation_loss(policy(i), i, e.devices) for i, e in zip(instances, examples)) / 3

    with torch.no_grad():
        before = float(loss())
    for _ in range(60):
        optimizer.zero_grad()
        value = loss()
        value.backward()
        optimizer.step()
    with torch.no_grad():
        assert float(loss()) < 0.8 * before


def _order(example):
    env = MappingEnv(example.problem, instantiation=example.instantiation, lower_bound=example.lower_bound)
    return env.slot_stage, env.slot_replica


def test_checkpoint_round_trip_and_bad_files(tmp_path):
    torch.manual_seed(0)
    policy = MappingPolicy(SMALL)
    path = tmp_path / "mapper.pt"
    save_mapping_policy(path, policy, step=7, meta={"note": "x"})
    loaded = load_mapping_policy(path)
    assert loaded.step == 7 and loaded.config == SMALL and loaded.meta == {"note": "x"}
    for name, value in policy.state_dict().items():
        assert torch.equal(value, loaded.model.state_dict()[name])
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(PolicyError, match="not a readable mapping policy"):
        load_mapping_policy(tmp_path / "bad.pt")
    torch.save({"format": "tag.policy"}, tmp_path / "other.pt")
    with pytest.raises(PolicyError, match="not a mapping policy checkpoint"):
        load_mapping_policy(tmp_path / "other.pt")
    with pytest.raises(PolicyError, match="no mapping policy checkpoint"):
        make_mapper("learned", policy=tmp_path / "missing.pt")


def test_training_resumes_where_it_stopped(tmp_path):
    """Two epochs in one go equal one epoch, an interruption, and a resumed second epoch."""
    base = dict(instances=6, validation=2, devices=(8,), exact_time_limit=1.0, batch=3, policy=SMALL)
    whole = train_mapper(MapperTrainConfig(epochs=2, **base), tmp_path / "whole")
    train_mapper(MapperTrainConfig(epochs=1, **base), tmp_path / "parts")
    with pytest.raises(TrainingError, match="exists"):
        train_mapper(MapperTrainConfig(epochs=2, **base), tmp_path / "parts")
    parts = train_mapper(MapperTrainConfig(epochs=2, **base), tmp_path / "parts", resume=True)
    assert [round(r["loss"], 6) for r in parts["history"]] == [round(r["loss"], 6) for r in whole["history"]]
    a = load_mapping_policy(tmp_path / "whole" / "checkpoint.pt").model.state_dict()
    b = load_mapping_policy(tmp_path / "parts" / "checkpoint.pt").model.state_dict()
    for name in a:
        torch.testing.assert_close(a[name], b[name])


def test_shipped_mapper_places_a_pipeline_from_the_cli(capsys):
    """`tag pipeline --mapper learned` with the shipped checkpoints/tag-mapper.pt: a valid mapping whose
    objective is at least the exact mapper's lower bound and at most CS map's."""
    assert load_mapping_policy(shipped_mapping_checkpoint()).step > 0
    args = ("pipeline", "vgg19", "--tiny", "--cluster", "tag-testbed", "--stages", "4", "--replicas", "4")
    learned = run_json(capsys, *args, "--mapper", "learned")
    cs = run_json(capsys, *args, "--mapper", "cs")
    exact = run_json(capsys, *args, "--mapper", "exact")
    fast = run_json(capsys, *args, "--mapper", "learned-fast")
    for result in (learned, fast):
        devices = [d for stage in result["mapping"] for d in stage]
        assert len(devices) == 16 and len(set(devices)) == 16
        assert (exact["max_stage_time_s"] * (1 - 1e-9) <= result["max_stage_time_s"]
                <= cs["max_stage_time_s"] * (1 + 1e-9))
