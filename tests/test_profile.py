"""tag profile: the linear fits, the profile file, the profile-backed cost model, `local:N`, the command."""

import gzip
import json

import numpy as np
import torch
import pytest

from conftest import make_graph, run, run_json
from tag.cluster import resolve_cluster
from tag.cost import CostModel, ProfiledCostModel, ring_allreduce_time
from tag.errors import ProfileError
from tag.profile import (
    CommCurve,
    DeviceProfile,
    ModelTimes,
    Profile,
    fit_linear,
    load_profile,
    save_profile,
    structure_fingerprint,
)
from tag.profile.comm import _robust_line, fit_curve

SIZES = (2, 4)


# ------------------------------------------------------------------------------------------------ fits
def test_fit_linear_recovers_a_known_line_per_op():
    batches = np.array([1.0, 2.0, 4.0, 8.0])
    fixed = np.array([3e-6, 0.0, 1e-3])
    per_sample = np.array([2e-6, 5e-5, 0.0])
    a, c = fit_linear(batches, fixed[:, None] + per_sample[:, None] * batches)
    np.testing.assert_allclose(a, fixed, atol=1e-15)
    np.testing.assert_allclose(c, per_sample, atol=1e-15)


def test_fit_linear_keeps_both_parts_non_negative():
    batches = np.array([1.0, 2.0, 3.0])
    times = np.array([[6.0, 4.0, 2.0],  # falls with the batch: flat at the mean
                      [0.0, 3.0, 6.0],  # would cross below 0 at the origin: through the origin
                      [np.nan, 5.0, np.nan]])  # one sample: flat
    a, c = fit_linear(batches, times)
    np.testing.assert_allclose(a, [4.0, 0.0, 5.0])
    np.testing.assert_allclose(c, [0.0, 24.0 / 14.0, 0.0])


def test_relative_fit_and_comm_fit_keep_the_latency_of_small_messages():
    sizes = np.array([2.0 ** k for k in range(10, 25, 2)])
    alpha, beta = 2e-4, 3e9
    seconds = alpha + sizes / beta
    a, c = fit_linear(sizes, seconds, relative=True)
    assert a == pytest.approx(alpha, rel=1e-9) and 1 / c == pytest.approx(beta, rel=1e-9)
    a, c = _robust_line(sizes, seconds)
    assert a == pytest.approx(alpha, rel=1e-9) and 1 / c == pytest.approx(beta, rel=1e-9)
    noisy = seconds.copy()
    noisy[3] *= 10  # one loaded round among the small messages
    a, c = _robust_line(sizes, noisy)
    assert a == pytest.approx(alpha, rel=0.05) and 1 / c == pytest.approx(beta, rel=1e-6)


def test_comm_fits_recover_a_known_transfer_and_a_whole_collective():
    sizes = (1e3, 1e4, 1e5, 1e6, 1e7, 1e8)
    p2p = fit_curve("p2p", "gloo", 2, sizes, [3e-4 + s / 2e9 for s in sizes])
    assert p2p.latency_s == pytest.approx(3e-4, rel=1e-9) and p2p.bandwidth == pytest.approx(2e9, rel=1e-9)
    assert p2p.predicted(5e6) == pytest.approx(3e-4 + 5e6 / 2e9, rel=1e-9)
    # a whole all-reduce of 8e-4 s + S / 1 GB/s between 2 ranks: the ring's two hops each 4e-4 s, β = 1 GB/s
    whole = [8e-4 + s / 1e9 for s in sizes]
    collective = fit_curve("allreduce", "gloo", 2, sizes, whole)
    assert collective.latency_s == pytest.approx(4e-4, rel=1e-9)
    assert collective.bandwidth == pytest.approx(1e9, rel=1e-9)
    for s, t in zip(sizes, whole):
        assert collective.allreduce_seconds(s) == pytest.approx(t, rel=1e-9)
        assert collective.allreduce_seconds(s) == pytest.approx(ring_allreduce_time(s, 2, 1e9, 4e-4), rel=1e-12)
    # four ranks: 2(n-1)/n = 1.5 of S/β and 6 hop latencies make the same whole curve
    four = fit_curve("allreduce", "gloo", 4, sizes, whole)
    assert four.latency_s == pytest.approx(8e-4 / 6, rel=1e-9) and four.bandwidth == pytest.approx(1.5e9, rel=1e-9)
    assert four.allreduce_seconds(1e7) == pytest.approx(8e-4 + 1e7 / 1e9, rel=1e-9)


def test_allreduce_fit_is_the_ring_formula_of_the_cost_model():
    sizes = (1e3, 1e4, 1e5, 1e6, 1e7, 1e8)
    world, alpha, beta = 3, 5e-5, 2e9
    seconds = [ring_allreduce_time(s, world, beta, alpha) for s in sizes]
    curve = fit_curve("allreduce", "gloo", world, sizes, seconds)
    assert curve.latency_s == pytest.approx(alpha, rel=1e-6)
    assert curve.bandwidth == pytest.approx(beta, rel=1e-6)


# ------------------------------------------------------------------------------------------------ file
def _graph():
    return make_graph([(0, 1), (1, 2), (2, 3)], role=[0, 1, 2, 3], batch_scaled=[True, True, True, False])


def _times(graph, *, fixed=(0.0, 2e-5, 3e-5, 7e-6), per_sample=(0.0, 1e-5, 4e-6, 0.0)) -> ModelTimes:
    fixed, per_sample = np.array(fixed), np.array(per_sample)
    measured = fixed[:, None] + per_sample[:, None] * np.array(SIZES, dtype=float)
    measured[0] = np.nan  # the input is not timed
    return ModelTimes("toy", structure_fingerprint(graph), 4, SIZES, tuple(graph.kinds), graph.batch_scaled.copy(),
                      fixed, per_sample, measured)


def _profile(graph, device="cpu", **kwargs) -> Profile:
    p2p = CommCurve("gloo", 2, (1024.0, 1048576.0), (1.1e-4, 6e-4), 1e-4, 2e9)
    return Profile({device: DeviceProfile(device, "test device", "cpu", "fp32", 1, "2.13", {"repeats": 5},
                                          {"toy": _times(graph, **kwargs)}, {"p2p": p2p})})


@pytest.mark.parametrize("name", ["p.json", "p.json.gz"])
def test_profile_round_trips_through_its_file(tmp_path, name):
    graph = _graph()
    profile = _profile(graph)
    path = tmp_path / name
    save_profile(profile, path)
    loaded = load_profile(path)
    assert loaded == profile and hash(loaded) == hash(profile)
    times = loaded.device("cpu").models["toy"]
    np.testing.assert_allclose(times.fixed_s, [0.0, 2e-5, 3e-5, 7e-6])
    np.testing.assert_allclose(times.measured_s[1], [4e-5, 6e-5])
    assert np.isnan(times.measured_s[0]).all()
    assert loaded.device("cpu").match(graph) is times
    assert loaded.device("cpu").comm["p2p"].bandwidth == 2e9
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")
    doc = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
    assert doc["format"] == "tag.profile" and doc["schema_version"] == 1


def test_profiles_merge_by_device_and_model():
    import dataclasses

    graph = _graph()
    first = _profile(graph)
    device = first.device("cpu")
    renamed = dataclasses.replace(device.models["toy"], name="other")
    second = Profile({"cpu": dataclasses.replace(device, models={"other": renamed}, comm={}),
                      "h100": dataclasses.replace(device, name="h100")})
    merged = first.merged(second)
    assert sorted(merged.devices) == ["cpu", "h100"]
    assert sorted(merged.device("cpu").models) == ["other", "toy"]
    assert merged.device("cpu").comm["p2p"] == device.comm["p2p"]  # kept: the second measured none


def _doc(graph) -> dict:
    from tag.profile.data import profile_to_json

    return json.loads(json.dumps(profile_to_json(_profile(graph))))


def _break(doc: dict, how: str) -> dict:
    device = doc["devices"]["cpu"]
    model = device["models"]["toy"]
    if how == "version":
        doc["schema_version"] = 99
    elif how == "no_devices":
        doc["devices"] = {}
    elif how == "negative_time":
        model["fixed_s"][1] = -1.0
    elif how == "short_row":
        model["measured_s"][2] = [1.0]
    elif how == "batch_over_traced":
        model["batch_sizes"] = [2, 8]
    elif how == "zero_bandwidth":
        device["comm"]["p2p"]["bandwidth"] = 0
    elif how == "unknown_comm":
        device["comm"]["broadcast"] = device["comm"]["p2p"]
    elif how == "bad_fit":
        device["roofline_fit"] = {"launch_overhead_s": 1e-5, "compute_efficiency": 0.0, "memory_efficiency": 0.5}
    return doc


@pytest.mark.parametrize("how, field", [("version", "schema_version"), ("no_devices", "devices"),
                                        ("negative_time", "fixed_s[1]"), ("short_row", "measured_s[2]"),
                                        ("batch_over_traced", "batch_sizes"), ("zero_bandwidth", "bandwidth"),
                                        ("unknown_comm", "broadcast"), ("bad_fit", "compute_efficiency")])
def test_a_malformed_profile_is_one_error_naming_the_field(tmp_path, how, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_break(_doc(_graph()), how)))
    with pytest.raises(ProfileError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_profile(path)


def test_a_bad_profile_on_the_command_line_is_one_clean_line(capsys, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    code, out, err = run(capsys, "show", "candle-uno", "--tiny", "--cluster", "local:2", "--profile", str(path))
    assert code == 2 and out == ""
    assert err.startswith("tag: error: ") and err.count("\n") == 1 and "Traceback" not in err
    code, _, err = run(capsys, "show", "candle-uno", "--tiny", "--cluster", f"local:2,profile={tmp_path / 'no.json'}")
    assert code == 2 and "no such profile" in err and err.count("\n") == 1


# ------------------------------------------------------------------------------------------------ cost
def test_cost_model_uses_measured_times_where_covered_and_the_roofline_elsewhere():
    graph = _graph()
    model = ProfiledCostModel(profile=_profile(graph))
    roofline = CostModel()
    # covered: the profile's line at the graph's batch (4 rows); the optimizer op does not scale
    np.testing.assert_allclose(model.op_times(graph, "cpu", 1.0), [0.0, 2e-5 + 4e-5, 3e-5 + 1.6e-5, 7e-6])
    np.testing.assert_allclose(model.op_times(graph, "cpu", 0.5), [0.0, 2e-5 + 2e-5, 3e-5 + 8e-6, 7e-6])
    # the same step at another batch: the same line, per sample
    doubled = graph.with_batch_size(8)
    np.testing.assert_allclose(model.op_times(doubled, "cpu", 1.0), [0.0, 1e-4, 6.2e-5, 7e-6])
    # not covered: another GPU type, another graph, another dtype, measured times switched off
    np.testing.assert_array_equal(model.op_times(graph, "v100"), roofline.op_times(graph, "v100"))
    other = make_graph([(0, 1), (0, 2)], role=[0, 1, 1])
    np.testing.assert_array_equal(model.op_times(other, "cpu"), roofline.op_times(other, "cpu"))
    wider = make_graph([(0, 1), (1, 2), (2, 3)], role=[0, 1, 2, 3], batch_scaled=[True, True, True, False],
                       param_bytes=[64.0, 0.0, 0.0, 0.0])  # the same layout with other sizes: not this step
    np.testing.assert_array_equal(model.op_times(wider, "cpu"), roofline.op_times(wider, "cpu"))
    fp16 = ProfiledCostModel(profile=_profile(graph, device="v100-16gb"), dtype="fp16")
    np.testing.assert_array_equal(fp16.op_times(graph, "v100"), CostModel(dtype="fp16").op_times(graph, "v100"))
    assert not ProfiledCostModel(profile=model.profile, use_measured=False).covers(graph, "cpu")
    assert model.covers(graph, "cpu") and not model.covers(graph, "h100")
    # it crosses process boundaries (the exact mapper's pool, self-play workers)
    import pickle

    again = pickle.loads(pickle.dumps(model))
    assert again == model and np.array_equal(again.op_times(graph, "cpu"), model.op_times(graph, "cpu"))
    # a cost model with another profile is another key for the compiler's caches
    assert model != ProfiledCostModel(profile=_profile(graph, fixed=(0.0, 1e-5, 3e-5, 7e-6)))
    assert model == ProfiledCostModel(profile=_profile(graph))


def test_other_steps_on_a_profiled_gpu_get_the_roofline_calibrated_to_the_profile():
    import dataclasses

    from tag.cluster import gpu_type

    graph = _graph()
    device = _profile(graph).device("cpu")
    fit = {"launch_overhead_s": 2e-5, "compute_efficiency": 1.0, "memory_efficiency": 0.8}
    toy = dataclasses.replace(device.models["toy"], executor_overhead_s=1e-5)  # the measured steps' executor
    model = ProfiledCostModel(profile=Profile({"cpu": dataclasses.replace(device, roofline_fit=fit,
                                                                          models={"toy": toy})}))
    other = make_graph([(0, 1), (0, 2)], role=[0, 1, 1])
    calibrated = CostModel(compute_efficiency=1.0, memory_efficiency=0.8).op_times(
        other, dataclasses.replace(gpu_type("cpu"), launch_overhead_s=2e-5 + 1e-5))
    np.testing.assert_allclose(model.op_times(other, "cpu"), calibrated)
    assert model.op_times(other, "cpu")[1] > CostModel().op_times(other, "cpu")[1]  # the measured floor
    np.testing.assert_array_equal(model.op_times(other, "v100"), CostModel().op_times(other, "v100"))
    plain = ProfiledCostModel(profile=model.profile, use_measured=False)
    np.testing.assert_array_equal(plain.op_times(other, "cpu"), CostModel().op_times(other, "cpu"))


def test_roofline_fit_recovers_a_known_launch_floor_and_efficiencies():
    import dataclasses

    from tag.cluster import gpu_type
    from tag.profile.report import roofline_fit

    n = 12
    graph = make_graph([(i, i + 1) for i in range(n - 1)], role=[0] + [1] * (n - 1))
    graph.flops[:] = [0.0] + [1.0] * 5 + [1e9 * (k + 1) for k in range(6)]  # 5 launch-only ops, 6 busy ones
    graph.bytes_accessed[:] = [0.0] + [1.0] * 5 + [4e7 * (6 - k) for k in range(6)]
    gpu = gpu_type("cpu")
    truth = CostModel(compute_efficiency=1.2, memory_efficiency=0.6).op_times(
        graph, dataclasses.replace(gpu, launch_overhead_s=2e-5))
    measured = np.where(np.arange(n) == 0, np.nan, truth)
    times = ModelTimes("toy", structure_fingerprint(graph), 4, (4,), tuple(graph.kinds), graph.batch_scaled.copy(),
                       np.nan_to_num(measured), np.zeros(n), measured[:, None])
    fit = roofline_fit([(graph, times)], gpu)
    assert fit["launch_overhead_s"] == pytest.approx(2e-5, rel=1e-4)  # plus the launch-only ops' own bytes
    assert fit["compute_efficiency"] == pytest.approx(1.2, rel=2e-3)
    assert fit["memory_efficiency"] == pytest.approx(0.6, rel=2e-3)
    assert fit["rms_log_error"] < 1e-3


def test_the_executors_overhead_is_charged_to_every_op_that_runs(tmp_path):
    import dataclasses

    graph = _graph()
    profile = _profile(graph)
    device = profile.device("cpu")
    times = dataclasses.replace(device.models["toy"], executor_overhead_s=3e-5)
    slow = Profile({"cpu": dataclasses.replace(device, models={"toy": times})})
    save_profile(slow, tmp_path / "slow.json")
    loaded = load_profile(tmp_path / "slow.json")
    assert loaded == slow and loaded.device("cpu").models["toy"].executor_overhead_s == 3e-5
    added = ProfiledCostModel(profile=loaded).op_times(graph, "cpu") - ProfiledCostModel(profile=profile).op_times(
        graph, "cpu")
    np.testing.assert_allclose(added, [0.0, 3e-5, 3e-5, 3e-5])  # the input runs no call


def test_local_cluster_resolves_with_defaults_or_the_profiles_curve(tmp_path):
    from tag.cluster.presets import LOCAL_BANDWIDTH, LOCAL_LATENCY_S

    cluster = resolve_cluster("local:3")
    assert cluster.num_devices == 3 and cluster.types[0].name == "cpu" and cluster.num_device_groups == 3
    assert cluster.bandwidth[0, 1] == LOCAL_BANDWIDTH and cluster.latency[0, 2] == LOCAL_LATENCY_S
    path = tmp_path / "host.json"
    save_profile(_profile(_graph()), path)
    measured = resolve_cluster(f"local:2,profile={path}")
    assert measured.bandwidth[0, 1] == 2e9 and measured.latency[1, 0] == 1e-4
    given = resolve_cluster("local:2,bandwidth=1GB/s,latency=50us")
    assert given.bandwidth[0, 1] == 1e9 and given.latency[0, 1] == pytest.approx(5e-5)


def test_a_profiled_local_cluster_prices_collectives_by_the_measured_allreduce(tmp_path):
    from tag.compiler.compile import compile_strategy
    from tag.cost import allreduce_time, ps_time
    from tag.grouping import group_ops
    from tag.sim import TASK_COLLECTIVE
    from tag.strategy import Strategy

    graph = _graph()
    # a whole all-reduce of 8e-4 s + S / 1 GB/s between the two processes: 4e-4 s and 1 GB/s per ring hop
    allreduce = CommCurve("gloo", 2, (1024.0, 1048576.0), (8.01e-4, 1.85e-3), 4e-4, 1e9)
    device = _profile(graph).device("cpu")
    profile = Profile({"cpu": DeviceProfile("cpu", "test device", "cpu", "fp32", 1, "2.13", {}, device.models,
                                            {**device.comm, "allreduce": allreduce})})
    path = tmp_path / "host.json"
    save_profile(profile, path)
    cluster = resolve_cluster(f"local:2,profile={path}")
    assert cluster.latency[0, 1] == 1e-4 and cluster.bandwidth[0, 1] == 2e9  # transfers: the p2p curve
    assert (cluster.collective_latency_s, cluster.collective_bandwidth) == (4e-4, 1e9)
    nbytes = 3e6
    assert allreduce_time(cluster, [0, 1], nbytes) == pytest.approx(8e-4 + nbytes / 1e9, rel=1e-12)
    assert allreduce_time(cluster, [0, 1], nbytes) == pytest.approx(allreduce.allreduce_seconds(nbytes), rel=1e-12)
    assert ps_time(cluster, [0, 1], 0, nbytes) == pytest.approx(2 * (8e-4 + nbytes / 2e9), rel=1e-12)
    links = resolve_cluster("local:2,latency=100us,bandwidth=2GB/s")  # no profile: the links price collectives
    assert allreduce_time(links, [0, 1], nbytes) == pytest.approx(2e-4 + nbytes / 2e9, rel=1e-12)
    # the compiler prices a data-parallel plan's all-reduces and a PS's phases the same way: per task, the
    # same k latencies (one per fused tensor, or per parameter of a PS) at the collective's α, not the link's
    from tag.graph.resolve import resolve_model as zoo_model

    model = zoo_model("candle-uno", tiny=True)
    gg = group_ops(model, num_groups=4, gpus=cluster)
    for option, per_byte, per_latency in (("allreduce", (1 / 1e9, 1 / 2e9), (8e-4, 2e-4)),
                                          ("ps", (2 / 2e9, 2 / 2e9), (2 * 8e-4, 2 * 1e-4))):
        strategy = Strategy.data_parallel(gg.num_groups, cluster, option=option)
        measured, linked = (compile_strategy(gg, strategy, target, granularity="op").taskgraph
                            for target in (cluster, links))
        synced = np.flatnonzero(measured.kind == TASK_COLLECTIVE)
        assert synced.size > 0 and (linked.kind == measured.kind).all()
        latencies = [(tg.duration[synced] - tg.nbytes[synced] * b) / a
                     for tg, b, a in ((measured, per_byte[0], per_latency[0]), (linked, per_byte[1], per_latency[1]))]
        np.testing.assert_allclose(latencies[0], np.round(latencies[0]), atol=1e-6)  # whole latencies
        np.testing.assert_allclose(latencies[0], latencies[1], atol=1e-6)
        assert (latencies[0] >= 1 - 1e-9).all()


def test_local_cluster_plans_with_the_profiles_op_times():
    from tag.baselines import single_device
    from tag.grouping import group_ops

    graph = _graph()
    cost = ProfiledCostModel(profile=_profile(graph))
    cluster = resolve_cluster("local:2")
    group_graph = group_ops(graph, num_groups=2, gpus=cluster, cost=cost)
    result = single_device(group_graph, cluster).compiled.simulate(feedback=False)
    assert result.iteration_time == pytest.approx(6e-5 + 4.6e-5 + 7e-6, rel=1e-9)


# ------------------------------------------------------------------------------------------- measuring
def test_tag_profile_times_a_tiny_model_end_to_end(capsys, tmp_path):
    from tag.graph.resolve import resolve_model

    out = tmp_path / "host.json.gz"
    payload = run_json(capsys, "profile", "candle-uno", "--tiny", "--batch-sizes", "2,4", "--warmup", "1",
                       "--repeats", "3", "--no-comm", "--out", str(out))
    assert payload["device"] == "cpu" and payload["batch_sizes"] == [2, 4] and payload["cluster"] is None
    assert payload["executor_overhead_s"] >= 0  # what tag run's interpreter adds per op (timing: no sign test)
    assert 0 < payload["timed_ops"] < payload["ops"] and all(s["measured_s"] > 0 for s in payload["steps"])
    assert payload["roofline"]["by_kind"][-1]["kind"] == "all"
    profile = load_profile(out)
    graph = resolve_model("candle-uno", tiny=True)
    times = profile.device("cpu").match(graph)
    assert times is not None and times.batch_sizes == (2, 4)
    assert times.executor_overhead_s == pytest.approx(payload["executor_overhead_s"], rel=1e-3)
    cost = ProfiledCostModel(profile=profile)
    assert cost.covers(graph, "cpu")
    timed = np.isfinite(times.measured_s).all(axis=1)
    assert (cost.op_times(graph, "cpu")[timed] > 0).all()
    # the simulator reads it: one device's iteration is the sum of the measured ops' fitted times
    simulated = run_json(capsys, "baselines", "candle-uno", "--tiny", "--cluster", "local:2", "--only",
                         "single-device", "--profile", str(out))
    expected = times.predicted(4)[graph.role != 0].sum()
    assert simulated["baselines"][0]["iteration_time_s"] == pytest.approx(expected, rel=1e-6)
    # and the planner plans for this host with it
    planned = run_json(capsys, "plan", "candle-uno", "--tiny", "--cluster", "local:2", "--profile", str(out),
                       "--uniform", "--budget", "4", "--num-groups", "4", "--no-sfb")
    assert planned["cluster"] == "local:2" and planned["devices"] == 2
    assert planned["feasible"] and planned["iteration_time_s"] > 0


@pytest.mark.parametrize("spawned", [False, True])
def test_comm_is_measured_between_two_processes(pool, spawned):
    from tag.profile.comm import measure_comm

    sizes = (1024, 4096, 65536, 262144)
    curves = measure_comm(sizes=sizes, warmup=0, repeats=1, timeout_s=60, pool=None if spawned else pool)
    for kind in ("p2p", "allreduce"):
        curve = curves[kind]
        assert curve.backend == "gloo" and curve.processes == 2 and curve.bytes == tuple(map(float, sizes))
        assert all(t > 0 for t in curve.seconds) and curve.bandwidth > 0 and curve.latency_s >= 0
    assert all(t > 0 for t in curves["p2p"].seconds)


# --------------------------------------------------------------------------------------------- timeline
def test_timed_program_times_every_instruction_of_tag_runs_interpreter(pool):
    from tag.cluster.presets import local_cluster
    from tag.compiler.compile import compile_strategy
    from tag.execute import lower_plan, zoo_program
    from tag.execute.launch import launch
    from tag.execute.lower import Compute, Recv, Reduce, Send
    from tag.grouping import group_ops
    from tag.profile.timeline import (COMPUTE, INSTRUCTION_KINDS, LOCAL_REDUCE, RECV, REDUCE, SEND, TimedProgram,
                                      timelines)
    from tag.strategy import Strategy

    program = zoo_program("candle-uno", tiny=True, batch_size=4)
    cluster = local_cluster(2)
    gg = group_ops(program.graph, num_groups=4, gpus=cluster)
    placement = np.zeros((4, 2), dtype=int)
    placement[:2, 0], placement[2:, 1] = 1, 1  # two groups on each rank: transfers both ways
    compiled = compile_strategy(gg, Strategy.from_cluster(cluster, placement, ["duplicate"] * 4), cluster,
                                granularity="op")
    programs = lower_plan(program, compiled)
    plain = launch(programs, program.tensors, steps=2, pool=pool)
    timed = launch([TimedProgram(p) for p in programs], program.tensors, steps=2, pool=pool)
    lines = timelines(timed)
    seen = set()
    for rank, rank_program in enumerate(programs):
        expected = [(COMPUTE, s.op) if isinstance(s, Compute) else (SEND, s.task) if isinstance(s, Send)
                    else (RECV, s.task) if isinstance(s, Recv)
                    else (REDUCE if len(s.members) > 1 else LOCAL_REDUCE, s.task)
                    for s in rank_program.steps if isinstance(s, (Compute, Send, Recv, Reduce))]
        seen |= {kind for kind, _ in expected}
        for step, line in enumerate(lines[rank]):
            assert [(int(k), int(i)) for k, i in line[:, :2]] == expected  # every instruction, in program order
            start, end = line[:, 2], line[:, 3]
            assert (end >= start).all() and (start[1:] >= end[:-1]).all() and start[0] >= 0
            assert end[-1] <= timed[rank]["times"][step]  # inside the step it timed
        # the timeline is the only thing added: the same results as the untimed run, value for value
        for got, want in zip(timed[rank]["results"], plain[rank]["results"]):
            assert got.keys() == want.keys()
            assert all(torch.equal(got[name], want[name]) for name in want)
    assert {COMPUTE, SEND, RECV} <= seen and len(INSTRUCTION_KINDS) == 5
