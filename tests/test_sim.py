"""tag.sim: hand-computed schedules, memory and feedback; traces; validation; fast path == reference."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tag.cluster import Cluster, tag_random
from tag.errors import GraphError, TagError
from tag.sim import kernels
from tag.sim import (
    NO_GROUP,
    RES_LINK,
    RES_NIC_IN,
    RES_NIC_OUT,
    TASK_COMPUTE,
    OOMError,
    TaskGraphBuilder,
    TaskGraphError,
    device_schedule,
    format_schedule,
    gantt,
    merge_taskgraph,
    random_taskgraph,
    simulate,
    simulate_fast,
    to_chrome_trace,
)

GB = 1e9
GiB = 2**30
SIMULATORS = [simulate, simulate_fast]


def make_cluster(machine, *, bandwidth=10 * GB, inter_bandwidth=None, latency=0.0, nic=None, gpu="v100-32gb"):
    """Devices on the given machines; ``bandwidth`` within a machine, ``inter_bandwidth`` between."""
    machine = np.asarray(machine)
    same = machine[:, None] == machine[None, :]
    table = np.where(same, bandwidth, inter_bandwidth if inter_bandwidth is not None else bandwidth)
    return Cluster(name="test", types=(gpu,), device_type=np.zeros(len(machine), int), machine=machine,
                   bandwidth=table.astype(float), latency=np.full(table.shape, float(latency)), nic_bandwidth=nic)


@pytest.fixture(params=SIMULATORS, ids=["reference", "fast"])
def sim(request):
    return request.param


# ------------------------------------------------------------------------------------------- schedules


def test_two_ops_over_one_link(sim):
    builder = TaskGraphBuilder(make_cluster([0, 0], latency=5e-6))
    a = builder.compute(0, 1.0, name="a")
    t = builder.transfer(0, 1, 1 * GB, deps=[a], name="t")
    b = builder.compute(1, 2.0, deps=[t], name="b")
    result = sim(builder.build())
    assert result.iteration_time == pytest.approx(3.100005, rel=1e-12)
    assert result.start[t] == 1.0 and result.finish[t] == pytest.approx(1.100005)
    assert result.start[b] == pytest.approx(1.100005)


def test_ring_allreduce_waits_for_every_member(sim):
    n, size, beta = 4, 1 * GB, 10 * GB
    duration = 2 * (n - 1) / n * size / beta  # 0.15 s
    builder = TaskGraphBuilder(make_cluster([0] * n, bandwidth=beta))
    grads = [builder.compute(d, float(d + 1), name=f"grad{d}") for d in range(n)]  # last one ready at 4 s
    allreduce = builder.collective(range(n), duration, nbytes=size, deps=grads, name="allreduce")
    result = sim(builder.build())
    assert result.start[allreduce] == 4.0
    assert result.finish[allreduce] == pytest.approx(4.15)


def test_collective_waits_for_busy_comm_channel_but_not_compute(sim):
    builder = TaskGraphBuilder(make_cluster([0] * 4))
    earlier = builder.collective([2, 3], 5.0, op="broadcast", name="earlier")  # holds channels 2, 3 over [0, 5]
    ready = builder.compute(0, 1.0, name="ready")
    allreduce = builder.collective(range(4), 0.5, deps=[ready], name="allreduce")
    overlap = builder.compute(0, 3.0, deps=[ready], name="overlap")  # same device, during the all-reduce
    result = sim(builder.build())
    assert result.start[allreduce] == 5.0 and result.finish[allreduce] == 5.5
    assert result.start[overlap] == 1.0 and result.finish[overlap] == 4.0
    assert result.finish[earlier] == 5.0


@pytest.mark.parametrize("latency", [0.0, 1e-5])
def test_transfers_share_a_nic(sim, latency):
    # Machine 0 = devices 0, 1; machine 1 = devices 2, 3; NIC 1 GB/s, pair bandwidth 10 GB/s.
    cluster = make_cluster([0, 0, 1, 1], bandwidth=10 * GB, latency=latency, nic=[1 * GB, 1 * GB])
    builder = TaskGraphBuilder(cluster)
    first = builder.transfer(0, 2, 1 * GB)
    second = builder.transfer(1, 3, 1 * GB)
    tg = builder.build()
    kinds = sorted(tg.resource_kind[tg.resources(first)].tolist())
    assert kinds == [RES_NIC_OUT, RES_NIC_IN, RES_LINK]
    result = sim(tg)
    assert result.finish[first] == pytest.approx(1.0 + latency)  # the NIC, not the pair, sets the speed
    assert result.finish[second] == pytest.approx(2.0 + 2 * latency)  # FIFO: the last of k at k·S/β


def test_transfers_without_shared_nic_run_in_parallel(sim):
    cluster = make_cluster([0, 0, 1, 1], bandwidth=10 * GB, inter_bandwidth=1 * GB, latency=1e-5)
    builder = TaskGraphBuilder(cluster)  # nic_bandwidth defaults to inf: no shared NIC
    transfers = [builder.transfer(0, 2, 1 * GB), builder.transfer(1, 3, 1 * GB)]
    tg = builder.build()
    assert len(tg.resources(transfers[0])) == 1
    result = sim(tg)
    np.testing.assert_allclose(result.finish[transfers], [1.0 + 1e-5] * 2)


def test_transfers_on_one_link_serialise(sim):
    builder = TaskGraphBuilder(make_cluster([0, 0], bandwidth=1 * GB))
    transfers = [builder.transfer(0, 1, 1 * GB) for _ in range(3)]
    back = builder.transfer(1, 0, 1 * GB)  # the other direction is its own link
    result = sim(builder.build())
    np.testing.assert_allclose(result.finish[transfers], [1.0, 2.0, 3.0])
    assert result.finish[back] == 1.0


def test_zero_byte_transfer_costs_nothing(sim):
    builder = TaskGraphBuilder(make_cluster([0, 1], latency=1e-3))
    a = builder.compute(0, 1.0)
    t = builder.transfer(0, 1, 0.0, deps=[a])
    assert sim(builder.build()).finish[t] == 1.0


@pytest.mark.parametrize("devices, finishes", [([0, 0, 0], [1.0, 2.0, 3.0]), ([0, 1, 0], [1.0, 1.0, 2.0])])
def test_per_device_fifo(sim, devices, finishes):
    builder = TaskGraphBuilder(make_cluster([0, 0]))
    tasks = [builder.compute(d, 1.0) for d in devices]
    result = sim(builder.build())
    np.testing.assert_allclose(result.finish[tasks], finishes)


def test_fifo_by_ready_time_then_id(sim):
    builder = TaskGraphBuilder(make_cluster([0, 0]))
    late = builder.compute(0, 1.0, name="late", label="L")  # id 0, ready at 0.5
    early = builder.compute(0, 1.0, name="early", label="E")  # id 1, ready at 0
    tie = builder.compute(0, 1.0, name="tie", label="T")  # id 2, ready at 0
    gate = builder.compute(1, 0.5, name="gate")
    builder.add_deps(late, [gate])
    tg = builder.build()
    result = sim(tg)
    assert (late, early, tie) == (0, 1, 2)
    assert [repr(e) for e in device_schedule(result, tg, 0)] == ["E@0", "T@1", "L@2"]


def test_text_grid():
    builder = TaskGraphBuilder(make_cluster([0, 0]))
    a = builder.compute(0, 2.0, label="A")
    builder.compute(1, 1.0, deps=[a], label="B")
    builder.collective([0, 1], 1.0, deps=[a], label="R")
    tg = builder.build()
    grid = format_schedule(simulate(tg), tg, columns=3)
    assert grid.splitlines()[1:] == ["d0  cmp |AA.|", "d0  com |..R|", "d1  cmp |..B|", "d1  com |..R|"]


# ------------------------------------------------------------------------------------------- memory


def test_peak_memory_of_a_chain(sim):
    builder = TaskGraphBuilder(make_cluster([0, 0]))
    a = builder.compute(0, 1.0, name="a")
    b = builder.compute(0, 1.0, deps=[a], name="b")
    c = builder.compute(0, 1.0, deps=[b], name="c")
    builder.tensor(0, 1, producer=a, consumers=[b])  # live [0, 2)
    builder.tensor(0, 2, producer=b, consumers=[c])  # live [1, 3)
    builder.tensor(0, 4, producer=c)  # no consumer: live [2, 3)
    builder.tensor(0, 10, persistent=True)
    builder.tensor(1, 7, persistent=True)
    result = sim(builder.build())
    # [0,1): 1; [1,2): 1+2; [2,3): 2+4 (the 1-byte tensor is freed at 2 before c allocates): peak 6 + 10.
    np.testing.assert_array_equal(result.peak_memory, [16.0, 7.0])
    assert result.feasible and result.oom_device == -1


def test_input_tensor_lives_from_time_zero(sim):
    builder = TaskGraphBuilder(make_cluster([0]))
    a = builder.compute(0, 1.0)
    b = builder.compute(0, 1.0, deps=[a])
    builder.tensor(0, 5, consumers=[b])  # live [0, 2)
    builder.tensor(0, 3, producer=b)  # live [1, 2)
    assert sim(builder.build()).peak_memory[0] == 8.0


def test_oom(sim):
    builder = TaskGraphBuilder(make_cluster([0, 0]))  # 32 GiB each
    a = builder.compute(1, 1.0)
    builder.tensor(1, 40 * GiB, producer=a)
    tg = builder.build()
    result = sim(tg)
    assert not result.feasible and result.oom_device == 1
    assert result.peak_memory[1] == 40 * GiB and result.memory_capacity[1] == 32 * GiB
    with pytest.raises(OOMError) as caught:
        sim(tg, raise_on_oom=True)
    message = str(caught.value)
    assert "\n" not in message
    assert "device 1" in message and "40.00 GiB" in message and "32.00 GiB" in message
    assert isinstance(caught.value, TagError) and caught.value.device == 1


# ------------------------------------------------------------------------------------------- feedback


def test_feedback_by_hand(sim):
    # Devices 0 and 1 on two machines (two device groups), 1 GB/s between them, no shared NIC.
    builder = TaskGraphBuilder(make_cluster([0, 1], inter_bandwidth=1 * GB), num_groups=3)
    builder.transfer(0, 1, 1.5 * GB, group=1, name="x")  # link 0->1 over [0, 1.5]
    a = builder.compute(0, 1.0, group=0, name="a")  # [0, 1]
    t = builder.transfer(0, 1, 1 * GB, deps=[a], group=0, name="t")  # waits for the link: [1.5, 2.5]
    builder.compute(1, 2.0, deps=[t], group=1, name="b")  # [2.5, 4.5]
    result = sim(builder.build())
    assert result.iteration_time == 4.5
    fb = result.feedback
    np.testing.assert_allclose(fb.group_makespan, [2.5, 4.5, 0.0])
    np.testing.assert_allclose(fb.group_output_idle, [0.5, 0.0, 0.0])
    np.testing.assert_allclose(fb.device_idle, [1 - 1 / 4.5, 1 - 2 / 4.5])
    np.testing.assert_allclose(fb.comm_idle, [1.0, 1.0])
    np.testing.assert_allclose(fb.link_idle, [1 - 2.5 / 4.5])
    np.testing.assert_allclose(fb.device_group_link_idle, [[1.0, 1 - 2.5 / 4.5], [1.0, 1.0]])
    np.testing.assert_allclose(fb.device_group_idle, fb.device_idle)


def test_no_feedback_when_not_asked(sim):
    builder = TaskGraphBuilder(make_cluster([0]))
    builder.compute(0, 1.0)
    assert sim(builder.build(), feedback=False).feedback is None


def test_empty_graph(sim):
    builder = TaskGraphBuilder(make_cluster([0, 0]))
    builder.tensor(0, 3, persistent=True)
    result = sim(builder.build())
    assert result.iteration_time == 0.0
    np.testing.assert_array_equal(result.peak_memory, [3.0, 0.0])
    np.testing.assert_array_equal(result.feedback.device_idle, [1.0, 1.0])


# ------------------------------------------------------------------------------------------- exports


def _small_graph():
    cluster = make_cluster([0, 0, 1], nic=[1 * GB, 1 * GB])
    builder = TaskGraphBuilder(cluster)
    a = builder.compute(0, 1e-3, label="0F0", group=0)
    t = builder.transfer(0, 2, 1e6, deps=[a], label="send")
    b = builder.compute(2, 2e-3, deps=[t], label="1F0", group=1)
    builder.collective([0, 1, 2], 1e-3, deps=[b], label="ar")
    return builder.build()


def test_chrome_trace(tmp_path):
    tg = _small_graph()
    result = simulate(tg)
    path = tmp_path / "trace.json"
    to_chrome_trace(result, tg, path)
    document = json.loads(path.read_text())
    complete = [e for e in document["traceEvents"] if e["ph"] == "X"]
    main = [e for e in complete if e["cat"] in ("compute", "transfer", "collective")]
    assert sorted(e["args"]["task"] for e in main) == list(range(tg.num_tasks))
    assert {e["name"] for e in main} == {"0F0", "send", "1F0", "ar"}
    occupancy = [e for e in complete if e["cat"].endswith(".occupancy")]
    assert len(occupancy) == 2 + 2  # the transfer's two NICs, the collective's two other members
    assert not list(tmp_path.glob(".*.tmp"))


def test_gantt_png(tmp_path):
    tg = _small_graph()
    path = tmp_path / "gantt.png"
    gantt(simulate(tg), tg, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------- validation


def test_cycle_names_the_tasks():
    builder = TaskGraphBuilder(make_cluster([0]))
    a = builder.compute(0, 1.0, name="a")
    b = builder.compute(0, 1.0, deps=[a], name="b")
    c = builder.compute(0, 1.0, deps=[b], name="c")
    builder.compute(0, 1.0, name="free")
    builder.add_deps(a, [c])
    with pytest.raises(TaskGraphError, match=r"cycle: (a -> b -> c -> a|b -> c -> a -> b|c -> a -> b -> c)"):
        builder.build()


@pytest.mark.parametrize("make, match", [
    (lambda b: b.compute(0, -1.0, name="neg"), r"'neg': duration must be finite and non-negative"),
    (lambda b: b.compute(0, float("nan")), "duration"),
    (lambda b: b.compute(5, 1.0, name="far"), r"'far': unknown device 5"),
    (lambda b: b.transfer(0, 0, 1.0, name="self"), "from device 0 to itself"),
    (lambda b: b.transfer(0, 1, -1.0), "bytes must be finite and non-negative"),
    (lambda b: b.collective([0, 0], 1.0), "listed twice"),
    (lambda b: b.collective([0, 1], 1.0, op="reduce"), "unknown collective"),
    (lambda b: b.compute(0, 1.0, deps=[7]), "no task 7"),
    (lambda b: b.tensor(0, 1.0, producer=b.compute(1, 1.0)), "lives on device 0 but its producer"),
    (lambda b: b.tensor(0, -4.0, persistent=True), "bytes must be finite"),
    (lambda b: b.tensor(0, 4.0, producer=b.compute(0, 1.0), persistent=True), "takes no producer"),
])
def test_validation(make, match):
    builder = TaskGraphBuilder(make_cluster([0, 0]))
    with pytest.raises(TaskGraphError, match=match):
        make(builder)


def test_duplicate_names_and_orphan_tensors():
    builder = TaskGraphBuilder(make_cluster([0]))
    builder.compute(0, 1.0, name="x")
    with pytest.raises(TaskGraphError, match="'x' is used twice"):
        builder.compute(0, 1.0, name="x")
    builder.tensor(0, 1.0, name="orphan")
    with pytest.raises(TaskGraphError, match="'orphan' has neither producer nor consumers"):
        builder.build()


def test_errors_are_graph_errors():
    assert issubclass(TaskGraphError, GraphError) and issubclass(OOMError, TagError)


# ------------------------------------------------------------------------------------------- merged chunks


def _merged_example():
    """Chunks a1 (1 s) and a2 (2 s) of one part on device 0; a2 reads what x (1.5 s on device 1) sends over a
    1 GB/s link (1 s); a1's output goes to device 1 (1 s) for b (1 s)."""
    builder = TaskGraphBuilder(make_cluster([0, 0], bandwidth=1 * GB))
    a1 = builder.compute(0, 1.0, name="a1")
    x = builder.compute(1, 1.5, name="x")
    t_in = builder.transfer(1, 0, 1 * GB, deps=[x], name="t_in")
    a2 = builder.compute(0, 2.0, deps=[a1, t_in], name="a2")
    t_out = builder.transfer(0, 1, 1 * GB, deps=[a1], name="t_out")
    b = builder.compute(1, 1.0, deps=[t_out], name="b")
    builder.tensor(0, 1, producer=a1, consumers=[t_out])
    builder.tensor(0, 2, producer=a2)
    builder.tensor(1, 8, producer=x, consumers=[t_in])
    builder.tensor(0, 4, producer=t_in, consumers=[a2])
    builder.tensor(1, 16, producer=t_out, consumers=[b])
    tg = builder.build()
    key = np.full(tg.num_tasks, -1)
    key[[a1, a2]] = 0
    return tg, key


def test_merged_chunks_by_hand(sim):
    tg, key = _merged_example()
    merged, new_id = merge_taskgraph(tg, key)
    assert merged.num_tasks == tg.num_tasks - 1 and new_id[0] == new_id[3]  # a1 and a2 are one task
    a, x, t_in, t_out, b = new_id[[0, 1, 2, 4, 5]]
    result = sim(merged)
    # a2 starts 1 s into the merged task and reads t_in (arriving at 2.5 s): the task runs [1.5, 4.5), as the
    # two chunks end at op level; t_out leaves when a1 ends inside it (2.5 s) instead of at 1 s
    expected = {a: (1.5, 4.5), x: (0.0, 1.5), t_in: (1.5, 2.5), t_out: (2.5, 3.5), b: (3.5, 4.5)}
    for task, (start, finish) in expected.items():
        assert (result.start[task], result.finish[task]) == pytest.approx((start, finish)), merged.names[task]
    # device 0: t_in's 4 B from 1.5 to 4.5, a1's 1 B from 1.5 until t_out is done (3.5), a2's 2 B from 2.5:
    # 7 B in [2.5, 3.5); device 1: x's 8 B until t_in ends (2.5), then t_out's 16 B
    np.testing.assert_array_equal(result.peak_memory, [7.0, 16.0])
    assert sim(tg).iteration_time == result.iteration_time == 4.5  # the chunks alone end at 4.5 s too


def test_merging_nothing_changes_nothing(sim):
    tg = random_taskgraph(tag_random(seed=4, machines=2), 60, seed=4, tie_fraction=0.5)
    merged, new_id = merge_taskgraph(tg, np.full(tg.num_tasks, -1))
    np.testing.assert_array_equal(new_id, np.arange(tg.num_tasks))
    a, b = sim(tg), sim(merged)
    np.testing.assert_array_equal(a.start, b.start)
    np.testing.assert_array_equal(a.peak_memory, b.peak_memory)


def _chains(tg, rng):
    """Merge keys [T]: chains of compute tasks on one device, ids ascending, each the direct predecessor of the
    next and on no other path to it (so the merged graph stays acyclic)."""
    order = tg.topological_order.tolist()
    ancestors = [set() for _ in range(tg.num_tasks)]
    for t in order:
        for p in tg.predecessors(t).tolist():
            ancestors[t] |= ancestors[p] | {p}
    key = np.full(tg.num_tasks, -1)
    last = {}  # chain key -> its last task
    for t in order:
        if tg.kind[t] != 0 or rng.random() < 0.1:
            continue
        for p in tg.predecessors(t).tolist():
            k = key[p]
            if (k >= 0 and last.get(k) == p and p < t and tg.device[p] == tg.device[t]
                    and not any(ancestors[q] & {u for u in range(tg.num_tasks) if key[u] == k}
                                for q in tg.predecessors(t).tolist() if q != p)):
                key[t] = k
                last[k] = t
                break
        else:
            key[t] = len(last)
            last[key[t]] = t
    return key


@pytest.mark.parametrize("case", range(3))
def test_fast_path_matches_reference_on_merged_graphs(case):
    """Random graphs with chains of compute tasks merged (outputs released and inputs awaited inside tasks):
    the fast path still equals the event-driven reference, task for task."""
    rng = np.random.default_rng(case)
    merged_some = 0
    for seed in range(25):
        tg = random_taskgraph(tag_random(seed=300 * case + seed, machines=2), 80, seed=seed,
                              tie_fraction=(0.2, 0.6, 0.0)[case], p_transfer=0.2, p_collective=0.05)
        merged, new_id = merge_taskgraph(tg, _chains(tg, rng))
        merged_some += tg.num_tasks - merged.num_tasks
        reference, fast = simulate(merged), simulate_fast(merged)
        np.testing.assert_array_equal(fast.start, reference.start)
        np.testing.assert_array_equal(fast.finish, reference.finish)
        np.testing.assert_allclose(fast.peak_memory, reference.peak_memory, rtol=1e-12)
        for name, a, b in zip(reference.feedback._fields, reference.feedback, fast.feedback):
            np.testing.assert_allclose(b, a, rtol=1e-9, err_msg=name)
        for task in range(merged.num_tasks):  # every dependency met at its lag
            lags = merged.lags.dep[merged.dep_ptr[task]:merged.dep_ptr[task + 1]]
            for dep, lag in zip(merged.predecessors(task).tolist(), lags.tolist()):
                assert fast.start[task] >= fast.start[dep] + lag
    assert merged_some >= 50  # tasks merged away over the 25 graphs


def test_bad_lags_are_refused():
    tg, _ = _merged_example()
    with pytest.raises(ValueError, match="dep_lag"):
        dataclasses.replace(tg, dep_lag=np.zeros(3))
    with pytest.raises(ValueError, match="outside"):
        dataclasses.replace(tg, dep_lag=tg.duration[tg.dep] + 1.0)


# ------------------------------------------------------------------------------------------- fast == reference

_RANDOM_CASES = [  # (tasks, machines, tie_fraction, p_transfer, p_collective)
    (40, 1, 0.2, 0.25, 0.08),
    (60, 2, 1.0, 0.35, 0.15),  # a third of the durations zero: many coinciding events
    (80, 3, 0.5, 0.30, 0.10),
    (50, None, 0.0, 0.25, 0.08),  # continuous durations, random machine count
]


@pytest.mark.parametrize("case", range(len(_RANDOM_CASES)))
def test_fast_path_matches_reference(case):
    num_tasks, machines, tie_fraction, p_transfer, p_collective = _RANDOM_CASES[case]
    for seed in range(60):  # 4 x 60 = 240 random graphs
        cluster = tag_random(seed=1000 * case + seed, machines=machines)
        tg = random_taskgraph(cluster, num_tasks, seed=seed, tie_fraction=tie_fraction, p_transfer=p_transfer,
                              p_collective=p_collective)
        reference, fast = simulate(tg), simulate_fast(tg)
        assert fast.iteration_time == pytest.approx(reference.iteration_time, rel=1e-9, abs=0)
        np.testing.assert_array_equal(fast.start, reference.start)
        np.testing.assert_array_equal(fast.finish, reference.finish)
        np.testing.assert_allclose(fast.peak_memory, reference.peak_memory, rtol=1e-9)
        assert fast.oom_device == reference.oom_device
        for name, a, b in zip(reference.feedback._fields, reference.feedback, fast.feedback):
            np.testing.assert_allclose(b, a, rtol=1e-9, err_msg=name)


def test_random_graph_respects_dependencies_and_resources():
    cluster = tag_random(seed=5, machines=3)
    tg = random_taskgraph(cluster, 300, seed=5, tie_fraction=0.5)
    result = simulate_fast(tg)
    for task in range(tg.num_tasks):
        for dep in tg.predecessors(task):
            assert result.start[task] >= result.finish[dep]
    holder = np.repeat(np.arange(tg.num_tasks), np.diff(tg.res_ptr))
    for resource in np.unique(tg.res):
        tasks = holder[tg.res == resource]
        tasks = tasks[np.lexsort((result.finish[tasks], result.start[tasks]))]
        assert (result.start[tasks][1:] >= result.finish[tasks][:-1]).all()  # one at a time
    assert tg.group.min() >= NO_GROUP


# ------------------------------------------------------------------------------------------- kernels


def test_radix_order_is_a_stable_sort():
    rng = np.random.default_rng(0)
    near = 1.0 + rng.integers(-50, 50, 200) * 1e-13  # distinct times that round to one float32
    times = np.concatenate([rng.random(700) * 10, np.round(rng.random(700) * 10, 1), np.zeros(30), [-0.0] * 5,
                            [5e-324, 1e-300, 1e300, 3.0, 3.0], near])
    rng.shuffle(times)
    order = kernels._radix_order(times)
    np.testing.assert_array_equal(order, np.argsort(times + 0.0, kind="stable"))
    assert kernels._radix_order(np.zeros(0)).size == 0


@pytest.mark.parametrize("case", ["spread", "coarse", "crowded", "infinite", "tiny"])
def test_bucket_order_is_a_stable_sort(case):
    """peak_memory's bucket sort against a stable argsort: times spread out, coarse (many ties inside and
    across buckets), crowded into one bucket (its insertion pass would move too much: the radix fallback),
    with an infinite time (no key: the fallback), and 0-2 times. ``ordered`` is filled with the times in order."""
    rng = np.random.default_rng(3)
    times = {"spread": rng.random(2000) * 7,
             "coarse": np.round(rng.random(2000) * 4, 1),
             "crowded": np.concatenate([rng.random(3000) * 1e-9, [1.0]]),
             "infinite": np.concatenate([rng.random(500), [np.inf, 0.5, np.inf]]),
             "tiny": np.array([2.0, 1.0])}[case]
    rng.shuffle(times)
    for sample in ([times] if case != "tiny" else [times, times[:1], times[:0]]):
        ordered = np.empty(sample.size)
        order = kernels._bucket_order(sample, ordered)
        np.testing.assert_array_equal(order, np.argsort(sample, kind="stable"))
        np.testing.assert_array_equal(ordered, sample[order])


def _plain_peak_memory(num_devices, device, nbytes, persistent, alloc, free):
    """Peak memory as the kernel's predecessor computed it: bincount of the persistent bytes, plus a sweep of
    the transient tensors' frees then allocations in a stable argsort of their times."""
    peak = np.bincount(device[persistent], weights=nbytes[persistent], minlength=num_devices)
    transient = ~persistent
    times = np.concatenate([free[transient], alloc[transient]])
    delta = np.concatenate([-nbytes[transient], nbytes[transient]])
    devices = np.concatenate([device[transient], device[transient]])
    live, top = np.zeros(num_devices), np.zeros(num_devices)
    for i in np.argsort(times, kind="stable").tolist():
        live[devices[i]] += delta[i]
        top[devices[i]] = max(top[devices[i]], live[devices[i]])
    return peak + top


def test_peak_memory_kernel_by_hand():
    """Two devices. Device 0: a tensor [0, 2) of 1 byte, one [1, 3) of 2 (read by task 2), one allocated at 2
    (task 2's start) of 4, freed at 3: at 2 the 1-byte tensor goes before the 4-byte one comes, so the peak
    is 2 + 4, plus 10 persistent. Device 1: 7 persistent bytes and nothing else."""
    start, finish = np.array([0.0, 1.0, 2.0]), np.array([2.0, 3.0, 3.0])
    device = np.array([0, 0, 0, 0, 1])
    nbytes = np.array([1.0, 2.0, 4.0, 10.0, 7.0])
    persistent = np.array([False, False, False, True, True])
    producer = np.array([0, 1, 2, -1, -1])
    reader_tensor, reader_task = np.array([1]), np.array([2])
    empty = np.zeros(0)
    for kernel in (kernels.peak_memory, getattr(kernels.peak_memory, "py_func", kernels.peak_memory)):
        peak = kernel(2, device, nbytes, persistent, producer, empty, empty, reader_tensor, reader_task, empty, start,
                      finish)
        np.testing.assert_array_equal(peak, [16.0, 7.0])


@pytest.mark.parametrize("lagged, lockstep", [(False, False), (True, False), (False, True)])
def test_peak_memory_kernel_equals_bincount_plus_sorted_sweep(lagged, lockstep):
    """The one-pass kernel against the path it replaced, bit for bit: many equal times (frees before
    allocations at one instant), persistent tensors mixed in, tensors without a producer or readers; and
    tensors of replicas in lockstep (runs of 4 consecutive tensors with equal times, as the kernel sorts
    runs as one key)."""
    rng = np.random.default_rng(7 + lagged + 2 * lockstep)
    num_tasks, num_tensors, num_reads, num_devices = 300, 400, 700, 5
    start = np.round(rng.random(num_tasks) * 20) / 4  # coarse times: ties everywhere
    duration = np.where(rng.random(num_tasks) < 0.3, 0.0, np.round(rng.random(num_tasks) * 8) / 4)
    finish = start + duration
    device = rng.integers(0, num_devices, num_tensors)
    nbytes = rng.random(num_tensors) * 1e9
    persistent = rng.random(num_tensors) < 0.2
    producer = np.where(persistent | (rng.random(num_tensors) < 0.1), -1, rng.integers(0, num_tasks, num_tensors))
    reader_tensor, reader_task = rng.integers(0, num_tensors, num_reads), rng.integers(0, num_tasks, num_reads)
    if lockstep:  # tensors 4k..4k+3: one producer, the same readers, one persistence
        producer, persistent = np.repeat(producer[::4], 4), np.repeat(persistent[::4], 4)
        reader_tensor = (np.repeat(reader_tensor // 4 * 4, 4) + np.tile(np.arange(4), num_reads))[:num_reads]
        reader_task = np.repeat(reader_task, 4)[:num_reads]
    lags = ((rng.random(num_tensors) * duration[np.maximum(producer, 0)] / 2,
             duration[np.maximum(producer, 0)], duration[reader_task]) if lagged else (np.zeros(0),) * 3)
    alloc, free = kernels.tensor_lifetimes(producer, lags[0], lags[1], reader_tensor, reader_task, lags[2], start,
                                           finish)
    expected = _plain_peak_memory(num_devices, device, nbytes, persistent, alloc, free)
    peak = kernels.peak_memory(num_devices, device, nbytes, persistent, producer, lags[0], lags[1], reader_tensor,
                               reader_task, lags[2], start, finish)
    np.testing.assert_array_equal(peak, expected)


def test_feedback_sums_read_either_csr_the_same():
    """feedback_sums over the successor CSR (the evaluator's) and over the predecessor CSR (a TaskGraph's):
    the same dependencies, so the same first starts, last finishes, waits and busy times."""
    tg = random_taskgraph(tag_random(seed=4, machines=2), 200, seed=4, tie_fraction=0.3, p_transfer=0.3)
    result = simulate_fast(tg)
    common = (tg.num_groups, tg.num_resources, tg.group, tg.kind, tg.duration, tg.res_ptr, tg.res)
    by_task = kernels.feedback_sums(*common, tg.dep_ptr, tg.dep, tg.lags.dep, False, result.start, result.finish)
    by_pred = kernels.feedback_sums(*common, tg.succ_ptr, tg.succ, tg.succ_lag, True, result.start, result.finish)
    assert by_task[3].sum() > 0  # some compute task feeds a transfer
    for a, b in zip(by_task, by_pred):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    # by hand: each wait is a transfer's start minus the finish of the compute task it waits for
    pred = np.repeat(np.arange(tg.num_tasks), np.diff(tg.succ_ptr))
    feeds = (tg.kind[pred] == 0) & (tg.kind[tg.succ] != 0) & (tg.group[pred] >= 0)
    wait = np.zeros(tg.num_groups)
    np.add.at(wait, tg.group[pred[feeds]], result.start[tg.succ[feeds]] - result.finish[pred[feeds]])
    np.testing.assert_allclose(by_pred[2], wait, rtol=1e-12)


def _vectorised_feedback(cluster, busy, first, last, wait, count, resource_kind, resource_a, resource_b, makespan,
                         peak):
    """Table 1's arrays from the sums the plain numpy way (np.add.at, np.bincount): the reference that
    kernels.feedback_tables must match bit for bit."""
    idle = np.ones_like(busy) if makespan <= 0 else 1.0 - busy / makespan
    links = np.flatnonzero(resource_kind == RES_LINK)
    n = cluster.num_device_groups
    src, dst = cluster.device_group[resource_a[links]], cluster.device_group[resource_b[links]]
    pair_count, pair_idle = np.zeros((n, n)), np.zeros((n, n))
    np.add.at(pair_count, (src, dst), 1.0)
    np.add.at(pair_idle, (src, dst), idle[links])
    group_peak = np.zeros(n)
    np.maximum.at(group_peak, cluster.device_group, peak)
    members = np.bincount(cluster.device_group, minlength=n)
    return (np.where(np.isfinite(first), last - first, 0.0),
            np.divide(wait, count, out=np.zeros(first.size), where=count > 0), idle, idle[links],
            idle[resource_kind == RES_NIC_OUT], idle[resource_kind == RES_NIC_IN], group_peak,
            np.bincount(cluster.device_group, weights=idle[:cluster.num_devices], minlength=n) / members,
            np.divide(pair_idle, pair_count, out=np.ones_like(pair_idle), where=pair_count > 0))


@pytest.mark.parametrize("seed", [4, 7])
def test_feedback_tables_equal_the_vectorised_arrays(seed):
    """kernels.feedback_tables (one pass, in index order) gives the numpy arrays bit for bit, on a schedule
    with links and shared NICs, and with a zero makespan (every resource idle)."""
    cluster = tag_random(seed=seed, machines=3)
    tg = random_taskgraph(cluster, 200, seed=seed, tie_fraction=0.3, p_transfer=0.4)
    result = simulate_fast(tg)
    first, last, wait, count, busy = kernels.feedback_sums(
        tg.num_groups, tg.num_resources, tg.group, tg.kind, tg.duration, tg.res_ptr, tg.res, tg.dep_ptr, tg.dep,
        tg.lags.dep, False, result.start, result.finish)
    assert (tg.resource_kind == RES_LINK).any() and (tg.resource_kind == RES_NIC_OUT).any()
    for makespan in (result.iteration_time, 0.0):
        got = kernels.feedback_tables(first, last, wait, count, busy, makespan, tg.resource_kind, tg.resource_a,
                                      tg.resource_b, cluster.device_group, cluster.num_device_groups,
                                      result.peak_memory)
        expected = _vectorised_feedback(cluster, busy, first, last, wait, count, tg.resource_kind, tg.resource_a,
                                        tg.resource_b, makespan, result.peak_memory)
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def _heapq_list_schedule(duration, res_ptr, res, succ_ptr, succ, succ_lag, indegree, num_resources):
    """The list scheduling rule of :mod:`tag.sim.fast` written plainly with heapq (a dependency is met
    ``succ_lag`` after its predecessor's start; empty: at its finish)."""
    import heapq

    waiting, ready, free = indegree.copy(), np.zeros(duration.size), np.zeros(num_resources)
    start, finish = np.empty(duration.size), np.empty(duration.size)
    heap = [(0.0, task) for task in np.flatnonzero(waiting == 0).tolist()]
    while heap:
        begin, task = heapq.heappop(heap)
        held = res[res_ptr[task]:res_ptr[task + 1]]
        begin = max([begin, *free[held]])
        start[task], finish[task] = begin, begin + duration[task]
        free[held] = finish[task]
        for k in range(succ_ptr[task], succ_ptr[task + 1]):
            successor = int(succ[k])
            release = begin + succ_lag[k] if succ_lag.size else finish[task]
            ready[successor] = max(ready[successor], release)
            waiting[successor] -= 1
            if waiting[successor] == 0:
                heapq.heappush(heap, (ready[successor], successor))
    return start, finish


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("times", ["coarse", "fine", "lagged"])
def test_list_schedule_pops_tasks_in_ready_time_then_id_order(seed, times):
    """The kernel's radix heap (buckets by the highest bit a ready time differs from the last one taken in,
    a heap of ids for the ties) and its stream of dependency-free tasks merged with it take tasks in the order
    of a plain heapq, ties included. Coarse durations, many of them zero, make tasks ready at 0 through a
    dependency compete with the stream and make equal ready times later on; fine ones (from microseconds to
    seconds) spread the ready times over many buckets; lags release a dependency inside its predecessor."""
    rng = np.random.default_rng(seed)
    num_tasks, num_resources = 400, 7
    if times == "coarse":
        duration = np.where(rng.random(num_tasks) < 0.4, 0.0, rng.integers(1, 4, num_tasks) * 0.5)
    else:
        duration = np.where(rng.random(num_tasks) < 0.1, 0.0, 10.0 ** rng.uniform(-6, 0, num_tasks))
    dep_task = rng.integers(1, num_tasks, 900)
    dep_on = (rng.random(900) * dep_task).astype(np.int64)  # earlier tasks only: a DAG
    dep_lag = duration[dep_on] * rng.random(900) if times == "lagged" else np.zeros(0)
    holds = rng.integers(1, 3, num_tasks)
    res_ptr = np.concatenate([[0], np.cumsum(holds)])
    res = np.concatenate([rng.choice(num_resources, k, replace=False) for k in holds.tolist()])
    succ_ptr, succ, succ_lag, indegree = kernels.successors_csr(num_tasks, dep_task, dep_on, dep_lag)
    expected = _heapq_list_schedule(duration, res_ptr, res, succ_ptr, succ, succ_lag, indegree, num_resources)
    for schedule in (kernels.list_schedule, getattr(kernels.list_schedule, "py_func", kernels.list_schedule)):
        start, finish = schedule(duration, res_ptr, res, succ_ptr, succ, succ_lag, indegree, num_resources)
        np.testing.assert_array_equal(start, expected[0])
        np.testing.assert_array_equal(finish, expected[1])


@pytest.mark.skipif(not kernels.COMPILED, reason="the kernels are plain Python already")
def test_kernels_agree_with_their_python_source():
    """The fallback without numba runs the same source; check that the source alone gives the same schedule."""
    tg = random_taskgraph(tag_random(seed=2, machines=2), 150, seed=2, tie_fraction=0.6)
    args = (tg.duration, tg.res_ptr, tg.res, tg.succ_ptr, tg.succ, tg.succ_lag, np.diff(tg.dep_ptr), tg.num_resources)
    start, finish = kernels.list_schedule(*args)
    start_py, finish_py = kernels.list_schedule.py_func(*args)
    np.testing.assert_array_equal(start, start_py)
    np.testing.assert_array_equal(finish, finish_py)
    dep_task = np.repeat(np.arange(tg.num_tasks), np.diff(tg.dep_ptr))
    lag = tg.duration[tg.dep]
    doubled = (np.concatenate([dep_task, dep_task[:10]]), np.concatenate([tg.dep, tg.dep[:10]]),
               np.concatenate([lag, lag[:10] / 2]))  # duplicates, with smaller lags: the larger one is kept
    for got in (kernels.successors_csr(tg.num_tasks, *doubled), kernels.successors_csr.py_func(tg.num_tasks, *doubled)):
        succ_ptr, succ, succ_lag, indegree = got
        np.testing.assert_array_equal(indegree, np.diff(tg.dep_ptr))
        for task in range(tg.num_tasks):
            assert sorted(succ[succ_ptr[task]:succ_ptr[task + 1]].tolist()) == tg.successors(task).tolist()
        pred = np.repeat(np.arange(tg.num_tasks), np.diff(succ_ptr))
        np.testing.assert_array_equal(succ_lag, tg.duration[pred])


@pytest.mark.parametrize("lagged", [False, True])
def test_successor_lists_with_duplicates_give_the_merged_csrs_schedule_and_feedback(lagged):
    """successor_lists (duplicates kept: the evaluator's) against successors_csr (duplicates merged) on
    dependencies listed twice, in random places and, with lags, with other lags: the same schedule, and
    feedback_sums over either gives the same sums bit for bit."""
    tg = random_taskgraph(tag_random(seed=5, machines=2), 200, seed=5, tie_fraction=0.3, p_transfer=0.4)
    rng = np.random.default_rng(5 + lagged)
    dep_task = np.repeat(np.arange(tg.num_tasks), np.diff(tg.dep_ptr))
    twice = rng.choice(dep_task.size, 80, replace=False)
    order = rng.permutation(dep_task.size + twice.size)
    dep_task = np.concatenate([dep_task, dep_task[twice]])[order]
    dep_on = np.concatenate([tg.dep, tg.dep[twice]])[order]
    lag = tg.duration[dep_on] * rng.random(dep_on.size) * 1.5 if lagged else np.zeros(0)
    fed = (tg.kind[dep_on] == TASK_COMPUTE) & (tg.kind[dep_task] != TASK_COMPUTE) & (tg.group[dep_on] >= 0)
    assert fed[order >= order.size - twice.size].any()  # some duplicate is a dependency the feedback reads
    merged = kernels.successors_csr(tg.num_tasks, dep_task, dep_on, lag)
    expected = kernels.list_schedule(tg.duration, tg.res_ptr, tg.res, *merged, tg.num_resources)
    common = (tg.num_groups, tg.num_resources, tg.group, tg.kind, tg.duration, tg.res_ptr, tg.res)
    sums = kernels.feedback_sums(*common, *merged[:3], True, *expected)
    for successor_lists, feedback_sums in ((kernels.successor_lists, kernels.feedback_sums),
                                           (getattr(kernels.successor_lists, "py_func", kernels.successor_lists),
                                            getattr(kernels.feedback_sums, "py_func", kernels.feedback_sums))):
        listed = successor_lists(tg.num_tasks, dep_task, dep_on, lag)
        assert listed[1].size == dep_task.size and listed[3].sum() == dep_task.size
        schedule = kernels.list_schedule(tg.duration, tg.res_ptr, tg.res, *listed, tg.num_resources)
        for a, b in zip(schedule, expected):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(feedback_sums(*common, *listed[:3], True, *expected), sums):
            np.testing.assert_array_equal(a, b)


def test_int_tables_look_up_and_store_many_keys_at_once():
    """The evaluator's int64 -> int64 tables: every stored key found with its last value, every other one -1,
    keys past 2^32 included; the same through the plain-Python kernels on a plain dict."""
    rng = np.random.default_rng(3)
    keys = rng.choice(1 << 40, size=300, replace=False).astype(np.int64)
    values = rng.integers(0, 1 << 31, size=300)
    for table, look_up, store in ((kernels.int_table(), kernels.table_look_up, kernels.table_store),
                                  ({}, getattr(kernels.table_look_up, "py_func", kernels.table_look_up),
                                   getattr(kernels.table_store, "py_func", kernels.table_store))):
        np.testing.assert_array_equal(look_up(table, keys), -1)
        store(table, keys[:200], values[:200])
        store(table, keys[:10], values[200:210])  # stored again: the last value holds
        expected = np.concatenate([values[200:210], values[10:200], np.full(100, -1)])
        np.testing.assert_array_equal(look_up(table, keys), expected)
        assert len(table) == 200


def test_without_numba_the_fast_path_still_matches_the_reference(without_numba):
    without_numba("import numpy as np\n"
                  "from tag.cluster import tag_random\n"
                  "from tag.sim import kernels, random_taskgraph, simulate, simulate_fast\n"
                  "assert not kernels.COMPILED\n"
                  "tg = random_taskgraph(tag_random(seed=1, machines=2), 80, seed=1, tie_fraction=0.5)\n"
                  "a, b = simulate(tg), simulate_fast(tg)\n"
                  "assert np.array_equal(a.start, b.start) and np.array_equal(a.finish, b.finish)\n"
                  "assert np.allclose(a.peak_memory, b.peak_memory, rtol=1e-9)\n", timeout=120)
