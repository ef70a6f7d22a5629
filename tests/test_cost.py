import math
from pathlib import Path

import numpy as np
import pytest

from tag.cluster.cluster import Cluster
from tag.cluster.gpus import GPUType, gpu_type
from tag.cost import (
    CostModel,
    allreduce_time,
    broadcast_time,
    chain_broadcast_time,
    fit_efficiencies,
    fits,
    p2p_time,
    profile_agreement,
    ps_push_pull_time,
    ps_time,
    rankdata,
    ring_allreduce_time,
    roofline_time,
    spearman,
    training_memory_breakdown,
    training_memory_bytes,
    transfer_time,
)
from tag.errors import ClusterError
from tag.graph import OpGraph

PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"

# Round numbers: 10 TFLOP/s, 1 TB/s, 10 us launch overhead.
TOY = GPUType("toy", memory_bytes=1000.0, memory_bandwidth=1e12, peak_flops=(("fp32", 1e13),), launch_overhead_s=1e-5)
FAST = GPUType("fast", memory_bytes=1000.0, memory_bandwidth=2e12, peak_flops=(("fp32", 4e13),), launch_overhead_s=1e-5)
EXACT = CostModel(compute_efficiency=1.0, memory_efficiency=1.0)


def ops(flops, nbytes, *, role=None, batch_scaled=None, measured=None, params=None, output=None, edges=(), meta=None):
    n = len(flops)
    return OpGraph(
        names=[f"op{i}" for i in range(n)], kinds=["k"] * n, role=role or [1] * n, flops=flops,
        bytes_accessed=nbytes, output_bytes=output or [0.0] * n, param_bytes=params or [0.0] * n,
        batch_scaled=batch_scaled or [True] * n, split=[0] * n, edge_src=[a for a, _ in edges],
        edge_dst=[b for _, b in edges], edge_bytes=[1.0] * len(edges), measured_time=measured, meta=meta or {},
    )


# ------------------------------------------------------------------------------------------------ compute


def test_roofline_compute_and_memory_bound_by_hand():
    # op0: 1e11 FLOP, 1e8 B -> compute 10 ms, memory 0.1 ms: compute-bound.
    # op1: 1e8 FLOP, 1e10 B -> compute 0.01 ms, memory 10 ms: memory-bound.
    graph = ops([1e11, 1e8], [1e8, 1e10])
    np.testing.assert_allclose(EXACT.op_times(graph, TOY), [1e-5 + 1e-2, 1e-5 + 1e-2])
    half = CostModel(compute_efficiency=0.5, memory_efficiency=0.25)
    np.testing.assert_allclose(half.op_times(graph, TOY), [1e-5 + 2e-2, 1e-5 + 4e-2])
    assert roofline_time(1e11, 1e8, 1e13, 1e12, compute_efficiency=1.0, memory_efficiency=1.0) == pytest.approx(1e-2)


def test_zero_cost_and_input_ops_cost_nothing():
    graph = ops([0.0, 1e9, 1e9], [0.0, 1e6, 1e6], role=[1, 0, 1])
    times = EXACT.op_times(graph, TOY)
    assert times[0] == 0 and times[1] == 0 and times[2] > 0


def test_batch_fraction_is_linear_and_keeps_the_launch_overhead():
    graph = ops([1e11, 1e11], [0.0, 0.0], batch_scaled=[True, False])
    full = EXACT.op_times(graph, TOY)
    for fraction in (0.0, 0.25, 0.5, 2.0):
        times = EXACT.op_times(graph, TOY, fraction)
        assert times[0] == pytest.approx(1e-5 + fraction * 1e-2)
        assert times[1] == pytest.approx(full[1])  # not batch-scaled
    per_op = EXACT.op_times(graph, TOY, np.array([0.5, 0.5]))
    assert per_op[0] == pytest.approx(1e-5 + 0.5e-2)
    with pytest.raises(ValueError):
        EXACT.op_times(graph, TOY, -1.0)


def _gemm_graph(rows, h1, h2):
    """op0 input x [rows, h1], op1 weight W [h1, h2] (a parameter), op2 Y = x·W, op3 dW = xᵀ·dY (its output
    reaches only the optimizer op4: a partial sum over the batch, which does not scale). fp32."""
    x, w, y = 4.0 * rows * h1, 4.0 * h1 * h2, 4.0 * rows * h2
    flops = 2.0 * rows * h1 * h2
    return OpGraph(names=["x", "w", "y", "dw", "adam"], kinds=["input", "parameter", "mm", "mm", "adam"],
                   role=[0, 0, 1, 2, 3], flops=[0.0, 0.0, flops, flops, 10.0 * h1 * h2],
                   bytes_accessed=[0.0, 0.0, x + w + y, x + y + w, 4 * w], output_bytes=[x, w, y, w, w],
                   param_bytes=[0.0, w, 0.0, 0.0, 0.0], batch_scaled=[True, False, True, True, False],
                   split=[0, 2, 0, 1, 2], edge_src=[0, 1, 0, 3, 1], edge_dst=[2, 2, 3, 4, 4],
                   edge_bytes=[x, w, x, w, w], batch_size=rows)


def test_fixed_bytes_are_the_weights_read_and_the_weight_gradients_written():
    graph = _gemm_graph(8, 1000, 500)
    w = 4.0 * 1000 * 500
    # Y reads W over an unscaled edge; dW writes a W-sized output whose only edge does not scale;
    # the optimizer reads W and dW (it is not batch-scaled, so its fixed bytes do not matter); inputs none
    assert graph.fixed_bytes().tolist() == [0.0, 0.0, w, w, 2 * w]


def test_a_micro_batch_still_reads_the_whole_weight_matrix():
    """Y = x·W with 1000 rows, W 1000×500 on TOY (10 TFLOP/s, 1 TB/s, 10 us): full 1e9 FLOP = 100 us of
    compute (bytes 8 MB = 8 us); W alone is 2 MB = 2 us, fixed at every fraction: t(f) = 12 us + f·98 us.
    The line is the chord of the roofline max(f·100 us, (f·6 MB + 2 MB)/1 TB/s) + 10 us, never below it."""
    graph = _gemm_graph(1000, 1000, 500)
    assert EXACT.fixed_times(graph, TOY)[2] == pytest.approx(1e-5 + 2e-6)
    for fraction in (0.0, 0.01, 0.25, 1.0):
        t = EXACT.op_times(graph, TOY, fraction)[2]
        assert t == pytest.approx(1.2e-5 + fraction * (1.1e-4 - 1.2e-5))
        roofline = 1e-5 + max(fraction * 1e-4, (fraction * 6e6 + 2e6) / 1e12)
        assert t >= roofline * (1 - 1e-12)
    # a weight-bound GEMV (one row) costs the same on any share of its batch
    gemv = _gemm_graph(1, 1000, 500)
    assert EXACT.op_times(gemv, TOY, 0.5)[2] == pytest.approx(EXACT.op_times(gemv, TOY, 1.0)[2], rel=1e-3)


def test_measured_times_are_used_and_moved_by_the_roofline_ratio():
    meta = {"measured_on": "v100-16gb"}
    graph = ops([1e11, 0.0, 1e9], [1e8, 0.0, 1e6], measured=[0.02, 0.0, np.nan], meta=meta)
    v100, p100 = gpu_type("v100-16gb"), gpu_type("p100")
    model = CostModel()
    on_v100 = model.op_times(graph, v100)
    assert on_v100[0] == pytest.approx(0.02)  # measured, as is
    assert on_v100[1] == 0.0
    assert on_v100[2] == pytest.approx(model.roofline(graph, v100)[2])  # no measurement: roofline
    ratio = model.roofline(graph, p100)[0] / model.roofline(graph, v100)[0]
    assert model.op_times(graph, p100)[0] == pytest.approx(0.02 * ratio)
    assert ratio == pytest.approx((5e-6 + 1e11 / (9.3e12 * 0.7)) / (5e-6 + 1e11 / (15.7e12 * 0.7)))
    ignored = CostModel(use_measured=False).op_times(graph, v100)
    np.testing.assert_allclose(ignored, model.roofline(graph, v100))
    unknown_gpu = ops([1e11], [1e8], measured=[0.02], meta={"measured_on": None})
    assert model.op_times(unknown_gpu, v100)[0] == pytest.approx(model.roofline(unknown_gpu, v100)[0])


def test_op_time_table_has_a_column_per_gpu():
    graph = ops([1e11, 1e8], [1e8, 1e10])
    table = EXACT.op_time_table(graph, [TOY, FAST])
    assert table.shape == (2, 2)
    np.testing.assert_allclose(table[:, 1], [1e-5 + 2.5e-3, 1e-5 + 5e-3])


def test_bad_efficiency_is_rejected():
    with pytest.raises(ValueError, match="compute_efficiency"):
        CostModel(compute_efficiency=0.0)
    with pytest.raises(ValueError, match="dtype"):
        CostModel(dtype="fp8")


# ------------------------------------------------------------------------------------------------ formulas


def test_p2p_by_hand():
    assert p2p_time(1e9, 1e10, 1e-5) == pytest.approx(0.1 + 1e-5)
    assert p2p_time(0, 1e10, 1e-5) == 0.0
    np.testing.assert_allclose(p2p_time(np.array([0.0, 1e9]), 1e10, 0.0), [0.0, 0.1])


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_allreduce_by_hand(n):
    size, beta, alpha = 1e9, 1e10, 1e-5
    assert ring_allreduce_time(size, n, beta, alpha) == pytest.approx(2 * (n - 1) / n * size / beta + 2 * (n - 1) * alpha)
    assert ring_allreduce_time(size, 1, beta, alpha) == 0.0


def test_ps_and_broadcast_formulas_by_hand():
    assert ps_push_pull_time(1e9, 3, 1e10, 1e-5) == pytest.approx(2 * (1e-5 + 0.3))
    assert chain_broadcast_time(1e9, 2, 1e10, 1e-5) == pytest.approx(1e-5 + 0.1)
    assert chain_broadcast_time(1e9, 5, 1e10, 0.0) == pytest.approx(0.1)
    # alpha = 1e-3, S/beta = 0.1, n = 6: k* = sqrt(4 * 0.1 / 1e-3) = 20 chunks -> 24 * (1e-3 + 0.1 / 20)
    assert chain_broadcast_time(1e9, 6, 1e10, 1e-3) == pytest.approx(24 * (1e-3 + 0.005))
    with pytest.raises(ValueError):
        p2p_time(-1.0, 1e10)
    with pytest.raises(ValueError):
        ring_allreduce_time(1.0, 2, 0.0)


# ------------------------------------------------------------------------------------------------ cluster


def two_machines(*, intra=1e11, inter=1e10, nic=1e10, latency=1e-5):
    """Devices 0, 1 on machine 0 and 2, 3 on machine 1."""
    machine = np.array([0, 0, 1, 1])
    same = machine[:, None] == machine[None, :]
    bandwidth = np.where(same, intra, inter)
    return Cluster(name="two", types=("v100-16gb",), device_type=[0] * 4, machine=machine, bandwidth=bandwidth,
                   latency=np.where(same, 0.0, latency), nic_bandwidth=[nic, nic])


def test_transfer_time_uses_the_link_and_the_nic():
    cluster = two_machines(nic=5e9)
    assert transfer_time(cluster, 0, 1, 1e9) == pytest.approx(1e9 / 1e11)
    assert transfer_time(cluster, 0, 2, 1e9) == pytest.approx(1e-5 + 1e9 / 5e9)  # NIC slower than the link
    assert transfer_time(cluster, 3, 3, 1e9) == 0.0


def test_allreduce_on_a_cluster_matches_the_formula():
    cluster = two_machines()
    # ring 0 -> 1 -> 2 -> 3 -> 0: slowest hop the 1e10 inter-machine link, one hop out of each machine.
    assert allreduce_time(cluster, [0, 1, 2, 3], 1e9) == pytest.approx(ring_allreduce_time(1e9, 4, 1e10, 1e-5))
    assert allreduce_time(cluster, [0, 1], 1e9) == pytest.approx(ring_allreduce_time(1e9, 2, 1e11, 0.0))
    assert allreduce_time(cluster, [2], 1e9) == 0.0


def test_nic_sharing_slows_an_interleaved_ring():
    cluster = two_machines()
    contiguous = allreduce_time(cluster, [0, 1, 2, 3], 1e9)
    # 0 -> 2 -> 1 -> 3 -> 0: every hop crosses, two leave each machine and share its NIC: beta = 1e10 / 2.
    interleaved = allreduce_time(cluster, [0, 2, 1, 3], 1e9)
    assert interleaved == pytest.approx(2 * 3 / 4 * 1e9 / 5e9 + 2 * 3 * 1e-5)
    assert interleaved > contiguous
    without_nic = Cluster(name="lut", types=("v100-16gb",), device_type=[0] * 4, machine=[0, 0, 1, 1],
                          bandwidth=cluster.bandwidth, latency=cluster.latency)  # nic_bandwidth inf
    assert allreduce_time(without_nic, [0, 2, 1, 3], 1e9) == pytest.approx(contiguous)


def test_ps_versus_allreduce_by_hand():
    machine = [0, 0, 0, 0]
    cluster = Cluster(name="one", types=("v100-16gb",), device_type=[0] * 4, machine=machine,
                      bandwidth=np.full((4, 4), 1e10), latency=np.zeros((4, 4)))
    size = 1e9
    ring = allreduce_time(cluster, [0, 1, 2, 3], size)  # 2 * 3/4 * 0.1 = 0.15 s
    ps = ps_time(cluster, [0, 1, 2, 3], 0, size)  # 3 workers push 0.1 s each, then pull: 0.6 s
    assert ring == pytest.approx(0.15)
    assert ps == pytest.approx(0.6)
    assert ps == pytest.approx(ps_push_pull_time(size, 3, 1e10))
    assert ps_time(cluster, [0], 0, size) == 0.0
    # A PS outside the set serves all four devices.
    assert ps_time(cluster, [1, 2, 3], 0, size) == pytest.approx(0.6)


def test_ps_on_two_machines_sums_each_worker():
    cluster = two_machines(nic=1e10)
    # PS on 0: worker 1 over the 1e11 link, workers 2, 3 over the 1e10 link; the max latency once per phase.
    assert ps_time(cluster, [0, 1, 2, 3], 0, 1e9) == pytest.approx(2 * (1e-5 + 0.01 + 0.1 + 0.1))


def test_broadcast_on_a_cluster():
    cluster = two_machines(latency=0.0)
    assert broadcast_time(cluster, 0, [1, 2, 3], 1e9) == pytest.approx(1e9 / 1e10)  # chain 0-1-2-3, one crossing
    assert broadcast_time(cluster, 0, [0], 1e9) == 0.0
    # Chain 0 -> 2 -> 1 -> 3: two crossings out of machine 0 share its NIC (1e10 / 2).
    assert broadcast_time(cluster, 0, [2, 1, 3], 1e9) == pytest.approx(1e9 / 5e9)


def test_device_sets_are_validated():
    cluster = two_machines()
    with pytest.raises(ClusterError, match="repeats"):
        allreduce_time(cluster, [0, 1, 1], 1.0)
    with pytest.raises(ClusterError, match="not in the cluster"):
        transfer_time(cluster, 0, 9, 1.0)


# ------------------------------------------------------------------------------------------------ memory


def test_training_memory_by_hand():
    # op0 input (out 5) -> op1 forward (params 100, out 10) -> op2 forward (out 20); op1 -> op3 backward;
    # op2 has no backward consumer; op3 -> op4 optimizer.
    graph = ops([1.0] * 5, [1.0] * 5, role=[0, 1, 1, 2, 3], params=[0.0, 100.0, 0.0, 0.0, 0.0],
                output=[5.0, 10.0, 20.0, 100.0, 0.0], edges=[(0, 1), (1, 2), (1, 3), (3, 4)])
    parts = training_memory_breakdown(graph)
    assert parts == {"parameters": 100.0, "gradients": 100.0, "optimizer_state": 200.0, "activations": 10.0,
                     "total": 410.0}
    assert training_memory_bytes(graph, optimizer="sgd") == 210.0
    assert training_memory_bytes(graph, batch_fraction=0.5) == 405.0
    assert fits(graph, TOY)  # 410 <= 1000 bytes
    assert not fits(graph, GPUType("tiny", 400.0, 1e12, (("fp32", 1e13),)))
    with pytest.raises(ValueError, match="optimizer"):
        training_memory_bytes(graph, optimizer="lion")


# ------------------------------------------------------------------------------------------------ calibration


def test_rankdata_and_spearman_by_hand():
    np.testing.assert_allclose(rankdata([10, 20, 20, 5]), [2, 3.5, 3.5, 1])
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks x 1..5, y 2,1,4,3,5: d^2 = 1+1+1+1+0 = 4 -> 1 - 6*4 / (5*24) = 0.8
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_fit_recovers_known_efficiencies():
    rng = np.random.default_rng(0)
    flops = 10 ** rng.uniform(8, 12, 200)
    nbytes = 10 ** rng.uniform(6, 10, 200)
    measured = roofline_time(flops, nbytes, 1e13, 1e12, compute_efficiency=0.6, memory_efficiency=0.3, launch_overhead=1e-5)
    fit = fit_efficiencies(flops, nbytes, measured, TOY)
    assert fit.compute_efficiency == pytest.approx(0.6, rel=1e-3)
    assert fit.memory_efficiency == pytest.approx(0.3, rel=1e-3)
    assert fit.rms_log_error < 1e-3


# Measured (scripts/check_cost_model.py, V100, efficiencies 0.7 / 0.5): vgg16 0.965 / 0.974,
# resnet50 0.912 / 0.920, gnmt 0.876 / 0.452 (GNMT's backward times are shifted between layers by
# the profiler). Thresholds sit a little below.
SPEARMAN_FLOOR = {"vgg16": (0.93, 0.94), "resnet50": (0.88, 0.89), "gnmt": (0.83, 0.40)}


@pytest.mark.skipif(not PROFILES.is_dir(), reason="PipeDream profiles not found")
@pytest.mark.parametrize("model", sorted(SPEARMAN_FLOOR))
def test_roofline_ranks_pipedream_layers(model):
    from tag.graph.pipedream import load_pipedream

    agreement = profile_agreement(load_pipedream(PROFILES / f"{model}.graph.txt"))
    forward, backward = SPEARMAN_FLOOR[model]
    assert agreement["forward"]["spearman"] >= forward
    assert agreement["backward"]["spearman"] >= backward


def test_measured_times_move_to_another_dtype_on_the_same_gpu():
    graph = ops([1e12], [1e6], measured=[0.1], meta={"measured_on": "v100-16gb"})
    fp16 = CostModel(dtype="fp16")
    # compute-bound: the fp16 tensor-core peak is 125 / 15.7 times the fp32 one (launch overhead aside)
    assert fp16.op_times(graph, "v100-16gb")[0] == pytest.approx(0.1 * 15.7 / 125, rel=1e-3)


def test_parameters_are_not_counted_as_activations():
    # op0 is a parameter placeholder (input role, owns 100 bytes) read by the forward op1 and the backward op2.
    graph = ops([0.0, 1.0, 1.0], [1.0] * 3, role=[0, 1, 2], params=[100.0, 0.0, 0.0], output=[100.0, 10.0, 100.0],
                edges=[(0, 1), (0, 2), (1, 2)])
    assert training_memory_breakdown(graph)["activations"] == 10.0
