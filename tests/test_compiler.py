"""tag.compiler: hand-computed plans, inserted ops, memory, the checker, and the fast path against the reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tag.cluster import Cluster, gpu_type, resolve_cluster
from tag.compiler import (
    ADAM_COPIES,
    CompileCheckError,
    CompileError,
    CompilerCache,
    StrategyEvaluator,
    check_compiled,
    compile_strategy,
    evaluate_strategy,
    random_strategy,
    strategy_evaluator,
)
from tag.cost import CostModel
from tag.graph import ROLE_BACKWARD, ROLE_FORWARD, ROLE_INPUT, ROLE_OPTIMIZER, OpGraph
from tag.graph.resolve import resolve_model
from tag.grouping import GroupGraph, group_ops
from tag.sim import (
    OOMError,
    RES_COMM,
    RES_NIC_IN,
    RES_NIC_OUT,
    TASK_COLLECTIVE,
    TASK_COMPUTE,
    TASK_TRANSFER,
    simulate,
    simulate_fast,
)
from tag.strategy import ALLREDUCE, DUPLICATE, MODEL_PARALLEL, PS, Strategy

GB = 1e9
CONCAT, SUM, NONE = 0, 1, 2
GRANULARITIES = ["group", "part", "op"]


def make_cluster(num_devices, device_group, *, machine=None, gpus=None, bandwidth=10 * GB, latency=5e-6):
    """Devices with explicit device groups; one bandwidth and latency between every pair, no shared NIC."""
    gpus = gpus or ["v100-32gb"] * num_devices
    types = tuple(dict.fromkeys(gpus))
    table = np.full((num_devices, num_devices), float(bandwidth))
    return Cluster(name="test", types=types, device_type=np.array([types.index(g) for g in gpus]),
                   machine=np.asarray(machine if machine is not None else [0] * num_devices),
                   bandwidth=table, latency=np.full(table.shape, latency), device_group=np.asarray(device_group))


def graph_of(ops, edges, *, batch_size=4):
    """An OpGraph from (name, role, split, batch_scaled, flops, output_bytes, param_bytes) rows and (a, b, bytes)
    edges; bytes_accessed 0, so an op's time is launch + f · flops / (peak · efficiency)."""
    return OpGraph(
        names=[o[0] for o in ops], kinds=["test"] * len(ops), role=[o[1] for o in ops], split=[o[2] for o in ops],
        batch_scaled=[o[3] for o in ops], flops=[o[4] for o in ops], bytes_accessed=[0.0] * len(ops),
        output_bytes=[o[5] for o in ops], param_bytes=[o[6] for o in ops],
        edge_src=[e[0] for e in edges], edge_dst=[e[1] for e in edges], edge_bytes=[e[2] for e in edges],
        batch_size=batch_size,
    )


def op_time(graph, op, gpu, fraction=1.0):
    return float(CostModel().op_times(graph, gpu, fraction)[op])


# ------------------------------------------------------------------------------------------ hand-computed plans


@pytest.fixture
def chain():
    """x (the batch) -> a -> b, a's output 0.8 GB at the reference batch; groups {x, a} and {b}."""
    graph = graph_of(
        [("x", ROLE_INPUT, CONCAT, True, 0.0, 4e6, 0.0),
         ("a", ROLE_FORWARD, CONCAT, True, 1e12, 8e8, 0.0),
         ("b", ROLE_FORWARD, CONCAT, True, 2e12, 4e6, 0.0)],
        [(0, 1, 4e6), (1, 2, 8e8)])
    return graph, np.array([0, 0, 1])


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_two_ops_on_two_devices_over_one_link(chain, granularity):
    graph, assignment = chain
    cluster = make_cluster(2, [0, 1])
    gg = GroupGraph.from_assignment(graph, assignment, gpus=cluster)
    strategy = Strategy.from_cluster(cluster, [[1, 0], [0, 1]], [DUPLICATE, DUPLICATE])
    plan = compile_strategy(gg, strategy, cluster, granularity=granularity)
    v100 = gpu_type("v100-32gb")
    expected = op_time(graph, 1, v100) + (5e-6 + 8e8 / (10 * GB)) + op_time(graph, 2, v100)
    for run in (simulate, simulate_fast):
        assert run(plan.taskgraph).iteration_time == pytest.approx(expected, rel=1e-12)
    [transfer] = plan.inserted
    assert (transfer.op, transfer.producer_group, transfer.group, transfer.devices) == ("Transfer", 0, 1, (0, 1))
    assert transfer.nbytes == 8e8 and len(transfer.tasks) == 1
    check_compiled(plan)


@pytest.mark.parametrize("granularity", ["group", "op"])
def test_split_sends_each_replica_its_rows(chain, granularity):
    """b replicated on devices 1 and 2 (even batch): each gets half of a's rows from device 0, in parallel."""
    graph, assignment = chain
    cluster = make_cluster(3, [0, 1, 1])
    gg = GroupGraph.from_assignment(graph, assignment, gpus=cluster)
    plan = compile_strategy(gg, Strategy.from_cluster(cluster, [[1, 0], [0, 1]], [DUPLICATE, ALLREDUCE]), cluster,
                            granularity=granularity)
    v100 = gpu_type("v100-32gb")
    expected = op_time(graph, 1, v100) + 5e-6 + 4e8 / (10 * GB) + op_time(graph, 2, v100, 0.5)
    assert simulate(plan.taskgraph).iteration_time == pytest.approx(expected, rel=1e-12)
    [split] = plan.inserted
    assert split.op == "Split" and split.nbytes == pytest.approx(8e8) and len(split.tasks) == 2
    rows = sorted((d.dst, d.lo, d.hi) for d in plan.deliveries)
    assert rows == [(1, 0.0, 0.5), (2, 0.5, 1.0)]
    check_compiled(plan)


def test_concat_gathers_replicated_rows(chain):
    """a replicated on devices 1 and 2, b alone on device 0: each half of a's output comes to device 0."""
    graph, assignment = chain
    cluster = make_cluster(3, [0, 1, 1])
    gg = GroupGraph.from_assignment(graph, assignment, gpus=cluster)
    plan = compile_strategy(gg, Strategy.from_cluster(cluster, [[0, 1], [1, 0]], [ALLREDUCE, DUPLICATE]), cluster)
    v100 = gpu_type("v100-32gb")
    expected = op_time(graph, 1, v100, 0.5) + 5e-6 + 4e8 / (10 * GB) + op_time(graph, 2, v100)
    assert simulate_fast(plan.taskgraph).iteration_time == pytest.approx(expected, rel=1e-12)
    assert [op.op for op in plan.inserted] == ["Concat"]
    check_compiled(plan)


def test_uneven_layouts_overlap_rows(chain):
    """a on 2 replicas, b on 3 (speed split off): rows move by overlap of [0, 1/2), [1/2, 1) with thirds."""
    graph, assignment = chain
    cluster = make_cluster(5, [0, 0, 1, 1, 1])
    gg = GroupGraph.from_assignment(graph, assignment, gpus=cluster)
    plan = compile_strategy(gg, Strategy.from_cluster(cluster, [[1, 0], [0, 1]], [ALLREDUCE, ALLREDUCE]), cluster)
    moved = sorted((d.src, d.dst, round(d.lo, 6), round(d.hi, 6)) for d in plan.deliveries)
    assert moved == [(0, 2, 0.0, round(1 / 3, 6)), (0, 3, round(1 / 3, 6), 0.5), (1, 3, 0.5, round(2 / 3, 6)),
                     (1, 4, round(2 / 3, 6), 1.0)]
    assert sum(plan.taskgraph.nbytes[d.task] for d in plan.deliveries) == pytest.approx(8e8)
    check_compiled(plan)


@pytest.fixture
def one_layer():
    """W (a parameter of P bytes), x -> f (forward) -> g (weight gradient, sum class) -> u (Adam update of W)."""
    param = 4e8
    graph = graph_of(
        [("W", ROLE_INPUT, NONE, False, 0.0, param, param),
         ("x", ROLE_INPUT, CONCAT, True, 0.0, 4e6, 0.0),
         ("f", ROLE_FORWARD, CONCAT, True, 3e12, 1e6, 0.0),
         ("g", ROLE_BACKWARD, SUM, True, 6e12, param, 0.0),
         ("u", ROLE_OPTIMIZER, NONE, False, 1e10, param, 0.0)],
        [(0, 2, param), (1, 2, 4e6), (2, 3, 1e6), (3, 4, param), (0, 4, param)])
    return graph, param


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_ps_against_allreduce_by_hand(one_layer, granularity):
    graph, param = one_layer
    beta, alpha = 10 * GB, 5e-6
    cluster = make_cluster(3, [0, 0, 0], bandwidth=beta, latency=alpha)
    gg = GroupGraph.from_assignment(graph, np.zeros(5, dtype=int), gpus=cluster)
    v100 = gpu_type("v100-32gb")
    compute = op_time(graph, 2, v100, 1 / 3) + op_time(graph, 3, v100, 1 / 3) + op_time(graph, 4, v100)
    allreduce = 2 * (2 / 3) * param / beta + 2 * 2 * alpha  # ring over 3 devices
    ps = 2 * (alpha + 2 * param / beta)  # 2 workers push then pull through the server's link
    times = {}
    for option in (ALLREDUCE, PS):
        plan = compile_strategy(gg, Strategy.from_cluster(cluster, [[1]], [option]), cluster, granularity=granularity)
        times[option] = simulate(plan.taskgraph).iteration_time
        # the search's path times the collective from its own per-skeleton plan: the same seconds
        fast = evaluate_strategy(gg, Strategy.from_cluster(cluster, [[1]], [option]), cluster, granularity=granularity)
        assert fast.iteration_time == simulate_fast(plan.taskgraph).iteration_time
        [sync] = plan.inserted
        assert sync.op == ("AllReduce" if option == ALLREDUCE else "PS") and sync.devices == (0, 1, 2)
        assert "weight gradients of group 0 replicated on 3 devices" in sync.reason
        check_compiled(plan)
    assert times[ALLREDUCE] == pytest.approx(compute + allreduce, rel=1e-12)
    assert times[PS] == pytest.approx(compute + ps, rel=1e-12)
    assert "parameter server(s) on device(s) [0]" in sync.reason  # group 0, first gradient: replica 0
    duplicate = compile_strategy(gg, Strategy.from_cluster(cluster, [[1]], [DUPLICATE]), cluster)
    assert duplicate.inserted == []  # every copy computes the whole batch: nothing to synchronise
    whole = op_time(graph, 2, v100) + op_time(graph, 3, v100) + op_time(graph, 4, v100)
    assert simulate_fast(duplicate.taskgraph).iteration_time == pytest.approx(whole, rel=1e-12)


def test_gradient_read_by_another_group_is_reduced_by_addn(one_layer):
    """g's partials (f, g on devices 0-2) are read whole by u on device 3: AddN at one root, then sent on."""
    graph, param = one_layer
    cluster = make_cluster(4, [0, 0, 0, 1])
    gg = GroupGraph.from_assignment(graph, np.array([0, 0, 0, 0, 1]), gpus=cluster)
    plan = compile_strategy(gg, Strategy.from_cluster(cluster, [[1, 0], [0, 1]], [ALLREDUCE, DUPLICATE]), cluster)
    kinds = sorted((d.kind, d.src, d.dst) for d in plan.deliveries if d.uses)
    partials = [k for k in kinds if k[0] == "partial"]
    assert partials == [("partial", 0, 3), ("partial", 1, 3), ("partial", 2, 3)]
    assert any(op.op == "AddN" for op in plan.inserted)
    check_compiled(plan)


def test_persistent_memory_and_oom_name_the_device(one_layer):
    graph, param = one_layer
    big = dataclasses.replace(graph, param_bytes=graph.param_bytes * 8)  # 3.2 GB of parameters
    cluster = make_cluster(1, [0], gpus=["1080ti"])  # 11 GB
    gg = GroupGraph.from_assignment(big, np.zeros(5, dtype=int), gpus=cluster)
    plan = compile_strategy(gg, Strategy.from_cluster(cluster, [[1]], [DUPLICATE]), cluster)
    assert plan.persistent_bytes.tolist() == [ADAM_COPIES * 8 * param]
    result = simulate(plan.taskgraph)
    # persistent parameter + gradient + two moments, and f's activation while g runs
    assert result.peak_memory[0] == pytest.approx(ADAM_COPIES * 8 * param + 1e6)
    assert not result.feasible and result.oom_device == 0
    with pytest.raises(OOMError, match=r"device 0 \(1080ti"):
        plan.simulate(raise_on_oom=True)


def test_data_parallel_memory_is_four_copies_of_the_parameters_per_device():
    graph = resolve_model("bert-large", tiny=True)
    cluster = resolve_cluster("tag-testbed")
    gg = group_ops(graph, num_groups=20, gpus=cluster)
    plan = compile_strategy(gg, Strategy.data_parallel(gg.num_groups, cluster), cluster)
    assert np.allclose(plan.persistent_bytes, ADAM_COPIES * graph.total_param_bytes())
    assert (simulate_fast(plan.taskgraph).peak_memory >= plan.persistent_bytes).all()


# ------------------------------------------------------------------------------------------ inserted ops


@pytest.mark.parametrize("cap", ["zero", "at the first update", "past three updates", "long"])
def test_updates_reading_their_parameters_are_cut_only_after_a_long_chunk(cap, monkeypatch):
    """Group granularity cuts a part before every op reading another group's tensor, except an optimizer op
    reading an input tensor of another group (its parameter): that one starts a chunk only once the chunk
    before it runs for OPTIMIZER_CHUNK_S. Parameters W1 and W2 live with the forward op f in group 0; the
    gradients g1, g2, a backward op h reading g1 and W1, and the updates, in the order u1a, u1b (reads W1),
    u2a, u2b (reads W2), in group 1; u1a is long, the other updates short. h's read of W1 still cuts."""
    import tag.compiler.tables as tables_module
    from tag.compiler.cache import compiler_tables

    row = (ROLE_OPTIMIZER, NONE, False)
    graph = graph_of(
        [("W1", ROLE_INPUT, NONE, False, 0.0, 4e6, 4e6), ("W2", ROLE_INPUT, NONE, False, 0.0, 4e6, 4e6),
         ("x", ROLE_INPUT, CONCAT, True, 0.0, 4e6, 0.0), ("f", ROLE_FORWARD, CONCAT, True, 1e9, 4e6, 0.0),
         ("g1", ROLE_BACKWARD, SUM, True, 1e9, 4e6, 0.0), ("g2", ROLE_BACKWARD, SUM, True, 1e9, 4e6, 0.0),
         ("u1a", *row, 1e12, 4e6, 0.0), ("u1b", *row, 1e6, 4e6, 0.0), ("u2a", *row, 1e6, 4e6, 0.0),
         ("u2b", *row, 1e6, 4e6, 0.0), ("h", ROLE_BACKWARD, SUM, True, 1e9, 4e6, 0.0)],
        [(0, 3, 4e6), (1, 3, 4e6), (2, 3, 4e6), (3, 4, 4e6), (3, 5, 4e6), (4, 6, 4e6), (6, 7, 4e6), (0, 7, 4e6),
         (5, 8, 4e6), (8, 9, 4e6), (1, 9, 4e6), (4, 10, 4e6), (0, 10, 4e6)])
    v100 = gpu_type("v100-32gb")
    t = [op_time(graph, op, v100) for op in range(10)]
    assert t[6] > 100 * (t[7] + t[8])
    limit, expected = {
        "zero": (0.0, [[6], [7, 8], [9]]),  # every parameter read cuts, as any other read does
        "at the first update": (t[6], [[6], [7, 8, 9]]),  # u1a alone reaches the limit: a cut before u1b
        "past three updates": (t[6] + (t[7] + t[8]) / 2, [[6, 7, 8], [9]]),
        "long": (1.0, [[6, 7, 8, 9]]),
    }[cap]
    monkeypatch.setattr(tables_module, "OPTIMIZER_CHUNK_S", limit)
    cluster = make_cluster(1, [0])
    gg = GroupGraph.from_assignment(graph, np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]), gpus=cluster)
    tables = compiler_tables(gg, cluster, gg.cost, "group")
    units = [(int(role), ops.tolist()) for ops, role in zip(tables.unit_ops, tables.unit_role)]
    assert [ops for role, ops in units if role == ROLE_OPTIMIZER] == expected
    assert [ops for role, ops in units if role == ROLE_BACKWARD] == [[4], [5], [10]]  # other reads still cut


@pytest.mark.parametrize("case", ["view emits", "view does not emit", "view reads another group"])
def test_ops_of_no_time_stay_in_the_chunk_of_the_op_before_them(case):
    """After an op whose output another group reads, group granularity starts a chunk at the next op that
    takes time: an op of no time between them (a view: no FLOPs, no bytes) joins the emitter's chunk, which
    ends when the view does. Group 0: x -> s -> a -> v (a view of a) -> b; group 1: c reads a, and v if the
    view emits; group 2: x2 -> y, and v reads y if the view reads another group: then v starts a chunk for
    that read, which b joins. Cutting after every emitter gave [a], [v], [b] or [a], [v, b]."""
    from tag.compiler.cache import compiler_tables

    graph = graph_of(
        [("x", ROLE_INPUT, CONCAT, True, 0.0, 4e6, 0.0), ("s", ROLE_FORWARD, CONCAT, True, 1e9, 4e6, 0.0),
         ("a", ROLE_FORWARD, CONCAT, True, 1e9, 4e6, 0.0), ("v", ROLE_FORWARD, CONCAT, True, 0.0, 4e6, 0.0),
         ("b", ROLE_FORWARD, CONCAT, True, 1e9, 4e6, 0.0), ("c", ROLE_FORWARD, CONCAT, True, 1e9, 4e6, 0.0),
         ("y", ROLE_FORWARD, CONCAT, True, 1e9, 4e6, 0.0), ("x2", ROLE_INPUT, CONCAT, True, 0.0, 4e6, 0.0)],
        [(0, 1, 4e6), (1, 2, 4e6), (2, 3, 4e6), (3, 4, 4e6), (2, 5, 4e6), (7, 6, 4e6)]
        + {"view emits": [(3, 5, 4e6)], "view does not emit": [], "view reads another group": [(6, 3, 4e6)]}[case])
    assert op_time(graph, 3, gpu_type("v100-32gb")) == 0 < op_time(graph, 2, gpu_type("v100-32gb"))
    cluster = make_cluster(1, [0])
    gg = GroupGraph.from_assignment(graph, np.array([0, 0, 0, 0, 0, 1, 2, 2]), gpus=cluster)
    units = [ops.tolist() for ops in compiler_tables(gg, cluster, gg.cost, "group").unit_ops]
    if case == "view reads another group":  # group 2 comes first in the groups' topological order
        assert units == [[6], [1], [2], [3, 4], [5]]
    else:
        assert units == [[1], [2, 3], [4], [5], [6]]  # s alone: ready at 0 (reads only x)


@pytest.fixture(scope="module")
def bert_tiny():
    graph = resolve_model("bert-large", tiny=True)
    cluster = resolve_cluster("tag-testbed")
    return group_ops(graph, num_groups=30, gpus=cluster), cluster


def test_data_parallel_inserts_only_allreduces(bert_tiny):
    gg, cluster = bert_tiny
    plan = compile_strategy(gg, Strategy.data_parallel(gg.num_groups, cluster), cluster)
    assert {op.op for op in plan.inserted} == {"AllReduce"}
    assert (plan.taskgraph.kind != TASK_TRANSFER).all()
    reasons = [op.reason for op in plan.inserted]
    assert any("weight gradients of group" in r and "replicated on 16 devices (option allreduce)" in r for r in reasons)
    record = plan.inserted_ops()[0]
    assert set(record) == {"op", "group", "producer_group", "devices", "bytes", "tensors", "tasks", "reason"}
    assert record["devices"] == list(range(16))
    text = plan.format()
    assert "AllReduce" in text and "device(s) 0-15" in text


def test_collectives_across_machines_hold_their_nics(bert_tiny):
    """A collective whose members span machines holds their NICs (both ways), so p2p transfers over those NICs
    queue with it; one inside a machine holds only the comm channels."""
    gg, cluster = bert_tiny  # tag-testbed: machine 0 has devices 0-3, a 100 Gbps NIC per machine
    row = np.zeros(cluster.num_device_groups, dtype=bool)
    row[cluster.device_group[[0, 4]]] = True  # the NVLink machine and one 1080 Ti machine
    strategy = Strategy.data_parallel(gg.num_groups, cluster).with_group(0, row, ALLREDUCE)
    tg = compile_strategy(gg, strategy, cluster).taskgraph
    collectives = np.flatnonzero(tg.kind == TASK_COLLECTIVE)
    assert collectives.size
    for task in collectives.tolist():
        held = tg.resources(task)
        members = tg.members(task)
        machines = set(cluster.machine[members].tolist())
        nics = held[(tg.resource_kind[held] == RES_NIC_OUT) | (tg.resource_kind[held] == RES_NIC_IN)]
        assert sorted(tg.resource_a[nics].tolist()) == (sorted(list(machines) * 2) if len(machines) > 1 else [])
        assert (tg.resource_kind[held[~np.isin(held, nics)]] == RES_COMM).all()
    result = simulate_fast(tg)
    for nic in np.flatnonzero(tg.resource_kind == RES_NIC_OUT).tolist():  # one task at a time on each NIC
        holders = np.flatnonzero([nic in tg.resources(t) for t in range(tg.num_tasks)])
        order = holders[np.argsort(result.start[holders], kind="stable")]
        assert (result.start[order][1:] >= result.finish[order][:-1]).all()


def test_fusion_merges_gradient_allreduces_into_buckets(bert_tiny):
    gg, cluster = bert_tiny
    strategy = Strategy.data_parallel(gg.num_groups, cluster)
    plain = compile_strategy(gg, strategy, cluster)
    fused = compile_strategy(gg, strategy, cluster, fusion_bytes=25e6)
    count = lambda p: int((p.taskgraph.kind == TASK_COLLECTIVE).sum())  # noqa: E731
    assert count(fused) < count(plain)
    total = lambda p: p.taskgraph.nbytes[p.taskgraph.kind == TASK_COLLECTIVE].sum()  # noqa: E731
    assert total(fused) == pytest.approx(total(plain))
    check_compiled(fused)
    assert simulate_fast(fused.taskgraph).iteration_time <= simulate_fast(plain.taskgraph).iteration_time


def test_model_parallel_group_cuts_become_transfers(bert_tiny):
    gg, cluster = bert_tiny
    placement = np.zeros((gg.num_groups, cluster.num_device_groups), dtype=bool)
    placement[:, 0] = True  # the 4 V100s of machine 0
    plan = compile_strategy(gg, Strategy.from_cluster(cluster, placement, [MODEL_PARALLEL] * gg.num_groups), cluster)
    assert any("inside model-parallel group" in op.reason for op in plan.inserted)
    devices = {plan.op_devices(op)[0] for op in range(gg.op_graph.num_ops)}
    assert devices <= {0, 1, 2, 3} and len(devices) > 1
    check_compiled(plan)


def _leaf_types(bundle) -> list[type]:
    """The type of every number in a Bundle: its four scalars, each element of its per-category tuples and
    consumer units, and each use id."""
    return ([type(x) for x in bundle[:4]] + [type(x) for field in bundle[4:9] for x in field]
            + [type(q) for uses in bundle[9] for q in uses])


def _bundles_use_by_use(tables, use_ids, op_unit, skip_local, op_device):
    """make_bundles as a plain loop over the uses (its definition), to check the array version against."""
    from tag.compiler.tables import NO_UNIT, Bundle, always_local

    found = {}
    for q in np.asarray(use_ids).tolist():
        p = int(tables.use_producer[q])
        unit_p, group_p, group_c = int(op_unit[p]), int(tables.group_graph.assignment[p]), int(tables.use_group[q])
        pclass, demand, consumers = int(tables.use_pclass[q]), int(tables.use_demand[q]), tables.use_consumers[q]
        if skip_local and group_p == group_c:
            consumers = consumers[op_unit[consumers] != unit_p]
            if consumers.size == 0:
                continue
            demand = int(tables.op_demand[consumers].max())
            if always_local(pclass, demand):
                continue
        unit = unit_p if unit_p != NO_UNIT else NO_UNIT - 1 - p
        key = (group_p, unit, op_device.get(p, -1) if op_device is not None else -1, group_c,
               tuple(sorted(set(op_unit[consumers].tolist()))))
        entry = found.setdefault(key, {}).setdefault((pclass, demand), [0.0, 0, []])
        entry[0] += float(tables.use_bytes[q])
        entry[1] += bool(tables.use_bytes[q] > 0)
        entry[2].append(q)
    bundles = {}
    for (group_p, unit, device, group_c, units), categories in found.items():
        cats = sorted(categories)
        bundles.setdefault((group_p, group_c), []).append(Bundle(
            group_p, max(unit, NO_UNIT), device, group_c, units, tuple(c[0] for c in cats), tuple(c[1] for c in cats),
            tuple(categories[c][0] for c in cats), tuple(categories[c][1] for c in cats),
            tuple(tuple(categories[c][2]) for c in cats)))
    return bundles


@pytest.mark.parametrize("granularity", ["group", "merged", "part", "op"])
def test_make_bundles_equals_a_use_by_use_loop(bert_tiny, granularity):
    """make_bundles (array operations) gives the loop's bundles, in its order, with Python numbers: over all
    uses with static units, and per pair with a model-parallel group's ops on random pieces and devices."""
    from tag.compiler.cache import compiler_tables
    from tag.compiler.tables import make_bundles

    gg, cluster = bert_tiny
    tables = compiler_tables(gg, cluster, gg.cost, granularity)
    uses = np.arange(tables.use_producer.size)
    expected = _bundles_use_by_use(tables, uses, tables.op_unit, True, None)
    assert list(tables.bundles.items()) == list(expected.items())
    rng = np.random.default_rng(5)
    checked = 0
    for g in rng.choice(gg.num_groups, 6, replace=False).tolist():
        op_unit = tables.op_unit.copy()
        ops = gg.group_members(g)
        op_unit[ops] = tables.piece_unit(g, 0) + rng.integers(0, 4, ops.size)
        op_device = dict(zip(ops.tolist(), rng.integers(0, 4, ops.size).tolist()))
        for pair in [k for k in tables.pair_uses if g in k]:
            for skip_local in (True, False):
                got = make_bundles(tables, tables.pair_uses[pair], op_unit, skip_local=skip_local, op_device=op_device)
                want = _bundles_use_by_use(tables, tables.pair_uses[pair], op_unit, skip_local, op_device)
                assert list(got.items()) == list(want.items())
                types = [_leaf_types(b) for b in got.get(pair, [])]  # Python numbers, as the loop gives
                assert types == [_leaf_types(b) for b in want.get(pair, [])]
                assert {t for leaves in types for t in leaves} <= {int, float}
                checked += len(want.get(pair, []))
    assert checked > 50
    # readers outside the producer's unit set a use's demand inside a group: with the ops' demands drawn at
    # random, that demand differs from the use's (all its readers') for some uses
    shuffled = dataclasses.replace(tables, op_demand=rng.integers(0, 3, gg.op_graph.num_ops).astype(np.int8))
    got = make_bundles(shuffled, uses, tables.op_unit, skip_local=True)
    assert list(got.items()) == list(_bundles_use_by_use(shuffled, uses, tables.op_unit, True, None).items())
    assert got != tables.bundles
    assert make_bundles(tables, np.zeros(0, dtype=np.int64), tables.op_unit, skip_local=True) == {}


@pytest.mark.parametrize("granularity", ["group", "part"])
def test_dynamic_bundles_in_one_call_equal_one_call_per_pair(bert_tiny, granularity):
    """_Compiler.dynamic_bundles makes the bundles of many pairs with a model-parallel side in one
    make_bundles call per kind of producer: each pair's bundles (order, categories, sums to the bit) are those
    of a make_bundles call for that pair alone, from replicated and from model-parallel producers alike, with
    the op → unit map given or made from the layouts, and a pair listed twice is made once."""
    from tag.compiler.compile import _Compiler
    from tag.compiler.cache import cluster_context, compiler_tables
    from tag.compiler.layout import group_layout
    from tag.compiler.tables import make_bundles
    from tag.compiler.generate import random_strategy

    gg, cluster = bert_tiny
    tables = compiler_tables(gg, cluster, gg.cost, granularity)
    context = cluster_context(cluster, tables)
    rng = np.random.default_rng(11)
    kinds = set()
    for trial in range(4):
        strategy = random_strategy(gg.num_groups, cluster, seed=rng, options=(ALLREDUCE, MODEL_PARALLEL))
        layouts = tuple(group_layout(tables, context, strategy, g) for g in range(gg.num_groups))
        mp = [layout.model_parallel for layout in layouts]
        pairs = [(p, c) for p, c in tables.pair_uses if mp[p] or mp[c]]
        kinds.update(mp[p] for p, _ in pairs)
        for given in (False, True):
            context.plans.clear()
            compiler = _Compiler(tables, context, None, None, dense_links=True)
            compiler.layouts = layouts
            op_unit = compiler._op_unit(range(gg.num_groups)) if given else None
            calls = []
            counted = lambda *args, **kwargs: calls.append(1) or make_bundles(*args, **kwargs)  # noqa: E731
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr("tag.compiler.compile.make_bundles", counted)
                got = compiler.dynamic_bundles(pairs + pairs[:3], op_unit, mp)
            assert len(calls) == len({mp[p] for p, _ in pairs})
            for (p, c), bundles in zip(pairs + pairs[:3], got):
                want = make_bundles(tables, tables.pair_uses[(p, c)], compiler._op_unit((p, c)), skip_local=not mp[p],
                                    op_device=layouts[p].op_device if mp[p] else None).get((p, c), [])
                assert bundles == want
                assert [np.float64(x).tobytes() for b in bundles for x in b.nbytes] == \
                    [np.float64(x).tobytes() for b in want for x in b.nbytes]
    assert kinds == {False, True}  # pairs from replicated and from model-parallel producers


@pytest.mark.parametrize("granularity", ["group", "part"])
def test_model_parallel_cut_equals_a_unit_by_unit_cut(bert_tiny, granularity, monkeypatch):
    """The pieces of a model-parallel layout, cut by array operations, against a cut unit by unit: a unit on one
    device is one piece, a unit over several is one piece per device (ascending) where those pieces form a
    DAG and one piece per op where they do not. Random op → device maps make both kinds common."""
    from tag.compiler import layout as layout_module
    from tag.compiler.cache import cluster_context, compiler_tables
    from tag.grouping import quotient_is_dag
    from tag.grouping.metis import GroupSplitter

    gg, cluster = bert_tiny
    tables = compiler_tables(gg, cluster, gg.cost, granularity)
    context = cluster_context(cluster, tables)
    rng = np.random.default_rng(3)
    maps = {}
    monkeypatch.setattr(GroupSplitter, "split", lambda self, speeds, **_: maps.setdefault(
        (self.ops.tobytes(), speeds.size), rng.integers(0, speeds.size, self.ops.size)))
    graph = gg.op_graph
    kinds = {"whole": 0, "by device": 0, "by op": 0}
    for g in range(gg.num_groups):
        devices = tuple(sorted(rng.choice(cluster.num_devices, int(rng.integers(2, 6)), replace=False).tolist()))
        pieces, op_device, (piece_ops, piece_of) = layout_module._model_parallel_pieces(tables, context, g, devices)
        for k, piece in enumerate(pieces):
            np.testing.assert_array_equal(piece_ops[piece_of == k], piece.ops)
        assert piece_ops.size == sum(piece.ops.size for piece in pieces)
        ops = gg.group_members(g)
        where = maps[(ops.tobytes(), len(devices))]
        assert op_device == {op: devices[w] for op, w in zip(ops.tolist(), where.tolist())}
        expected = []
        for unit in tables.group_units[g].tolist():
            unit_ops = tables.unit_ops[unit]
            slot = where[np.searchsorted(ops, unit_ops)]
            local = {op: k for k, op in enumerate(unit_ops.tolist())}
            edges = [(local[a], local[b]) for a in unit_ops.tolist() for b in graph.successors(a).tolist()
                     if b in local]
            src, dst = np.array([e[0] for e in edges], dtype=np.int64), np.array([e[1] for e in edges], dtype=np.int64)
            if (slot == slot[0]).all():
                kinds["whole"] += 1
                cut = [unit_ops]
            elif quotient_is_dag(src, dst, slot):
                kinds["by device"] += 1
                cut = [unit_ops[slot == k] for k in np.unique(slot)]
            else:
                kinds["by op"] += 1
                cut = [unit_ops[k:k + 1] for k in range(unit_ops.size)]
            expected += [(unit, devices[int(where[np.searchsorted(ops, c[0])])], c) for c in cut]
        assert [(p.unit, p.device) for p in pieces] == [(u, d) for u, d, _ in expected]
        for piece, (_, device, piece_ops) in zip(pieces, expected):
            np.testing.assert_array_equal(piece.ops, piece_ops)
            t = context.type_index[device]
            assert piece.duration == pytest.approx(
                tables.op_time_fixed[piece_ops, t].sum() + tables.op_time_scaled[piece_ops, t].sum(), rel=1e-12)
            assert piece.out_rows == pytest.approx(tables.op_out_rows[piece_ops].sum(), rel=1e-12)
            assert piece.out_fixed == pytest.approx(tables.op_out_fixed[piece_ops].sum(), rel=1e-12)
            assert all(type(x) is float for x in piece[3:])
    assert min(kinds.values()) > 0, kinds


def test_bad_strategies_are_refused(bert_tiny):
    gg, cluster = bert_tiny
    with pytest.raises(CompileError, match="granularity"):
        compile_strategy(gg, Strategy.data_parallel(gg.num_groups, cluster), cluster, granularity="layer")
    with pytest.raises(CompileError, match="op groups"):
        compile_strategy(gg, Strategy.data_parallel(gg.num_groups + 1, cluster), cluster)
    with pytest.raises(CompileError, match="device groups"):
        other = resolve_cluster("tag-cloud")
        compile_strategy(gg, Strategy.data_parallel(gg.num_groups, other), cluster)


# ------------------------------------------------------------------------------------------ the checker

TINY_MODELS = ["resnet101", "bert-large", "mmt", "vgg19"]


@pytest.mark.parametrize("model", TINY_MODELS)
@pytest.mark.parametrize("cluster_name", ["tag-testbed", "tag-random:seed=7"])
def test_checker_accepts_random_strategies(model, cluster_name):
    """13 strategies x 4 models x 2 clusters = 104, each at group granularity (and every fourth at op level)."""
    graph = resolve_model(model, tiny=True)
    cluster = resolve_cluster(cluster_name)
    gg = group_ops(graph, num_groups=40, gpus=cluster)
    for k in range(13):
        strategy = random_strategy(gg.num_groups, cluster, seed=k, p_place=(0.25, 0.5, 0.8)[k % 3])
        for granularity in ("group", "merged", "op") if k % 4 == 0 else ("group",):
            check_compiled(compile_strategy(gg, strategy, cluster, granularity=granularity))


def _without_dependency(plan, task, on):
    """The plan with ``task`` no longer waiting for ``on``."""
    tg = plan.taskgraph
    deps = [tg.predecessors(t).tolist() for t in range(tg.num_tasks)]
    deps[task] = [d for d in deps[task] if d != on]
    ptr = np.zeros(tg.num_tasks + 1, dtype=np.int64)
    np.cumsum([len(d) for d in deps], out=ptr[1:])
    broken = dataclasses.replace(tg, dep_ptr=ptr, dep=np.array([d for ds in deps for d in ds], dtype=np.int64))
    return dataclasses.replace(plan, taskgraph=broken)


def test_checker_catches_broken_compilations(chain, one_layer):
    graph, assignment = chain
    cluster = make_cluster(5, [0, 0, 1, 1, 1])
    gg = GroupGraph.from_assignment(graph, assignment, gpus=cluster)
    plan = compile_strategy(gg, Strategy.from_cluster(cluster, [[1, 0], [0, 1]], [ALLREDUCE, ALLREDUCE]), cluster)
    check_compiled(plan)
    first = plan.deliveries[0]
    with pytest.raises(CompileCheckError, match=r"misses rows \[0, 0.333333\)"):  # a transfer dropped
        check_compiled(plan.with_deliveries(plan.deliveries[1:]))
    with pytest.raises(CompileCheckError, match="twice"):  # a row range sent twice
        check_compiled(plan.with_deliveries(plan.deliveries + [first]))
    widened = first._replace(hi=first.hi + 0.1)
    with pytest.raises(CompileCheckError, match="that none of its readers needs"):  # rows nobody asked for
        check_compiled(plan.with_deliveries([widened] + plan.deliveries[1:]))
    consumer = plan.op_task(2, first.dst)
    with pytest.raises(CompileCheckError, match="misses rows"):  # the consumer does not wait for the transfer
        check_compiled(_without_dependency(plan, consumer, first.task))

    graph, _ = one_layer
    cluster = make_cluster(3, [0, 0, 0])
    gg = GroupGraph.from_assignment(graph, np.zeros(5, dtype=int), gpus=cluster)
    plan = compile_strategy(gg, Strategy.from_cluster(cluster, [[1]], [ALLREDUCE]), cluster)
    check_compiled(plan)
    [reduce] = plan.deliveries
    with pytest.raises(CompileCheckError, match="misses the partial"):  # the gradient never synchronised
        check_compiled(plan.with_deliveries([]))
    with pytest.raises(CompileCheckError, match="more than once"):
        check_compiled(plan.with_deliveries([reduce, reduce]))


# ------------------------------------------------------------------------------------------ the evaluator


def assert_same_result(got, expected):
    """Bit for bit: schedule and memory; feedback up to the order of float sums."""
    np.testing.assert_array_equal(got.start, expected.start)
    np.testing.assert_array_equal(got.finish, expected.finish)
    np.testing.assert_array_equal(got.peak_memory, expected.peak_memory)
    assert (got.iteration_time, got.feasible, got.oom_device) == (expected.iteration_time, expected.feasible,
                                                                  expected.oom_device)
    for name, a, b in zip(expected.feedback._fields, expected.feedback, got.feedback):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15, err_msg=name)


@pytest.mark.parametrize("granularity", ["group", "merged", "part"])
@pytest.mark.parametrize("model, cluster_name", [
    ("bert-large", "tag-testbed"), ("dlrm", "tag-cloud"), ("resnet101", "tag-random:seed=3"),
    ("vgg19", "dgx1x4"),  # device groups smaller than machines
    ("mmt", "random-blk-1"),  # 64 devices, no shared NIC
])
def test_evaluator_equals_compile_then_simulate_fast(model, cluster_name, granularity):
    """StrategyEvaluator assembles cached fragments into the TaskGraph compile_strategy builds: same tasks,
    same ids, so the same result. Random strategies (all four options, both batch splits, model-parallel
    groups among them) and a walk that re-places one group at a time; each evaluated cold (fragments
    compiled) and warm (fragments cached)."""
    cluster = resolve_cluster(cluster_name)
    gg = group_ops(resolve_model(model, tiny=True), num_groups=30, gpus=cluster)
    evaluator = StrategyEvaluator(gg, cluster, granularity=granularity)
    strategies = [random_strategy(gg.num_groups, cluster, seed=k) for k in range(4)]
    rng = np.random.default_rng(0)
    walk = Strategy.data_parallel(gg.num_groups, cluster)
    for _ in range(4):
        row = rng.random(cluster.num_device_groups) < 0.5
        row[rng.integers(cluster.num_device_groups)] = True
        walk = walk.with_group(int(rng.integers(gg.num_groups)), row, int(rng.integers(4)))
        strategies.append(walk)
    for strategy in strategies:
        cold = evaluator(strategy)
        expected = simulate_fast(compile_strategy(gg, strategy, cluster, granularity=granularity).taskgraph)
        assert_same_result(cold, expected)
        assert_same_result(evaluator(strategy), expected)


def test_fragment_references_are_stored_by_segment():
    """The arena keeps a reference as (segment, index in it) so that assembly places it with one look-up:
    by hand, P's block of 3 tasks, an empty C block (a group's pair with itself), 2 early own tasks, then
    late ones; decoded with each segment's global first task, every reference lands on its task. A second
    fragment stored in the same call (P's block of 2, C's of 2, no early tasks) keeps its own segments."""
    from tag.compiler.arena import _SEGMENT_SHIFT, _IN_SEGMENT, _segmented

    refs = np.array([0, 2, 3, 4, 5, 7, -1, 1, 2, 3, 4, 6])
    ends = np.array([[3, 3, 5], [9, 9, 9], [2, 4, 4]])  # the middle fragment has no references
    stored = _segmented(refs, np.array([7, 0, 5]), ends)
    segment, index = stored >> _SEGMENT_SHIFT, stored & _IN_SEGMENT
    np.testing.assert_array_equal(segment[:6], [0, 0, 2, 2, 3, 3])
    np.testing.assert_array_equal(index[:6], [0, 2, 0, 1, 0, 2])
    assert stored[6] == -1  # no producer
    base = np.array([100, 200, 300, 400])  # global first task of P's block, C's block, early own, late own
    expected = [100, 102, 300, 301, 400, 402]
    np.testing.assert_array_equal(base[segment[:6]] + index[:6], expected)
    np.testing.assert_array_equal(segment[7:], [0, 1, 1, 3, 3])
    np.testing.assert_array_equal(index[7:], [1, 0, 1, 0, 2])


def test_parameter_server_costs_equal_hop_bandwidths(bert_tiny):
    """ClusterContext.server caches single-hop bandwidths per (worker, server): the same latency and Σ 1/β as
    hop_bandwidths over each worker's hop, on a cluster whose machines share NICs, for new device sets and
    for device sets whose hops were all seen before."""
    from tag.compiler.cache import cluster_context, compiler_tables
    from tag.cost.comm import hop_bandwidths

    gg, cluster = bert_tiny
    context = cluster_context(cluster, compiler_tables(gg, cluster, gg.cost, "group"))
    cases = [((0, 1, 4, 9), 4), ((2, 5, 12), 2), ((3, 8, 13, 15), 15), ((0, 1, 4, 9), 9), ((0, 4, 9), 9),
             ((1, 9), 9)]
    for devices, ps in cases:
        workers = [w for w in devices if w != ps]
        expected = (max(float(cluster.latency[w, ps]) for w in workers),
                    sum(1.0 / float(hop_bandwidths(cluster, [(w, ps)])[0]) for w in workers))
        assert context.server(devices, ps) == expected


@pytest.mark.parametrize("batch_split", ["even", "speed"])
def test_replica_row_ranges_are_in_order(bert_tiny, batch_split):
    """A split layout's replicas hold consecutive row ranges [lo, hi) in device order, covering [0, 1): the
    order the compiler's overlap scan relies on (it stops at the first holder past the rows a consumer needs)."""
    from tag.compiler.cache import cluster_context, compiler_tables
    from tag.compiler.layout import group_layout

    gg, cluster = bert_tiny
    context = cluster_context(cluster, compiler_tables(gg, cluster, gg.cost, "group"))
    split = 0
    for seed in range(6):
        strategy = random_strategy(gg.num_groups, cluster, seed=seed, batch_split=batch_split)
        for g in range(gg.num_groups):
            layout = group_layout(context.tables, context, strategy, g)
            if not layout.split:
                continue
            split += 1
            assert layout.lo[0] == 0.0 and layout.hi[-1] == 1.0
            assert list(layout.lo[1:]) == list(layout.hi[:-1])
            assert all(lo < hi for lo, hi in zip(layout.lo, layout.hi))
    assert split > 0


def test_merged_granularity_runs_the_chunks_of_each_part_as_one_task(bert_tiny):
    """``merged``: group granularity's chunks, one task per part and replica, with lags; both simulators
    agree on it task for task, and the plan's records point at the merged tasks."""
    gg, cluster = bert_tiny
    for k in range(3):
        strategy = random_strategy(gg.num_groups, cluster, seed=k)
        chunks = compile_strategy(gg, strategy, cluster, granularity="group")
        merged = compile_strategy(gg, strategy, cluster, granularity="merged")
        kinds = np.bincount(merged.taskgraph.kind, minlength=3)
        assert (kinds[1:] == np.bincount(chunks.taskgraph.kind, minlength=3)[1:]).all()  # communication as is
        assert kinds[0] < np.bincount(chunks.taskgraph.kind, minlength=3)[0]
        assert merged.taskgraph.duration.sum() == pytest.approx(chunks.taskgraph.duration.sum())
        reference, fast = simulate(merged.taskgraph), simulate_fast(merged.taskgraph)
        np.testing.assert_array_equal(fast.start, reference.start)
        np.testing.assert_allclose(fast.peak_memory, reference.peak_memory, rtol=1e-12)
        assert fast.iteration_time == pytest.approx(chunks.simulate().iteration_time, rel=0.1)
        for op in merged.inserted:
            assert all(merged.taskgraph.kind[t] != 0 for t in op.tasks)


def test_evaluator_cache_bound_and_entry_points(bert_tiny):
    gg, cluster = bert_tiny
    strategies = [random_strategy(gg.num_groups, cluster, seed=k) for k in range(3)]
    small = StrategyEvaluator(gg, cluster, max_cached_tasks=100)  # emptied before almost every evaluation
    for strategy in strategies:
        expected = simulate_fast(compile_strategy(gg, strategy, cluster).taskgraph)
        assert_same_result(small(strategy), expected)
        assert_same_result(evaluate_strategy(gg, strategy, cluster), expected)
    cache = CompilerCache()
    assert strategy_evaluator(gg, cluster, cache=cache) is strategy_evaluator(gg, cluster, cache=cache)  # kept there
    assert strategy_evaluator(gg, cluster) is not strategy_evaluator(gg, cluster)  # no cache: nothing kept
    assert not any(isinstance(v, (dict, StrategyEvaluator)) and k.startswith("_compiler")
                   for k, v in {**vars(gg), **vars(cluster)}.items())  # nothing stashed on the grouping or cluster
    assert evaluate_strategy(gg, strategies[0], cluster, feedback=False).feedback is None


@pytest.mark.parametrize("wide", [False, True])
def test_evaluator_looks_up_the_groups_whose_row_option_or_split_changed(bert_tiny, wide):
    """Group fragments are found by one int64 key per group (row bits, option, batch split, group; interned
    where a cluster has too many device groups for the bits: forced here): strategies that change a few
    groups, then only the option of one, then only the batch split, each give compile_strategy's result, and
    a strategy seen before brings no new fragment."""
    gg, cluster = bert_tiny
    evaluator = StrategyEvaluator(gg, cluster)
    if wide:
        evaluator._bits = None
    base = random_strategy(gg.num_groups, cluster, seed=3, batch_split="even")
    rng = np.random.default_rng(0)
    option = base.option.copy()
    option[int(rng.integers(gg.num_groups))] ^= 1  # allreduce <-> ps, or duplicate <-> model-parallel
    changed = random_strategy(gg.num_groups, cluster, seed=4, batch_split="even")
    placement = base.placement.copy()
    picked = rng.choice(gg.num_groups, size=3, replace=False)
    placement[picked] = changed.placement[picked]
    sequence = [base, Strategy.from_cluster(cluster, placement, base.option),
                Strategy.from_cluster(cluster, base.placement, option),
                Strategy.from_cluster(cluster, base.placement, base.option, batch_split="speed"), base]
    built = []
    for strategy in sequence:
        assert_same_result(evaluator(strategy), simulate_fast(compile_strategy(gg, strategy, cluster).taskgraph))
        built.append(evaluator.cached_fragments()[0])
    assert built[0] > 0 and built[-1] == built[-2]  # the first strategy again: every fragment found
    assert built[1] - built[0] <= 3 and built[2] - built[1] <= 1  # only the changed groups are new


def test_evaluator_refuses_bad_strategies_and_reports_oom(bert_tiny, one_layer):
    gg, cluster = bert_tiny
    evaluator = strategy_evaluator(gg, cluster)
    with pytest.raises(CompileError, match="op groups"):
        evaluator(Strategy.data_parallel(gg.num_groups + 1, cluster))
    with pytest.raises(CompileError, match="device groups"):
        evaluator(Strategy.data_parallel(gg.num_groups, resolve_cluster("tag-cloud")))
    with pytest.raises(CompileError, match="expected a Strategy"):
        evaluator("data parallel")
    with pytest.raises(CompileError, match="granularity"):
        StrategyEvaluator(gg, cluster, granularity="layer")
    graph, param = one_layer
    big = dataclasses.replace(graph, param_bytes=graph.param_bytes * 8)
    small = make_cluster(1, [0], gpus=["1080ti"])
    big_gg = GroupGraph.from_assignment(big, np.zeros(5, dtype=int), gpus=small)
    strategy = Strategy.from_cluster(small, [[1]], [DUPLICATE])
    result = evaluate_strategy(big_gg, strategy, small)
    assert not result.feasible and result.oom_device == 0
    with pytest.raises(OOMError, match=r"device 0 \(1080ti"):
        evaluate_strategy(big_gg, strategy, small, raise_on_oom=True)


# ------------------------------------------------------------------------------------------ fast path vs reference

AGREEMENT_MODELS = ["vgg19", "candle-uno", "dlrm"]
AGREEMENT_CLUSTERS = ["tag-testbed", "tag-cloud", "tag-random:seed=3"]
STRATEGIES_PER_CASE = 23  # 3 models x 3 clusters x 23 = 207 strategies


@pytest.mark.slow
def test_fast_path_agrees_with_reference():
    """What search runs (:func:`evaluate_strategy`: group granularity, the fast path, equal bit for bit to
    compiling with compile_strategy and running simulate_fast) against the event-driven reference at op
    granularity, on 207 seeded random strategies (3 full-size small models x 3 clusters); and the same for
    ``merged`` granularity (group granularity's chunks run as one task per part, with lags).

    Group: 98.1 % agree within 3 % (85 % within 1 %, median 0.20 %, 95th percentile 2.2 %, max 4.5 %).
    Merged: 95.7 % (79 % within 1 %, median 0.35 %, 95th percentile 2.6 %, max 8.3 %). The rest are
    list-scheduling anomalies of the FIFO queues, not modelling differences: every granularity does the same
    work on the same resources (same bytes per link, same collective and compute seconds), but a strict
    FIFO is discontinuous in ready times: when a transfer becomes ready a few milliseconds later (at op level
    its producer shares the device with other groups' ops; at group level the ops between two boundary
    tensors run as one task), it can queue behind another transfer on a shared NIC, or two collectives over
    overlapping devices pack in the other order. Before collectives across machines held their NICs, a
    collective and the p2p transfers it should have competed with overlapped freely, and those jumps were
    larger (94.7 % within 3 %, max 17 %; median 0.04 %). Merging the chunks of a part takes away the other
    tasks' chances to run between them, which moves more strategies by a little (the same worst cases, a
    wider middle); cutting merged tasks at 0.5 ms does not help, so it is the reordering itself, not long
    tasks. Only op granularity removes them entirely.

    Peak memory on the reference's fullest device (what decides OOM): group within 5 % on all 207 (max 4.3 %;
    before optimizer updates were chunked by time and views joined their emitter, 99.0 % and 13.2 %), merged
    on 99.5 % (max 7.1 %); group's OOM verdict is the reference's on every strategy.
    """
    errors = {"group": [], "merged": []}
    peak_errors = {"group": [], "merged": []}  # peak memory on the reference's fullest device
    for m, model in enumerate(AGREEMENT_MODELS):
        graph = resolve_model(model)
        for c, name in enumerate(AGREEMENT_CLUSTERS):
            cluster = resolve_cluster(name)
            gg = group_ops(graph, num_groups=60, gpus=cluster)
            for k in range(STRATEGIES_PER_CASE):
                strategy = random_strategy(gg.num_groups, cluster, seed=10000 * m + 1000 * c + k)
                reference = simulate(compile_strategy(gg, strategy, cluster, granularity="op").taskgraph,
                                     feedback=False)
                fullest = int(np.argmax(reference.peak_memory / reference.memory_capacity))
                for granularity, found in errors.items():
                    fast = evaluate_strategy(gg, strategy, cluster, granularity=granularity, feedback=False)
                    found.append(fast.iteration_time / reference.iteration_time - 1)
                    peak_errors[granularity].append(fast.peak_memory[fullest] / reference.peak_memory[fullest] - 1)
                    if granularity == "group":
                        assert fast.feasible == reference.feasible
    # (within 3 %, median, 95th percentile, max) bounds, a little above what each achieves
    # Merged's median rose from 0.35 % to 0.59 % when getitems of a multi-output op's partial-sum outputs
    # (layer norm's weight gradient) became partial-sum uses with their own collectives.
    bounds = {"group": (0.98, 0.0025, 0.025, 0.07), "merged": (0.95, 0.0075, 0.035, 0.1)}
    for granularity, found in errors.items():
        found = np.abs(found)
        within, median, p95, worst = bounds[granularity]
        assert len(found) >= 200
        assert (found <= 0.03).mean() >= within, f"{granularity}: only {(found <= 0.03).mean():.1%} within 3 %"
        assert np.median(found) <= median, granularity
        assert np.quantile(found, 0.95) <= p95, granularity
        assert found.max() <= worst, granularity
    for granularity, (within, worst) in {"group": (0.99, 0.06), "merged": (0.98, 0.1)}.items():
        found = np.abs(peak_errors[granularity])
        close = (found <= 0.05).mean()
        assert close >= within, f"{granularity}: peak memory within 5 % on only {close:.1%}"
        assert found.max() <= worst, f"{granularity}: peak memory off by {found.max():.1%}"


def test_arena_stores_queued_fragments_in_one_go():
    """The arena queues fragments and stores them at once: ids in order of adding, a column given as one value
    repeated over the fragment's rows, a task's dependency on itself dropped (and the fragment's count with
    it), every reference numbered by its own fragment's segments. By hand: a group fragment of 2 tasks, then
    a pair fragment over a 2-task block with 1 transfer of its own."""
    from tag.compiler.arena import _SEGMENT_SHIFT, _IN_SEGMENT, _META, _Arena

    arena = _Arena(lagged=False)
    group = {"duration": np.array([1.0, 2.0]), "kind": 0, "group": 3, "nres": 1, "res": [0, 1],
             "dep_task": [1, 1], "dep_on": [0, 1], "tensor_device": [0], "tensor_bytes": [8.0],
             "tensor_producer": [0], "tensor_persistent": False, "read_tensor": [0], "read_task": [1]}
    pair = {"duration": [0.5], "kind": np.array([1], dtype=np.int8), "group": 4, "nres": np.array([1]),
            "res": [40], "dep_task": [2, 1], "dep_on": [0, 2], "tensor_device": [1], "tensor_bytes": [8.0],
            "tensor_producer": [2], "tensor_persistent": np.array([False]), "read_tensor": [0, 1],
            "read_task": [2, 1]}
    assert (arena.add(group, (0, 0, 0, 0), 2), arena.add(pair, (2, 0, 1, 0), 1)) == (0, 1)
    assert arena.stored == 0 and arena.size["task"] == 0  # queued only
    arena.flush()
    assert arena.stored == 2 and arena.pending == []
    assert "group" not in arena.columns  # tasks take their group at assembly: the given one is not stored
    np.testing.assert_array_equal(arena.view("kind"), [0, 0, 1])
    np.testing.assert_array_equal(arena.view("nres"), [1, 1, 1])
    meta = arena.meta[:2]
    assert meta.shape[1] == _META
    np.testing.assert_array_equal(meta[:, :3], [[0, 2, 2], [2, 1, 1]])  # first task, tasks, early tasks
    np.testing.assert_array_equal(meta[:, 5:7], [[0, 1], [1, 2]])  # first dependency, dependencies
    dep_task, dep_on = arena.view("dep_task"), arena.view("dep_on")
    segment, index = dep_task >> _SEGMENT_SHIFT, dep_task & _IN_SEGMENT
    # group: 1 waits for 0 (own early tasks: segment 2); pair: its transfer (own, segment 2) waits for P's 0
    np.testing.assert_array_equal(segment, [2, 2, 0])
    np.testing.assert_array_equal(index, [1, 0, 1])
    np.testing.assert_array_equal(dep_on & _IN_SEGMENT, [0, 0, 0])
    np.testing.assert_array_equal(dep_on >> _SEGMENT_SHIFT, [2, 0, 2])
    # tensor references: the pair reads P's tensor 0 (segment 0) and its own first tensor (segment 2)
    np.testing.assert_array_equal(arena.view("read_tensor")[1:] >> _SEGMENT_SHIFT, [0, 2])


def test_arena_stores_pair_fragments_at_once_as_queue_and_flush_would():
    """store_many (the pair kernel's rows written straight into the arena) against add_many + flush: the same
    rows, references segmented alike, the same fragment table, over random fragments (with blocks empty or
    not, a fragment of one group's pair with C's block empty) stored on top of a queued one."""
    from tag.compiler.arena import (_DEP0, _GROUP_COLUMNS, _META, _PAIR_COLUMNS, _READ0, _RES0, _TABLES,
                                    _TASK0, _TEN0, _Arena)

    rng = np.random.default_rng(7)
    for _ in range(20):
        f = int(rng.integers(1, 6))
        blocks = rng.integers(0, 4, size=(f, 4))
        blocks[rng.random(f) < 0.3, 1] = 0
        counts = rng.integers(0, 5, size=(f, 5))
        early = np.minimum(rng.integers(0, 5, size=f), counts[:, 0])
        counts[:, 3] = early  # a pair's tensors are its transfers' outputs
        tasks, tensors = blocks[:, 0] + blocks[:, 1] + counts[:, 0], blocks[:, 2] + blocks[:, 3] + counts[:, 3]

        def refs(table, bound):  # a reference of each row of ``table``, below each fragment's bound (>= 1 here)
            return np.concatenate([rng.integers(0, max(int(b), 1), size=int(c)) for c, b in zip(
                counts[:, _TABLES.index(table)], bound)]).astype(np.int64)

        dep_task = refs("dep", tasks)
        dep_on = (dep_task + 1 + refs("dep", tasks)) % np.repeat(np.maximum(tasks, 1), counts[:, 2])
        dep_on[dep_on == dep_task] = -1  # no task waits for itself (store_many's premise)
        keep = dep_on >= 0
        counts[:, 2] = np.bincount(np.repeat(np.arange(f), counts[:, 2])[keep], minlength=f)
        dep_task, dep_on = dep_task[keep], dep_on[keep]
        total = counts.sum(axis=0)
        columns = {"duration": rng.random(total[0]), "kind": rng.integers(1, 3, size=total[0]).astype(np.int8),
                   "nres": rng.integers(1, 4, size=total[0]), "res": rng.integers(0, 50, size=total[1]),
                   "dep_task": dep_task, "dep_on": dep_on, "tensor_device": rng.integers(0, 8, size=total[3]),
                   "tensor_bytes": rng.random(total[3]), "tensor_producer": refs("tensor", tasks),
                   "read_tensor": refs("read", tensors), "read_task": refs("read", tasks)}
        queued = {"duration": [1.0], "kind": 0, "group": 2, "nres": 1, "res": [0], "dep_task": [], "dep_on": [],
                  "tensor_device": [0], "tensor_bytes": [4.0], "tensor_producer": [0], "tensor_persistent": True,
                  "read_tensor": [], "read_task": []}
        names = [name for table in _TABLES for name in _PAIR_COLUMNS[table]]
        one, two = _Arena(lagged=False), _Arena(lagged=False)
        one.add(queued, (0, 0, 0, 0), 1)
        one.add_many({**columns, "tensor_persistent": False}, blocks, early, counts)
        one.flush()
        two.add(queued, (0, 0, 0, 0), 1)  # still queued when the others are stored: its rows come after theirs
        assert two.store_many(tuple(columns[name] for name in names), blocks, early, counts) == 1
        two.flush()
        assert one.stored == two.stored == f + 1
        where = [_TASK0, _RES0, _DEP0, _TEN0, _READ0]  # [5] each table's first row of a fragment
        rows_of = {name: table for table in _TABLES for name in _GROUP_COLUMNS[table]}
        held = [c for c in range(_META) if c not in where]
        np.testing.assert_array_equal(one.meta[:f + 1, held], two.meta[:f + 1, held])
        for name in names + ["tensor_persistent"]:
            k = _TABLES.index(rows_of[name])
            for fragment in range(f + 1):
                n = one.meta[fragment, where[k] + 1]
                a0, b0 = one.meta[fragment, where[k]], two.meta[fragment, where[k]]
                np.testing.assert_array_equal(one.view(name)[a0:a0 + n], two.view(name)[b0:b0 + n], err_msg=name)


def test_arena_numbers_compact_fragments_between_queued_ones():
    """Compact fragments (a replicated group's devices and batch fractions) take their ids when added, between
    fragments of rows that are still queued: the fragment table then holds each at its own id, the compact
    ones flagged with their group and replicas, the rows ones with their rows, and the tasks held count both."""
    from tag.compiler.arena import _COMPACT, _META, _REPLICAS, _RES0, _TASKS, _Arena

    arena = _Arena(lagged=False)
    rows = {"duration": [1.0, 2.0], "kind": 0, "group": 5, "nres": 1, "res": [0, 1], "dep_task": [1],
            "dep_on": [0], "tensor_device": [0], "tensor_bytes": [8.0], "tensor_producer": [0],
            "tensor_persistent": False, "read_tensor": [0], "read_task": [1]}
    assert arena.add(rows, (0, 0, 0, 0), 2) == 0
    # groups 3 (2 replicas, 3 units: 6 tasks) and 4 (1 replica, 2 units)
    first = arena.add_compact(np.array([3, 4]), np.array([2, 1]), np.array([6, 7, 2], dtype=np.int32),
                              np.array([0.25, 0.75, 1.0]), np.array([[6, 6, 4, 6, 2], [2, 2, 1, 1, 0]]))
    assert first == 1
    assert arena.add(rows, (0, 0, 0, 0), 2) == 3
    arena.flush()
    assert arena.stored == 4 and arena.meta.shape[1] == _META
    meta = arena.meta[:4]
    np.testing.assert_array_equal(meta[:, _COMPACT], [-1, 3, 4, -1])
    np.testing.assert_array_equal(meta[:, _REPLICAS], [0, 2, 1, 0])
    np.testing.assert_array_equal(meta[1:3, _RES0], [0, 2])  # each one's first replica in the compact store
    np.testing.assert_array_equal(meta[:, _TASKS], [2, 6, 2, 2])
    np.testing.assert_array_equal(meta[[0, 3], 0], [0, 2])  # the rows fragments' first tasks, in id order
    np.testing.assert_array_equal(arena.compact.view("device"), [6, 7, 2])
    np.testing.assert_array_equal(arena.compact.view("fraction"), [0.25, 0.75, 1.0])
    assert arena.size["task"] == 4 and arena.compact_tasks == 8 and arena.cached_tasks == 12


def test_evaluator_keeps_replicated_groups_compact(bert_tiny):
    """At group granularity a replicated group's fragment is stored compact: the rows held are the pairs'
    own tasks only, while the schedule is compile_strategy's; at merged granularity they are rows."""
    gg, cluster = bert_tiny
    strategy = Strategy.data_parallel(gg.num_groups, cluster)
    compiled = compile_strategy(gg, strategy, cluster).taskgraph
    evaluator = StrategyEvaluator(gg, cluster)
    assert_same_result(evaluator(strategy), simulate_fast(compiled))
    compute = int((compiled.kind == TASK_COMPUTE).sum())
    arena, pair_ids = evaluator._arena, evaluator._last_ids[1]
    assert arena.compact_tasks == compute
    tasks = arena.meta[:, 1]  # each fragment's tasks (_TASKS)
    assert tasks[pair_ids].sum() == compiled.num_tasks - compute  # every pair's tasks, shared fragments too
    assert arena.size["task"] == tasks[np.unique(pair_ids)].sum()  # rows held: one copy of each fragment
    shared = np.unique(pair_ids).size
    assert evaluator.cached_fragments() == (gg.num_groups, shared) and shared < len(pair_ids)  # alike pairs share
    merged = StrategyEvaluator(gg, cluster, granularity="merged")
    merged(strategy)
    assert merged._arena.compact_tasks == 0 and merged._arena.size["task"] > compiled.num_tasks - compute


def test_implied_edges_are_those_a_transitive_reduction_drops():
    """_implied_edges against networkx's transitive reduction on random DAGs, and by hand: an edge repeated
    is implied only by a longer path, not by its twin."""
    import networkx as nx

    from tag.compiler.lookup import _implied_edges

    rng = np.random.default_rng(5)
    for _ in range(30):
        n = int(rng.integers(1, 25))
        a, b = rng.integers(0, n, (2, int(rng.integers(0, 3 * n))))
        pairs = sorted({(min(x, y), max(x, y)) for x, y in zip(a.tolist(), b.tolist()) if x != y})  # a DAG
        src, dst = np.array([p for p, _ in pairs], dtype=np.int64), np.array([q for _, q in pairs], dtype=np.int64)
        graph = nx.DiGraph(pairs)
        graph.add_nodes_from(range(n))
        kept = nx.transitive_reduction(graph)
        np.testing.assert_array_equal(_implied_edges(n, src, dst), [not kept.has_edge(*p) for p in pairs])
    src, dst = np.array([0, 1, 0, 0, 3, 3]), np.array([1, 2, 2, 2, 4, 4])
    np.testing.assert_array_equal(_implied_edges(5, src, dst), [False, False, True, True, False, False])


def test_evaluator_drops_dependencies_longer_paths_imply(bert_tiny):
    """Inside a replicated group a dependency that a longer path of its units implies is not listed: the
    evaluator lists R fewer dependencies per such pair of units than compile_strategy, with the same
    schedule, memory and feedback; merged chunks (lags) keep them all."""
    gg, cluster = bert_tiny
    strategy = Strategy.data_parallel(gg.num_groups, cluster)  # every group on all D devices
    compiled = compile_strategy(gg, strategy, cluster).taskgraph
    evaluator = StrategyEvaluator(gg, cluster)
    assert_same_result(evaluator(strategy), simulate_fast(compiled))
    dropped = int((~evaluator._local_dep).sum())
    assert dropped > 0
    group_ids = evaluator._group_fragment_ids(strategy)
    columns = evaluator._assemble(group_ids, evaluator._pair_fragment_ids(group_ids))
    assert columns.dep_task.size == compiled.dep.size - dropped * cluster.num_devices
    assert StrategyEvaluator(gg, cluster, granularity="merged")._local_dep.all()


@pytest.mark.parametrize("granularity", ["group", "part"])
@pytest.mark.parametrize("model, cluster_name, row", [
    ("bert-large", "tag-testbed", [1, 0, 1, 0, 1, 1, 0]), ("dlrm", "tag-cloud", [1, 1, 1, 0, 1, 0]),
])
def test_pairs_of_one_template_share_one_fragment(model, cluster_name, row, granularity):
    """Every group on one replicated layout: pairs of groups whose bundles and block shapes match (repeated
    layers) share one pair fragment, built once, and the result is still compile_strategy's bit for bit,
    each task in its own consumer group. Under PS the parameter servers of a pair's uses enter the template
    (pairs alike but for their servers would give the wrong schedule if shared)."""
    cluster = resolve_cluster(cluster_name)
    gg = group_ops(resolve_model(model, tiny=True), num_groups=30, gpus=cluster)
    evaluator = StrategyEvaluator(gg, cluster, granularity=granularity)
    placement = np.repeat(np.array([row], dtype=bool), gg.num_groups, axis=0)
    for option in (ALLREDUCE, PS, DUPLICATE):
        strategy = Strategy.from_cluster(cluster, placement, np.full(gg.num_groups, option))
        before = evaluator._arena.num_fragments
        got = evaluator(strategy)
        compiled = compile_strategy(gg, strategy, cluster, granularity=granularity).taskgraph
        assert_same_result(got, simulate_fast(compiled))  # the feedback's per-group makespans: tasks' groups
        pair_ids = evaluator._last_ids[1]
        built = np.unique(pair_ids[pair_ids >= before]).size  # the pair fragments this evaluation built
        assert 0 < built < pair_ids.size, (option, built, pair_ids.size)


def test_mixed_and_overflowing_templates_still_build_every_pair(bert_tiny, monkeypatch):
    """Pairs with a model-parallel side have no template and are built beside pairs served by a known
    template (the pair table is dropped so that every pair is looked up again); with template codes too
    narrow for the rows and classes (3 bits here) the pairs past them are built too. Either way the result
    is compile_strategy's."""
    import tag.compiler.evaluate as evaluate
    from tag.sim.kernels import int_table

    gg, cluster = bert_tiny
    row = np.zeros(cluster.num_device_groups, dtype=bool)
    row[:3] = True
    uniform = Strategy.from_cluster(cluster, np.repeat(row[None, :], gg.num_groups, axis=0),
                                    np.full(gg.num_groups, ALLREDUCE))
    strategies = [uniform, uniform.with_group(4, row, MODEL_PARALLEL), Strategy.data_parallel(gg.num_groups, cluster),
                  random_strategy(gg.num_groups, cluster, seed=1)]
    for bits in (evaluate._ROW_BITS, 3):
        monkeypatch.setattr(evaluate, "_ROW_BITS", bits)
        monkeypatch.setattr(evaluate, "_CLASS_BITS", bits)
        evaluator = StrategyEvaluator(gg, cluster)
        for k, strategy in enumerate(strategies):
            if k == 1:  # after the uniform strategy: its pairs are served by their templates
                evaluator._pair_table, evaluator._last_ids = int_table(), (np.zeros(0, dtype=np.int64),) * 2
            expected = simulate_fast(compile_strategy(gg, strategy, cluster).taskgraph)
            assert_same_result(evaluator(strategy), expected)
        assert evaluator._templates and (bits > 3 or len(evaluator._row_ids) <= 8 and len(evaluator._class_ids) <= 8)


def _stored_skeletons(store) -> list[tuple]:
    """Every row of a skeleton store (``_Skeletons``) read back as ``_Compiler._skeleton`` records it:
    (transfers as (src, dst, stage, ((category, fraction), ...)), local devices, holders, collectives); the
    holders are stored only for a skeleton with collectives (its collectives' devices), else None."""
    column = {name: store.view(name).tolist() for name in store.specs}
    d = store.num_devices
    skeletons = []
    for row in range(store.size["skeleton"]):
        colls = range(column["coll_first"][row], column["coll_first"][row] + column["colls"][row])
        collectives = tuple((column["coll_category"][j], "ps" if column["coll_ps"][j] else "allreduce")
                            for j in colls)
        first_holder = column["holder_first"][row]
        holders = tuple(column["holder_device"][first_holder:first_holder + column["holders"][row]]) or None
        transfers = []
        first = column["first_transfer"][row]
        for t in range(first, first + column["transfers"][row]):
            parts = range(column["first_part"][t], column["first_part"][t] + column["parts"][t])
            contributions = tuple((column["part_category"][i], column["part_fraction"][i]) for i in parts)
            transfers.append((column["src"][t], column["dst"][t], column["stage"][t], contributions))
        local = frozenset(e for e in range(d) if column["local"][row * d + e])
        skeletons.append((tuple(transfers), local, holders, collectives))
    return skeletons


def _count_skeleton_branches(hits: dict, b, layout_p, layout_c, skeleton, beta) -> None:
    """Add to ``hits`` the rules of :mod:`tag.compiler.rules` that bundle ``b`` took between these layouts
    (``skeleton``: what it made; ``beta`` [D][D] the bandwidths that choose a whole copy's source)."""
    from tag.compiler.rules import EMPTY as _EMPTY
    from tag.compiler.tables import DEMAND_SUM, ROWS

    p_split = b.producer_device < 0 and layout_p.split
    rows = p_split and ROWS in b.pclass
    same_devices = layout_c.split and layout_c.devices == layout_p.devices
    overlaps = [min(hi, need_hi) - max(lo, need_lo) for lo, hi in zip(layout_p.lo, layout_p.hi)
                for need_lo, need_hi in zip(layout_c.lo, layout_c.hi)] if rows and not same_devices else []
    hits["same devices, other rows"] += rows and same_devices and layout_c.lo != layout_p.lo
    hits["sliver overlap skipped"] += any(0 < overlap < _EMPTY for overlap in overlaps)
    hits["overlap of exactly _EMPTY"] += _EMPTY in overlaps
    hits["model-parallel producer"] += b.producer_device >= 0 and bool(skeleton.transfers)
    hits["model-parallel consumer"] += layout_c.model_parallel and bool(skeleton.transfers)
    for _, op in skeleton.collectives:
        hits[op] += 1
    for s, e, stage, _, _, items in skeleton.transfers:
        hits["sums forwarded (stage 2)"] += stage == 2
        for kind, k, *_ in items:
            hits["rows between split layouts"] += kind == "rows" and p_split and layout_c.split
            hits["partials to a root"] += kind == "partial"
            hits["partials to C's first device"] += (kind == "partial" and layout_c.split
                                                     and b.demand[k] == DEMAND_SUM and e == layout_c.devices[0])
            if kind == "full" or kind == "rows" and not p_split:  # a whole copy: not the first best holder
                best = max(beta[h][e] for h in skeleton.holders)
                first_best = next(h for h in skeleton.holders if beta[h][e] >= best * (1 - 1e-9))
                hits["tied sources rotated"] += s != first_best


def test_both_compilers_read_one_skeleton_per_bundle_and_every_rule_is_hit():
    """The rules are written once (:func:`tag.compiler.rules.make_skeletons`); the evaluator's store of them
    (``_Skeletons.row`` then ``build``, read by its pair kernel) and the readable compiler's records
    (``_Compiler._skeleton``: delivery items, op names) hold the same skeletons, exactly (fractions bit for
    bit, transfers and their contributions in order), for every bundle of every pair of groups under 10
    seeded random strategies (all four options, both batch splits) of 3 tiny models on 3 clusters (two of
    them several machines). Strategies 0 and 1 come again with the first replica of most split layouts (all
    but every third group's) cut to rows [0, EMPTY): an overlap of exactly the threshold moves nothing, and
    layouts on the same devices hold other rows. Every rule is hit (:func:`_count_skeleton_branches`), so the
    check cannot pass on trivial cases; that the rules deliver exactly what each consumer needs is
    ``check_compiled``'s (test_checker_accepts_random_strategies)."""
    from tag.compiler.rules import EMPTY as _EMPTY
    from tag.compiler.stores import _Skeletons
    from tag.compiler.layout import group_layout

    hits = dict.fromkeys(["rows between split layouts", "same devices, other rows", "sliver overlap skipped",
                          "overlap of exactly _EMPTY", "tied sources rotated", "partials to a root",
                          "sums forwarded (stage 2)", "partials to C's first device", "allreduce", "ps",
                          "model-parallel producer", "model-parallel consumer"], 0)
    for model, cluster_name in [("bert-large", "tag-testbed"), ("dlrm", "tag-cloud"), ("vgg19", "two-level")]:
        cluster = resolve_cluster(cluster_name)
        gg = group_ops(resolve_model(model, tiny=True), num_groups=20, gpus=cluster)
        evaluator = StrategyEvaluator(gg, cluster)
        tables, context = evaluator.tables, evaluator.context
        compiler, store, cases = evaluator._compiler(), _Skeletons(cluster.num_devices), []
        for seed in range(10):
            strategy = random_strategy(gg.num_groups, cluster, seed=seed % 8, batch_split=("even", "speed")[seed % 2])
            layouts = [group_layout(tables, context, strategy, g) for g in range(gg.num_groups)]
            if seed >= 8:
                layouts = [layout._replace(lo=(0.0, _EMPTY) + layout.lo[2:], hi=(_EMPTY,) + layout.hi[1:],
                                           key=layout.key + ("cut",)) if layout.split and g % 3 else layout
                           for g, layout in enumerate(layouts)]
            compiler.layouts = layouts  # read for the records' op names
            for p, c in tables.pair_uses:
                layout_p, layout_c = layouts[p], layouts[c]
                first_piece = tables.piece_unit(c, 0) if layout_c.model_parallel else 0
                for b in evaluator._static_bundles((p, c), layout_p, layout_c).bundles:
                    cases.append((store.row(b, layout_p, layout_c, first_piece), b, layout_p, layout_c,
                                  compiler._skeleton(b, layout_p, layout_c)))
        store.build(evaluator._beta, context)
        stored = _stored_skeletons(store)
        for row, b, layout_p, layout_c, expected in cases:
            assert stored[row] == (tuple(transfer[:4] for transfer in expected.transfers), expected.local,
                                   expected.holders if expected.collectives else None, expected.collectives)
            assert all(counted == tuple(k for k, _ in contributions)
                       for *_, contributions, counted, _ in expected.transfers)
            _count_skeleton_branches(hits, b, layout_p, layout_c, expected, context.beta)
    assert all(hits.values()), hits


def test_template_look_up_finds_known_templates_and_leads_new_ones_by_their_first_pair():
    """``_template_look_up`` against a plain loop: a pair with both rows and a class has a code; a code the
    table holds gives its fragment; each new code's first pair leads the others of it; the pairs to build
    are those without a code and the leaders, ascending. Random rows and classes (with -1s), a table holding
    some of the codes, 3 row bits."""
    from tag.compiler.lookup import _template_look_up
    from tag.sim.kernels import int_table, table_store

    rng = np.random.default_rng(0)
    for m in (0, 1, 7, 60, 171):
        row_p, row_c, classes = (rng.integers(-1, 4, m) for _ in range(3))
        codes = np.where((row_p >= 0) & (row_c >= 0) & (classes >= 0), (classes << 6) | (row_p << 3) | row_c, -1)
        known = np.unique(codes[codes >= 0])[::2]  # every other code is held
        table = int_table()
        table_store(table, known, 1000 + known)
        out, build, leader, got_codes = _template_look_up(row_p, row_c, classes, table, 3)
        first: dict[int, int] = {}
        expected_out, expected_leader, expected_build = [], [], []
        for i, code in enumerate(codes.tolist()):
            held = code >= 0 and code in set(known.tolist())
            expected_out.append(1000 + code if held else -1)
            lead = -1 if code < 0 or held else first.setdefault(code, i)
            expected_leader.append(lead)
            if code < 0 or lead == i:
                expected_build.append(i)
        assert got_codes.tolist() == codes.tolist() and out.tolist() == expected_out
        assert leader.tolist() == expected_leader and build.tolist() == expected_build


def test_evaluator_columns_keep_their_rows_as_they_grow():
    """The evaluator's column store grows its arrays past 1024 rows; every row written stays readable,
    in order, through the growths, per table."""
    from tag.compiler.arena import _Columns

    columns = _Columns({"a": (np.float64, "t"), "b": (np.int32, "t"), "c": (np.int64, "u")})
    rng = np.random.default_rng(0)
    written = {"a": [], "b": [], "c": []}
    for _ in range(40):
        rows_t, rows_u = int(rng.integers(0, 300)), int(rng.integers(0, 900))
        rows = {"a": rng.random(rows_t), "b": rng.integers(-5, 5, rows_t).astype(np.int32),
                "c": rng.integers(0, 1 << 40, rows_u)}
        first = columns.extend(rows, {"t": rows_t, "u": rows_u})
        assert first == {"t": sum(len(x) for x in written["a"]), "u": sum(len(x) for x in written["c"])}
        for name, values in rows.items():
            written[name].append(values)
    for name, parts in written.items():
        np.testing.assert_array_equal(columns.view(name), np.concatenate(parts))
    assert columns.columns["c"].size > 1024 * 8  # it grew several times


def test_without_numba_the_evaluator_still_matches_compile_strategy(without_numba):
    """With numba off (its kernels run as plain Python, the fragment tables are plain dicts), the evaluator
    still gives compile_strategy + simulate_fast's schedule, at group and merged granularity."""
    without_numba("import numpy as np\n"
                  "from tag.sim import kernels, simulate_fast\n"
                  "from tag.cluster import resolve_cluster\n"
                  "from tag.graph.resolve import resolve_model\n"
                  "from tag.grouping import group_ops\n"
                  "from tag.compiler import StrategyEvaluator, compile_strategy, random_strategy\n"
                  "assert not kernels.COMPILED\n"
                  "cluster = resolve_cluster('tag-testbed')\n"
                  "gg = group_ops(resolve_model('vgg19'), num_groups=8, gpus=cluster)\n"
                  "for gran in ('group', 'merged'):\n"
                  "    ev = StrategyEvaluator(gg, cluster, granularity=gran)\n"
                  "    for seed in range(4):\n"
                  "        s = random_strategy(gg.num_groups, cluster, seed=seed)\n"
                  "        a = ev(s)\n"
                  "        b = simulate_fast(compile_strategy(gg, s, cluster, granularity=gran).taskgraph)\n"
                  "        assert np.array_equal(a.start, b.start) and np.array_equal(a.finish, b.finish)\n"
                  "        assert np.array_equal(a.peak_memory, b.peak_memory)\n")


def test_communication_costs_by_hand():
    """The costs both compilers time inserted ops with (tag.compiler.costs), against hand-computed figures."""
    from tag.compiler.costs import ps_seconds, ring_allreduce_seconds, transfer_seconds

    assert transfer_seconds(3, 1e-5, 1e9, 2e9) == pytest.approx(3e-5 + 2.0)
    assert transfer_seconds(3, 1e-5, 1e9, 0.0) == 0.0  # nothing moved: no latency either
    # 4 devices, 3 GB in 2 tensors: 2·3/4 · 3 s + 2 · 2·3 · 10 µs
    assert ring_allreduce_seconds(4, 1e9, 1e-5, 3e9, 2) == pytest.approx(4.5 + 1.2e-4)
    assert ring_allreduce_seconds(4, 1e9, 1e-5, 0.0, 2) == 0.0
    # two servers (latency, summed inverse bandwidth) behind one unused first slot; uses 0 and 2 of bytes 1e9
    # and 3e9, round robin from consumer group 1: use 0 (sync index 0) on server (1 + 0) % 2 = 1, use 2 (sync
    # index 1) on server 0; each pushed and pulled: 2 (α + S · Σ1/β)
    latency, inverse = np.array([9.0, 1e-3, 2e-3]), np.array([9.0, 1e-9, 2e-9])
    uses, sync_index, use_bytes = np.array([0, 2]), np.array([0, 5, 1]), np.array([1e9, 7.0, 3e9])
    expected = 2 * (2e-3 + 1e9 * 2e-9) + 2 * (1e-3 + 3e9 * 1e-9)
    assert ps_seconds(latency, inverse, 1, 2, 1, uses, 0, 2, sync_index, use_bytes) == pytest.approx(expected)
