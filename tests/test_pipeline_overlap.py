"""A pipeline stage's gradient all-reduce overlaps its last backward pass, bucket by bucket, as DDP does:
the same pure data-parallel plan scores the same as a 1-stage pipeline and as the DP-NCCL baseline."""

from pathlib import Path

import numpy as np
import pytest

from tag.baselines import dp_nccl
from tag.cluster import Cluster, gpu_type, resolve_cluster
from tag.exact.buckets import GradientBuckets, gradient_buckets
from tag.exact.pipeline import compile_pipeline, simulate_pipeline
from tag.exact.stage_graph import ForwardGraph, StageGraph, build_stage_graph
from tag.graph.pipedream import load_pipedream
from tag.graphpipe.pipeline import compile_graph_pipeline
from tag.grouping import group_ops
from tag.sim import TASK_COLLECTIVE, simulate, simulate_fast

PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"
needs_profiles = pytest.mark.skipif(not PROFILES.is_dir(), reason="PipeDream profiles not found")
MS = 1e-3


def flat_cluster(num_devices, bandwidth=1e9):
    return Cluster(name="flat", types=("v100-16gb",), device_type=[0] * num_devices, machine=[0] * num_devices,
                   bandwidth=np.full((num_devices, num_devices), bandwidth),
                   latency=np.zeros((num_devices, num_devices)))


def one_stage(replicas, pieces_ms, bucket_bytes, *, fwd_ms=1.0, micro_batches=1, buckets=True, optimizer_ms=0.0):
    """One stage whose backward pass runs in the given pieces, each closing a bucket of the given bytes."""
    k = len(pieces_ms)
    bwd = sum(pieces_ms) * MS
    return StageGraph(
        stage_time=np.array([fwd_ms * MS + bwd]), edge_src=np.zeros(0, np.int64), edge_dst=np.zeros(0, np.int64),
        edge_bytes=np.zeros(0), param_bytes=np.array([float(sum(bucket_bytes))]), memory_bytes=np.zeros(1),
        assignment=np.zeros(0, np.int64), replicas=np.array([replicas]), micro_batches=micro_batches,
        gpu_types=(gpu_type("v100-16gb"),), reference_type=0, forward_time=np.array([[fwd_ms * MS]]),
        backward_time=np.array([[bwd]]), optimizer_time=np.zeros((1, 1)), activation_bytes=np.zeros(1),
        input_bytes=np.zeros(1), forward_assignment=np.zeros(k, np.int64),
        buckets=GradientBuckets(np.zeros(k, np.int64), np.array(pieces_ms)[:, None] * MS,
                                np.array(bucket_bytes, dtype=float), np.full((k, 1), optimizer_ms * MS))
        if buckets else None)


def test_buckets_close_at_every_parameter_node_in_backward_order():
    # two stages: nodes 0,1,2 | 3,4; parameters on nodes 0, 2 and 4
    stage = np.array([0, 0, 0, 1, 1])
    backward = np.array([[1.0], [2.0], [4.0], [8.0], [16.0]])
    params = np.array([10.0, 0.0, 30.0, 0.0, 50.0])
    optimizer = params[:, None] / 10
    b = gradient_buckets(stage, backward, params, optimizer)
    # stage 0 runs 2 (closes 30), then 1 and 0 (closes 10); stage 1 runs 4 (closes 50), then 3 (no gradient)
    assert b.stage.tolist() == [0, 0, 1, 1]
    assert b.backward_time[:, 0].tolist() == [4.0, 3.0, 16.0, 8.0]
    assert b.nbytes.tolist() == [30.0, 10.0, 50.0, 0.0]
    assert b.optimizer_time[:, 0].tolist() == [3.0, 1.0, 5.0, 0.0]


@pytest.mark.parametrize("simulator", [simulate, simulate_fast], ids=["reference", "fast"])
def test_all_reduce_of_each_bucket_runs_under_the_rest_of_the_backward_pass(simulator):
    # F 0-1 ms; pieces 1-2, 2-3; two devices at 1 GB/s: a ring all-reduce of S bytes takes S / 1e9 s,
    # so 3 MB per bucket is 3 ms: AR1 2-5, AR2 5-8. Without buckets: 3 ms of passes + 6 ms of all-reduce.
    cluster = flat_cluster(2)
    overlapped = one_stage(2, [1.0, 1.0], [3e6, 3e6])
    assert simulator(compile_pipeline(overlapped, cluster, [[0, 1]])).iteration_time == pytest.approx(8 * MS)
    serial = one_stage(2, [1.0, 1.0], [3e6, 3e6], buckets=False)
    assert simulator(compile_pipeline(serial, cluster, [[0, 1]])).iteration_time == pytest.approx(9 * MS)


def test_updates_wait_for_the_whole_backward_pass():
    # three 1 ms pieces whose 1 kB all-reduces take 1 us; 1 ms updates run only after the last piece
    # (the backward pass ends at 4 ms, as without updates), then one after the other: 7 ms
    taskgraph, result = simulate_pipeline(one_stage(2, [1.0, 1.0, 1.0], [1e3] * 3, optimizer_ms=1.0),
                                          flat_cluster(2), [[0, 1]])
    assert result.finish[taskgraph.names.index("s0r0B0")] == pytest.approx(4 * MS)
    assert result.iteration_time == pytest.approx(7 * MS)


def test_only_the_last_backward_pass_runs_in_pieces():
    # M = 3 on one stage: B0 and B1 only accumulate; B2 carries the buckets: 3 x (1 + 2) ms of passes,
    # the first bucket's 3 ms all-reduce starts after B2's first piece (8 ms) and the second follows it
    sg = one_stage(2, [1.0, 1.0], [3e6, 3e6], micro_batches=3)
    taskgraph, result = simulate_pipeline(sg, flat_cluster(2), [[0, 1]])
    assert result.iteration_time == pytest.approx(14 * MS)
    names = set(taskgraph.names)
    assert {"s0r0B2.0", "s0r0B2", "s0.allreduce.0", "s0.allreduce.1"} <= names
    assert "s0r0B1.0" not in names


def _pure_data_parallel(graph, cluster):
    fg = ForwardGraph.from_graph(graph, cluster.types)
    sg = build_stage_graph(fg, np.zeros(fg.num_nodes, np.int64), replicas=cluster.num_devices, micro_batches=1)
    _, result = simulate_pipeline(sg, cluster, [list(range(cluster.num_devices))])
    return result, dp_nccl(group_ops(graph, gpus=cluster), cluster)


@needs_profiles
@pytest.mark.parametrize("cluster_name", ["tag-testbed", "two-level"])
def test_a_chain_as_one_stage_pipeline_takes_the_dp_nccl_time(cluster_name):
    """VGG-16 is a chain: every layer's gradient is all-reduced alone in both, so the times agree exactly."""
    cluster = resolve_cluster(cluster_name)
    result, baseline = _pure_data_parallel(load_pipedream(PROFILES / "vgg16.graph.txt"), cluster)
    assert result.iteration_time == pytest.approx(baseline.iteration_time_s, rel=1e-9)


@needs_profiles
def test_a_residual_network_as_one_stage_pipeline_takes_the_dp_nccl_time():
    """ResNet-50: the DP compiler merges conv1 and bn1 into one chunk (one all-reduce of both gradients,
    one update of both after it), where the pipeline updates bn1 a bucket earlier: 5 us of 57 ms."""
    cluster = resolve_cluster("tag-testbed")
    result, baseline = _pure_data_parallel(load_pipedream(PROFILES / "resnet50.graph.txt"), cluster)
    assert result.iteration_time == pytest.approx(baseline.iteration_time_s, rel=1e-4)
    assert result.iteration_time <= baseline.iteration_time_s


@needs_profiles
def test_graph_pipelines_sync_their_stages_in_buckets_too():
    graph = load_pipedream(PROFILES / "resnet50.graph.txt")
    cluster = flat_cluster(4, bandwidth=10e9)
    fg = ForwardGraph.from_graph(graph, cluster.types)
    half = np.repeat([0, 1], [fg.num_nodes // 2, fg.num_nodes - fg.num_nodes // 2])
    sg = build_stage_graph(fg, half, replicas=2, micro_batches=4)
    taskgraph = compile_graph_pipeline(sg, cluster, [[0, 1], [2, 3]])
    collectives = np.flatnonzero(taskgraph.kind == TASK_COLLECTIVE)
    assert len(collectives) == int((sg.buckets.nbytes > 0).sum()) > 2
    assert taskgraph.nbytes[collectives].sum() == pytest.approx(sg.param_bytes.sum())
