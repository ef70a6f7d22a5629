import logging
import re
from pathlib import Path

import numpy as np
import pytest

from tag.errors import ProfileError
from tag.graph import ROLE_BACKWARD, ROLE_FORWARD, ROLE_INPUT, ROLE_OPTIMIZER, SPLIT_CLASSES, graph_from_json, graph_to_json
from tag.graph.pipedream import load_pipedream, parse_pipedream

PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"
MODELS = ("vgg16", "resnet50", "gnmt")
BATCH = {"vgg16": 128, "resnet50": 128, "gnmt": 32}

needs_profiles = pytest.mark.skipif(not PROFILES.is_dir(), reason="PipeDream profiles not found")


@pytest.fixture(scope="module", params=MODELS)
def profile(request):
    if not PROFILES.is_dir():
        pytest.skip("PipeDream profiles not found")
    path = PROFILES / f"{request.param}.graph.txt"
    layers, edges = parse_pipedream(path)
    return request.param, load_pipedream(path), layers, edges


def _op(graph, name):
    return graph.index(name)


def test_loads_with_op_counts_by_role(profile):
    name, graph, layers, _ = profile
    inputs = [layer for layer in layers if layer.kind.startswith("Input") or layer.kind == "hidden"]
    counts = graph.count_by_role()
    assert counts["input"] == len(inputs)
    assert counts["input"] + counts["forward"] == len(layers)
    assert counts["backward"] == len(layers) - len(inputs)
    assert counts["optimizer"] == sum(layer.param_bytes > 0 for layer in layers)
    assert graph.is_dag()
    assert graph.meta["model"] == name and graph.meta["source"] == "pipedream"
    assert graph.batch_size == BATCH[name]


def test_measured_times_are_seconds(profile):
    _, graph, layers, _ = profile
    for layer in layers:
        if f"{layer.node}.forward" not in graph.names:
            assert np.isnan(graph.measured_time[_op(graph, f"{layer.node}.input")])
            continue
        for step, measured in (("forward", layer.forward_time), ("backward", layer.backward_time)):
            recorded = graph.measured_time[_op(graph, f"{layer.node}.{step}")]
            if measured == 0.0:  # untimed functional layers keep their roofline estimate
                assert np.isnan(recorded) or recorded == 0.0
            else:
                assert recorded == pytest.approx(measured)
    assert np.isnan(graph.measured_time[graph.role == ROLE_OPTIMIZER]).all()


@needs_profiles
def test_measured_time_units_on_a_known_layer():
    graph = load_pipedream(PROFILES / "vgg16.graph.txt")
    op = graph.index("node4.forward")  # Conv2d(64, 64): forward_compute_time=46.201 ms
    assert graph.measured_time[op] == pytest.approx(46.201e-3)
    assert graph.measured_time[graph.index("node4.backward")] == pytest.approx(113.330e-3)
    assert graph.meta["input_load_time"] == {"node1": pytest.approx(17.972e-3)}


def test_parameters_sum_to_the_profile(profile):
    _, graph, layers, _ = profile
    assert graph.total_param_bytes() == pytest.approx(sum(layer.param_bytes for layer in layers))
    assert (graph.param_bytes[graph.role != ROLE_FORWARD] == 0).all()  # the forward op owns the weights


def test_backward_edges_mirror_forward_edges(profile):
    _, graph, layers, edges = profile
    by_node = {layer.node: layer for layer in layers}
    pairs = {(graph.names[a], graph.names[b]): nbytes
             for a, b, nbytes in zip(graph.edge_src, graph.edge_dst, graph.edge_bytes)}
    for src, dst, _ in edges:
        assert pairs[(f"{src}.forward" if f"{src}.forward" in graph.names else f"{src}.input", f"{dst}.forward")] \
            == by_node[src].activation_bytes
        if f"{src}.backward" in graph.names:
            assert pairs[(f"{dst}.backward", f"{src}.backward")] == by_node[src].activation_bytes
    for layer in layers:
        if f"{layer.node}.backward" in graph.names:
            assert (f"{layer.node}.forward", f"{layer.node}.backward") in pairs
        if f"{layer.node}.optimizer" in graph.names:
            assert pairs[(f"{layer.node}.backward", f"{layer.node}.optimizer")] == layer.param_bytes


def test_split_classes_follow_the_rule(profile):
    _, graph, _, _ = profile
    split = np.array(SPLIT_CLASSES)[graph.split]
    assert (split[graph.role == ROLE_FORWARD] == "concat").all()
    assert (split[graph.role == ROLE_INPUT] == "concat").all()
    assert (split[graph.role == ROLE_OPTIMIZER] == "none").all()
    backward = graph.role == ROLE_BACKWARD
    has_params = np.zeros(graph.num_ops, dtype=bool)
    has_params[graph.edge_src[graph.role[graph.edge_dst] == ROLE_OPTIMIZER]] = True
    assert (split[backward & has_params] == "sum").all()
    assert (split[backward & ~has_params] == "concat").all()
    assert not graph.batch_scaled[graph.role == ROLE_OPTIMIZER].any()


def test_json_round_trip(profile):
    _, graph, _, _ = profile
    again = graph_from_json(graph_to_json(graph))
    assert again.names == graph.names and again.meta == graph.meta
    np.testing.assert_array_equal(again.flops, graph.flops)


@needs_profiles
def test_flop_estimates_by_hand():
    vgg = load_pipedream(PROFILES / "vgg16.graph.txt")
    out = 1644167168 / 4  # Conv2d(64, 64, 3x3): elements of its output
    assert vgg.flops[vgg.index("node4.forward")] == pytest.approx(2 * out * 64 * 9 + out)
    assert vgg.flops[vgg.index("node4.backward")] == pytest.approx(2 * (2 * out * 64 * 9 + out))
    linear_out = 512000 / 4  # Linear(4096, 1000)
    assert vgg.flops[vgg.index("node41.forward")] == pytest.approx(linear_out * (2 * 4096 + 1))
    assert vgg.flops[vgg.index("node34.forward")] == 0  # View
    assert vgg.flops[vgg.index("node41.optimizer")] == pytest.approx(10 * 16388000 / 4)

    gnmt = load_pipedream(PROFILES / "gnmt.graph.txt")
    tokens = 6291456 / 4 / 1024  # LSTM(1024, 1024): 1536 tokens
    per_token = 2 * 4 * 1024 * (1024 + 1024) + 10 * 4 * 1024
    assert gnmt.flops[gnmt.index("node11.forward")] == pytest.approx(tokens * per_token)
    # EmuBidirLSTM: only `bidir` (2 directions) runs; layer1/layer2 share its weights and are skipped.
    glue = 4 * 12582912 / 4
    assert gnmt.flops[gnmt.index("node5.forward")] == pytest.approx(tokens * 2 * per_token + glue)


@needs_profiles
@pytest.mark.parametrize("batch_size", [7, 256])
def test_batch_size_argument_overrides(batch_size):
    graph = load_pipedream(PROFILES / "vgg16.graph.txt", batch_size=batch_size)
    assert graph.batch_size == batch_size
    assert graph.meta["batch_size_source"] == "given"


# ------------------------------------------------------------------------------------------------ bad input

GOOD_NODES = (
    "node1 -- Input -- forward_compute_time=1.0, backward_compute_time=0.0, activation_size=602112.0, parameter_size=0.0\n"
    "node2 -- Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1)) -- forward_compute_time=2.0, "
    "backward_compute_time=3.0, activation_size=1605632.0, parameter_size=896.0\n"
    "node3 -- ReLU(inplace) -- forward_compute_time=0.5, backward_compute_time=0.5, activation_size=1605632.0, parameter_size=0.0\n"
)


def _write(tmp_path, text, name="toy.graph.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_tiny_profile_loads(tmp_path):
    graph = load_pipedream(_write(tmp_path, GOOD_NODES + "\tnode1 -- node2\n\tnode2 -- node3\n"))
    assert graph.count_by_role() == {"input": 1, "forward": 2, "backward": 2, "optimizer": 1}
    assert graph.batch_size == 1  # one 3x224x224 image
    assert graph.meta["model"] == "toy"


@pytest.mark.parametrize(
    "text, line, message",
    [
        (GOOD_NODES + "node4 -- ReLU -- forward_compute_time=1.0\n", 4, "missing backward_compute_time"),
        (GOOD_NODES + "node4 ReLU forward_compute_time=1.0\n", 4, "cannot parse node line"),
        (GOOD_NODES + "\tnode1 -- node2\n\tnode2 -- node9\n", 5, "node 'node9', which no node line defines"),
        (GOOD_NODES + "\tnode1 -- node2\n\tnode2 -- node3\n\tnode3 -- node2\n", 6, "cycle: node2 -> node3 -> node2"),
        (GOOD_NODES + "\tnode2 -- node2\n", 4, "cycle: node2 -> node2"),
        (GOOD_NODES.replace("forward_compute_time=2.0", "forward_compute_time=two"), 2,
         "forward_compute_time: cannot parse 'two' as a number"),
        (GOOD_NODES.replace("parameter_size=896.0", "parameter_size=-1"), 2, "parameter_size must be a finite non-negative"),
        (GOOD_NODES + GOOD_NODES.splitlines()[2] + "\n", 4, "defined twice"),
        (GOOD_NODES + "\tnode1 -- node2 -- node3\n", 4, "cannot parse edge line"),
        ("", 1, "empty PipeDream profile"),
        ("\n\n", 2, "empty PipeDream profile"),
    ],
)
def test_malformed_profiles_name_file_and_line(tmp_path, text, line, message):
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_pipedream(path)
    text = str(info.value)
    assert text.startswith(f"{path}:{line}: ")
    assert message in text
    assert "\n" not in text


def test_missing_file_is_a_profile_error(tmp_path):
    with pytest.raises(ProfileError, match="cannot read"):
        load_pipedream(tmp_path / "nope.graph.txt")


def test_unknown_layer_is_costed_by_bytes_with_a_warning(tmp_path, caplog):
    text = GOOD_NODES.replace("ReLU(inplace)", "Frobnicate(3)") + "\tnode1 -- node2\n\tnode2 -- node3\n"
    with caplog.at_level(logging.WARNING, logger="tag.graph.pipedream"):
        graph = load_pipedream(_write(tmp_path, text))
    assert "Frobnicate" in caplog.text
    op = graph.index("node3.forward")
    assert graph.flops[op] == 0
    assert graph.bytes_accessed[op] == pytest.approx(2 * 1605632.0)


def test_an_unindented_edge_is_a_malformed_node_line(tmp_path):
    path = _write(tmp_path, GOOD_NODES + "node1 -- node2\n")
    with pytest.raises(ProfileError, match=r":4: cannot parse node line 'node1 -- node2'"):
        load_pipedream(path)


@needs_profiles
def test_weight_gradients_keep_their_size_at_another_batch():
    graph = load_pipedream(PROFILES / "vgg16.graph.txt")
    half = graph.with_batch_size(graph.batch_size // 2)
    to_optimizer = graph.role[graph.edge_dst] == ROLE_OPTIMIZER
    np.testing.assert_array_equal(half.edge_bytes[to_optimizer], graph.edge_bytes[to_optimizer])
    np.testing.assert_allclose(half.edge_bytes[~to_optimizer], graph.edge_bytes[~to_optimizer] / 2)


@needs_profiles
def test_untimed_layers_are_not_free():
    graph = load_pipedream(PROFILES / "resnet50.graph.txt")
    adds = [i for i, kind in enumerate(graph.kinds) if kind.startswith("Add") and graph.role[i] != ROLE_INPUT]
    assert adds and np.isnan(graph.measured_time[adds]).all()


# ------------------------------------------------------------------ partitioned files (PipeDream's optimizer output)

TINY_PARTITIONED = Path(__file__).resolve().parent / "data" / "pipedream" / "tiny_partitioned.graph.txt"
V100X3 = """name: v100x3
network: {bandwidth: 100Gbps, latency: 5us}
machines:
  - {gpu: v100-16gb, count: 3, bandwidth: 130GB/s, latency: 2us}
"""


def _restaged(text: str, stages: dict[str, str | None]) -> str:
    """``text`` with the stage_id of the named nodes replaced (None: removed)."""
    lines = []
    for line in text.splitlines():
        node = line.split(" -- ")[0]
        if not line[:1].isspace() and node in stages:
            head, _, tail = line.rpartition(" -- ")
            line = head if tail.startswith("stage_id=") else line
            line += "" if stages[node] is None else f" -- stage_id={stages[node]}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_partitioned_file_gives_the_stage_of_every_layer():
    from tag.graph.pipedream import pipedream_stages

    layers, _ = parse_pipedream(TINY_PARTITIONED)
    assert [layer.stage for layer in layers] == [0, 0, 0, 1, 1, 2]
    assert pipedream_stages(TINY_PARTITIONED) == {"node1": 0, "node2": 0, "node3": 0, "node4": 1, "node5": 1,
                                                  "node6": 2}


def test_partitioned_file_loads_as_the_same_graph_as_its_plain_profile(tmp_path):
    from tag.graph.pipedream import pipedream_stages

    text = TINY_PARTITIONED.read_text()
    plain = _write(tmp_path, _restaged(text, {f"node{i}": None for i in range(1, 7)}), "tiny_partitioned.graph.txt")
    assert pipedream_stages(plain) is None
    assert graph_to_json(load_pipedream(plain)) == graph_to_json(load_pipedream(TINY_PARTITIONED))


@pytest.mark.parametrize("stages, line, message", [
    ({"node4": None}, 4, "node node4 has no stage_id, while 5 of 6 node lines have one"),
    ({"node4": "2", "node5": "2", "node6": "3"}, None, "stage 1 holds no layer"),
    ({"node3": "1", "node4": "0"}, 9, "edge node3 -- node4 goes from stage 1 back to stage 0"),
    ({"node2": "x"}, 2, "stage_id: cannot parse 'x'"),
    ({"node2": "\u00b2"}, 2, "stage_id: cannot parse '\u00b2'"),  # '²'.isdigit() is True, int('²') fails
    ({"node2": "\u0663"}, 2, "stage_id: cannot parse '\u0663'"),  # Arabic-Indic 3: int() would read 3
    ({"node2": ""}, 2, "stage_id: cannot parse ''"),
    ({"node5": "6"}, 5, "node node5: stage_id 6 is out of range (6 node lines make at most 6 stages"),
    ({"node6": "99999999999999999999999"}, 6, "stage_id 99999999999999999999999 is out of range"),
    ({"node6": "9" * 5000}, 6, "is out of range"),  # past int()'s 4300-digit limit
])
def test_bad_stage_ids_are_one_profile_error(tmp_path, stages, line, message):
    from tag.graph.pipedream import pipedream_stages

    path = _write(tmp_path, _restaged(TINY_PARTITIONED.read_text(), stages))
    with pytest.raises(ProfileError, match=re.escape(message)) as error:
        pipedream_stages(path)
    assert str(error.value).startswith(f"{path}:{line}:" if line else f"{path}:")
    assert len(str(error.value)) < 400


def test_a_huge_stage_id_is_refused_without_a_huge_set(tmp_path):
    """An id just under the parse-time cap used to build set(range(id + 1)) to find the missing stage;
    now it is refused against the line count, and a real gap is found without any range set."""
    import tracemalloc

    from tag.graph.pipedream import pipedream_stages

    def peak(stages: dict[str, str]) -> int:
        path = _write(tmp_path, _restaged(TINY_PARTITIONED.read_text(), stages))
        tracemalloc.start()
        try:
            with pytest.raises(ProfileError, match=r"is out of range|holds no layer"):
                pipedream_stages(path)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    # the baseline holds read_input's read buffer, which a valid file allocates too
    baseline = peak({"node4": "2", "node5": "2", "node6": "3"})  # stage 1 missing
    assert peak({"node6": "9" * 18}) < baseline + 1_000_000
    assert peak({"node6": "99999999999999999999999"}) < baseline + 1_000_000


@pytest.mark.parametrize("stage_id, message", [
    ("99999999999999999999999", "stage_id 99999999999999999999999 is out of range"),
    ("\u00b2", "stage_id: cannot parse '\u00b2'"),
    ("\u0663", "stage_id: cannot parse '\u0663'"),
    ("7", "node node6: stage_id 7 is out of range"),
])
def test_simulate_refuses_a_bad_stage_id_in_one_line(tmp_path, capsys, stage_id, message):
    from conftest import run

    lab = str(Path(__file__).resolve().parent / "data" / "clusters" / "lab.yaml")
    path = _write(tmp_path, _restaged(TINY_PARTITIONED.read_text(), {"node6": stage_id}), "bad.graph.txt")
    code, _, err = run(capsys, "simulate", str(path), "--cluster", lab)
    assert code == 2 and err.strip().count("\n") == 0 and err.startswith("tag: error:"), err
    assert message in err and "Traceback" not in err


def test_simulate_scores_the_partition_by_hand(tmp_path, capsys):
    """M = 1, one replica per stage on three V100s (the profile's GPU): the stages run the measured
    times one after another, forward 1.5 + 2.25 + 1.5 ms then backward 2.5 + 4.25 + 3 ms = 15 ms,
    plus three 2-us hops each way, microseconds of transfer and the optimizer steps."""
    from conftest import run_json

    cluster = tmp_path / "v100x3.yaml"
    cluster.write_text(V100X3)
    out = run_json(capsys, "simulate", str(TINY_PARTITIONED), "--cluster", str(cluster), "--micro-batches", "1")
    assert out["kind"] == "pipeline" and out["stages"] == 3 and out["replicas"] == [1, 1, 1]
    assert out["forward_assignment"] == [0, 0, 1, 1, 2]  # node2..node6, the input has no forward op
    assert out["mapping"] == [[0], [1], [2]] and out["micro_batches"] == 1
    assert 15.0e-3 < out["iteration_time_s"] < 15.05e-3
    assert out["feasible"]
    theirs, ours = out["iteration_time_s"], out["tag_pipeline"]["iteration_time_s"]
    assert out["tag_pipeline"]["stages"] == 3 and out["speedup_of_tag"] == pytest.approx(theirs / ours)


def test_simulate_defaults_fill_the_devices_and_match_a_replayed_plan(capsys):
    """R = 11 // 3 = 3 replicas on lab.yaml's 11 devices, M = 4 (the power of two >= 3), stage-major;
    the same plan replayed through tag.exact gives the same iteration."""
    from conftest import run_json

    from tag.cluster import resolve_cluster
    from tag.exact import replay_pipeline

    lab = str(Path(__file__).resolve().parent / "data" / "clusters" / "lab.yaml")
    out = run_json(capsys, "simulate", str(TINY_PARTITIONED), "--cluster", lab)
    assert out["replicas"] == [3, 3, 3] and out["micro_batches"] == 4
    assert out["mapping"] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    replayed = replay_pipeline(load_pipedream(TINY_PARTITIONED), resolve_cluster(lab), forward_assignment=[0, 0, 1, 1, 2],
                               replicas=[3, 3, 3], micro_batches=4, mapping=out["mapping"])
    assert out["iteration_time_s"] == pytest.approx(replayed.iteration_time, rel=1e-12)


@pytest.mark.parametrize("extra, message", [
    (("--replicas", "4"), "3 stages x 4 replicas need 12 devices; lab has 11"),
])
def test_simulate_partition_errors_are_one_line(capsys, extra, message):
    from conftest import run

    lab = str(Path(__file__).resolve().parent / "data" / "clusters" / "lab.yaml")
    code, _, err = run(capsys, "simulate", str(TINY_PARTITIONED), "--cluster", lab, *extra)
    assert code == 2 and err.strip().count("\n") == 0 and err.startswith("tag: error:") and message in err


def test_simulate_refuses_bad_stages_and_plain_profiles_in_one_line(tmp_path, capsys):
    from conftest import run

    lab = str(Path(__file__).resolve().parent / "data" / "clusters" / "lab.yaml")
    text = TINY_PARTITIONED.read_text()
    back = _write(tmp_path, _restaged(text, {"node3": "1", "node4": "0"}), "back.graph.txt")
    only_input = _write(tmp_path, _restaged(text, {f"node{i}": "1" for i in range(2, 7)}), "input.graph.txt")
    plain = _write(tmp_path, _restaged(text, {f"node{i}": None for i in range(1, 7)}), "plain.graph.txt")
    for path, message in ((back, "goes from stage 1 back to stage 0"), (only_input, "stage 0 holds only input layers"),
                          (plain, "give exactly one of --strategy")):
        code, _, err = run(capsys, "simulate", str(path), "--cluster", lab)
        assert code == 2 and err.strip().count("\n") == 0 and message in err, err
    code, _, err = run(capsys, "simulate", "resnet50", "--cluster", lab, "--baseline", "dp-nccl", "--replicas", "2")
    assert code == 2 and "apply to a PipeDream partitioned graph.txt only" in err


def _partition_by_time(path: Path, num_stages: int) -> str:
    """``path``'s profile with stage ids written on: contiguous runs of a topological order of even
    measured forward + backward time, as PipeDream's optimizer would cut a chain."""
    layers, edges = parse_pipedream(path)
    index = {layer.node: i for i, layer in enumerate(layers)}
    indegree = [0] * len(layers)
    succ: list[list[int]] = [[] for _ in layers]
    for src, dst, _ in edges:
        succ[index[src]].append(index[dst])
        indegree[index[dst]] += 1
    order, ready = [], [i for i, d in enumerate(indegree) if d == 0]
    while ready:
        i = ready.pop()
        order.append(i)
        for j in succ[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    times = np.array([layers[i].forward_time + layers[i].backward_time for i in order])
    cut = np.minimum((np.cumsum(times) - times / 2) / times.sum() * num_stages, num_stages - 1).astype(int)
    stage = {layers[i].node: str(int(s)) for i, s in zip(order, cut)}
    return _restaged(path.read_text(), stage)


@needs_profiles
def test_a_partitioned_resnet50_loads_and_simulates(tmp_path, capsys):
    from conftest import run_json

    from tag.graph.pipedream import pipedream_stages

    path = _write(tmp_path, _partition_by_time(PROFILES / "resnet50.graph.txt", 4), "resnet50.graph.txt")
    stages = pipedream_stages(path)
    assert sorted(set(stages.values())) == [0, 1, 2, 3]
    graph = load_pipedream(path)
    assert graph_to_json(graph) == graph_to_json(load_pipedream(PROFILES / "resnet50.graph.txt"))
    out = run_json(capsys, "simulate", str(path), "--cluster", "two-level")
    assert out["stages"] == 4 and out["replicas"] == [4, 4, 4, 4] and out["micro_batches"] == 4
    forward = [graph.names[i].removesuffix(".forward") for i in graph.topological_order()
               if graph.names[i].endswith(".forward")]
    assert sorted(out["forward_assignment"]) == sorted(stages[node] for node in forward)
    assert out["feasible"] and out["iteration_time_s"] > 0 and out["tag_pipeline"]["iteration_time_s"] > 0
