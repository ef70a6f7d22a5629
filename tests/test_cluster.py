"""tag.cluster: the table, spec files, presets and generators, on instances small enough to check by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tag.cluster import (
    DGX1_NVLINK_DOUBLE,
    DGX1_NVLINK_SINGLE,
    PRESETS,
    Cluster,
    Link,
    Machine,
    as_rng,
    build_cluster,
    gpu_type,
    grid_cluster,
    hop_bandwidth,
    list_presets,
    load_cluster,
    parse_cluster_spec,
    random_blk_1,
    random_blk_2,
    resolve_cluster,
    tag_random,
    uniform_dist,
    widest_paths,
)
from tag.errors import ClusterError, SchemaError, SpecError, TagError, UnitError
from tag.units import parse_bandwidth, parse_bytes, parse_time

DATA = Path(__file__).parent / "data" / "clusters"
GB = 1e9


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------- units


def test_units_used_by_specs():
    assert parse_bandwidth("100Gbps") == pytest.approx(12.5e9)
    assert parse_bandwidth("130GB/s") == pytest.approx(130e9)
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_time("5us") == pytest.approx(5e-6)


# ------------------------------------------------------------------------------------------- presets


@pytest.mark.parametrize("address, devices", [
    ("tag-testbed", 16), ("tag-cloud", 32), ("two-level", 16), ("dgx1x4", 32),
    ("mesh2d:8x8", 64), ("torus2d:8x8", 64), ("mesh3d:4x4x4", 64), ("torus3d:4x4x4", 64),
    ("random-blk-1:64", 64), ("random-blk-2:64", 64), ("uniform-dist:64", 64),
    ("random-blk-1:64,seed=5", 64), ("mesh2d", 64), ("uniform-dist", 64), ("mesh2d:4x4,gpu=a100-40gb", 16), ("random_blk_1:10", 10),
])
def test_preset_device_counts(address, devices):
    cluster = resolve_cluster(address)
    assert cluster.num_devices == devices
    assert np.all(np.diag(cluster.bandwidth) == np.inf)
    off = ~np.eye(devices, dtype=bool)
    assert np.all(cluster.bandwidth[off] > 0) and np.all(np.isfinite(cluster.bandwidth[off]))


def test_every_preset_listed_and_its_example_resolves():
    rows = list_presets()
    assert [r["name"] for r in rows] == list(PRESETS)
    for row in rows:
        cluster = resolve_cluster(row["address"])
        if row["devices"] != "varies":
            assert cluster.num_devices == row["devices"]


def test_tag_random_address_forms():
    a = resolve_cluster("tag-random:seed=3")
    assert a.num_devices == tag_random(seed=3).num_devices
    assert resolve_cluster("tag-random:seed=3,machines=4").num_machines == 4


def test_testbed_machines_and_device_groups():
    cluster = resolve_cluster("tag-testbed")
    assert cluster.num_machines == 7
    assert [len(g) for g in cluster.device_groups()] == [4, 2, 2, 2, 2, 2, 2]
    assert [cluster.gpu(g[0]).name for g in cluster.device_groups()] == ["v100-32gb"] + ["1080ti"] * 4 + ["p100"] * 2
    assert cluster.bandwidth[0, 1] == pytest.approx(130 * GB)
    assert cluster.bandwidth[4, 5] == pytest.approx(10 * GB)
    assert cluster.bandwidth[0, 4] == pytest.approx(12.5 * GB)  # 100 Gbps
    assert np.allclose(cluster.nic_bandwidth, 12.5 * GB)
    groups = cluster.group_bandwidth()
    assert groups.shape == (7, 7)
    assert groups[0, 0] == pytest.approx(130 * GB) and groups[0, 1] == pytest.approx(12.5 * GB)


def test_cloud_and_two_level():
    cloud = resolve_cluster("tag-cloud")
    assert cloud.summary()["gpus"] == {"v100-16gb": 16, "t4": 16}
    assert cloud.num_device_groups == 6
    two = resolve_cluster("two-level")
    assert two.bandwidth[0, 3] == pytest.approx(11 * GB) and two.bandwidth[0, 4] == pytest.approx(1.1 * GB)


def test_dgx1_nvlink_lanes_and_bandwidths():
    lanes = np.zeros(8, dtype=int)
    for pairs, width in ((DGX1_NVLINK_SINGLE, 1), (DGX1_NVLINK_DOUBLE, 2)):
        for a, b in pairs:
            lanes[a] += width
            lanes[b] += width
    assert lanes.tolist() == [6] * 8
    assert not set(DGX1_NVLINK_SINGLE) & set(DGX1_NVLINK_DOUBLE)
    cluster = resolve_cluster("dgx1x4")
    for m in range(4):
        base = 8 * m
        for a, b in DGX1_NVLINK_DOUBLE:
            assert cluster.bandwidth[base + a, base + b] == pytest.approx(43.2 * GB)
        for a, b in DGX1_NVLINK_SINGLE:
            assert cluster.bandwidth[base + a, base + b] == pytest.approx(21.4 * GB)
    assert cluster.bandwidth[0, 5] == pytest.approx(10.1 * GB)  # PCIe, not routed over NVLink
    assert cluster.bandwidth[0, 8] == pytest.approx(1.4 * GB)
    # Every device group joins devices of one machine at one bandwidth.
    for group in cluster.device_groups():
        assert len(set(cluster.machine[group])) == 1
        pairs = cluster.bandwidth[np.ix_(group, group)][~np.eye(len(group), dtype=bool)]
        assert len(set(pairs.tolist())) <= 1


def test_hop_bandwidth_table():
    assert hop_bandwidth(1) == pytest.approx(78.1 * GB)
    assert hop_bandwidth(20) == pytest.approx(0.098 * GB)
    assert hop_bandwidth([21, 31, 32, 51, 52, 500]).tolist() == pytest.approx(
        [0.088 * GB, 0.088 * GB, 0.078 * GB, 0.078 * GB, 0.068 * GB, 0.068 * GB])


def test_mesh_and_torus_hops():
    mesh, torus = resolve_cluster("mesh2d:4x4"), resolve_cluster("torus2d:4x4")
    corner, far = 0, 15  # (0, 0) and (3, 3)
    assert mesh.bandwidth[corner, far] == pytest.approx(7.81 * GB)  # 6 hops
    assert torus.bandwidth[corner, far] == pytest.approx(39.0 * GB)  # 2 hops, wrapping
    assert mesh.bandwidth[0, 1] == torus.bandwidth[0, 1] == pytest.approx(78.1 * GB)
    assert mesh.bandwidth[0, 5] == pytest.approx(39.0 * GB)  # (0,0)-(1,1)
    assert mesh.latency[corner, far] == pytest.approx(6 * mesh.latency[0, 1])
    assert mesh.num_machines == 16 and np.all(np.isinf(mesh.nic_bandwidth))
    assert resolve_cluster("torus3d:4x4x4").bandwidth[0, 63] == pytest.approx(24.4 * GB)  # 1+1+1 hops


# ------------------------------------------------------------------------------------------- generators


@pytest.mark.parametrize("generate", [
    lambda seed: random_blk_1(24, seed=seed),
    lambda seed: random_blk_2(24, seed=seed),
    lambda seed: uniform_dist(24, seed=seed),
    lambda seed: tag_random(seed=seed),
])
def test_generators_reproducible_and_seed_dependent(generate):
    a, b, c = generate(1), generate(1), generate(2)
    assert a.fingerprint() == b.fingerprint()
    assert np.array_equal(a.bandwidth, b.bandwidth)
    assert a.fingerprint() != c.fingerprint()


def test_random_blk_1_structure():
    cluster = random_blk_1(40, seed=7)
    mb_per_us = 1e6 / 1024 * GB
    off = ~np.eye(40, dtype=bool)
    inter = cluster.machine[:, None] != cluster.machine[None, :]
    assert np.allclose(cluster.bandwidth[inter], 1e-4 * mb_per_us)
    intra = ~inter & off
    assert np.all((cluster.bandwidth[intra] >= 1e-4 * mb_per_us) & (cluster.bandwidth[intra] <= 1e-2 * mb_per_us))
    assert np.bincount(cluster.machine).max() <= 8
    assert cluster.num_device_groups == cluster.num_machines  # one bandwidth per node


def test_random_blk_2_inter_falls_with_node_distance():
    cluster = random_blk_2(40, seed=3)
    m = cluster.machine
    same = m[:, None] == m[None, :]
    base = cluster.bandwidth[same & ~np.eye(40, dtype=bool)].mean() / 10
    i, j = np.argwhere(~same)[0]
    assert cluster.bandwidth[i, j] == pytest.approx(base / abs(m[i] - m[j]))


def test_uniform_dist_range_and_symmetry():
    cluster = uniform_dist(30, seed=0)
    mb_per_us = 1e6 / 1024 * GB
    off = cluster.bandwidth[~np.eye(30, dtype=bool)]
    assert off.min() >= 1e-5 * mb_per_us and off.max() <= 1e-2 * mb_per_us
    assert np.array_equal(cluster.bandwidth, cluster.bandwidth.T)
    assert cluster.num_machines == 30


def test_tag_random_ranges():
    for seed in range(20):
        cluster = tag_random(seed=seed)
        assert 1 <= cluster.num_machines <= 6
        assert np.bincount(cluster.machine).max() <= 8
        assert {t.name for t in cluster.types} <= {"v100-32gb", "1080ti", "p100"}
        inter = cluster.machine[:, None] != cluster.machine[None, :]
        intra = ~inter & ~np.eye(cluster.num_devices, dtype=bool)
        gbps = cluster.bandwidth * 8 / 1e9
        assert np.all((gbps[intra] >= 64) & (gbps[intra] <= 160))
        assert np.all((gbps[inter] >= 20) & (gbps[inter] <= 50)) and len(np.unique(gbps[inter])) <= 1


def test_as_rng():
    rng = np.random.default_rng(0)
    assert as_rng(rng) is rng
    assert as_rng(4).integers(1000) == np.random.default_rng(4).integers(1000)
    with pytest.raises(TagError, match="seed must be"):
        as_rng(-1)


# ------------------------------------------------------------------------------------------- routing


def test_widest_path_filling_on_chain_spec():
    cluster = load_cluster(DATA / "chain.yaml")
    assert cluster.num_devices == 3 and cluster.num_machines == 3
    assert cluster.bandwidth[0, 2] == pytest.approx(5 * GB)  # bottleneck of 10 and 5 GB/s
    assert cluster.latency[0, 2] == pytest.approx(3e-6)  # 1 us + 2 us
    assert np.all(np.isinf(cluster.nic_bandwidth))


def test_widest_paths_prefers_width_then_latency():
    # 0-1-3 is wide (10) but slow, 0-2-3 equally wide and fast, 0-3 narrow and direct is not linked.
    linked = np.zeros((4, 4), dtype=bool)
    bandwidth, latency = np.zeros((4, 4)), np.zeros((4, 4))
    for a, b, bw, lat in ((0, 1, 10, 5.0), (1, 3, 20, 5.0), (0, 2, 10, 1.0), (2, 3, 10, 1.0), (1, 2, 1, 0.0)):
        linked[a, b] = linked[b, a] = True
        bandwidth[a, b] = bandwidth[b, a] = bw
        latency[a, b] = latency[b, a] = lat
    out_bw, out_lat = widest_paths(bandwidth, latency, linked)
    assert out_bw[0, 3] == 10 and out_lat[0, 3] == 2.0
    assert out_bw[1, 2] == 1  # a declared link keeps its own value even where a route is wider
    assert out_bw[1, 0] == 10 and np.array_equal(out_bw, out_bw.T)


def test_matrix_spec_routes_missing_pairs():
    cluster = load_cluster(DATA / "matrix.json")
    assert cluster.bandwidth[0, 1] == pytest.approx(300 * GB)
    assert cluster.bandwidth[2, 3] == pytest.approx(16 * GB)
    assert cluster.bandwidth[0, 3] == pytest.approx(1.25 * GB)  # routed over either side
    assert cluster.latency[0, 3] == pytest.approx(12e-6)
    assert np.allclose(cluster.nic_bandwidth, 1.25 * GB)


def test_example_spec():
    cluster = load_cluster(DATA / "lab.yaml")
    assert cluster.num_devices == 11 and cluster.num_machines == 5
    assert cluster.gpu(8).name == "rtx3090" and cluster.gpu(8).memory_bytes == 24 * 2**30
    assert cluster.bandwidth[8, 9] == pytest.approx(56 * GB) and cluster.latency[8, 9] == pytest.approx(1e-6)
    assert cluster.bandwidth[0, 8] == pytest.approx(25e9 / 8)  # the workstation's slower NIC
    assert cluster.bandwidth[0, 4] == pytest.approx(12.5 * GB)
    assert cluster.latency[0, 4] == pytest.approx(5e-6)
    assert [len(g) for g in cluster.device_groups()] == [4, 2, 2, 2, 1]
    assert resolve_cluster(str(DATA / "lab.yaml")).fingerprint() == cluster.fingerprint()


# ------------------------------------------------------------------------------------------- the Cluster object


def test_json_round_trip_and_fingerprint(tmp_path):
    clusters = [resolve_cluster(a) for a in ("tag-testbed", "dgx1x4", "mesh2d:3x3", "random-blk-2:12")]
    for cluster in clusters + [load_cluster(DATA / "lab.yaml")]:
        data = json.loads(json.dumps(cluster.to_json(), allow_nan=False))
        back = Cluster.from_json(data)
        assert back.name == cluster.name and back.types == cluster.types
        for field in ("device_type", "machine", "bandwidth", "latency", "nic_bandwidth", "device_group"):
            assert np.array_equal(getattr(back, field), getattr(cluster, field)), field
        assert back.fingerprint() == cluster.fingerprint()
        assert back.to_json() == cluster.to_json()
    saved = _write(tmp_path, "saved.json", json.dumps(cluster.to_json()))
    assert load_cluster(saved).fingerprint() == cluster.fingerprint()


def test_fingerprint_stable_and_sensitive():
    a, b = resolve_cluster("two-level"), resolve_cluster("two-level")
    assert a.fingerprint() == b.fingerprint()
    assert len(a.fingerprint()) == 64
    bandwidth = a.bandwidth.copy()
    bandwidth[0, 1] = bandwidth[1, 0] = 12 * GB
    changed = Cluster(a.name, a.types, a.device_type, a.machine, bandwidth, a.latency, a.nic_bandwidth)
    assert changed.fingerprint() != a.fingerprint()
    renamed = Cluster("other", a.types, a.device_type, a.machine, a.bandwidth, a.latency, a.nic_bandwidth)
    assert renamed.fingerprint() == a.fingerprint()


def test_summary_memory_flops_networkx():
    cluster = resolve_cluster("tag-testbed")
    summary = cluster.summary()
    assert summary["devices"] == 16 and summary["machines"] == 7 and summary["device_groups"] == 7
    assert summary["gpus"] == {"v100-32gb": 4, "1080ti": 8, "p100": 4}
    assert summary["total_memory_bytes"] == (4 * 32 + 8 * 11 + 4 * 16) * 2**30
    assert summary["min_bandwidth"] == pytest.approx(10 * GB) and summary["max_bandwidth"] == pytest.approx(130 * GB)
    assert cluster.peak_flops("fp16")[0] == gpu_type("v100-32gb").peak("fp16")
    graph = cluster.to_networkx()
    assert graph.number_of_nodes() == 16 and graph.number_of_edges() == 16 * 15 // 2
    assert graph.nodes[4]["gpu"] == "1080ti" and graph.edges[0, 1]["intra_machine"]


def test_subset_renumbers():
    cluster = resolve_cluster("tag-testbed")
    sub = cluster.subset([12, 13, 0])
    assert sub.num_devices == 3 and sub.num_machines == 2
    assert [t.name for t in sub.types] == ["v100-32gb", "p100"]
    assert sub.gpu(0).name == "p100" and sub.gpu(2).name == "v100-32gb"
    assert sub.bandwidth[0, 2] == cluster.bandwidth[12, 0]
    assert sub.num_device_groups == 2
    with pytest.raises(ClusterError, match="repeated"):
        cluster.subset([1, 1])


def test_a_local_clusters_measured_collectives_survive_subset_and_json():
    from tag.cluster.presets import LocalCluster, local_cluster

    cluster = local_cluster(4, bandwidth=2e9, latency=3e-5, collective_latency=4e-4, collective_bandwidth=1.5e9)
    sub = cluster.subset([3, 1])
    assert isinstance(sub, LocalCluster) and sub.num_devices == 2
    assert (sub.collective_latency_s, sub.collective_bandwidth) == (4e-4, 1.5e9)
    for kept in (cluster, sub):
        back = Cluster.from_json(json.loads(json.dumps(kept.to_json(), allow_nan=False)))
        assert isinstance(back, LocalCluster)
        assert (back.collective_latency_s, back.collective_bandwidth) == (4e-4, 1.5e9)
        assert back.to_json() == kept.to_json() and back.fingerprint() == kept.fingerprint()
    unmeasured = local_cluster(2)
    assert "collective_latency_s" not in unmeasured.to_json()
    assert type(resolve_cluster("tag-testbed").subset([0, 1])) is Cluster
    with pytest.raises(SchemaError, match="collective_bandwidth"):
        Cluster.from_json({**cluster.to_json(), "collective_bandwidth": "fast"})


def test_build_cluster_with_links():
    cluster = build_cluster("pair", [Machine("t4"), Machine("t4")], links=[Link(0, 1, 3 * GB, 1e-6)])
    assert cluster.bandwidth[0, 1] == 3 * GB and cluster.num_device_groups == 2


# ------------------------------------------------------------------------------------------- bad input


def _cluster(**overrides):
    args = dict(name="c", types=("p100",), device_type=[0, 0], machine=[0, 0],
                bandwidth=[[0, 1e9], [1e9, 0]], latency=[[0, 1e-6], [1e-6, 0]])
    args.update(overrides)
    return Cluster(**args)


@pytest.mark.parametrize("overrides, message", [
    (dict(types=("v200",)), "unknown GPU type 'v200'"),
    (dict(bandwidth=[[0, 0], [0, 0]]), "disconnected"),
    (dict(bandwidth=[[0, -1], [-1, 0]]), r"bandwidth\[0, 1\]"),
    (dict(bandwidth=[[0, np.nan], [np.nan, 0]]), "NaN"),
    (dict(latency=[[0, -1e-6], [-1e-6, 0]]), "latency"),
    (dict(device_type=[], machine=[], bandwidth=np.zeros((0, 0)), latency=np.zeros((0, 0))), "no devices"),
    (dict(bandwidth=np.ones((3, 3))), "shape"),
    (dict(machine=[0, 2]), "machine"),
    (dict(device_type=[0, 1]), "device_type"),
])
def test_constructor_rejects(overrides, message):
    with pytest.raises(ClusterError, match=message):
        _cluster(**overrides)


def test_constructor_reports_unrouted_zero_in_connected_table():
    bandwidth = np.full((3, 3), 1e9)
    bandwidth[0, 2] = bandwidth[2, 0] = 0
    with pytest.raises(ClusterError, match=r"bandwidth\[0, 2\] is 0"):
        _cluster(device_type=[0, 0, 0], machine=[0, 0, 0], bandwidth=bandwidth, latency=np.zeros((3, 3)))


SPEC_ERRORS = [
    ("machines:\n  - {gpu: v200, count: 2, bandwidth: 10GB/s}\n", ClusterError,
     r"bad\.yaml: machines\[0\]\.gpu: unknown GPU type 'v200'"),
    ("machines:\n  - {gpu: p100, count: 2, bandwidth: 0GB/s}\n", ClusterError,
     r"bad\.yaml: machines\[0\]\.bandwidth: must be positive"),
    ("machines:\n  - {gpu: p100, count: 2, bandwidth: 10GB/s, latency: -2us}\n", ClusterError,
     r"machines\[0\]\.latency: latency must be finite and non-negative"),
    ("machines:\n  - {gpu: p100, count: 2, bandwidth: 10GB/s, latency: -0.001}\n", ClusterError,
     r"machines\[0\]\.latency"),
    ("machines:\n  - {gpu: p100, count: 2, bandwidth: 10GB/s}\n  - {gpu: t4}\n", ClusterError,
     "bad.yaml: disconnected cluster"),
    ("machines:\n  - {gpu: p100, repeat: 4}\nlinks:\n  - {between: [0, 1], bandwidth: 1GB/s}\n", ClusterError,
     "bad.yaml: disconnected cluster"),
    ("network: 100 Gbit\nmachines:\n  - {gpu: p100}\n", UnitError, r"bad\.yaml: network: unknown bandwidth unit 'Gbit'"),
    ("machines:\n  - {gpu: p100, count: 2}\n", SpecError, r"machines\[0\]\.bandwidth: missing"),
    ("machines:\n  - {gpu: p100, cuont: 2}\n", SpecError, r"machines\[0\]\.cuont: unknown field"),
    ("machine:\n  - {gpu: p100}\n", SpecError, "machine: unknown field"),
    ("name: x\n", SpecError, "machines: missing"),
    ("machines:\n  - {gpu: p100}\n  - {gpu: p100}\nnetwork: 1GB/s\nlinks:\n  - {between: [0, 5], bandwidth: 1GB/s}\n",
     SpecError, r"links\[0\]\.between"),
    ("machines: [{gpu: p100, count: 2, bandwidth: 1GB/s]\n", SpecError, "bad.yaml: malformed YAML"),
    ("", SpecError, "bad.yaml: the spec is empty"),
]


@pytest.mark.parametrize("text, error, message", SPEC_ERRORS)
def test_bad_spec_files(tmp_path, text, error, message):
    path = _write(tmp_path, "bad.yaml", text)
    with pytest.raises(error, match=message) as info:
        load_cluster(path)
    assert isinstance(info.value, TagError)
    assert "\n" not in str(info.value)


def test_bad_json_spec(tmp_path):
    with pytest.raises(SpecError, match=r"bad\.json: malformed JSON"):
        load_cluster(_write(tmp_path, "bad.json", '{"machines": [}'))
    with pytest.raises(SchemaError, match="version"):
        parse_cluster_spec({"format": "tag.cluster", "version": 99})


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_cluster(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="not found"):
        resolve_cluster(str(tmp_path / "nope.yml"))


@pytest.mark.parametrize("address, message", [
    ("nosuch", "unknown cluster preset 'nosuch'; known presets: tag-testbed"),
    ("mesh2d:8y8", r"'mesh2d:8y8'.*usage: mesh2d:AxB"),
    ("mesh3d:4x4", "usage: mesh3d:AxBxC"),
    ("random-blk-1:0", "positive integer"),
    ("random-blk-1:64,seed=x", "seed"),
    ("tag-random:seed=3,colour=red", "unknown argument 'colour'"),
    ("tag-testbed:4", "unexpected argument '4'; usage: tag-testbed .takes no arguments"),
    ("", "cluster address must be"),
    ("mesh2d:4x4,gpu=v200", "unknown GPU type 'v200'"),
    ("tag-random:seed=1,seed=2", "given twice"),
])
def test_bad_addresses(address, message):
    with pytest.raises(SpecError, match=message):
        resolve_cluster(address)


def test_gpu_catalogue_unknown():
    with pytest.raises(ClusterError, match="unknown GPU type"):
        gpu_type("v200")
    assert grid_cluster((2, 2), gpu="A100").types[0].name == "a100-40gb"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(peak_flops=(("fp16", 1e12),)), "must give fp32"),
        (dict(memory_bytes=-1.0), "memory_bytes"),
        (dict(memory_bandwidth=0.0), "memory_bandwidth"),
        (dict(peak_flops=(("fp32", float("inf")),)), r"peak_flops\[fp32\]"),
        (dict(peak_flops=(("fp32", 1e12), ("fp64", 1e12))), "unknown dtype"),
    ],
)
def test_gpu_type_validation(kwargs, message):
    from tag.cluster.gpus import GPUType

    fields = dict(name="custom", memory_bytes=1e9, memory_bandwidth=1e11, peak_flops=(("fp32", 1e12),))
    with pytest.raises(ClusterError, match=message):
        GPUType(**{**fields, **kwargs})


def test_a_profile_without_a_point_to_point_curve_names_a_flag_tag_profile_has(capsys):
    """The advice names `tag profile`'s real switch: measuring is the default, --no-comm skips it."""
    from types import SimpleNamespace

    from conftest import run

    from tag.cluster.presets import local_cluster
    from tag.errors import SpecError

    profile = SimpleNamespace(devices={"a100-40gb": SimpleNamespace(comm={})})
    with pytest.raises(SpecError, match=r"measured: none\); run `tag profile` on this host without --no-comm$"):
        local_cluster(2, profile=profile)
    with pytest.raises(SystemExit):
        run(capsys, "profile", "--help")
    options = capsys.readouterr().out
    assert "--no-comm" in options and "--comm " not in options.replace("--no-comm", "")
