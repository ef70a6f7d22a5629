import numpy as np
import pytest
import torch

from tag.cluster import Cluster, resolve_cluster
from tag.compiler import compile_strategy
from tag.errors import OutputError
from tag.graph.resolve import resolve_model
from tag.grouping import GroupGraph, group_ops
from tag.policy import (
    ACTION,
    DECIDES,
    DEVICE,
    DEVICE_FEATURES,
    FED_BY,
    FEEDS,
    HOSTS,
    IN_MASK,
    LINK,
    LINK_FEATURES,
    OP,
    OP_FEATURES,
    PLACED_ON,
    PLACEMENT_FEATURES,
    TENSOR_FEATURES,
    FeatureCache,
    GNNEvaluator,
    PolicyConfig,
    PolicyError,
    action_log_probs,
    build_policy,
    load_policy,
    policy_loss,
    save_policy,
    segment_log_softmax,
    state_to_data,
)
from tag.search.base import PlacementState
from tag.strategy import PS, Strategy, candidate_actions

SMALL = PolicyConfig(hidden=16, heads=2, decoder_hidden=16)  # fast enough for the fitting tests


def make_state(gg: GroupGraph, cluster: Cluster, *, decided: int = 2, feedback: bool = True,
               strategy: Strategy | None = None) -> PlacementState:
    """The state after ``decided`` levels of MCTS: groups in descending compute order, DP fill."""
    order = gg.order_by_compute()
    strategy = strategy if strategy is not None else Strategy.data_parallel(gg.num_groups, cluster)
    mask = np.zeros(gg.num_groups, dtype=bool)
    mask[order[:decided]] = True
    masks, options = candidate_actions(cluster)
    next_group = int(order[decided]) if decided < gg.num_groups else -1
    if next_group < 0:
        masks, options = masks[:0], options[:0]
    fb = compile_strategy(gg, strategy, cluster).simulate().feedback if feedback else None
    return PlacementState(gg, cluster, strategy, mask, next_group, masks, options, fb)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny graphs: torch's intra-op threads only contend with whatever else runs (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def testbed():
    return resolve_cluster("tag-testbed")


@pytest.fixture(scope="module")
def vgg(testbed):
    return group_ops(resolve_model("vgg19-tiny"), num_groups=10, gpus=testbed)


@pytest.fixture(scope="module")
def state(vgg, testbed):
    return make_state(vgg, testbed)


@pytest.fixture(scope="module")
def model():
    return build_policy(seed=0)


def scaled_cluster(cluster: Cluster, c: float) -> Cluster:
    """``cluster`` with every link c times slower."""
    return Cluster(cluster.name, cluster.types, cluster.device_type, cluster.machine, cluster.bandwidth / c,
                   cluster.latency * c, cluster.nic_bandwidth / c, cluster.device_group)


# ------------------------------------------------------------------------------------------------ features


def test_feature_shapes(state, vgg, testbed):
    data = state_to_data(state)
    g, m, a = vgg.num_groups, testbed.num_device_groups, len(state.options)
    assert data[OP].x.shape == (g, len(OP_FEATURES)) and data[OP].x.dtype == torch.float32
    assert data[DEVICE].x.shape == (m, len(DEVICE_FEATURES))
    edges = vgg.graph.edge_src.size
    assert data[FEEDS].edge_attr.shape == (edges, len(TENSOR_FEATURES))
    assert torch.equal(data[FED_BY].edge_index, data[FEEDS].edge_index.flip(0))
    assert data[LINK].edge_attr.shape == (m * (m - 1), len(LINK_FEATURES))
    assert data[PLACED_ON].edge_attr.shape == (g * m, len(PLACEMENT_FEATURES))
    assert data[HOSTS].edge_index.shape == (2, g * m)
    assert data[ACTION].num_nodes == a == 4 * 127  # no device group of tag-testbed has a single device
    assert data[IN_MASK].edge_index.shape == (2, int(state.masks.sum()))
    assert torch.all(data[DECIDES].edge_index[0] == state.next_group)
    assert torch.equal(data[DECIDES].edge_index[1], torch.arange(a))


def test_flags_and_strategy_encoding(vgg, testbed):
    order = vgg.order_by_compute()
    strategy = Strategy.data_parallel(vgg.num_groups, testbed).with_group(int(order[0]), [1, 1, 0, 0, 0, 0, 0], PS)
    state = make_state(vgg, testbed, decided=1, strategy=strategy, feedback=False)
    x = state_to_data(state)[OP].x
    column = {name: k for k, name in enumerate(OP_FEATURES)}
    assert x[:, column["decided"]].tolist() == state.decided.astype(float).tolist()
    assert x[:, column["next"]].nonzero().flatten().tolist() == [int(order[1])]
    options = x[:, column["option_allreduce"]:column["option_model_parallel"] + 1]
    assert options.argmax(1).tolist() == strategy.option.tolist()
    placed = state_to_data(state)[PLACED_ON].edge_attr[:, PLACEMENT_FEATURES.index("placed")]
    assert placed.view(vgg.num_groups, -1).bool().numpy().tolist() == strategy.placement.tolist()
    covered = x[:, column["devices_covered"]]
    assert covered[int(order[0])] == pytest.approx(6 / 16) and covered[int(order[1])] == 1.0


def test_normalisation(state, vgg, testbed):
    data = state_to_data(state)
    op = {name: data[OP].x[:, k].double().numpy() for k, name in enumerate(OP_FEATURES)}
    times = vgg.compute_table(testbed).mean(axis=1)
    tau = np.linalg.norm(times)
    assert np.linalg.norm(op["compute_time"]) == pytest.approx(1.0, rel=1e-6)
    fastest = testbed.bandwidth[~np.eye(testbed.num_devices, dtype=bool)].max()
    out_bytes = np.bincount(vgg.graph.edge_src, weights=vgg.graph.edge_bytes, minlength=vgg.num_groups)
    np.testing.assert_allclose(op["output_bytes"], out_bytes / (tau * fastest), rtol=1e-6)
    np.testing.assert_allclose(op["makespan"], state.feedback.group_makespan / tau, rtol=1e-6)
    device = {name: data[DEVICE].x[:, k].double().numpy() for k, name in enumerate(DEVICE_FEATURES)}
    assert device["devices"].sum() == pytest.approx(1.0)
    assert device["intra_bandwidth"].max() == pytest.approx(1.0)  # the NVLink V100 group holds the fastest link
    assert device["placed_compute"] == pytest.approx(np.ones(7))  # data parallel: everything everywhere
    assert device["speed"][0] > device["speed"][1]  # a V100 beats a 1080 Ti


@pytest.mark.parametrize("c", [7.3, 0.01])
def test_scale_invariance(state, vgg, testbed, c):
    """Everything c times slower (compute times × c, bandwidths ÷ c, feedback times × c): same features."""
    slow_graph = GroupGraph(vgg.op_graph, vgg.graph, vgg.assignment, vgg.gpu_types, vgg.compute_time * c, vgg.cost)
    slow_cluster = scaled_cluster(testbed, c)
    fb = state.feedback
    slow_feedback = fb._replace(group_makespan=fb.group_makespan * c, group_output_idle=fb.group_output_idle * c)
    slow = state._replace(group_graph=slow_graph, cluster=slow_cluster, feedback=slow_feedback)
    base, other = state_to_data(state), state_to_data(slow)
    for store in (OP, DEVICE):
        torch.testing.assert_close(other[store].x, base[store].x, rtol=1e-5, atol=1e-7)
    for relation in (FEEDS, LINK, PLACED_ON):
        torch.testing.assert_close(other[relation].edge_attr, base[relation].edge_attr, rtol=1e-5, atol=1e-7)


def test_missing_feedback(vgg, testbed):
    data = state_to_data(make_state(vgg, testbed, feedback=False))
    with_feedback = state_to_data(make_state(vgg, testbed, feedback=True))
    for store, columns in ((OP, OP_FEATURES), (DEVICE, DEVICE_FEATURES)):
        k = columns.index("no_feedback")
        assert torch.all(data[store].x[:, k] == 1) and torch.all(with_feedback[store].x[:, k] == 0)
    for name in ("makespan", "output_idle"):
        assert torch.all(data[OP].x[:, OP_FEATURES.index(name)] == 0)
    assert torch.all(data[LINK].edge_attr[:, LINK_FEATURES.index("link_idle")] == 0)
    assert torch.all(data[LINK].edge_attr[:, LINK_FEATURES.index("no_feedback")] == 1)


def test_feature_cache_builds_each_pair_once_and_leaves_the_grouping_alone(state, vgg, testbed):
    """A FeatureCache builds the static part of a (grouping, cluster) pair once and shares it between the
    states of that pair; the features equal those built without a cache; nothing is stored on the
    GroupGraph; a full cache starts afresh."""
    before = set(vars(vgg))
    cache = FeatureCache(max_pairs=2)
    first, second = state_to_data(state, cache), state_to_data(make_state(vgg, testbed, decided=0), cache)
    assert len(cache) == 1 and second[FEEDS].edge_index is first[FEEDS].edge_index
    plain = state_to_data(state)
    assert plain[FEEDS].edge_index is not first[FEEDS].edge_index
    for store in (OP, DEVICE):
        assert torch.equal(plain[store].x, first[store].x)
    for relation in (FEEDS, LINK, PLACED_ON):
        assert torch.equal(plain[relation].edge_attr, first[relation].edge_attr)
    assert set(vars(vgg)) == before
    others = [scaled_cluster(testbed, c) for c in (2.0, 3.0)]
    state_to_data(state._replace(cluster=others[0]), cache)
    assert len(cache) == 2
    state_to_data(state._replace(cluster=others[1]), cache)
    assert len(cache) == 1  # full: started afresh with the new pair


def test_bad_state(state, testbed):
    with pytest.raises(PolicyError, match="masks"):
        state_to_data(state._replace(masks=state.masks[:, :3]))
    with pytest.raises(PolicyError, match="next_group"):
        state_to_data(state._replace(next_group=-1))
    with pytest.raises(PolicyError, match="decided"):
        state_to_data(state._replace(decided=state.decided[:3]))
    other = testbed.subset(range(8))
    with pytest.raises(PolicyError, match="strategy"):
        state_to_data(state._replace(cluster=other))


# ------------------------------------------------------------------------------------------------ model


def test_priors_are_a_distribution_over_the_candidates(model, state):
    evaluator = GNNEvaluator(model)
    priors = evaluator(state)
    assert priors.shape == (len(state.options),) and priors.dtype == np.float64
    assert (priors > 0).all() and priors.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_array_equal(evaluator(state), priors)  # deterministic


def test_terminal_state_has_no_priors(model, vgg, testbed):
    terminal = make_state(vgg, testbed, decided=vgg.num_groups, feedback=False)
    evaluator = GNNEvaluator(model)
    assert evaluator(terminal).shape == (0,)
    assert [p.shape for p in evaluator.batch([terminal])] == [(0,)]


def test_batch_equals_one_by_one(model, state, vgg, testbed):
    small_cluster = testbed.subset([0, 1, 4, 12, 13])
    other_graph = group_ops(resolve_model("transformer-tiny"), num_groups=6, gpus=small_cluster)
    states = [
        state,
        make_state(vgg, testbed, decided=0, feedback=False),
        make_state(vgg, testbed, decided=vgg.num_groups, feedback=False),  # terminal: no candidates
        make_state(other_graph, small_cluster, decided=3),
        state._replace(next_group=int(vgg.order_by_compute()[5])),
    ]
    evaluator = GNNEvaluator(model)
    batched = evaluator.batch(states)
    assert len(batched) == len(states)
    for one, together in zip((evaluator(s) for s in states), batched):
        assert one.shape == together.shape
        np.testing.assert_allclose(together, one, rtol=1e-5, atol=1e-9)


def test_decoder_reads_the_next_group(model, state, vgg):
    """TAG's single dense layer would give every op group the same priors; the variant must not."""
    evaluator = GNNEvaluator(model)
    other = state._replace(next_group=int(vgg.order_by_compute()[7]))
    assert not np.allclose(evaluator(state), evaluator(other), rtol=1e-4, atol=0)


@pytest.mark.parametrize("gamma_cross, changes", [(0.0, False), (0.1, True)])
def test_gamma_weights_the_cross_type_relations(state, gamma_cross, changes):
    model = build_policy(PolicyConfig(gamma_cross=gamma_cross), seed=1)
    data = state_to_data(state)
    before = model.embed(data.x_dict, data.edge_index_dict, data.edge_attr_dict)[DEVICE]
    data[OP].x = data[OP].x * 3.0 + 1.0  # op groups change; device groups hear of it only across types
    after = model.embed(data.x_dict, data.edge_index_dict, data.edge_attr_dict)[DEVICE]
    assert torch.allclose(before, after) is not changes


@pytest.mark.parametrize("address, devices, model_name, num_groups", [
    ("tag-testbed", [4], "vgg19-tiny", 4),  # one device: a single candidate action
    ("tag-testbed", [0, 1, 2, 3], "vgg19-tiny", 1),  # one device group, one op group: no edges at all
    ("two-level", None, "transformer-tiny", 8),
    ("tag-cloud", None, "resnet101-tiny", 12),
])
def test_any_number_of_groups_and_device_groups(model, address, devices, model_name, num_groups):
    cluster = resolve_cluster(address)
    cluster = cluster.subset(devices) if devices is not None else cluster
    gg = group_ops(resolve_model(model_name), num_groups=num_groups, gpus=cluster)
    state = make_state(gg, cluster, decided=0)
    priors = GNNEvaluator(model)(state)
    assert priors.shape == (len(state.options),) and priors.sum() == pytest.approx(1.0)
    assert np.isfinite(state_to_data(state)[OP].x.numpy()).all()


def test_segment_log_softmax():
    values = torch.tensor([1.0, 2.0, 3.0, -1.0, 5.0])
    segment = torch.tensor([0, 0, 0, 1, 1])
    out = segment_log_softmax(values, segment, 2)
    torch.testing.assert_close(out[:3], torch.log_softmax(values[:3], 0))
    torch.testing.assert_close(out[3:], torch.log_softmax(values[3:], 0))


def test_supervised_fit_decreases_the_loss(state, vgg, testbed):
    model = build_policy(SMALL, seed=0)
    data = [state_to_data(state), state_to_data(make_state(vgg, testbed, decided=0, feedback=False))]
    rng = np.random.default_rng(0)
    targets = [rng.dirichlet(np.full(len(state.options), 0.1)) for _ in data]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        optimizer.zero_grad()
        loss = policy_loss(model, data, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05
    with torch.no_grad():
        log_probs, _ = action_log_probs(model, data[0])
    assert float(log_probs.exp().sum()) == pytest.approx(1.0, abs=1e-5)


def test_policy_loss_checks_targets(model, state):
    data = state_to_data(state)
    with pytest.raises(PolicyError, match="targets\\[0\\]"):
        policy_loss(model, [data], [np.ones(3) / 3])
    with pytest.raises(PolicyError):
        policy_loss(model, [data], [])


def test_build_policy_is_seeded():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = build_policy(SMALL, seed=5), build_policy(SMALL, seed=5), build_policy(SMALL, seed=6)
    assert torch.equal(torch.rand(1), expected)  # the global RNG is left alone
    for (name, p), q, r in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(p, q), name
    assert any(not torch.equal(p, r) for p, r in zip(a.state_dict().values(), c.state_dict().values()))


@pytest.mark.parametrize("bad", [dict(heads=3), dict(hidden=0), dict(num_layers=-1), dict(gamma_cross=-0.1),
                                 dict(gamma_same=float("nan")), dict(decoder_hidden=2.5)])
def test_bad_config(bad):
    with pytest.raises(PolicyError):
        PolicyConfig(**bad)


# ------------------------------------------------------------------------------------------------ checkpoints


def test_checkpoint_round_trip(tmp_path, state):
    model = build_policy(SMALL, seed=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    policy_loss(model, [state_to_data(state)], [np.full(len(state.options), 1 / len(state.options))]).backward()
    optimizer.step()
    path = tmp_path / "policy.pt"
    save_policy(path, model, SMALL, optimizer, step=7)
    assert [p.name for p in tmp_path.iterdir()] == ["policy.pt"]  # no temporary left behind
    loaded = load_policy(path)
    assert loaded.config == SMALL and loaded.step == 7
    restored = torch.optim.Adam(loaded.model.parameters(), lr=1e-3)
    restored.load_state_dict(loaded.optimizer)
    assert restored.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    np.testing.assert_array_equal(GNNEvaluator(loaded.model)(state), GNNEvaluator(model)(state))


def _payload(model, **changes):
    payload = {"format": "tag.policy", "version": 1, "feature_version": 1, "config": model.config.to_dict(),
               "model": model.state_dict(), "optimizer": None, "step": 0}
    payload.update(changes)
    return payload


@pytest.mark.parametrize("case, message", [
    ("garbage", "not a readable"),
    ("truncated", "not a readable"),
    ("list", "not a policy checkpoint"),
    ("feature_version", "features version"),
    ("config", "do not fit"),
    ("unknown_field", "unknown field"),
    ("missing", "lacks"),
    ("pickled_object", "not a readable"),
])
def test_corrupt_checkpoint(tmp_path, case, message):
    model = build_policy(SMALL)
    path = tmp_path / "policy.pt"
    save_policy(path, model, SMALL)
    if case == "garbage":
        path.write_bytes(b"\x00not a checkpoint" * 10)
    elif case == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif case == "list":
        torch.save([1, 2, 3], path)
    elif case == "feature_version":
        torch.save(_payload(model, feature_version=0), path)
    elif case == "config":
        torch.save(_payload(model, config={**SMALL.to_dict(), "hidden": 32}), path)
    elif case == "unknown_field":
        torch.save(_payload(model, config={**SMALL.to_dict(), "width": 3}), path)
    elif case == "missing":
        payload = _payload(model)
        del payload["model"]
        torch.save(payload, path)
    elif case == "pickled_object":  # weights_only refuses arbitrary objects
        torch.save({"format": "tag.policy", "obj": PolicyConfig()}, path)
    with pytest.raises(PolicyError, match=message):
        load_policy(path)


def test_missing_checkpoint_and_unwritable_path(tmp_path):
    with pytest.raises(PolicyError, match="no policy checkpoint"):
        load_policy(tmp_path / "absent.pt")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    model = build_policy(SMALL)
    with pytest.raises(OutputError):
        save_policy(blocker / "policy.pt", model, SMALL)
    with pytest.raises(PolicyError, match="not the model's"):
        save_policy(tmp_path / "p.pt", model, PolicyConfig())
