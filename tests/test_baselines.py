"""tag.baselines: DP-NCCL by hand, the batch split of DP-NCCL-P, Horovod's fusion, OOM on a huge model."""

from __future__ import annotations

import re

import numpy as np
import pytest

from test_compiler import graph_of, make_cluster, op_time
from tag.baselines import BASELINES, baselines_table, dp_nccl, dp_nccl_p, horovod, run_baselines, single_device
from tag.cluster import Machine, build_cluster, gpu_type, resolve_cluster
from tag.compiler import check_compiled
from tag.graph import ROLE_BACKWARD, ROLE_FORWARD, ROLE_INPUT, ROLE_OPTIMIZER
from tag.graph.resolve import resolve_model
from tag.grouping import GroupGraph, group_ops
from tag.sim import TASK_COLLECTIVE

GB = 1e9
CONCAT, SUM, NONE = 0, 1, 2


@pytest.fixture
def two_layers():
    """Two linear layers with Adam: group 0 = x, W0, f0; group 1 = layer 1 (forward f1, data gradient b1,
    weight gradient g1, update u1); group 2 = layer 0's weight gradient g0 and update u0."""
    p0, p1 = 2e8, 6e8
    ops = [("x", ROLE_INPUT, CONCAT, True, 0.0, 4e6, 0.0),
           ("W0", ROLE_INPUT, NONE, False, 0.0, p0, p0),
           ("W1", ROLE_INPUT, NONE, False, 0.0, p1, p1),
           ("f0", ROLE_FORWARD, CONCAT, True, 2e12, 1e7, 0.0),
           ("f1", ROLE_FORWARD, CONCAT, True, 3e12, 1e7, 0.0),
           ("b1", ROLE_BACKWARD, CONCAT, True, 3e12, 1e7, 0.0),
           ("g1", ROLE_BACKWARD, SUM, True, 6e12, p1, 0.0),
           ("g0", ROLE_BACKWARD, SUM, True, 4e12, p0, 0.0),
           ("u0", ROLE_OPTIMIZER, NONE, False, 1e10, p0, 0.0),
           ("u1", ROLE_OPTIMIZER, NONE, False, 3e10, p1, 0.0)]
    edges = [(0, 3, 4e6), (1, 3, p0), (3, 4, 1e7), (2, 4, p1), (4, 5, 1e7), (2, 5, p1), (4, 6, 1e7), (3, 6, 1e7),
             (5, 7, 1e7), (0, 7, 4e6), (6, 9, p1), (2, 9, p1), (7, 8, p0), (1, 8, p0)]
    graph = graph_of(ops, edges)
    #            x  W0 W1 f0 f1 b1 g1 g0 u0 u1
    assignment = [0, 0, 1, 0, 1, 1, 1, 2, 2, 1]
    return graph, np.array(assignment), (p0, p1)


def test_dp_nccl_on_two_devices_is_compute_plus_allreduce_by_hand(two_layers):
    graph, assignment, (p0, p1) = two_layers
    beta, alpha = 10 * GB, 5e-6
    cluster = make_cluster(2, [0, 1], machine=[0, 1], gpus=["v100-32gb", "1080ti"], bandwidth=beta, latency=alpha)
    gg = GroupGraph.from_assignment(graph, assignment, gpus=cluster)
    result = dp_nccl(gg, cluster)
    v100, gtx = gpu_type("v100-32gb"), gpu_type("1080ti")
    # Each device runs f0, f1, b1, g1, g0 on half the batch. The all-reduce of W1's gradient waits for g1 on the
    # slower device and overlaps g0; W0's follows it; each update waits for its all-reduce.
    half = {d: [op_time(graph, op, gpu, 0.5) for op in (3, 4, 5, 6, 7)] for d, gpu in ((0, v100), (1, gtx))}
    ring = lambda size: 2 * (1 / 2) * size / beta + 2 * 1 * alpha  # noqa: E731  ring over 2 devices
    g1_done = max(sum(half[d][:4]) for d in (0, 1))
    g0_done = {d: sum(half[d]) for d in (0, 1)}
    ar1_done = g1_done + ring(p1)
    ar0_done = max(max(g0_done.values()), ar1_done) + ring(p0)
    update = {d: (op_time(graph, 8, gpu), op_time(graph, 9, gpu)) for d, gpu in ((0, v100), (1, gtx))}
    expected = max(max(max(ar1_done, g0_done[d]) + update[d][1], ar0_done) + update[d][0] for d in (0, 1))
    assert result.iteration_time_s == pytest.approx(expected, rel=1e-12)
    assert result.samples_per_s == pytest.approx(graph.batch_size / expected)
    assert not result.oom and result.oom_device == -1
    assert {op.op for op in result.compiled.inserted} == {"AllReduce"}
    check_compiled(result.compiled)


def test_dp_nccl_p_splits_the_batch_by_speed(two_layers):
    graph, assignment, _ = two_layers
    cluster = make_cluster(2, [0, 1], machine=[0, 1], gpus=["v100-32gb", "1080ti"])
    gg = GroupGraph.from_assignment(graph, assignment, gpus=cluster)
    result = dp_nccl_p(gg, cluster)
    speeds = cluster.peak_flops()
    devices, fractions = zip(*result.compiled.replicas(0))
    assert devices == (0, 1) and fractions == pytest.approx(speeds / speeds.sum())
    assert result.iteration_time_s < dp_nccl(gg, cluster).iteration_time_s  # the fast device no longer waits


@pytest.fixture(scope="module")
def resnet_tiny_testbed():
    cluster = resolve_cluster("tag-testbed")
    return group_ops(resolve_model("resnet101", tiny=True), num_groups=60, gpus=cluster), cluster


def test_horovod_fuses_allreduces_that_wait_only_for_their_gradients(resnet_tiny_testbed):
    gg, cluster = resnet_tiny_testbed
    plain, fused = dp_nccl(gg, cluster), horovod(gg, cluster, fusion_bytes=1e5)
    collectives = lambda r: np.flatnonzero(r.compiled.taskgraph.kind == TASK_COLLECTIVE)  # noqa: E731
    assert 0 < len(collectives(fused)) < len(collectives(plain))
    tg = fused.compiled.taskgraph
    buckets = [op for op in fused.compiled.inserted if op.reason.startswith("Horovod fusion bucket")]
    assert buckets
    for bucket in buckets:
        # a bucket waits for the backward units producing its gradients, nothing else
        [task] = bucket.tasks
        assert {re.match(r"G\d+([FBO])", tg.labels[p]).group(1) for p in tg.predecessors(task)} == {"B"}
    assert fused.iteration_time_s < plain.iteration_time_s  # fewer latencies to pay
    check_compiled(fused.compiled)


def test_run_baselines_on_a_tiny_model(resnet_tiny_testbed):
    gg, cluster = resnet_tiny_testbed
    results = run_baselines(gg, cluster)
    assert [r.name for r in results] == ["DP-NCCL", "DP-NCCL-P", "Horovod", "single device", "METIS MP"]
    for r in results:
        assert r.iteration_time_s > 0 and not r.oom and r.oom_device == -1
        assert r.samples_per_s == pytest.approx(gg.op_graph.batch_size / r.iteration_time_s)
        assert r.peak_memory.shape == (cluster.num_devices,) and r.peak_memory.max() > 0
    single = results[3]
    assert np.count_nonzero(single.peak_memory) == 1
    rows = baselines_table(results)
    assert rows[0]["speedup"] == 1.0 and set(rows[0]) >= {"name", "iteration_time_s", "samples_per_s", "oom"}
    with pytest.raises(ValueError, match="unknown baseline"):
        run_baselines(gg, cluster, names=("dp-nccl", "flexflow"))


def test_huge_model_reports_oom_on_1080ti_only_cluster():
    cluster = build_cluster("1080ti-only", [Machine("1080ti", 2, 10 * GB)] * 2, network_bandwidth=12.5 * GB)
    graph = resolve_model("bert-48")
    results = {r.name: r for r in run_baselines(graph, cluster, num_groups=60)}
    assert set(results) == {"DP-NCCL", "DP-NCCL-P", "Horovod", "single device", "METIS MP"}
    capacity = cluster.memory_bytes()
    params = graph.total_param_bytes()
    for name in ("DP-NCCL", "DP-NCCL-P", "Horovod", "single device"):
        r = results[name]
        assert r.oom and 0 <= r.oom_device < cluster.num_devices, name
        assert r.peak_memory[r.oom_device] > capacity[r.oom_device]
        assert r.peak_memory[r.oom_device] >= 4 * params  # every replica holds parameters, gradients, Adam moments
    assert "no single device fits" in results["single device"].note
    # split four ways without replication, the model fits
    mp = results["METIS MP"]
    assert not mp.oom and (mp.peak_memory <= capacity).all()


def test_single_device_picks_the_fastest_that_fits(two_layers):
    graph, assignment, _ = two_layers
    cluster = make_cluster(2, [0, 1], machine=[0, 1], gpus=["1080ti", "v100-32gb"])
    gg = GroupGraph.from_assignment(graph, assignment, gpus=cluster)
    result = single_device(gg, cluster)
    assert result.note.startswith("device 1 (v100-32gb)") and result.peak_memory[0] == 0
    assert set(BASELINES) == {"dp-nccl", "dp-nccl-p", "horovod", "single-device", "metis-mp"}
