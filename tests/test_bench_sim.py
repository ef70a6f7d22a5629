"""scripts/bench_sim.py: the mcts workload records what a real search hands the evaluator, in its order."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import tag.search.placement
from tag.cluster import resolve_cluster
from tag.compiler import StrategyEvaluator
from tag.graph.resolve import resolve_model
from tag.grouping import group_ops

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_sim.py"
spec = importlib.util.spec_from_file_location("bench_sim", SCRIPT)
bench_sim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_sim)

CLUSTER = "tag-testbed"


@pytest.fixture(scope="module")
def group_graph():
    return group_ops(resolve_model("vgg19", tiny=True), num_groups=4, gpus=resolve_cluster(CLUSTER))


def test_mcts_trace_is_every_strategy_the_search_sends_the_evaluator_in_order(group_graph, monkeypatch):
    sent = []
    evaluate = tag.search.placement.evaluate_strategy

    def spying(graph, strategy, cluster, **kwargs):
        sent.append(strategy)
        return evaluate(graph, strategy, cluster, **kwargs)

    monkeypatch.setattr(tag.search.placement, "evaluate_strategy", spying)
    trace = bench_sim.mcts_trace(group_graph, CLUSTER, 12, seed=3)
    assert len(trace) == 12 and len(set(trace)) == 12
    assert sent[1:] == trace  # sent[0]: the DP-NCCL reference, simulated before the search
    assert bench_sim.mcts_trace(group_graph, CLUSTER, 12, seed=3) == trace


def test_second_pass_builds_no_fragment(group_graph):
    trace = bench_sim.mcts_trace(group_graph, CLUSTER, 8)
    evaluator = StrategyEvaluator(group_graph, resolve_cluster(CLUSTER))
    assert evaluator.cached_fragments() == (0, 0)
    for strategy in trace:
        evaluator(strategy)
    built = evaluator.cached_fragments()
    assert built[0] >= group_graph.num_groups
    for strategy in trace:
        evaluator(strategy)
    assert evaluator.cached_fragments() == built


def test_script_reports_the_mcts_workload(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_sim.py", "--model", "vgg19", "--groups", "4", "--strategies", "3",
                                      "--compare", "1", "--granularity", "group", "--workload", "mcts",
                                      "--mcts-simulations", "4", "--mcts-priors", "uniform"])
    bench_sim.main()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["mcts_simulations"] == 4 and report["mcts_priors"] == "uniform"
    (row,) = report["results"]
    assert row["workload"] == "mcts" and row["evaluations"] == 4
    assert row["evals_per_cpu_s"] > 0 and row["new_group_fragments"] > 0


def test_script_skips_the_plain_path_with_compare_0_and_rejects_bad_counts(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_sim.py", "--model", "vgg19", "--groups", "4", "--strategies", "3",
                                      "--compare", "0", "--granularity", "group", "--workload", "search"])
    bench_sim.main()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (row,) = report["results"]
    assert row["compile_path_evals_per_s"] is None and row["evals_per_cpu_s"] > 0
    for bad in (["--compare", "-1"], ["--strategies", "0"]):
        monkeypatch.setattr(sys, "argv", ["bench_sim.py", *bad])
        with pytest.raises(SystemExit):
            bench_sim.main()
        assert bad[0] in capsys.readouterr().err
