"""`tag pipeline` and pipeline plan files: the JSON contract, replay by `tag simulate`, bad input."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import run, run_json
from tag.cli import main
from tag.cluster import resolve_cluster
from tag.graph.pipedream import load_pipedream
from tag.strategy import (
    PlanError,
    PlanMismatchError,
    load_pipeline_plan,
    load_plan,
    make_pipeline_plan,
    pipeline_plan_from_json,
    pipeline_plan_to_json,
    plan_kind,
    save_pipeline_plan,
)

PIPEDREAM = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"
GNMT = str(PIPEDREAM / "gnmt.graph.txt")
VGG = str(PIPEDREAM / "vgg16.graph.txt")
pytestmark = pytest.mark.skipif(not PIPEDREAM.is_dir(), reason="PipeDream profiles not found")


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One `tag pipeline --out` run shared by the tests that read its plan file."""
    folder = tmp_path_factory.mktemp("pipeline")
    plan = folder / "plan.json"
    code = main(["pipeline", GNMT, "--cluster", "two-level", "--stages", "4", "--replicas", "4", "--time-limit", "5",
                 "--out", str(plan), "--json"])
    assert code == 0
    return plan


def test_pipeline_json_contract(capsys):
    payload = run_json(capsys, "pipeline", GNMT, "--cluster", "two-level", "--stages", "4", "--replicas", "4",
                       "--time-limit", "5")
    for key in ("stages", "replicas", "mapping", "max_stage_time_s", "lower_bound_s", "proven_optimal",
                "solve_time_s", "iteration_time_s"):
        assert key in payload
    assert payload["stages"] == 4 and payload["replicas"] == 4
    devices = [d for row in payload["mapping"] for d in row]
    assert [len(row) for row in payload["mapping"]] == [4] * 4 and sorted(devices) == list(range(16))
    # seconds per iteration, all three: bound ≤ objective < simulated iteration (which adds fill and drain)
    assert 0 < payload["lower_bound_s"] <= payload["max_stage_time_s"] < payload["iteration_time_s"]
    assert payload["proven_optimal"] == (payload["lower_bound_s"] == payload["max_stage_time_s"])
    assert max(row["time_per_iteration_s"] for row in payload["stage_rows"]) == payload["max_stage_time_s"]


@pytest.mark.parametrize("mapper", ["cs", "p2p", "random"])
def test_pipeline_heuristic_mappers_are_never_better_than_exact(capsys, mapper):
    argv = ("pipeline", GNMT, "--cluster", "two-level", "--stages", "2", "--replicas", "4", "--micro-batches", "4")
    exact = run_json(capsys, *argv, "--time-limit", "5")
    heuristic = run_json(capsys, *argv, "--mapper", mapper)
    assert exact["proven_optimal"]
    assert heuristic["max_stage_time_s"] >= exact["max_stage_time_s"] * (1 - 1e-12)
    assert heuristic["lower_bound_s"] <= exact["max_stage_time_s"] * (1 + 1e-12)


def test_pipeline_human_output(capsys):
    code, out, err = run(capsys, "pipeline", GNMT, "--cluster", "two-level", "--stages", "2", "--replicas", "2",
                         "--micro-batches", "2", "--mapper", "cs")
    assert code == 0, err
    assert "Pipeline stages" in out and "iteration time" in out and "lower bound" in out


def test_simulate_replays_a_pipeline_plan(capsys, planned):
    assert plan_kind(planned) == "pipeline"
    doc = json.loads(planned.read_text())
    assert doc["kind"] == "pipeline" and doc["schema_version"] == 1 and len(doc["model"]["fingerprint"]) == 64
    replay = run_json(capsys, "simulate", GNMT, "--cluster", "two-level", "--strategy", str(planned))
    assert replay["kind"] == "pipeline"
    assert replay["iteration_time_s"] == pytest.approx(doc["summary"]["iteration_time_s"], rel=1e-12)
    assert replay["mapping"] == doc["pipeline"]["mapping"]


def test_a_chain_plan_file_replays_on_its_chain(capsys, tmp_path):
    """`--links chain`: the plan file records the stage edges and `tag simulate` rebuilds the same chain."""
    out = tmp_path / "chain.json"
    argv = ("pipeline", "candle-uno", "--tiny", "--cluster", "two-level", "--stages", "4", "--replicas", "1",
            "--micro-batches", "4", "--mapper", "cs")
    chain = run_json(capsys, *argv, "--links", "chain", "--out", str(out))
    data = run_json(capsys, *argv)
    assert chain["links"] == "chain" and data["links"] == "data"
    assert len(chain["edge_bytes"]) == 3  # one edge per cut of the chain
    doc = json.loads(out.read_text())
    assert doc["pipeline"]["links"] == "chain"
    replay = run_json(capsys, "simulate", "candle-uno", "--tiny", "--cluster", "two-level", "--strategy", str(out))
    assert replay["iteration_time_s"] == pytest.approx(chain["iteration_time_s"], rel=1e-12)
    doc["pipeline"]["links"] = "ring"
    with pytest.raises(PlanError, match="pipeline.links must be one of data, chain"):
        pipeline_plan_from_json(doc)
    del doc["pipeline"]["links"]  # files written before the field read as direct links
    assert pipeline_plan_from_json(doc).links == "data"


def test_plan_for_another_model_or_cluster_is_one_clear_error(capsys, planned):
    code, out, err = run(capsys, "simulate", VGG, "--cluster", "two-level", "--strategy", str(planned))
    assert code == 2 and "made for model 'gnmt'" in err and "Traceback" not in err
    code, out, err = run(capsys, "simulate", GNMT, "--cluster", "dgx1x4", "--strategy", str(planned))
    assert code == 2 and "made for cluster 'two-level'" in err
    with pytest.raises(PlanError, match="kind"):  # the strategy loader does not take a pipeline plan
        load_plan(planned)


def test_bad_pipeline_input_fails_before_writing(capsys, tmp_path):
    out = tmp_path / "plan.json"
    cases = [
        (["--stages", "8", "--replicas", "4"], "need 32 devices"),
        (["--stages", "0"], "must be in"),
        (["--mapper", "greedy"], "invalid choice"),
        (["--time-limit", "-1"], "positive number of seconds"),
        (["--out", str(tmp_path / "plan.txt")], "must end in .json"),
        (["--gantt", str(tmp_path / "g.jpg")], "must end in .png"),
    ]
    for extra, words in cases:
        try:
            code, _, err = run(capsys, "pipeline", GNMT, "--cluster", "two-level", "--out", str(out), *extra)
        except SystemExit as error:  # argparse rejects the value itself
            code, err = error.code, capsys.readouterr().err
        assert code == 2 and words in err, (extra, err)
        assert not out.exists() and list(tmp_path.iterdir()) == []
    code, _, err = run(capsys, "pipeline", "no-such-model", "--cluster", "two-level")
    assert code == 2 and "no-such-model" in err


def test_pipeline_plan_file_round_trip_and_validation(tmp_path):
    graph, cluster = load_pipedream(GNMT), resolve_cluster("two-level")
    plan = make_pipeline_plan(graph, cluster, partitioner="parmesan", schedule="1f1b", micro_batches=2,
                              replicas=[2, 2], reference_gpu="titan-v", forward_assignment=[0] * 10 + [1] * 5,
                              mapping=[[0, 1], [4, 5]], summary={"iteration_time_s": np.float64(0.5)})
    path = tmp_path / "p.json"
    save_pipeline_plan(plan, path)
    assert load_pipeline_plan(path, graph=graph, cluster=cluster) == plan
    doc = pipeline_plan_to_json(plan)
    bad = [
        (lambda d: d["pipeline"].update(mapping=[[0, 1], [1, 5]]), "two stage replicas on device 1"),
        (lambda d: d["pipeline"].update(mapping=[[0, 1], [4, 99]]), "device 99"),
        (lambda d: d["pipeline"].update(replicas=[2, 3]), "mapping[1] has 2 devices for 3"),
        (lambda d: d["pipeline"].update(forward_assignment=[0, 0, 2]), "outside 0..1"),
        (lambda d: d["pipeline"].update(forward_assignment=[1, 1]), "stage 0 no forward op"),
        (lambda d: d["pipeline"].pop("micro_batches"), "pipeline.micro_batches"),
        (lambda d: d.update(schema_version=7), "schema_version"),
        (lambda d: d["cluster"].update(num_devices="16"), "cluster.num_devices"),
    ]
    for mutate, words in bad:
        broken = json.loads(json.dumps(doc))
        mutate(broken)
        with pytest.raises(PlanError, match=words.replace("[", r"\[").replace("]", r"\]")):
            pipeline_plan_from_json(broken)
    with pytest.raises(PlanMismatchError, match="cluster"):
        load_pipeline_plan(path, cluster=resolve_cluster("dgx1x4"))


def test_pipeline_graphpipe_partitioner(capsys):
    payload = run_json(capsys, "pipeline", "candle-uno", "--tiny", "--cluster", "tag-testbed",
                       "--partitioner", "graphpipe")
    assert payload["kind"] == "graph_pipeline" and payload["feasible"] is True
    used = [d for row in payload["mapping"] for d in row]
    assert len(used) == len(set(used)) <= 16
    assert any(b != a + 1 for a, b in payload["stage_edges"])  # branches: the stages form a graph, not a chain
    code, _, err = run(capsys, "pipeline", "candle-uno", "--tiny", "--cluster", "tag-testbed",
                       "--partitioner", "graphpipe", "--stages", "4")
    assert code == 2 and "graphpipe chooses its own stages" in err
