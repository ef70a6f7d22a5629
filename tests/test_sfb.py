"""tag.sfb: the SFB integer program (TAG §4.2.3) against closed forms and brute force, and the plan over a
strategy on hand-built graphs and a zoo graph."""

import itertools
import time
import json
import warnings

import numpy as np
import pulp
import pytest

from tag.cluster.build import Machine, build_cluster
from tag.compiler import check_compiled, compile_strategy
from tag.graph import OpGraph
from tag.graph.io import load_graph
from tag.graph.resolve import prebuilt_path
from tag.grouping import GroupGraph, group_ops
from tag.sfb import (
    AUTO_EXHAUSTIVE_OPS,
    EXTERNAL,
    SFBCache,
    SFBError,
    apply_sfb,
    select_sfb,
    sfb_objective,
    solve_sfb,
)
from tag.strategy import PS, Strategy

F32 = 4  # bytes per element
GBPS = 1e9 / 8


def two_1080ti(network_bandwidth: float = 10 * GBPS):
    """TAG §5.6: two machines with one GTX 1080Ti each."""
    return build_cluster("2x1080ti", [Machine("1080ti", 1), Machine("1080ti", 1)], network_bandwidth=network_bandwidth)


def matmul_graph(batch: int, h1: int, h2: int) -> OpGraph:
    """Y = X·W (X: B×H₁, W: H₁×H₂), a loss, dY, dW = Xᵀ·dY and an optimizer op updating W (TAG Fig. 4).

    ops: 0 x (batch input), 1 w (parameter), 2 y, 3 loss, 4 dy, 5 dw, 6 adam.
    """
    x, w, y = batch * h1 * F32, h1 * h2 * F32, batch * h2 * F32
    edges = [(0, 2, x), (1, 2, w), (2, 3, y), (2, 4, y), (0, 5, x), (4, 5, y), (1, 6, w), (5, 6, w)]
    matmul_flops = 2.0 * batch * h1 * h2
    return OpGraph(
        names=["x", "w", "y", "loss", "dy", "dw", "adam"],
        kinds=["input", "parameter", "aten.mm.default", "aten.mse", "aten.mse_backward", "aten.mm.default",
               "aten.adam"],
        role=[0, 0, 1, 1, 2, 2, 3],
        flops=[0, 0, matmul_flops, batch * h2, batch * h2, matmul_flops, 10.0 * h1 * h2],
        bytes_accessed=[0, 0, x + w + y, y, 2 * y, x + y + w, 4 * w],
        output_bytes=[x, w, y, F32, y, w, w],
        param_bytes=[0, w, 0, 0, 0, 0, 0],
        batch_scaled=[True, False, True, True, True, True, False],
        split=[0, 2, 0, 1, 0, 1, 2],  # concat, none, concat, sum, concat, sum, none
        edge_src=[a for a, _, _ in edges],
        edge_dst=[b for _, b, _ in edges],
        edge_bytes=[float(n) for _, _, n in edges],
        batch_size=batch,
        meta={"model": "matmul"},
    )


def one_group(graph: OpGraph, cluster) -> GroupGraph:
    return GroupGraph.from_assignment(graph, np.zeros(graph.num_ops, dtype=np.int64), gpus=cluster)


# ------------------------------------------------------------------------------------------- reference


def brute_force(op_time, edge_src, edge_dst, edge_bytes, gradient_bytes, d, tau, root=0, sync_time=None):
    """min over every α ∈ {0,1}^V satisfying the constraints of TAG §4.2.3, b at its least: (cost, α)."""
    v = len(op_time)
    s = 2.0 * (d - 1) / d * gradient_bytes / tau if sync_time is None else sync_time
    best = (0.0, (0,) * v)
    for alpha in itertools.product((0, 1), repeat=v):
        feasible = all(alpha[k] <= sum(alpha[i] for j, i in zip(edge_src, edge_dst) if j == k)
                       for k in range(v) if k != root)
        if not feasible:
            continue
        cut = [max(0, alpha[i] - (alpha[j] if j != EXTERNAL else 0)) for j, i in zip(edge_src, edge_dst)]
        cost = ((d - 1) * sum(a * t for a, t in zip(alpha, op_time))
                + d * (d - 1) * sum(b * n for b, n in zip(cut, edge_bytes)) / tau - alpha[root] * s)
        if cost < best[0]:
            best = (cost, alpha)
    return best


def random_program(rng: np.random.Generator, v: int):
    """V ops flowing into op 0 (each op feeds 1-2 ops of lower index), plus tensors from outside."""
    src, dst = [], []
    for k in range(1, v):
        for i in rng.choice(k, size=min(k, int(rng.integers(1, 3))), replace=False).tolist():
            src.append(k)
            dst.append(i)
    for i in range(v):
        for _ in range(int(rng.integers(0, 3))):
            src.append(EXTERNAL)
            dst.append(i)
    op_time = rng.exponential(1e-4, v) * (rng.random(v) < 0.8)
    edge_bytes = rng.exponential(1e5, len(src)) * (rng.random(len(src)) < 0.85)
    d = int(rng.integers(2, 5))
    tau = 1e9
    gradient_bytes = float(rng.exponential(2e6))
    return op_time, np.array(src), np.array(dst), edge_bytes, gradient_bytes, d, tau


# ------------------------------------------------------------------------------------------- the program


@pytest.mark.parametrize("method", ["exhaustive", "cbc"])
def test_fig4_break_even_matches_closed_form(method):
    """Cut A of Fig. 4 (duplicate the MatMul, broadcast x and ∇): SFB exactly when
    (D−1)·T + D(D−1)(L_x + L_∇)/τ < 2(D−1)/D · L_gl/τ, swept across the break-even batch."""
    h1, h2, d, tau = 1024, 4096, 2, 1.25e9
    per_sample_time = 2.0 * h1 * h2 / 10e12  # T of the dW MatMul per sample of a replica's batch
    gradient_bytes = h1 * h2 * F32
    # break-even per-replica batch b*: T(b) + 2·4b(H1+H2)/τ = L_gl/τ
    b_star = (gradient_bytes / tau) / ((d - 1) * per_sample_time + d * (d - 1) * F32 * (h1 + h2) / tau)
    for b in (0.25 * b_star, 0.9 * b_star, 0.99 * b_star, 1.01 * b_star, 1.1 * b_star, 4 * b_star):
        op_time = [per_sample_time * b]
        edge_bytes = [b * h1 * F32, b * h2 * F32]
        cost = (d - 1) * op_time[0] + d * (d - 1) * sum(edge_bytes) / tau - 2 * (d - 1) / d * gradient_bytes / tau
        decision = solve_sfb(op_time, [EXTERNAL, EXTERNAL], [0, 0], edge_bytes, gradient_bytes, d, tau,
                             method=method)
        assert decision.changed == (b < b_star) == (cost < 0)
        assert decision.time_saved == pytest.approx(max(0.0, -cost), rel=1e-9, abs=1e-15)
        assert decision.broadcast.tolist() == [decision.changed] * 2
        assert decision.optimal


@pytest.mark.parametrize("seed", range(24))
def test_cbc_and_enumeration_agree_with_brute_force(seed):
    rng = np.random.default_rng(seed)
    problem = random_program(rng, int(rng.integers(1, 8)))
    expected, _ = brute_force(*problem)
    scale = problem[4] / problem[6] + problem[0].sum() + problem[3].sum() * 12 / problem[6]
    for method in ("cbc", "exhaustive"):
        decision = solve_sfb(*problem, method=method)
        assert decision.status in ("optimal", "exhaustive", "bound")
        assert -decision.time_saved == pytest.approx(expected, abs=1e-9 * scale)
        alpha = decision.duplicated
        # the returned assignment is feasible and its terms add up
        op_time, src, dst = problem[0], problem[1], problem[2]
        for k in range(len(op_time)):
            if k != 0 and alpha[k]:
                assert alpha[dst[src == k]].any()
        assert decision.extra_compute + decision.broadcast_time - decision.sync_saved == pytest.approx(
            -decision.time_saved, abs=1e-12)
        assert sfb_objective(alpha, *problem) == pytest.approx(-decision.time_saved, abs=1e-12)


def test_no_change_when_nothing_saves_time():
    # the gradient is tiny next to its factors: keep the all-reduce
    decision = solve_sfb([1e-5, 1e-5], [1, EXTERNAL, EXTERNAL], [0, 0, 1], [1e6, 1e6, 1e6], 1e3, 2, 1e9)
    assert not decision.changed and decision.time_saved == 0.0
    assert decision.status == "bound"  # one copy of g already costs more than the sync saves
    decision = solve_sfb([0.0, 0.0], [1, EXTERNAL], [0, 1], [1e6, 1e6], 1e5, 2, 1e9, method="cbc")
    assert not decision.changed and decision.time_saved == 0.0 and not decision.broadcast.any()


def test_duplicates_upstream_when_its_inputs_are_smaller():
    """g reads a large tensor from op 1, which reads a small one: cut B (duplicate both) beats cut A."""
    args = ([1e-6, 1e-6], [1, EXTERNAL], [0, 1], [4e6, 1e4], 64e6, 2, 1e9)
    for method in ("cbc", "exhaustive"):
        decision = solve_sfb(*args, method=method)
        assert decision.duplicated.tolist() == [True, True]
        assert decision.broadcast.tolist() == [False, True]


def test_sync_time_override_for_a_parameter_server():
    # PS: 2(D−1) L_gl / τ instead of the ring's 2(D−1)/D L_gl / τ
    d, tau, nbytes = 4, 1e9, 1e6
    args = ([1e-4], [EXTERNAL], [0], [2e5], nbytes, d, tau)
    ring = solve_sfb(*args)
    ps = solve_sfb(*args, sync_time=2 * (d - 1) * nbytes / tau)
    assert not ring.changed  # 1.5 ms of all-reduce < 0.3 ms compute + 2.4 ms broadcast
    assert ps.changed and ps.sync_saved == pytest.approx(6e-3)


class _StoppedWithIncumbent(pulp.PULP_CBC_CMD):
    """CBC stopped at its time limit holding an incumbent: pulp reports LpStatus "Optimal" with
    sol_status LpSolutionIntegerFeasible (its reading of "Stopped on time - objective value ...")."""

    def actualSolve(self, lp, **kwargs):
        super().actualSolve(lp, **kwargs)
        lp.assignStatus(pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible)
        return lp.status


class _StoppedEmpty(pulp.PULP_CBC_CMD):
    """CBC stopped at its time limit before finding any solution."""

    def actualSolve(self, lp, **kwargs):
        lp.assignStatus(pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound)
        return lp.status


def _quiet(solver_class):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return solver_class(msg=False)


def test_time_limit_incumbent_is_reported_as_not_proven():
    args = ([1e-6, 1e-6], [1, EXTERNAL], [0, 1], [4e6, 1e4], 64e6, 2, 1e9)
    proven = solve_sfb(*args, method="cbc")
    stopped = solve_sfb(*args, method="cbc", solver=_quiet(_StoppedWithIncumbent))
    assert proven.status == "optimal" and proven.optimal
    assert stopped.status == "time_limit" and not stopped.optimal
    assert stopped.time_saved == pytest.approx(proven.time_saved)  # the incumbent is kept when it is best


def test_time_limit_without_solution_falls_back_to_cut_a():
    args = ([1e-6, 1e-6], [1, EXTERNAL], [0, 1], [4e6, 1e4], 64e6, 2, 1e9)
    cut_a = -sfb_objective([True, False], *args)
    decision = solve_sfb(*args, method="cbc", solver=_quiet(_StoppedEmpty))
    assert decision.status == "no_solution" and not decision.optimal
    assert decision.duplicated.tolist() == [True, False]
    assert decision.time_saved == pytest.approx(cut_a)
    assert decision.time_saved < solve_sfb(*args).time_saved
    # and no change at all when cut A does not pay either
    small = ([1e-6, 1e-6], [1, EXTERNAL], [0, 1], [4e6, 1e4], 4.1e6, 2, 1e9)
    decision = solve_sfb(*small, method="cbc", solver=_quiet(_StoppedEmpty))
    assert decision.status == "no_solution" and not decision.changed


def test_real_cbc_time_limit_on_a_large_program():
    """1000 ops and a 10 ms limit: CBC usually stops before its first solution (pulp: LpStatus "Not Solved",
    or "Optimal" with an incumbent); whatever it returns must never be worse than cut A."""
    rng = np.random.default_rng(1)
    problem = list(random_program(rng, 1000))
    problem[4] = problem[0].sum() * problem[6] * 3  # a gradient worth duplicating
    cut_a = np.zeros(1000, dtype=bool)
    cut_a[0] = True
    decision = solve_sfb(*problem, method="cbc", time_limit=0.01)
    assert decision.status in ("optimal", "time_limit", "no_solution")
    assert decision.optimal == (decision.status == "optimal")
    assert decision.time_saved >= -sfb_objective(cut_a, *problem) - 1e-12
    assert solve_sfb(*problem, method="cbc", time_limit=30).time_saved >= decision.time_saved - 1e-12


def test_cache_is_keyed_by_signature_replicas_and_bandwidth():
    cache = SFBCache()
    args = ([1e-6, 1e-6], [1, EXTERNAL], [0, 1], [4e6, 1e4], 64e6)
    first = solve_sfb(*args, 2, 1e9, cache=cache, method="cbc")
    again = solve_sfb(*args, 2, 1e9, cache=cache, method="cbc")
    assert again is first and (cache.hits, cache.misses) == (1, 1)
    solve_sfb(*args, 3, 1e9, cache=cache)
    solve_sfb(*args, 2, 2e9, cache=cache)
    solve_sfb([1e-6, 2e-6], *args[1:], 2, 1e9, cache=cache)
    assert (cache.hits, cache.misses, len(cache)) == (1, 4, 4)
    with pytest.raises(ValueError):
        first.duplicated[0] = False  # shared through the cache: read-only


def test_cache_keeps_only_proven_decisions(monkeypatch):
    # A solve cut short by its time limit (a deadline's) must not answer a later call with more time.
    import tag.sfb.program as program

    args = ([1e-6, 1e-6], [1, EXTERNAL], [0, 1], [4e6, 1e4], 64e6, 2, 1e9)
    proven = solve_sfb(*args, method="cbc")
    assert proven.optimal
    cut_short = proven._replace(status="time_limit")
    cache = SFBCache()
    with monkeypatch.context() as patch:
        patch.setattr(program, "_solve", lambda *a: cut_short)
        assert solve_sfb(*args, cache=cache, method="cbc", time_limit=1e-3) is cut_short
    assert len(cache) == 0
    again = solve_sfb(*args, cache=cache, method="cbc", time_limit=60)
    assert again.optimal and len(cache) == 1 and solve_sfb(*args, cache=cache) is again


@pytest.mark.parametrize("bad, match", [
    (dict(num_replicas=1), "num_replicas"),
    (dict(bandwidth=0.0), "bandwidth"),
    (dict(op_time=[-1.0]), "op_time"),
    (dict(edge_dst=[3]), "edge_dst"),
    (dict(edge_src=[-2]), "edge_src"),
    (dict(edge_bytes=[float("nan")]), "edge_bytes"),
    (dict(gradient_bytes=-1.0), "gradient_bytes"),
    (dict(root=5), "root"),
    (dict(method="simplex"), "method"),
    (dict(time_limit=0), "time_limit"),
])
def test_bad_arguments_name_the_field(bad, match):
    args = dict(op_time=[1e-6], edge_src=[EXTERNAL], edge_dst=[0], edge_bytes=[1e3], gradient_bytes=1e6,
                num_replicas=2, bandwidth=1e9)
    args.update(bad)
    with pytest.raises(SFBError, match=match):
        solve_sfb(**args)


def test_exhaustive_refuses_large_programs():
    v = 17
    with pytest.raises(SFBError, match="exhaustive"):
        solve_sfb([0.0] * v, list(range(1, v)), [0] * (v - 1), [1.0] * (v - 1), 1e9, 2, 1e9, method="exhaustive")


# ------------------------------------------------------------------------------------------- over a strategy


def test_plan_reproduces_fig4_sizes():
    """D = 2 replicas of batch b: all-reduce of H₂×H₁ replaced by broadcasting 2(H₂×b + b×H₁). With b = 128
    the MatMuls are compute-bound (a 1080Ti reads W faster than it multiplies 128 rows by it), so running
    Y on the whole batch costs ~0.2 ms more, while broadcasting dY (1 MiB at 100 Gbps) costs ~0.1 ms: only
    dW, which writes a whole H₁×H₂ matrix at any batch, is cheaper to duplicate. (At b = 2 every MatMul is
    bound by its weight reads and costs the same on 2 rows as on 4, so duplicating Y and dY too is right.)"""
    b, h1, h2 = 128, 4096, 2048
    cluster = two_1080ti(100 * GBPS)
    graph = matmul_graph(2 * b, h1, h2)
    group_graph = one_group(graph, cluster)
    strategy = Strategy.data_parallel(1, cluster)
    for depth in (0, 3):
        plan = apply_sfb(group_graph, strategy, cluster, depth=depth)
        (group,) = plan.groups
        assert group.sync_free_ops.tolist() == [5] and group.duplicated_ops.tolist() == [5]
        assert group.broadcast_ops.tolist() == [0, 4]  # x and ∇ (dy): the sufficient factors
        assert group.broadcast_partial.tolist() == [False, False]
        assert group.allreduce_bytes_removed == h2 * h1 * F32
        assert group.broadcast_bytes_added == 2 * (h2 * b + b * h1) * F32
        assert group.broadcast_bytes.tolist() == [2 * b * h1 * F32, 2 * b * h2 * F32]  # whole tensors
        report = plan.report()
        assert (report.gradients, report.applied, report.ops_duplicated) == (1, 1, 1)
        assert report.estimated_time_saved_s == pytest.approx(group.time_saved_s) and group.time_saved_s > 0
    (program,) = plan.gradients
    assert program.ops[0] == 5 and set(program.ops.tolist()) >= {5, 4, 2}  # dy and y were candidates


def test_plan_follows_the_bandwidth_across_break_even():
    b, h1, h2 = 128, 2048, 2048  # gradient 16 MiB, factors 2·128·(2048 + 2048)·4 = 4 MiB plus dW's ~0.1 ms
    graph = matmul_graph(2 * b, h1, h2)
    for gbps, expected in ((1, True), (10_000, False)):
        cluster = two_1080ti(gbps * GBPS)
        plan = apply_sfb(one_group(graph, cluster), Strategy.data_parallel(1, cluster), cluster)
        assert bool(plan.groups) == expected


def test_rewritten_graph_compiles_without_the_allreduce_and_runs_faster():
    b, h1, h2 = 2, 2048, 2048
    cluster = two_1080ti(10 * GBPS)
    graph = matmul_graph(2 * b, h1, h2)
    group_graph = one_group(graph, cluster)
    strategy = Strategy.data_parallel(1, cluster)
    plan = apply_sfb(group_graph, strategy, cluster)
    before = compile_strategy(group_graph, strategy, cluster, granularity="op")
    after = compile_strategy(plan.rewritten_group_graph(), strategy, cluster, granularity="op")
    check_compiled(after)
    assert [op.op for op in before.inserted] == ["AllReduce"]
    assert sorted(op.op for op in after.inserted) == ["Concat", "Concat"]  # x and ∇ gathered on both
    assert sum(op.nbytes for op in after.inserted) == pytest.approx(plan.report().broadcast_bytes_added)
    t_before = before.simulate().iteration_time
    t_after = after.simulate().iteration_time
    assert t_after < t_before
    # the estimate is the serialised saving; here nothing overlaps the all-reduce, so it is close
    assert t_before - t_after == pytest.approx(plan.estimated_time_saved_s, rel=0.2)


def test_parameter_server_groups_use_the_ps_time():
    cluster = two_1080ti(10 * GBPS)
    graph = matmul_graph(4, 512, 512)
    plan = apply_sfb(one_group(graph, cluster), Strategy.data_parallel(1, cluster, option=PS), cluster)
    (program,) = plan.gradients
    assert program.option == PS
    assert program.sync_time == pytest.approx(2 * 1 * 512 * 512 * F32 / (10 * GBPS))


def test_groups_that_do_not_split_the_batch_are_left_alone():
    cluster = two_1080ti()
    group_graph = one_group(matmul_graph(4, 1024, 1024), cluster)
    single = Strategy.single_device(1, cluster.subset([0]), 0)
    plan = apply_sfb(group_graph, single, cluster.subset([0]))
    assert plan.gradients == [] and plan.groups == [] and plan.report().gradients == 0
    duplicate = Strategy.data_parallel(1, cluster, option="duplicate")
    assert apply_sfb(group_graph, duplicate, cluster).groups == []


def conv_like_graph() -> OpGraph:
    """A backward op with two outputs selected by getitem views: dX (rows) and dW (a partial gradient).

    ops: 0 x, 1 w, 2 y = conv(x, w), 3 loss, 4 dy, 5 conv_bwd(x, dy, w), 6 dX = getitem, 7 dW = getitem,
    8 adam(w, dW), 9 sink reading dX.
    """
    x, w, y = 64e3, 4e6, 64e3
    edges = [(0, 2, x), (1, 2, w), (2, 3, y), (2, 4, y), (0, 5, x), (4, 5, y), (1, 5, w), (5, 6, x), (5, 7, x),
             (7, 8, w), (1, 8, w), (6, 9, x)]
    return OpGraph(
        names=["x", "w", "y", "loss", "dy", "conv_bwd", "dX", "dW", "adam", "sink"],
        kinds=["input", "parameter", "aten.convolution", "aten.mse", "aten.mse_backward",
               "aten.convolution_backward.default", "getitem", "getitem", "aten.adam", "aten.sum"],
        role=[0, 0, 1, 1, 2, 2, 2, 2, 3, 2],
        flops=[0, 0, 1e9, 1e4, 1e4, 2e9, 0, 0, 1e7, 1e4],
        bytes_accessed=[0, 0, 1e6, 1e5, 1e5, 1e6, 0, 0, 1e7, 1e5],
        output_bytes=[x, w, y, 4, y, x + w, x, w, w, 4],
        param_bytes=[0, w, 0, 0, 0, 0, 0, 0, 0, 0],
        batch_scaled=[True, False, True, True, True, True, True, True, False, True],
        split=[0, 2, 0, 1, 0, 0, 0, 1, 2, 1],
        edge_src=[a for a, _, _ in edges], edge_dst=[b for _, b, _ in edges],
        edge_bytes=[n for _, _, n in edges], batch_size=4, meta={"model": "conv-like"},
    )


def test_a_gradient_view_is_duplicated_with_its_base():
    cluster = two_1080ti(1 * GBPS)
    graph = conv_like_graph()
    plan = apply_sfb(one_group(graph, cluster), Strategy.data_parallel(1, cluster), cluster)
    (program,) = plan.gradients
    assert program.op == 5 and program.gradient_ops.tolist() == [7]
    assert [m.tolist() for m in program.members][0] == [5, 6, 7]  # conv_bwd with its views
    (group,) = plan.groups
    assert group.sync_free_ops.tolist() == [7]
    assert group.duplicated_ops.tolist() == [5, 6, 7]
    assert group.broadcast_ops.tolist() == [0, 4]  # x and dy; w is whole on every replica
    after = compile_strategy(plan.rewritten_group_graph(), Strategy.data_parallel(1, cluster), cluster,
                             granularity="op")
    check_compiled(after)
    assert "AllReduce" not in {op.op for op in after.inserted}


@pytest.fixture(scope="module")
def tiny_transformer():
    """The zoo's tiny transformer in 8 groups, data parallel on two 1080Ti over 1 Gbps."""
    cluster = two_1080ti(1 * GBPS)
    group_graph = group_ops(load_graph(prebuilt_path("transformer", tiny=True)), num_groups=8, gpus=cluster)
    return group_graph, Strategy.data_parallel(group_graph.num_groups, cluster), cluster


def test_zoo_graph_plan_is_consistent(tiny_transformer):
    group_graph, strategy, cluster = tiny_transformer
    graph = group_graph.op_graph
    cache = SFBCache()
    plan = apply_sfb(group_graph, strategy, cluster, cache=cache)
    report = plan.report()
    assert report.applied > 0 and report.programs == len(plan.gradients)
    assert report.cache_hits > 0  # repeated layers share programs
    duplicated = set(plan.duplicated_ops.tolist())
    assert set(plan.sync_free_ops.tolist()) <= duplicated
    for edge in plan.broadcast_edges.tolist():
        assert graph.edge_dst[edge] in duplicated and graph.edge_src[edge] not in duplicated
    json.dumps(report.as_dict())
    assert "estimate" in report.format()
    compiled = compile_strategy(plan.rewritten_group_graph(), strategy, cluster)
    check_compiled(compiled)
    assert compiled.simulate().iteration_time > 0
    # a second call finds every group memoised; a plan restricted to no group changes nothing
    again = apply_sfb(group_graph, strategy, cluster, cache=cache)
    assert again.cache_hits == len(again.gradients)
    assert [g.group for g in again.groups] == [g.group for g in plan.groups]
    none = plan.restricted([])
    assert none.groups == [] and np.array_equal(none.rewrite_graph().split, graph.split)
    assert none.report().gradients == report.gradients and none.report().applied == 0


def test_cbc_matches_enumeration_on_zoo_programs(tiny_transformer):
    group_graph, strategy, cluster = tiny_transformer
    by_cbc = apply_sfb(group_graph, strategy, cluster, depth=5, max_ops=14, method="cbc")
    by_enumeration = apply_sfb(group_graph, strategy, cluster, depth=5, max_ops=14, method="exhaustive")
    assert any(len(x.ops) > AUTO_EXHAUSTIVE_OPS for x in by_cbc.gradients)  # larger than "auto" enumerates
    assert [x.op for x in by_cbc.gradients] == [x.op for x in by_enumeration.gradients]
    for a, b in zip(by_cbc.gradients, by_enumeration.gradients):
        assert a.decision.status in ("optimal", "bound")
        assert a.decision.time_saved == pytest.approx(b.decision.time_saved, rel=1e-9, abs=1e-15)
    assert by_cbc.estimated_time_saved_s == pytest.approx(by_enumeration.estimated_time_saved_s)


# ------------------------------------------------------------------------------------------- under a deadline


def test_a_passed_deadline_solves_nothing_new_but_keeps_memoised_groups(tiny_transformer):
    group_graph, strategy, cluster = tiny_transformer
    cache = SFBCache()
    plan = apply_sfb(group_graph, strategy, cluster, cache=cache)
    assert plan.groups
    cold = apply_sfb(group_graph, strategy, cluster, cache=SFBCache(), deadline=time.perf_counter())
    assert cold.groups == [] and cold.report().gradients == plan.report().gradients
    warm = apply_sfb(group_graph, strategy, cluster, cache=cache, deadline=time.perf_counter())
    assert [g.group for g in warm.groups] == [g.group for g in plan.groups]


def test_select_sfb_past_its_deadline_keeps_the_strategy_and_says_so(tiny_transformer):
    group_graph, strategy, cluster = tiny_transformer
    base = compile_strategy(group_graph, strategy, cluster).simulate(feedback=False).iteration_time
    selection = select_sfb(group_graph, strategy, cluster, cache=SFBCache(), time_without_s=base,
                           deadline=time.perf_counter())
    assert not selection.applied and selection.time_s == base and selection.simulations == 0
    assert selection.deadline_reached and selection.as_dict()["deadline_reached"]


def test_select_sfb_stops_toggling_when_its_reserve_no_longer_fits(tiny_transformer):
    """A reserve longer than the deadline allows: the whole plan is simulated (no simulation timed yet to
    judge by), then no toggle is tried; the best of the two is kept, and the untried toggles reported."""
    group_graph, strategy, cluster = tiny_transformer
    base = compile_strategy(group_graph, strategy, cluster).simulate(feedback=False).iteration_time
    chosen = len(apply_sfb(group_graph, strategy, cluster).groups)  # groups the program puts SFB in
    free = select_sfb(group_graph, strategy, cluster, cache=SFBCache(), time_without_s=base)
    assert chosen > 1 and not free.deadline_reached and free.untried == 0
    assert 1 < free.simulations <= 1 + chosen and free.time_s <= base
    cut = select_sfb(group_graph, strategy, cluster, cache=SFBCache(), time_without_s=base,
                     deadline=time.perf_counter() + 600.0, reserve=1e9)
    assert cut.simulations == 1 and cut.deadline_reached and cut.untried == chosen
    assert cut.time_all_s == free.time_all_s and cut.time_s == min(base, cut.time_all_s) >= free.time_s
    assert cut.as_dict()["groups_untried"] == cut.untried
    # a deadline far enough away changes nothing
    late = select_sfb(group_graph, strategy, cluster, cache=SFBCache(), time_without_s=base,
                      deadline=time.perf_counter() + 600.0, reserve=2.0)
    assert not late.deadline_reached and late.untried == 0 and late.time_s == free.time_s
    assert [g.group for g in late.plan.groups] == [g.group for g in free.plan.groups]
