"""The planners layer: the compute bound, the fastest plan over families, and `tag plan` across families."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tag.cli import main
from tag.cluster import Cluster, resolve_cluster
from tag.cost import CostModel
from tag.graph.pipedream import load_pipedream
from tag.planner import PlanConfig
from tag.planners import FAMILIES, compute_bound, plan_fastest
from tag.planners.bounds import _best_share, dual_bound

PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"
needs_profiles = pytest.mark.skipif(not PROFILES.is_dir(), reason="PipeDream profiles not found")
GB = 1e9


def two_type_optimum(work, counts):
    """The fractional load-balancing LP with two GPU types, exactly: ops sorted by how much cheaper they
    are on type 0, a prefix on type 0 and the rest on type 1, the boundary op split to balance."""
    order = np.argsort(work[:, 0] / work[:, 1])
    w0, w1 = work[order, 0] / counts[0], work[order, 1] / counts[1]
    best = np.inf
    for k in range(len(order) + 1):  # ops before k on type 0; op k split by x in [0, 1]
        head, tail = w0[:k].sum(), w1[k + 1:].sum()
        if k == len(order):
            best = min(best, head)
            continue
        # head + x w0[k] = tail + (1 - x) w1[k]
        x = np.clip((tail + w1[k] - head) / (w0[k] + w1[k]), 0.0, 1.0)
        best = min(best, max(head + x * w0[k], tail + (1 - x) * w1[k]))
    return best


def test_bound_by_hand():
    # each op is twice as fast on the other type: each goes where it is fast, 2 s on each device
    assert _best_share(np.array([[2.0, 4.0], [4.0, 2.0]]), np.array([1.0, 1.0])) == pytest.approx(2.0, rel=1e-6)
    # type 0 twice as fast on every op: 4 s of type-0 work over 1 + 1/2 of its speed
    assert _best_share(np.array([[1.0, 2.0], [3.0, 6.0]]), np.array([1.0, 1.0])) == pytest.approx(8 / 3, rel=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_two_type_bound_is_the_lp_optimum(seed):
    rng = np.random.default_rng(seed)
    work = rng.uniform(0.1, 5.0, (12, 2))
    counts = rng.integers(1, 5, 2).astype(float)
    exact = two_type_optimum(work, counts)
    assert _best_share(work, counts) == pytest.approx(exact, rel=1e-4)
    # weak duality: no point of the simplex gives more than the optimum
    shares = rng.dirichlet([1.0, 1.0], 200)
    assert (dual_bound(work, counts, shares) <= exact * (1 + 1e-9)).all()


def test_bound_of_a_homogeneous_cluster_is_the_work_over_the_devices():
    graph = load_pipedream(PROFILES / "vgg16.graph.txt") if PROFILES.is_dir() else pytest.skip("no profiles")
    cluster = resolve_cluster("two-level")
    work = CostModel().op_times(graph, cluster.types[0]).sum()
    assert compute_bound(graph, cluster) == pytest.approx(work / cluster.num_devices)


def random_cluster(rng, num_devices):
    types = ("v100-16gb", "p100", "t4")
    device_type = rng.permutation(np.r_[0, 1, 2, rng.integers(0, 3, num_devices - 3)])  # every type present
    machine = np.arange(num_devices) // 2
    same = machine[:, None] == machine[None, :]
    return Cluster(name="random", types=types, device_type=device_type.tolist(), machine=machine.tolist(),
                   bandwidth=np.where(same, 50 * GB, rng.uniform(1, 10) * GB), latency=np.zeros((num_devices,) * 2))


@needs_profiles
@pytest.mark.parametrize("seed,model", [(0, "vgg16"), (1, "resnet50"), (2, "gnmt")])
def test_no_plan_beats_its_bound_and_the_chosen_plan_is_the_fastest(seed, model):
    rng = np.random.default_rng(seed)
    graph = load_pipedream(PROFILES / f"{model}.graph.txt")
    cluster = random_cluster(rng, 4)
    found = plan_fastest(graph, cluster, families=("data-parallel", "pipeline"), config=PlanConfig(num_groups=8))
    made = [c for c in found.candidates if c.ok]
    assert len(made) >= 4 and {c.family for c in made} == {"data-parallel", "pipeline"}
    assert all(c.iteration_time_s >= found.compute_bound_s for c in made)
    feasible = [c.iteration_time_s for c in made if c.feasible]
    assert found.best.feasible and found.iteration_time_s == min(feasible)
    for family, best in found.families.items():
        assert best.iteration_time_s == min(c.iteration_time_s for c in made if c.family == family and c.feasible)
    assert found.bound_ratio >= 1.0


def test_placement_and_graph_families_join_in():
    from tag.graph.resolve import resolve_model

    graph, cluster = resolve_model("candle-uno", tiny=True), resolve_cluster("examples/toy4.yaml")
    found = plan_fastest(graph, cluster, config=PlanConfig(num_groups=6, max_iterations=5))
    assert set(found.families) == set(FAMILIES)
    assert all(c.iteration_time_s >= found.compute_bound_s for c in found.candidates if c.ok)
    assert found.iteration_time_s == min(c.iteration_time_s for c in found.candidates if c.ok and c.feasible)


def test_lower_packages_never_import_the_planners():
    code = ("import sys; import tag.exact, tag.graphpipe, tag.search, tag.policy, tag.baselines, tag.planner; "
            "print(any(m.startswith('tag.planners') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@needs_profiles
@pytest.mark.parametrize("family,kind", [("pipeline", "pipeline"), ("data-parallel", "strategy")])
def test_tag_plan_writes_the_chosen_plan_and_simulate_agrees(capsys, tmp_path, family, kind):
    common = (str(PROFILES / "vgg16.graph.txt"), "--cluster", "examples/toy4.yaml")
    out = tmp_path / "plan.json"
    payload = run_json(capsys, "plan", *common, "--family", family, "--num-groups", "8", "--out", str(out))
    assert payload["family"] == family and payload["files"]["plan"] == str(out)
    assert payload["iteration_time_s"] >= payload["compute_bound_s"] > 0
    assert payload["bound_ratio"] == pytest.approx(payload["iteration_time_s"] / payload["compute_bound_s"])
    assert [row["family"] for row in payload["families"]] == [family]
    assert json.loads(out.read_text())["kind"] == kind
    again = run_json(capsys, "simulate", *common, "--strategy", str(out))
    assert again["iteration_time_s"] == pytest.approx(payload["iteration_time_s"], rel=1e-9)


def test_tag_plan_table_fits_80_columns(capfd):
    assert main(["plan", "vgg19", "--tiny", "--cluster", "examples/toy4.yaml", "--family", "pipeline"]) == 0
    out = capfd.readouterr().out
    assert "compute bound" in out and "chosen: pipeline" in out
    assert max(len(line) for line in out.splitlines()) <= 80


@needs_profiles
def test_tag_pipeline_best_is_the_fastest_partitioner(capsys):
    common = (str(PROFILES / "resnet50.graph.txt"), "--cluster", "examples/toy4.yaml", "--mapper", "cs")
    best = run_json(capsys, "pipeline", *common, "--partitioner", "best")
    each = {p: run_json(capsys, "pipeline", *common, "--partitioner", p)["iteration_time_s"]
            for p in ("parmesan", "pipedream", "rannc")}
    assert best["iteration_time_s"] == pytest.approx(min(each.values()), rel=1e-12)
    assert best["partitioner"] in each and each[best["partitioner"]] == pytest.approx(best["iteration_time_s"])


def fork_join_graph(rng):
    """A stem, 2-3 branches of 1-3 forward ops of random work and weights, a join and a head."""
    from conftest import make_graph

    edges, ends, k = [], [], 1
    for _ in range(int(rng.integers(2, 4))):
        prev = 0
        for _ in range(int(rng.integers(1, 4))):
            edges.append((prev, k))
            prev, k = k, k + 1
        ends.append(prev)
    edges += [(e, k) for e in ends] + [(k, k + 1)]
    n = k + 2
    return make_graph(edges, n=n, flops=(rng.uniform(0.2, 5, n) * 1e12).tolist(),
                      param_bytes=(rng.uniform(0, 200, n) * 1e6).tolist(),
                      edge_bytes=(rng.uniform(1, 50, len(edges)) * 1e6).tolist())


@pytest.mark.parametrize("seed", range(4))
def test_on_random_small_instances_bounds_hold_and_no_family_beats_the_choice(seed):
    """Branched graphs over mixed GPU types, every family: no plan is faster than the compute bound, the
    chosen plan is the fastest feasible one simulated, and the graph pipeline family (which holds the
    pipeline family's plans) is never slower than the pipeline family."""
    rng = np.random.default_rng(700 + seed)
    graph = fork_join_graph(rng)
    cluster = random_cluster(rng, int(rng.integers(3, 6)))
    found = plan_fastest(graph, cluster, config=PlanConfig(num_groups=4, max_iterations=4))
    made = [c for c in found.candidates if c.ok]
    assert {c.family for c in made} == set(FAMILIES)
    assert all(c.iteration_time_s >= found.compute_bound_s * (1 - 1e-9) for c in made)
    fits = [c for c in made if c.feasible]
    assert found.best.feasible and found.iteration_time_s == min(c.iteration_time_s for c in fits)
    pipeline, graph_pipeline = found.families["pipeline"], found.families["graph-pipeline"]
    assert graph_pipeline.key() <= (pipeline.key()[0], pipeline.key()[1] * (1 + 1e-9))


def test_a_small_budget_is_shared_and_honoured():
    """--time 3 s: each budgeted family gets a share of what is left, every budgeted family (the placement
    planner with its SFB and final pass included) stops within half a second of its share, every family
    reports its planning time, and the whole call ends within the budget and half a second (a loaded
    machine)."""
    import time

    from tag.graph.resolve import resolve_model

    graph, cluster = resolve_model("candle-uno", tiny=True), resolve_cluster("examples/toy4.yaml")
    start = time.perf_counter()
    found = plan_fastest(graph, cluster, time_limit_s=3.0, config=PlanConfig(num_groups=6))
    wall = time.perf_counter() - start
    assert set(found.shares_s) == {"pipeline", "graph-pipeline", "placement"}
    assert all(0 < share <= 3.0 for share in found.shares_s.values())
    times = found.family_times()
    assert set(times) == set(FAMILIES)
    for family in ("pipeline", "graph-pipeline", "placement"):
        assert times[family] <= found.shares_s[family] + 0.5
    assert wall <= 3.0 + 0.5
    payload = found.as_dict()
    assert payload["time_limit_s"] == 3.0 and set(payload["family_planning_time_s"]) == set(FAMILIES)
