import dataclasses
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import make_graph
from tag.cluster import resolve_cluster
from tag.errors import SchemaError, TagError
from tag.strategy import (
    ALLREDUCE,
    DUPLICATE,
    MODEL_PARALLEL,
    OPTIONS,
    PS,
    SINGLE_DEVICE_OPTION,
    PlanError,
    PlanMismatchError,
    Strategy,
    StrategyError,
    candidate_actions,
    count_actions,
    graph_fingerprint,
    load_plan,
    make_plan,
    replica_fractions,
    replicas,
    restricted_actions,
    save_plan,
)

# Peak fp32 TFLOP/s of the tag-testbed GPUs.
V100, GTX1080TI, P100 = 15.7, 11.3, 9.3


@pytest.fixture(scope="module")
def testbed():
    # device groups: 0 = 4 x V100 (devices 0-3), 1-4 = 2 x 1080Ti each (4-11), 5-6 = 2 x P100 each (12-15)
    return resolve_cluster("tag-testbed")


@pytest.fixture
def chain():
    graph = make_graph([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)])
    graph.meta["model"] = "chain6"
    return graph


# ---------------------------------------------------------------------------------------------- options


def test_options_are_named_ints():
    assert (ALLREDUCE, PS, DUPLICATE, MODEL_PARALLEL) == (0, 1, 2, 3)
    assert OPTIONS == ("allreduce", "ps", "duplicate", "model_parallel")


# ---------------------------------------------------------------------------------------------- validation

SIZES = [2, 2, 1]


@pytest.mark.parametrize(
    "placement, option, batch_split, message",
    [
        ([[1, 0, 0], [0, 0, 0]], [0, 0], "even", "op group 1 is placed on no device group"),
        ([[1, 0], [0, 1]], [0, 0], "even", "placement has 2 columns, but there are 3 device groups"),
        ([1, 0, 0], [0], "even", "placement must be a [G, M] matrix"),
        (np.zeros((0, 3)), [], "even", "at least one op group"),
        ([[1, 0, 0], [1, 1]], [0, 0], "even", "rows of equal length"),
        ([[2, 0, 0]], [0], "even", "placement must hold 0/1"),
        ([[1, 0, 0], [0, 1, 0]], [0], "even", "option has 1 entries for 2 op groups"),
        ([[1, 1, 0]], [7], "even", "option[0]"),
        ([[1, 1, 0]], np.array([4]), "even", "option[0] = 4 is not an option"),
        ([[1, 1, 0]], ["ring"], "even", "unknown option 'ring'"),
        ([[1, 1, 0]], [True], "even", "unknown option True"),
        ([[1, 1, 0]], [0], "fastest", "batch_split must be one of 'even', 'speed'"),
    ],
)
def test_invalid_strategies_raise_one_clear_error(placement, option, batch_split, message):
    with pytest.raises(StrategyError) as error:
        Strategy(placement, option, SIZES, batch_split)
    assert message in str(error.value)
    assert isinstance(error.value, TagError)


@pytest.mark.parametrize("sizes", [[], [2, 0], [[2, 2]], [1.5, 2]])
def test_bad_device_group_sizes(sizes):
    with pytest.raises(StrategyError, match="device_group_sizes"):
        Strategy([[1]], [0], sizes)


def test_single_device_rows_are_normalised():
    # Device group 2 has one device: every option there means "the whole batch on that device".
    a = Strategy([[0, 0, 1], [1, 0, 0], [0, 0, 1]], ["allreduce", "ps", "model_parallel"], SIZES)
    assert a.option.tolist() == [SINGLE_DEVICE_OPTION, PS, SINGLE_DEVICE_OPTION]
    b = Strategy([[0, 0, 1], [1, 0, 0], [0, 0, 1]], [DUPLICATE, PS, PS], SIZES)
    assert a == b and hash(a) == hash(b)
    assert a != Strategy([[0, 0, 1], [1, 0, 0], [0, 0, 1]], [DUPLICATE, ALLREDUCE, PS], SIZES)
    assert a != a.with_batch_split("speed")
    # Two devices (the mask [1, 0, 0] covers a group of 2, [0, 1, 1] covers 3): options kept.
    assert Strategy([[1, 0, 0], [0, 1, 1]], [MODEL_PARALLEL, ALLREDUCE], SIZES).option.tolist() == [3, 0]


def test_strategy_is_read_only():
    strategy = Strategy([[1, 1, 0]], [0], SIZES)
    with pytest.raises(ValueError):
        strategy.placement[0, 2] = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        strategy.batch_split = "speed"


def test_data_parallel(testbed):
    strategy = Strategy.data_parallel(5, testbed)
    assert strategy.placement.shape == (5, 7) and strategy.placement.all()
    assert strategy.option_names() == ["allreduce"] * 5
    assert strategy.batch_split == "even"
    assert strategy.devices_covered().tolist() == [16] * 5
    assert Strategy.data_parallel(5, testbed, option="ps", batch_split="speed").option.tolist() == [PS] * 5
    assert repr(strategy) == "Strategy(G=5, M=7, even: " + " ".join(["1111111/AR"] * 5) + ")"
    assert repr(Strategy.data_parallel(10, testbed)).endswith("1111111/AR ... +2)")
    with pytest.raises(StrategyError, match="positive integer"):
        Strategy.data_parallel(0, testbed)


def test_single_device(testbed):
    lone = dataclasses.replace(testbed, device_group=np.arange(testbed.num_devices))  # every device its own group
    strategy = Strategy.single_device(3, lone, 4)
    assert strategy.placement.sum() == 3 and strategy.placement[:, 4].all()
    assert strategy.option.tolist() == [SINGLE_DEVICE_OPTION] * 3
    with pytest.raises(StrategyError, match="device group 0 of cluster 'tag-testbed' has 4 devices"):
        Strategy.single_device(3, testbed, 0)
    on_machine = Strategy.single_device(3, testbed, 0, option="allreduce")
    assert on_machine.devices_covered().tolist() == [4, 4, 4]
    with pytest.raises(StrategyError, match="device_group must be in 0..6"):
        Strategy.single_device(3, testbed, 7)


def test_with_group_is_functional(testbed):
    base = Strategy.data_parallel(3, testbed)
    changed = base.with_group(1, [1, 1, 0, 0, 0, 0, 0], "model_parallel")
    assert base.placement.all() and base.option.tolist() == [0, 0, 0]
    assert changed.placement[1].tolist() == [True, True, False, False, False, False, False]
    assert changed.option.tolist() == [ALLREDUCE, MODEL_PARALLEL, ALLREDUCE]
    assert base.with_group(1, np.ones(7, bool), ALLREDUCE) == base
    with pytest.raises(StrategyError, match="op group must be in 0..2"):
        base.with_group(3, np.ones(7), 0)
    with pytest.raises(StrategyError, match=r"mask has shape \(3,\)"):
        base.with_group(0, [1, 0, 0], 0)
    with pytest.raises(StrategyError, match="placed on no device group"):
        base.with_group(0, np.zeros(7), 0)


# ---------------------------------------------------------------------------------------------- replicas


def test_replicas_even_data_parallel(testbed):
    r = replicas(Strategy.data_parallel(2, testbed), testbed, 1)
    assert r.devices.tolist() == list(range(16))
    np.testing.assert_allclose(r.batch_fraction, np.full(16, 1 / 16))
    np.testing.assert_allclose(r.op_fraction, np.ones(16))
    assert r.synchronised and not r.model_parallel
    assert r.pairs()[0] == (0, 1 / 16)


def test_replicas_by_speed_data_parallel(testbed):
    r = replicas(Strategy.data_parallel(1, testbed, batch_split="speed"), testbed, 0)
    total = 4 * V100 + 8 * GTX1080TI + 4 * P100  # 190.4
    expected = [V100 / total] * 4 + [GTX1080TI / total] * 8 + [P100 / total] * 4
    np.testing.assert_allclose(r.batch_fraction, expected, rtol=1e-12)
    assert r.batch_fraction.sum() == pytest.approx(1.0)
    assert r.batch_fraction[0] == pytest.approx(0.0824579832)  # 15.7 / 190.4


def test_replicas_by_speed_on_two_device_groups(testbed):
    strategy = Strategy.from_cluster(testbed, [[1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1, 1]], ["ps", "allreduce"],
                                     batch_split="speed")
    v100_1080 = replicas(strategy, testbed, 0)
    assert v100_1080.devices.tolist() == [0, 1, 2, 3, 4, 5]
    np.testing.assert_allclose(v100_1080.batch_fraction, [15.7 / 85.4] * 4 + [11.3 / 85.4] * 2, rtol=1e-12)
    p100s = replicas(strategy, testbed, 1)  # one GPU type: speed split is even
    assert p100s.devices.tolist() == [12, 13, 14, 15]
    np.testing.assert_allclose(p100s.batch_fraction, [0.25] * 4)


def test_replicas_duplicate_and_model_parallel(testbed):
    strategy = Strategy.from_cluster(testbed, [[1, 1, 0, 0, 0, 0, 0]] * 2, ["duplicate", "model_parallel"],
                                     batch_split="speed")
    duplicate = replicas(strategy, testbed, 0)
    np.testing.assert_allclose(duplicate.batch_fraction, np.ones(6))  # every copy computes the whole batch
    np.testing.assert_allclose(duplicate.op_fraction, np.ones(6))
    assert not duplicate.synchronised and not duplicate.model_parallel
    split = replicas(strategy, testbed, 1)
    assert split.model_parallel and not split.synchronised
    np.testing.assert_allclose(split.batch_fraction, np.ones(6))  # devices share the ops, not the batch
    np.testing.assert_allclose(split.op_fraction, [15.7 / 85.4] * 4 + [11.3 / 85.4] * 2, rtol=1e-12)
    even = replicas(strategy.with_batch_split("even"), testbed, 1)
    np.testing.assert_allclose(even.op_fraction, np.full(6, 1 / 6))


def test_replicas_on_a_single_device(testbed):
    lone = dataclasses.replace(testbed, device_group=np.arange(testbed.num_devices))
    strategy = Strategy.from_cluster(lone, np.eye(16, dtype=bool)[[7]], ["allreduce"], batch_split="speed")
    r = replicas(strategy, lone, 0)
    assert r.pairs() == [(7, 1.0)] and r.op_fraction.tolist() == [1.0] and r.option == DUPLICATE


def test_replica_fractions_match_replicas(testbed):
    rng = np.random.default_rng(0)
    placement = rng.random((12, 7)) < 0.4
    placement[np.arange(12), rng.integers(0, 7, 12)] = True
    for split in ("even", "speed"):
        strategy = Strategy.from_cluster(testbed, placement, rng.integers(0, 4, 12), batch_split=split)
        batch, ops = replica_fractions(strategy, testbed)
        assert batch.shape == ops.shape == (12, 16)
        for g in range(12):
            r = replicas(strategy, testbed, g)
            assert np.flatnonzero(batch[g]).tolist() == r.devices.tolist()
            np.testing.assert_allclose(batch[g, r.devices], r.batch_fraction)
            np.testing.assert_allclose(ops[g, r.devices], r.op_fraction)


def test_replicas_reject_another_cluster(testbed):
    strategy = Strategy.data_parallel(2, testbed)
    with pytest.raises(StrategyError, match="cluster 'tag-cloud' has 6 of"):
        replicas(strategy, resolve_cluster("tag-cloud"), 0)
    with pytest.raises(StrategyError, match="op group must be in 0..1"):
        replicas(strategy, testbed, 2)


# ---------------------------------------------------------------------------------------------- actions


def _brute_force(sizes):
    """Every (mask, option) there is, normalised by Strategy: the distinct plans for one group."""
    actions = set()
    for bits in itertools.product([0, 1], repeat=len(sizes)):
        if any(bits):
            for option in range(len(OPTIONS)):
                strategy = Strategy([bits], [option], sizes)
                actions.add((bits, int(strategy.option[0])))
    return actions


@pytest.mark.parametrize("sizes", [s for m in range(1, 5) for s in itertools.product([1, 2, 3], repeat=m)][::3])
def test_candidate_actions_equal_brute_force(sizes):
    masks, options = candidate_actions(sizes)
    listed = [(tuple(int(b) for b in m), int(o)) for m, o in zip(masks, options)]
    assert masks.shape == (len(listed), len(sizes)) and options.dtype == np.int8
    assert len(set(listed)) == len(listed)  # no action twice
    assert set(listed) == _brute_force(sizes)
    assert len(listed) == count_actions(sizes)


@pytest.mark.parametrize("num_device_groups, expected", [(1, 4), (2, 12), (3, 28), (4, 60)])
def test_candidate_counts_multi_device_groups(num_device_groups, expected):
    # Every group of 2 devices: 4 options on each of the 2^M - 1 masks.
    masks, options = candidate_actions([2] * num_device_groups)
    assert len(options) == expected == len(_brute_force([2] * num_device_groups))


def test_candidate_counts_single_device_groups():
    # M single-device groups: M one-device masks (1 action each) + 4 per other mask.
    assert [len(candidate_actions([1] * m)[1]) for m in range(1, 5)] == [1, 1 * 2 + 4 * 1, 3 + 4 * 4, 4 + 4 * 11]


def test_candidate_actions_order_and_cap(testbed):
    masks, options = candidate_actions([2, 1])
    assert masks.astype(int).tolist() == [[1, 0]] * 4 + [[0, 1]] + [[1, 1]] * 4
    assert options.tolist() == [0, 1, 2, 3, DUPLICATE, 0, 1, 2, 3]
    assert len(candidate_actions(testbed)[1]) == 4 * 127
    with pytest.raises(StrategyError, match="restricted_actions"):
        candidate_actions(resolve_cluster("dgx1x4"))
    with pytest.raises(StrategyError, match="max_device_groups=3"):
        candidate_actions([2] * 4, max_device_groups=3)


def test_restricted_actions_on_dgx1x4():
    cluster = resolve_cluster("dgx1x4")  # 4 machines x 4 device groups of 2 V100 (NVLink pairs)
    masks, options = restricted_actions(cluster)
    unique_masks = np.unique(masks, axis=0)
    # 16 singles + 15 prefixes (k = 2..16) + 4 machines + 4 * 6 pairs, less prefix 2 = pair (0, 1) and
    # prefix 4 = machine 0.
    assert len(unique_masks) == 16 + 15 + 4 + 24 - 2
    assert len(options) == 4 * len(unique_masks)
    assert masks.all(axis=1).any()  # data parallelism is a candidate
    group_machine = cluster.machine[[g[0] for g in cluster.device_groups()]]
    pairs = unique_masks[unique_masks.sum(axis=1) == 2]
    assert all(len(set(group_machine[m])) == 1 for m in pairs)


def test_restricted_actions_are_candidates(testbed):
    every = {(m.tobytes(), int(o)) for m, o in zip(*candidate_actions(testbed))}
    masks, options = restricted_actions(testbed, num_fastest=3)
    assert {(m.tobytes(), int(o)) for m, o in zip(masks, options)} <= every
    # Fastest first: the V100 group, then 1080Ti groups 1 and 2.
    assert masks.astype(int).tolist()[-1] == [1, 1, 1, 0, 0, 0, 0]


# ---------------------------------------------------------------------------------------------- plans


@pytest.fixture
def plan(testbed, chain):
    strategy = Strategy.from_cluster(testbed, [[1] * 7, [1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1, 1]],
                                     ["allreduce", "model_parallel", "duplicate"], batch_split="speed")
    return make_plan(strategy, chain, testbed, assignment=[0, 0, 1, 1, 2, 2],
                     summary={"iteration_time": np.float64(0.125), "speedup": 1.5, "oom": False,
                              "per_device": np.arange(3), "missing": float("inf")})


def test_plan_round_trip(tmp_path, plan, testbed, chain):
    path = tmp_path / "plans" / "plan.json"
    save_plan(plan, path)
    loaded = load_plan(path, graph=chain, cluster=testbed)
    assert loaded == plan
    assert loaded.strategy == plan.strategy
    assert loaded.assignment.tolist() == [0, 0, 1, 1, 2, 2]
    assert loaded.summary == {"iteration_time": 0.125, "speedup": 1.5, "oom": False, "per_device": [0, 1, 2],
                              "missing": None}
    doc = json.loads(path.read_text())
    assert doc["format"] == "tag.plan" and doc["schema_version"] == 1 and doc["kind"] == "strategy"
    assert doc["model"] == {"name": "chain6", "fingerprint": graph_fingerprint(chain)}
    assert doc["cluster"]["name"] == "tag-testbed" and doc["cluster"]["fingerprint"] == testbed.fingerprint()
    assert doc["grouping"]["num_groups"] == 3
    assert doc["strategy"]["option"] == ["allreduce", "model_parallel", "duplicate"]
    assert doc["strategy"]["placement"][1] == [1, 1, 0, 0, 0, 0, 0]
    assert "[1,1,0,0,0,0,0]" in path.read_text()  # one line per placement row
    assert os.listdir(path.parent) == ["plan.json"]  # no temporary file left


def test_plan_for_another_cluster(tmp_path, plan):
    save_plan(plan, tmp_path / "plan.json")
    cloud = resolve_cluster("tag-cloud")
    with pytest.raises(PlanMismatchError) as error:
        load_plan(tmp_path / "plan.json", cluster=cloud)
    message = str(error.value)
    assert "plan.json was made for cluster 'tag-testbed' (fingerprint " in message
    assert f"not 'tag-cloud' ({cloud.fingerprint()[:12]}…)" in message
    assert isinstance(error.value, TagError)


def test_plan_for_another_device_grouping(tmp_path, plan, testbed):
    save_plan(plan, tmp_path / "plan.json")
    regrouped = dataclasses.replace(testbed, device_group=np.arange(testbed.num_devices))
    assert regrouped.fingerprint() == testbed.fingerprint()  # the grouping does not enter the fingerprint
    with pytest.raises(PlanMismatchError, match="groups the devices of cluster 'tag-testbed'"):
        load_plan(tmp_path / "plan.json", cluster=regrouped)


def test_plan_for_another_model(tmp_path, plan, chain):
    save_plan(plan, tmp_path / "plan.json")
    other = make_graph([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)], flops=[1.0] * 6)
    other.meta["model"] = "chain6-changed"
    with pytest.raises(PlanMismatchError, match=r"was made for model 'chain6' \(fingerprint [0-9a-f]{12}…\), "
                                                r"not 'chain6-changed'"):
        load_plan(tmp_path / "plan.json", graph=other)
    load_plan(tmp_path / "plan.json", graph=chain)  # the right model passes


def _rewrite(path, edit):
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(format="tag.opgraph"), "field 'format' must be 'tag.plan'"),
        (lambda d: d.update(schema_version=2), "unsupported schema_version 2"),
        (lambda d: d.pop("strategy"), "missing field 'strategy'"),
        (lambda d: d["cluster"].pop("fingerprint"), "missing field 'cluster.fingerprint'"),
        (lambda d: d["model"].pop("name"), "missing field 'model.name'"),
        (lambda d: d["strategy"].pop("batch_split"), "missing field 'strategy.batch_split'"),
        (lambda d: d["grouping"].update(num_groups="3"), "field 'grouping.num_groups' must be an integer"),
        (lambda d: d["strategy"]["option"].__setitem__(1, "ring"), r"strategy.option\[1\] is 'ring'"),
        (lambda d: d["strategy"]["placement"].__setitem__(2, [0] * 7), "op group 2 is placed on no device group"),
        (lambda d: d["strategy"]["placement"].__setitem__(0, [1, 2]), r"strategy.placement\[0\] must be a list of 0/1"),
        (lambda d: d["grouping"].update(num_groups=4), "grouping.num_groups is 4 but strategy.placement has 3 rows"),
        (lambda d: d["grouping"]["assignment"].__setitem__(0, 9), "assignment\\[0\\] = 9 is not an op group"),
        (lambda d: d["cluster"].update(device_group=[0] * 16), "strategy: placement has 7 columns, but there are 1 device groups"),
        (lambda d: d.update(summary=[]), "field 'summary' must be an object"),
    ],
)
def test_malformed_plan_names_the_field(tmp_path, plan, edit, message):
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    _rewrite(path, edit)
    with pytest.raises(PlanError, match=message) as error:
        load_plan(path)
    assert str(error.value).startswith(str(path))
    assert isinstance(error.value, SchemaError)


def test_corrupt_plan_file(tmp_path, plan):
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    path.write_bytes(path.read_bytes()[:100])  # truncated
    with pytest.raises(PlanError, match="not a valid JSON plan file"):
        load_plan(path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PlanError, match="not a valid JSON plan file"):
        load_plan(path)
    with pytest.raises(PlanError, match="no such plan file"):
        load_plan(tmp_path / "missing.json")


def test_failed_save_keeps_the_old_file(tmp_path, plan):
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    before = path.read_bytes()
    bad = dataclasses.replace(plan, summary={"callback": object()})
    with pytest.raises(TypeError):
        save_plan(bad, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["plan.json"]
    with pytest.raises(TypeError, match="expected a Plan first"):
        save_plan(path, plan)


def test_make_plan_checks_its_inputs(testbed, chain):
    strategy = Strategy.data_parallel(3, testbed)
    with pytest.raises(StrategyError, match="assignment has 2 entries for 6 ops"):
        make_plan(strategy, chain, testbed, assignment=[0, 1])
    with pytest.raises(StrategyError, match="give the assignment"):
        make_plan(strategy, chain, testbed)
    with pytest.raises(StrategyError, match="cluster 'tag-cloud'"):
        make_plan(strategy, chain, resolve_cluster("tag-cloud"), assignment=[0] * 6)
    by_fingerprint = make_plan(strategy, chain, testbed, grouping_fingerprint="ab" * 32)
    assert by_fingerprint.assignment is None and by_fingerprint.grouping_fingerprint == "ab" * 32


# ---------------------------------------------------------------------------------------------- fingerprint


def _chain(**columns):
    return make_graph([(0, 1), (1, 2), (2, 3), (0, 3)], **columns)


def test_graph_fingerprint_is_stable():
    first, second = _chain(), _chain()
    assert graph_fingerprint(first) == graph_fingerprint(second)
    assert len(graph_fingerprint(first)) == 64
    second.meta["model"] = "renamed"  # meta is not identity
    assert graph_fingerprint(first) == graph_fingerprint(second)
    reordered = make_graph([(0, 3), (2, 3), (0, 1), (1, 2)])  # the same edges listed in another order
    assert graph_fingerprint(reordered) == graph_fingerprint(first)


def test_graph_fingerprint_is_stable_across_processes():
    code = ("import sys; sys.path.insert(0, 'tests'); from conftest import make_graph; "
            "from tag.strategy import graph_fingerprint; "
            "print(graph_fingerprint(make_graph([(0, 1), (1, 2), (2, 3), (0, 3)])))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == graph_fingerprint(_chain())


@pytest.mark.parametrize(
    "change",
    [
        lambda g: g.names.__setitem__(0, "renamed"),
        lambda g: g.kinds.__setitem__(1, "aten.mm"),
        lambda g: g.role.__setitem__(2, 2),
        lambda g: g.flops.__setitem__(3, 41.0),
        lambda g: g.split.__setitem__(0, 1),
        lambda g: g.param_bytes.__setitem__(0, 4.0),
        lambda g: g.edge_bytes.__setitem__(0, 8.0),
    ],
)
def test_graph_fingerprint_changes_with_a_column(change):
    graph = _chain()
    before = graph_fingerprint(graph)
    change(graph)
    assert graph_fingerprint(graph) != before


def test_graph_fingerprint_changes_with_edges_and_batch():
    base = graph_fingerprint(_chain())
    assert graph_fingerprint(make_graph([(0, 1), (1, 2), (2, 3), (1, 3)])) != base
    assert graph_fingerprint(_chain().with_batch_size(8)) != base
