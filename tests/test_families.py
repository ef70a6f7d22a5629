"""Topology families (tag.cluster.families) and their use by training: deterministic draws, the shapes
each family promises, held-out families refused by training, and runs without families unchanged."""

import numpy as np
import pytest

from tag.cluster import tag_random
from tag.cluster.families import FAMILIES, HELD_OUT, TRAIN_FAMILIES, family_cluster
from tag.errors import ClusterError
from tag.training import TrainConfig, TrainingError, game_instance, validation_instances
from tag.training.selfplay import Instance, build_instance

SEEDS = range(12)


def _same(a, b) -> bool:
    return (a.num_devices == b.num_devices and np.array_equal(a.bandwidth, b.bandwidth)
            and np.array_equal(a.latency, b.latency) and [t.name for t in a.types] == [t.name for t in b.types])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_draws_are_deterministic_sized_and_varied(family):
    clusters = [family_cluster(family, s) for s in SEEDS]
    assert all(_same(c, family_cluster(family, s)) for c, s in zip(clusters, SEEDS))
    assert all(2 <= c.num_devices <= 48 for c in clusters)
    shapes = {(c.num_devices, tuple(t.name for t in c.types), float(np.sum(c.bandwidth[np.isfinite(c.bandwidth)])))
              for c in clusters}
    assert len(shapes) >= 6
    assert all(np.all(c.bandwidth[~np.eye(c.num_devices, dtype=bool)] > 0) for c in clusters)


def test_tag_random_family_is_tags_generator():
    assert all(_same(family_cluster("tag-random", s), tag_random(seed=s)) for s in SEEDS)


def test_families_are_independent_streams():
    # The same seed in two look-up-table families does not give the same table.
    a, b = family_cluster("random-blk-1", 5), family_cluster("uniform-dist", 5)
    assert a.num_devices != b.num_devices or not np.array_equal(a.bandwidth, b.bandwidth)


def test_nvlink_machines_have_nvlink_inside_and_network_between():
    for s in SEEDS:
        c = family_cluster("nvlink", s)
        same = c.machine[:, None] == c.machine[None, :]
        off = ~np.eye(c.num_devices, dtype=bool)
        assert np.max(c.bandwidth[same & off]) >= 21.4e9  # at least one NVLink lane inside a machine
        if (~same).any():
            assert np.max(c.bandwidth[~same]) <= 100e9 / 8 + 1  # Ethernet / InfiniBand between machines
        counts = np.bincount(c.machine)
        assert set(counts.tolist()) <= {4, 8}


def test_mixed_generations_mix_gpu_types():
    assert all(len(family_cluster("mixed-gen", s).types) >= 2 for s in SEEDS)


def test_a_torus_wraps_around():
    # A torus's farthest pair is closer (in hops, so in bandwidth) than the mesh of the same shape.
    for s in SEEDS:
        torus = family_cluster("torus", s)
        assert torus.bandwidth[np.isfinite(torus.bandwidth)].min() >= 9.7e9  # at most 4 hops on these shapes


@pytest.mark.parametrize("family, seed, match", [("ring", 0, "unknown topology family"),
                                                 ("mesh", -1, "non-negative"), ("mesh", 1.5, "non-negative")])
def test_bad_family_or_seed(family, seed, match):
    with pytest.raises(ClusterError, match=match):
        family_cluster(family, seed)


def test_held_out_families_are_not_trained_on():
    assert set(HELD_OUT) and not set(HELD_OUT) & set(TRAIN_FAMILIES)
    with pytest.raises(TrainingError, match="held out"):
        TrainConfig(topology_families=("mesh", HELD_OUT[0]))
    with pytest.raises(TrainingError, match="unknown topology family"):
        TrainConfig(topology_families=("ring",))
    with pytest.raises(TrainingError, match="twice"):
        TrainConfig(topology_families=("mesh", "mesh"))


def test_games_draw_every_family_and_runs_without_families_are_unchanged():
    config = TrainConfig(topology_families=TRAIN_FAMILIES)
    games = [game_instance(config, k)[0] for k in range(200)]
    assert {g.family for g in games} == set(TRAIN_FAMILIES)
    assert game_instance(config, 3)[0] == game_instance(config, 3)[0]
    plain = TrainConfig()
    for k in range(20):  # the model and seed draws of a run without families, from before families existed
        rng = np.random.default_rng([plain.seed, 1, k])
        model = plain.models[int(rng.integers(len(plain.models)))]
        assert game_instance(plain, k)[0] == Instance(model, int(rng.integers(*plain.topology_seeds)))
    assert [v.family for v in validation_instances(config.replace(validation_instances=7))] == \
        list(TRAIN_FAMILIES) + [TRAIN_FAMILIES[0]]
    assert TrainConfig.from_dict(config.to_dict()) == config


def test_an_instance_builds_its_familys_cluster():
    _, cluster = build_instance(Instance("vgg19", 4, family="mesh"), num_groups=4, tiny=True)
    assert _same(cluster, family_cluster("mesh", 4))


def _fingerprint(clusters) -> str:
    import hashlib

    digest = hashlib.sha256()
    for c in clusters:
        for array in (c.bandwidth, c.latency, c.machine, c.device_type):
            digest.update(np.ascontiguousarray(array).tobytes())
        digest.update(",".join(t.name for t in c.types).encode())
        digest.update(c.name.encode())
    return digest.hexdigest()


def test_unsized_draws_are_those_the_placement_policy_trains_on():
    """The draws of family_cluster(family, seed) are pinned bit for bit (the sized draws have their own
    streams and must not move them)."""
    clusters = [family_cluster(f, s) for f in FAMILIES for s in (0, 1, 7, 123)]
    assert _fingerprint(clusters) == "e441687c110b22ae251e3f7b3d17a70af3b3f2fd4d53996c18a7c63e3ea86725"


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("devices", [2, 13, 64, 256])
def test_sized_draws_have_exactly_the_devices_asked_for(family, devices):
    cluster = family_cluster(family, 3, devices=devices)
    assert cluster.num_devices == devices
    assert _same(cluster, family_cluster(family, 3, devices=devices))
    assert np.all(cluster.bandwidth[~np.eye(devices, dtype=bool)] > 0)
    if family in ("random-blk-1", "random-blk-2", "uniform-dist", "tag-random", "mixed-gen"):
        assert not _same(cluster, family_cluster(family, 4, devices=devices))  # seeds differ


def test_sized_families_keep_their_kind():
    from tag.cluster.families import squarest_grid

    assert [squarest_grid(d) for d in (16, 32, 64, 128, 256, 13)] == [(4, 4), (4, 8), (8, 8), (8, 16), (16, 16),
                                                                      (1, 13)]
    mesh, torus = family_cluster("mesh", 0, devices=64), family_cluster("torus", 0, devices=64)
    assert mesh.bandwidth[0, 63] < torus.bandwidth[0, 63]  # the corners of an 8x8 torus are 2 hops apart
    for seed in range(6):
        nvlink = family_cluster("nvlink", seed, devices=64)
        same = nvlink.machine[:, None] == nvlink.machine[None, :]
        assert np.max(nvlink.bandwidth[same & ~np.eye(64, dtype=bool)]) >= 21.4e9
        assert len(family_cluster("mixed-gen", seed, devices=64).types) >= 2
    with pytest.raises(ClusterError, match="number of devices"):
        family_cluster("mesh", 0, devices=1)
