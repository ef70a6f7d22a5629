"""`tag compare`: every planner on one model and cluster, through one simulator."""

import json

import pytest

from tag.cli import main


@pytest.fixture(scope="module")
def compared():
    from tag.cluster import resolve_cluster
    from tag.compare import CompareConfig, compare_planners
    from tag.graph.resolve import resolve_model

    config = CompareConfig(budget=12, num_groups=8, mapping_time_limit=10, mcts_mapper_iterations=100)
    return compare_planners(resolve_model("vgg19", tiny=True), resolve_cluster("tag-testbed"), config=config)


def test_every_planner_has_a_row_with_consistent_figures(compared):
    names = [row["planner"] for row in compared]
    assert names == ["DP-NCCL", "DP-NCCL-P", "Horovod-like", "MCMC", "pure MCTS", "tag (GNN+MCTS)",
                     "Parmesan + exact map",
                     "Parmesan + CS map", "Parmesan + p2p map", "Parmesan + pure-MCTS map",
                     "Parmesan + learned (GNN+MCTS) map", "RaNNC", "GraphPipe"]
    dp = compared[0]
    assert dp["speedup_over_dp_nccl"] == 1.0
    for row in compared:
        assert {"planner", "iteration_time_s", "search_time_s", "feasible"} <= set(row)
        if row["feasible"]:
            assert row["speedup_over_dp_nccl"] == pytest.approx(dp["iteration_time_s"] / row["iteration_time_s"])


def test_mapper_rows_are_measured_against_the_exact_bound(compared):
    rows = {row["planner"]: row for row in compared}
    exact = rows["Parmesan + exact map"]
    assert exact["proven_optimal"] and exact["gap"] == 0.0
    assert exact["lower_bound_s"] == pytest.approx(exact["max_stage_time_s"])
    for name in ("Parmesan + CS map", "Parmesan + p2p map", "Parmesan + pure-MCTS map",
                 "Parmesan + learned (GNN+MCTS) map"):
        row = rows[name]
        assert row["lower_bound_s"] == exact["lower_bound_s"]
        # the exact mapping is optimal, so no mapper's objective is below it
        assert row["max_stage_time_s"] >= exact["max_stage_time_s"] * (1 - 1e-12)
        assert row["gap"] == pytest.approx(1 - exact["lower_bound_s"] / row["max_stage_time_s"], abs=1e-12)
        assert row["stages"] == exact["stages"] and row["micro_batches"] == exact["micro_batches"]


def test_learned_mapper_row_without_a_checkpoint_says_why(tmp_path):
    from tag.cluster import resolve_cluster
    from tag.compare import CompareConfig, _pipeline_rows

    config = CompareConfig(mapping_time_limit=5, mcts_mapper_iterations=20, graphpipe=False,
                           mapper_policy=str(tmp_path / "missing.pt"))
    from tag.graph.resolve import resolve_model

    rows = {row["planner"]: row for row in _pipeline_rows(resolve_model("vgg19", tiny=True),
                                                          resolve_cluster("tag-testbed"), config, lambda m: None)}
    row = rows["Parmesan + learned (GNN+MCTS) map"]
    assert not row["feasible"] and "no mapping policy checkpoint" in row["note"]


def test_compare_json(capsys):
    code = main(["compare", "vgg19", "--tiny", "--cluster", "tag-testbed", "--budget", "5", "--num-groups", "6",
                 "--time-limit", "5", "--no-graphpipe", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    payload = json.loads(out)
    assert payload["planners"][0]["planner"] == "DP-NCCL"
    assert all(row["planner"] != "GraphPipe" for row in payload["planners"])
