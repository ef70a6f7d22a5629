"""`tag plan` end to end: grouping, search, SFB, compile, simulate; its JSON contract and plan files."""

import json

import pytest

from tag.cli import main
from tag.cluster import resolve_cluster
from tag.graph.resolve import resolve_model
from tag.planner import COMPARED_BASELINES, PlanConfig, plan_training

# small-gpu: the smallest memory a spec accepts (1 MiB) is still too little for a data-parallel replica of
# vgg19-tiny at 16 rows (batch 64 over 4 devices), while the V100s can hold the whole model.
TIGHT_SPEC = """
name: tight
network: {bandwidth: 10GB/s}
gpus:
  small-gpu: {memory: 1.2MB, memory_bandwidth: 900GB/s, fp32: 15TFLOPS, fp16: 30TFLOPS}
machines:
  - {gpu: v100-16gb, count: 2, bandwidth: 100GB/s}
  - {gpu: small-gpu, count: 2, bandwidth: 100GB/s}
"""


def run_json(capsys, *argv):
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def vgg_outcome():
    graph = resolve_model("vgg19", tiny=True)
    cluster = resolve_cluster("tag-testbed")
    return plan_training(graph, cluster, config=PlanConfig(num_groups=6, max_iterations=40))


def test_plan_is_never_slower_than_dp_nccl_and_figures_are_consistent(vgg_outcome):
    outcome = vgg_outcome
    dp = outcome.baselines[0]
    assert not dp.oom and outcome.result.feasible
    for baseline in outcome.baselines:  # DP-NCCL, DP-NCCL-P, Horovod: each is a start of the final pass
        assert outcome.iteration_time_s <= baseline.iteration_time_s * (1 + 1e-12)
    # The search's best, then SFB kept only where it helps: the final plan is never slower than the search's.
    assert outcome.iteration_time_s <= outcome.search.best_time * (1 + 1e-12)
    speedups = outcome.speedup_over()
    assert list(speedups) == list(COMPARED_BASELINES)
    for key, baseline in zip(COMPARED_BASELINES, outcome.baselines):
        assert speedups[key] == pytest.approx(baseline.iteration_time_s / outcome.iteration_time_s)
    rows = outcome.group_rows()
    assert sorted(row["group"] for row in rows) == list(range(outcome.group_graph.num_groups))
    assert sum(row["ops"] for row in rows) == outcome.graph.num_ops


def test_plan_json_contract_and_plan_file_round_trip(capsys, tmp_path):
    out, chart = tmp_path / "plan.json", tmp_path / "g.png"
    common = ("vgg19", "--tiny", "--cluster", "tag-testbed", "--num-groups", "6")
    payload = run_json(capsys, "plan", *common, "--family", "placement", "--budget", "30", "--out", str(out),
                       "--gantt", str(chart))
    for key in ("iteration_time_s", "feasible", "speedup_over", "search_time_s", "simulations"):
        assert key in payload
    assert set(payload["speedup_over"]) == {"dp-nccl", "dp-nccl-p", "horovod"}
    assert payload["feasible"] is True and payload["simulations"] >= 1
    assert chart.read_bytes()[:4] == b"\x89PNG"
    # The plan file simulates to the same time, SFB included.
    again = run_json(capsys, "simulate", *common, "--strategy", str(out))
    assert again["iteration_time_s"] == pytest.approx(payload["iteration_time_s"], rel=1e-12)


def test_plan_is_feasible_when_dp_nccl_does_not_fit(capsys, tmp_path):
    spec = tmp_path / "tight.yaml"
    spec.write_text(TIGHT_SPEC)
    common = ("vgg19", "--tiny", "--batch-size", "64", "--cluster", str(spec), "--num-groups", "6")
    baselines = run_json(capsys, "baselines", *common, "--only", "dp-nccl,dp-nccl-p,horovod")["baselines"]
    assert all(row["oom"] for row in baselines)
    payload = run_json(capsys, "plan", *common, "--family", "placement", "--budget", "60")
    assert payload["feasible"] is True and payload["oom_device"] is None
    assert payload["reference"] == "single-device compute"
    assert all(peak <= cap for peak, cap in zip(payload["peak_memory_bytes"], payload["memory_capacity_bytes"]))


@pytest.mark.parametrize("argv,needle", [
    (("--budget", "0"), "--budget"),
    (("--time", "-3"), "--time"),
    (("--budget", "5", "--time", "3"), "not allowed with"),
])
def test_plan_bad_flags_are_usage_errors(capsys, argv, needle):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "vgg19", "--tiny", "--cluster", "tag-testbed", *argv])
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (("--out", "plan.txt"), "--out 'plan.txt'"),
    (("--policy", "missing.pt"), "missing.pt"),
])
def test_plan_bad_input_gives_one_line(capsys, tmp_path, argv, needle):
    code = main(["plan", "vgg19", "--tiny", "--cluster", "tag-testbed", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("tag: error:") and needle in err


def test_priors_guide_only_the_trees_of_the_policy_fills():
    """The policy is trained with TAG's first-group fill; the other fills' trees search with uniform priors,
    exactly as pure MCTS does."""
    import numpy as np

    from tag.search import uniform_evaluator

    graph, cluster = resolve_model("vgg19", tiny=True), resolve_cluster("tag-testbed")
    seen = {"calls": 0}

    def counting(state):
        seen["calls"] += 1
        return np.full(len(state.options), 1.0 / len(state.options))

    def plan(policy_fills):
        seen["calls"] = 0
        config = PlanConfig(num_groups=6, max_iterations=24, sfb=False, policy_fills=policy_fills)
        return plan_training(graph, cluster, config=config, evaluator=counting), seen["calls"]

    unguided, calls = plan(())
    assert calls == 0
    pure = plan_training(graph, cluster, config=PlanConfig(num_groups=6, max_iterations=24, sfb=False),
                         evaluator=uniform_evaluator)
    assert unguided.search.best == pure.search.best and unguided.iteration_time_s == pure.iteration_time_s
    _, first_only = plan(("first",))
    _, both = plan(("first", "root"))
    assert 0 < first_only < both


def two_1080ti_at_1gbps():
    from tag.cluster.build import Machine, build_cluster

    return build_cluster("2x1080ti", [Machine("1080ti", 1), Machine("1080ti", 1)], network_bandwidth=1e9 / 8)


def test_a_deadline_bounds_the_planner_with_sfb_and_sfb_never_makes_it_slower():
    """The tiny transformer, data parallel over 1 Gbps: SFB's program puts SFB in several groups. With a
    deadline the call ends within a final pass of it (0.5 s here, a loaded machine), and the plan is no
    slower than its strategy finalised without SFB, nor than DP-NCCL."""
    import time

    from tag.planner import _final_plan
    from tag.sfb import apply_sfb
    from tag.strategy import Strategy

    graph, cluster = resolve_model("transformer", tiny=True), two_1080ti_at_1gbps()
    plan_training(graph, cluster, config=PlanConfig(num_groups=8, max_iterations=4))  # imports and caches warm
    for budget in (0.3, 1.5):
        start = time.perf_counter()
        outcome = plan_training(graph, cluster, config=PlanConfig(num_groups=8, deadline=start + budget))
        wall = time.perf_counter() - start
        assert wall <= budget + 0.5
        gg = outcome.group_graph
        assert len(apply_sfb(gg, Strategy.data_parallel(gg.num_groups, cluster), cluster).groups) > 1
        _, plain, _ = _final_plan(gg, outcome.strategy, cluster, PlanConfig())
        assert outcome.result.feasible and outcome.iteration_time_s <= plain.iteration_time
        assert outcome.iteration_time_s <= outcome.baselines[0].iteration_time_s
        assert set(outcome.skipped) <= {"dp-nccl", "dp-nccl-p"}
        assert outcome.summary()["deadline_skipped"] == list(outcome.skipped)


def test_a_passed_deadline_finalises_only_the_search_best_and_what_beats_it():
    """Past the deadline before the final pass: no SFB is tried, the search's best is finalised, and a
    baseline start only if its simulated time beats that plan."""
    import time

    graph, cluster = resolve_model("transformer", tiny=True), two_1080ti_at_1gbps()
    outcome = plan_training(graph, cluster, config=PlanConfig(num_groups=8, deadline=time.perf_counter()))
    assert outcome.sfb is None and outcome.result.feasible
    times = dict(zip(COMPARED_BASELINES, (b.iteration_time_s for b in outcome.baselines)))
    assert outcome.skipped and all(times[name] >= outcome.iteration_time_s for name in outcome.skipped)
    assert outcome.origin not in outcome.skipped and outcome.iteration_time_s <= times["dp-nccl"]
