"""Pipeline schedules, compilation of pipeline plans to the TaskGraph, and end-to-end planning."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tag.cluster import Cluster, gpu_type, resolve_cluster
from tag.exact.mappers import pipeline_problem
from tag.exact.mapping import solve_mapping
from tag.exact.pipeline import (
    compile_pipeline,
    consecutive_mapping,
    mapping_objective,
    plan_pipeline,
    replay_pipeline,
    simulate_pipeline,
)
from tag.exact.schedules import Action, format_grid, stage_order, stage_orders, unit_time_schedule
from tag.exact.stage_graph import ForwardGraph, PartitionError, StageGraph, build_stage_graph, inflight_micro_batches
from tag.graph.pipedream import load_pipedream
from tag.planners.mappers import make_mapper
from tag.sim import TASK_COLLECTIVE, TASK_TRANSFER, device_schedule, simulate, simulate_fast

PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"
needs_profiles = pytest.mark.skipif(not PROFILES.is_dir(), reason="PipeDream profiles not found")
GB = 1e9


def flat_cluster(num_devices, *, bandwidth=10 * GB, gpu="v100-16gb"):
    return Cluster(name="flat", types=(gpu,), device_type=[0] * num_devices, machine=[0] * num_devices,
                   bandwidth=np.full((num_devices, num_devices), bandwidth),
                   latency=np.zeros((num_devices, num_devices)))


def hand_stage_graph(num_stages, micro_batches, *, fwd=1e-3, bwd=2e-3, edge_bytes=0.0, params=0.0,
                     activation=0.0, replicas=1, optimizer=0.0):
    """A chain of uniform stages built by hand (no OpGraph behind it)."""
    counts = np.full(num_stages, replicas) if np.isscalar(replicas) else np.asarray(replicas)
    src = np.arange(num_stages - 1)
    return StageGraph(
        stage_time=np.full(num_stages, fwd + bwd), edge_src=src, edge_dst=src + 1,
        edge_bytes=np.full(num_stages - 1, float(edge_bytes)), param_bytes=np.full(num_stages, float(params)),
        memory_bytes=np.zeros(num_stages), assignment=np.zeros(0, dtype=np.int64), replicas=counts,
        micro_batches=micro_batches, gpu_types=(gpu_type("v100-16gb"),), reference_type=0,
        forward_time=np.full((num_stages, 1), fwd), backward_time=np.full((num_stages, 1), bwd),
        optimizer_time=np.full((num_stages, 1), optimizer), activation_bytes=np.full(num_stages, float(activation)),
        input_bytes=np.zeros(num_stages), forward_assignment=np.arange(num_stages))


# ------------------------------------------------------------------------------------------- schedules


def test_action_repr():
    assert repr(Action(2, "F", 0)) == "2F0"
    assert repr(stage_order(1, 2, 3)) == "[1F0, 1B0, 1F1, 1B1, 1F2, 1B2]"
    assert repr(stage_order(0, 2, 3)) == "[0F0, 0F1, 0B0, 0F2, 0B1, 0B2]"


def test_grid_by_hand():
    assert format_grid(stage_orders(2, 3, "1f1b")) == (
        "stage 0 |0F0 0F1 ... 0B0 0F2 0B1 ... 0B2|\n"
        "stage 1 |... 1F0 1B0 1F1 1B1 1F2 1B2 ...|")


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stages,micro_batches", [(1, 1), (2, 4), (4, 3), (4, 8), (5, 2)])
def test_orders_run_each_pass_once_forward_first(schedule, stages, micro_batches):
    for s, order in enumerate(stage_orders(stages, micro_batches, schedule)):
        assert sorted(order) == sorted(Action(s, k, m) for k in "FB" for m in range(micro_batches))
        position = {a: i for i, a in enumerate(order)}
        assert all(position[Action(s, "F", m)] < position[Action(s, "B", m)] for m in range(micro_batches))
        live = peak = 0
        for action in order:
            live += 1 if action.kind == "F" else -1
            peak = max(peak, live)
        assert peak == inflight_micro_batches(stages, micro_batches, schedule)[s]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stages,micro_batches", [(2, 1), (2, 5), (3, 4), (4, 8)])
def test_unit_time_schedule_and_grid(schedule, stages, micro_batches):
    orders = stage_orders(stages, micro_batches, schedule)
    times = unit_time_schedule(orders, forward=1.0, backward=2.0)
    assert max(f for _, f in times.values()) == (micro_batches + stages - 1) * 3.0
    grid = format_grid(orders, forward=1.0, backward=2.0)
    assert len(grid.splitlines()) == stages and "0F0" in grid.splitlines()[0]


# ------------------------------------------------------------------------------------------- compilation


@pytest.mark.parametrize("simulator", [simulate, simulate_fast], ids=["reference", "fast"])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stages,micro_batches", [(2, 1), (2, 4), (2, 7), (3, 5)])
def test_uniform_pipeline_takes_the_textbook_time(simulator, schedule, stages, micro_batches):
    f, b = 1e-3, 2e-3
    sg = hand_stage_graph(stages, micro_batches, fwd=f, bwd=b)
    taskgraph = compile_pipeline(sg, flat_cluster(stages), [[s] for s in range(stages)], schedule=schedule)
    result = simulator(taskgraph)
    assert result.iteration_time == pytest.approx((micro_batches + stages - 1) * (f + b))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_device_orders_respect_stage_dependencies(schedule):
    stages, micro_batches = 3, 5
    sg = hand_stage_graph(stages, micro_batches, edge_bytes=1e6, activation=1e6)
    cluster = flat_cluster(stages)
    taskgraph, result = simulate_pipeline(sg, cluster, [[s] for s in range(stages)], schedule=schedule)
    index = {name: i for i, name in enumerate(taskgraph.names)}

    def span(s, kind, m):
        i = index[f"s{s}r0{kind}{m}"]
        return result.start[i], result.finish[i]

    for m in range(micro_batches):
        for s in range(stages):
            assert span(s, "F", m)[1] <= span(s, "B", m)[0]
            if s + 1 < stages:
                assert span(s, "F", m)[1] < span(s + 1, "F", m)[0]  # a transfer sits between them
                assert span(s + 1, "B", m)[1] < span(s, "B", m)[0]
    for s in range(stages):
        labels = [e.label for e in device_schedule(result, taskgraph, s)]
        assert labels[:-1] == [repr(a) for a in stage_order(s, stages, micro_batches, schedule)]
        assert labels[-1] == f"{s}O"


def test_1f1b_holds_less_memory_than_gpipe():
    stages, micro_batches = 4, 8
    sg = hand_stage_graph(stages, micro_batches, edge_bytes=1e5, activation=1e8, params=1e7)
    cluster = flat_cluster(stages)
    mapping = [[s] for s in range(stages)]
    peaks = {schedule: simulate_pipeline(sg, cluster, mapping, schedule=schedule)[1].peak_memory
             for schedule in ("1f1b", "gpipe")}
    assert (peaks["1f1b"] <= peaks["gpipe"]).all()
    assert peaks["1f1b"][0] < peaks["gpipe"][0]
    # GPipe's first stage holds all M activations and the parameters, Adam state included.
    assert peaks["gpipe"][0] >= micro_batches * 1e8 + 4 * 1e7


def test_replicas_all_reduce_and_split_transfers():
    sg = hand_stage_graph(2, 2, edge_bytes=1e6, params=1e8, replicas=[2, 1], optimizer=1e-4)
    cluster = flat_cluster(3)
    taskgraph, result = simulate_pipeline(sg, cluster, [[0, 1], [2]])
    collectives = np.flatnonzero(taskgraph.kind == TASK_COLLECTIVE)
    assert len(collectives) == 1 and sorted(taskgraph.members(collectives[0]).tolist()) == [0, 1]
    transfers = np.flatnonzero(taskgraph.kind == TASK_TRANSFER)
    forward = [t for t in transfers if taskgraph.labels[t].endswith(("F0",))]
    assert sum(taskgraph.nbytes[t] for t in forward) == pytest.approx(2 * 1e6)  # both halves reach stage 1
    no_sync = simulate_pipeline(hand_stage_graph(2, 2, edge_bytes=1e6, replicas=[2, 1]), cluster, [[0, 1], [2]])[1]
    assert result.iteration_time > no_sync.iteration_time


def _skip_graph():
    """0 -> 1 -> 3 and 0 -> 2 -> 3 (a diamond) plus a skip 0 -> 3, one op per stage; edge bytes by hand."""
    from conftest import make_graph

    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (0, 3)]
    graph = make_graph(edges, n=4, flops=[1e12] * 4, edge_bytes=[10.0, 20.0, 30.0, 40.0, 50.0])
    return ForwardGraph.from_graph(graph, [gpu_type("v100-16gb")])


def test_chain_links_carry_every_activation_across_each_cut():
    """Stages 0..3 one op each. Cut 0|123: producer 0's tensor once, its largest edge 50. Cut 01|23:
    0's tensor (max of 20, 50) and 1's 30. Cut 012|3: 0's 50, 1's 30, 2's 40."""
    fg = _skip_graph()
    data = build_stage_graph(fg, [0, 1, 2, 3], micro_batches=1)
    assert sorted(zip(data.edge_src.tolist(), data.edge_dst.tolist(), data.edge_bytes.tolist())) == \
        [(0, 1, 10.0), (0, 2, 20.0), (0, 3, 50.0), (1, 3, 30.0), (2, 3, 40.0)]
    chain = build_stage_graph(fg, [0, 1, 2, 3], micro_batches=1, links="chain")
    assert chain.edge_src.tolist() == [0, 1, 2] and chain.edge_dst.tolist() == [1, 2, 3]
    assert chain.edge_bytes.tolist() == [50.0, 80.0, 120.0]
    assert chain.input_bytes.tolist() == [0.0, 50.0, 80.0, 120.0]
    assert chain.info["links"] == "chain" and data.info["links"] == "data"
    # two micro-batches: every activation here scales with the batch, so each cut carries half
    assert build_stage_graph(fg, [0, 1, 2, 3], micro_batches=2, links="chain").edge_bytes.tolist() == [25.0, 40.0, 60.0]
    # stages 0 and 1 merged: one cut, every tensor leaving {0, 1} once (0's 50, 1's 30)
    assert build_stage_graph(fg, [0, 0, 1, 1], micro_batches=1, links="chain").edge_bytes.tolist() == [80.0]
    with pytest.raises(PartitionError, match="links must be one of"):
        build_stage_graph(fg, [0, 1, 2, 3], links="ring")


def test_a_chain_runs_independent_stages_in_sequence():
    """The two branch stages 1 and 2 of the diamond run side by side with data links; on a chain stage 2
    waits for stage 1, so one micro-batch takes longer."""
    fg = _skip_graph()
    cluster = flat_cluster(4, bandwidth=1e12)
    mapping = [[0], [1], [2], [3]]
    data = simulate_pipeline(build_stage_graph(fg, [0, 1, 2, 3]), cluster, mapping)[1]
    chain = simulate_pipeline(build_stage_graph(fg, [0, 1, 2, 3], links="chain"), cluster, mapping)[1]
    passes = build_stage_graph(fg, [0, 1, 2, 3]).stage_time  # [4] fwd + bwd of each stage
    assert data.iteration_time < chain.iteration_time
    assert chain.iteration_time >= passes.sum()  # every pass of the micro-batch in turn
    assert data.iteration_time < passes.sum() - 0.9 * min(passes[1], passes[2])


@needs_profiles
def test_stage_times_follow_each_device_type(profiles):
    cluster = Cluster(name="mixed", types=("v100-32gb", "p100"), device_type=[0, 1, 1, 0], machine=[0, 0, 1, 1],
                      bandwidth=np.full((4, 4), 10 * GB), latency=np.zeros((4, 4)))
    plan = plan_pipeline(profiles["vgg16"], cluster, stages=2, replicas=2, micro_batches=2, alphas=(1.0,))
    sg, tg = plan.stage_graph, plan.taskgraph
    assert [t.name for t in sg.gpu_types] == ["v100-32gb", "p100"]
    for s, row in enumerate(plan.mapping):
        for r, device in enumerate(row):
            column = sg.gpu_types.index(cluster.gpu(device))
            assert tg.duration[tg.names.index(f"s{s}r{r}F0")] == pytest.approx(sg.forward_time[s, column])
    assert (sg.forward_time[:, 1] > sg.forward_time[:, 0]).all()  # the P100 is slower


def test_mapping_is_validated():
    sg = hand_stage_graph(2, 2, replicas=2)
    cluster = flat_cluster(4)
    with pytest.raises(PartitionError, match="two stage replicas on device 1"):
        compile_pipeline(sg, cluster, [[0, 1], [1, 2]])
    with pytest.raises(PartitionError, match="row 1 has 1 devices for 2 replicas"):
        compile_pipeline(sg, cluster, [[0, 1], [2]])
    with pytest.raises(PartitionError, match="device 9 is not in cluster"):
        compile_pipeline(sg, cluster, [[0, 1], [2, 9]])
    assert consecutive_mapping(sg, 2, cluster, [3, 2, 1, 0]).mapping == [[3, 2], [1, 0]]


# ------------------------------------------------------------------------------------------- planning


@pytest.fixture(scope="module")
def profiles():
    return {name: load_pipedream(PROFILES / f"{name}.graph.txt") for name in ("vgg16", "resnet50", "gnmt")}


@needs_profiles
@pytest.mark.parametrize("partitioner", ["parmesan", "pipedream", "rannc"])
@pytest.mark.parametrize("model", ["vgg16", "resnet50", "gnmt"])
def test_pipedream_profiles_plan_end_to_end(profiles, model, partitioner):
    graph = profiles[model]
    cluster = flat_cluster(4, gpu="v100-32gb")
    plan = plan_pipeline(graph, cluster, stages=2, replicas=2, partitioner=partitioner, micro_batches=4,
                         alphas=(1.0,))
    summary = plan.as_dict()
    for key in ("stages", "replicas", "mapping", "max_stage_time_s", "iteration_time_s", "lower_bound_s",
                "proven_optimal", "solve_time_s"):
        assert key in summary
    assert summary["stages"] == 2 and summary["feasible"]
    assert summary["iteration_time_s"] == plan.result.iteration_time > summary["max_stage_time_s"] > 0
    assert sorted(d for row in plan.mapping for d in row) == sorted(set(d for row in plan.mapping for d in row))
    sg = plan.stage_graph
    assert sg.assignment.shape == (graph.num_ops,) and set(sg.assignment.tolist()) == {0, 1}
    assert sg.param_bytes.sum() == pytest.approx(graph.total_param_bytes())
    reference = simulate(plan.taskgraph, feedback=False)
    assert reference.iteration_time == pytest.approx(plan.iteration_time)


@needs_profiles
def test_plan_calls_the_mapper_once_with_the_chosen_stage_graph(profiles):
    calls = []

    def mapper(stage_graph, replicas, cluster, devices):
        calls.append((stage_graph, replicas, list(devices)))
        rows = consecutive_mapping(stage_graph, replicas, cluster, devices[::-1]).mapping
        return SimpleNamespace(mapping=np.array(rows), lower_bound=1e-3, proven_optimal=True, solve_time_s=0.25)

    plan = plan_pipeline(profiles["gnmt"], flat_cluster(4), stages=2, replicas=2, mapper=mapper, micro_batches=2,
                         alphas=(1.0,))
    assert len(calls) == 1 and calls[0][0] is plan.stage_graph and calls[0][1] == 2 and calls[0][2] == [0, 1, 2, 3]
    assert plan.mapping == [[3, 2], [1, 0]]
    summary = plan.as_dict()
    assert summary["lower_bound_s"] == 1e-3 and summary["proven_optimal"] and summary["solve_time_s"] == 0.25


@needs_profiles
@pytest.mark.parametrize("partitioner", ["parmesan", "rannc"])
def test_auto_searches_configurations(profiles, partitioner):
    cluster = resolve_cluster("two-level")
    plan = plan_pipeline(profiles["gnmt"], cluster, auto=True, partitioner=partitioner, devices=range(8),
                         alphas=(1.0,))
    assert plan.result.feasible
    assert sum(plan.stage_graph.replicas) <= 8
    assert plan.info["configurations_simulated"] > 1
    best = min(entry["iteration_time_s"] for entry in plan.info["search"] if entry["feasible"])
    assert plan.iteration_time == pytest.approx(best)  # the consecutive placement is kept: no mapper


@needs_profiles
@pytest.mark.parametrize("partitioner", ["parmesan", "pipedream"])
def test_a_time_limit_keeps_the_first_candidate_and_prefixes_the_full_search(profiles, partitioner):
    """A limit that has passed before the first candidate: the search keeps that candidate (the first
    (S, R, M) of the full search, simulated alike) and says it stopped; a bad limit is refused."""
    cluster = resolve_cluster("two-level")
    options = dict(auto=True, partitioner=partitioner, devices=range(8), alphas=(1.0,))
    full = plan_pipeline(profiles["gnmt"], cluster, **options)
    cut = plan_pipeline(profiles["gnmt"], cluster, time_limit_s=1e-9, **options)
    assert cut.info["stopped_at_limit"] and not full.info["stopped_at_limit"]
    assert 1 <= cut.info["configurations_simulated"] < full.info["configurations_simulated"]
    assert cut.info["search"][0] == full.info["search"][0]
    assert cut.iteration_time >= full.iteration_time
    with pytest.raises(PartitionError, match="time_limit_s"):
        plan_pipeline(profiles["gnmt"], cluster, time_limit_s=0, **options)


@needs_profiles
def test_plan_errors(profiles):
    graph, cluster = profiles["gnmt"], flat_cluster(4)
    with pytest.raises(PartitionError, match="need 6 devices; 4 given"):
        plan_pipeline(graph, cluster, stages=3, replicas=2)
    with pytest.raises(PartitionError, match="partitioner must be one of"):
        plan_pipeline(graph, cluster, stages=2, partitioner="metis")
    with pytest.raises(PartitionError, match="exceed the batch"):
        plan_pipeline(graph, cluster, stages=2, replicas=2, micro_batches=64)
    with pytest.raises(PartitionError, match="schedule must be one of"):
        plan_pipeline(graph, cluster, stages=2, schedule="zb")


# ------------------------------------------------------------------------------------------- units


@pytest.mark.parametrize("replicas, params, edge_bytes", [(1, 0.0, 0.0), (1, 0.0, 4e6), (2, 8e6, 0.0)])
def test_mapper_objective_is_per_iteration_like_the_simulator(replicas, params, edge_bytes):
    """2 stages × M = 4 micro-batches of f = 1 ms, b = 2 ms on a flat 1 GB/s cluster, by hand.

    Per iteration a stage replica computes M (f + b) = 12 ms; p2p (eq. 6) adds its 2M transfers of the
    edge's bytes, 8 n / B; all-reduce (eq. 7) adds a ring hop 2 (R−1)/R · P / B. The 1F1B iteration is
    that plus the fill and drain, (S − 1)(f + b) = 3 ms, and (with R = 2) the last stage's all-reduce
    P / B at the end."""
    bandwidth, f, b, m = 1 * GB, 1e-3, 2e-3, 4
    sg = hand_stage_graph(2, m, fwd=f, bwd=b, edge_bytes=edge_bytes, params=params, replicas=replicas)
    cluster = flat_cluster(2 * replicas, bandwidth=bandwidth)
    mapping = [list(range(replicas)), list(range(replicas, 2 * replicas))]
    objective, mode = mapping_objective(sg, cluster, mapping)
    compute = m * (f + b)
    if replicas == 1:
        assert mode == "p2p" and objective == pytest.approx(compute + 2 * m * edge_bytes / bandwidth)
    else:
        assert mode == "allreduce" and objective == pytest.approx(compute + params / bandwidth)
    problem = pipeline_problem(sg, cluster, range(cluster.num_devices))
    result = solve_mapping(problem, time_limit=5.0)
    assert result.proven_optimal and result.lower_bound == pytest.approx(objective)  # all mappings equal
    if edge_bytes == 0:
        _, simulated = simulate_pipeline(sg, cluster, mapping)
        fill_drain = (2 - 1) * (f + b)
        assert simulated.iteration_time == pytest.approx(objective + fill_drain)


@needs_profiles
def test_plan_reports_mapper_bound_and_objective_in_one_unit(profiles):
    plan = plan_pipeline(profiles["gnmt"], resolve_cluster("two-level"), stages=2, replicas=4, micro_batches=4,
                         mapper=make_mapper("exact", time_limit=5.0), alphas=(1.0,))
    summary = plan.as_dict()
    assert summary["lower_bound_s"] <= summary["max_stage_time_s"] < summary["iteration_time_s"]
    assert summary["max_stage_time_s"] == pytest.approx(mapping_objective(plan.stage_graph, resolve_cluster("two-level"),
                                                                          plan.mapping)[0])
    # Without a mapper the objective is still evaluated per iteration on the consecutive placement.
    consecutive = plan_pipeline(profiles["gnmt"], resolve_cluster("two-level"), stages=2, replicas=4,
                                micro_batches=4, alphas=(1.0,)).as_dict()
    assert consecutive["max_stage_time_s"] >= summary["max_stage_time_s"] * (1 - 1e-12)


@needs_profiles
@pytest.mark.parametrize("name", ["cs", "p2p", "random"])
def test_heuristic_mappers_report_the_assignment_bound(profiles, name):
    plan = plan_pipeline(profiles["gnmt"], resolve_cluster("two-level"), stages=2, replicas=4, micro_batches=4,
                         mapper=make_mapper(name), alphas=(1.0,), devices=range(2, 14))
    summary = plan.as_dict()
    assert all(2 <= d < 14 for row in plan.mapping for d in row)
    assert summary["lower_bound_s"] <= summary["max_stage_time_s"]
    assert summary["gap"] == pytest.approx(1 - summary["lower_bound_s"] / summary["max_stage_time_s"])


@needs_profiles
def test_replay_rebuilds_the_plan(profiles):
    cluster = resolve_cluster("two-level")
    plan = plan_pipeline(profiles["gnmt"], cluster, stages=4, replicas=2, micro_batches=4,
                         mapper=make_mapper("exact", time_limit=5.0), alphas=(1.0,))
    sg = plan.stage_graph
    again = replay_pipeline(profiles["gnmt"], cluster, forward_assignment=sg.forward_assignment,
                            replicas=sg.replicas, micro_batches=sg.micro_batches, mapping=plan.mapping)
    assert again.iteration_time == plan.iteration_time
    assert again.max_stage_time == pytest.approx(plan.max_stage_time)
    with pytest.raises(PartitionError, match="forward ops"):
        replay_pipeline(profiles["gnmt"], cluster, forward_assignment=[0, 1], replicas=[1, 1], micro_batches=1,
                        mapping=[[0], [1]])
