"""Executed plans against the single-device step (gloo on the CPU, at most 4 processes, one shared pool)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tag.cluster.build import Machine, build_cluster
from tag.compiler.compile import compile_strategy
from tag.execute import ExecutionError, lower_plan, run_strategy, zoo_program
from tag.execute.program import batch_coupled_ops, build_program
from tag.grouping import GroupGraph, group_ops
from tag.strategy import Strategy

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def gpt2():
    return zoo_program("gpt2", tiny=True, batch_size=6)


@pytest.fixture(scope="module")
def uno():
    return zoo_program("candle-uno", tiny=True, batch_size=6)


def toy_cluster(n: int, gpus: tuple[str, ...] | None = None):
    """``n`` single-GPU machines: every device is a device group of its own."""
    gpus = gpus or ("v100-16gb",) * n
    return build_cluster("toy", [Machine(g, 1) for g in gpus], network_bandwidth=1e9)


def assert_equal_to_one_device(result):
    check = result.check
    assert check["applies"]
    for part in ("loss", "grads", "params"):
        assert check[part]["rel"] <= TOLERANCE, (part, check[part])
    assert check["passed"]


def run(program, group_graph, strategy, cluster, pool, **options):
    result = run_strategy(program, group_graph, strategy, cluster, steps=2, check=True, pool=pool, **options)
    assert len(result.losses) == 2 and result.losses[1] < result.losses[0]  # Adam moved downhill
    return result


# ---------------------------------------------------------------------------------------------- data parallel
@pytest.mark.parametrize("option", ["allreduce", "ps"])
def test_data_parallel_even(gpt2, pool, option):
    cluster = toy_cluster(2)
    gg = group_ops(gpt2.graph, num_groups=4, gpus=cluster)
    result = run(gpt2, gg, Strategy.data_parallel(gg.num_groups, cluster, option=option), cluster, pool)
    assert_equal_to_one_device(result)
    assert result.summary()["collectives"] > 0 and result.summary()["transfers"] == 0


def test_data_parallel_uneven_split_by_speed(uno, pool):
    """V100 and T4 split 6 rows by peak FLOP/s: 5 and 1 (the loss is scaled by each replica's share)."""
    cluster = toy_cluster(2, ("v100-16gb", "t4"))
    gg = group_ops(uno.graph, num_groups=4, gpus=cluster)
    strategy = Strategy.data_parallel(gg.num_groups, cluster, batch_split="speed")
    compiled = compile_strategy(gg, strategy, cluster, granularity="op")
    rows = [compiled.layouts[0].hi[r] - compiled.layouts[0].lo[r] for r in range(2)]
    assert round(rows[0] * 6) != round(rows[1] * 6)
    assert_equal_to_one_device(run(uno, gg, strategy, cluster, pool))


def test_uneven_rows_of_an_even_split(uno, pool):
    """Batch 6 over 4 replicas: 1.5 rows each, rounded at whole rows (2, 1, 1, 2) that still tile the batch."""
    cluster = toy_cluster(4)
    gg = group_ops(uno.graph, num_groups=4, gpus=cluster)
    result = run(uno, gg, Strategy.data_parallel(gg.num_groups, cluster), cluster, pool)
    assert_equal_to_one_device(result)
    assert {1, 2} <= set(uno.records)


# ---------------------------------------------------------------------------------------------- other options
def test_duplicate_groups_compute_the_whole_batch(uno, pool):
    cluster = toy_cluster(2)
    gg = group_ops(uno.graph, num_groups=4, gpus=cluster)
    strategy = Strategy.data_parallel(gg.num_groups, cluster, option="duplicate")
    assert_equal_to_one_device(run(uno, gg, strategy, cluster, pool))


def test_model_parallel_group(gpt2, pool):
    cluster = toy_cluster(3)
    gg = group_ops(gpt2.graph, num_groups=4, gpus=cluster)
    placement = np.ones((gg.num_groups, 3), dtype=int)
    options = ["allreduce"] * gg.num_groups
    options[1] = "model_parallel"
    result = run(gpt2, gg, Strategy.from_cluster(cluster, placement, options), cluster, pool)
    assert_equal_to_one_device(result)
    assert result.summary()["transfers"] > 0


@pytest.mark.parametrize("model,seed", [("gpt2", 0), ("candle-uno", 1), ("dlrm", 2)])
def test_metis_hybrid_six_groups_on_three_devices(model, seed, gpt2, uno, pool):
    """Random masks and options over 6 METIS groups: every option next to every other, rows and partial sums
    moved between replica sets of different sizes."""
    program = {"gpt2": gpt2, "candle-uno": uno}.get(model) or zoo_program(model, tiny=True, batch_size=6)
    cluster = toy_cluster(3)
    gg = group_ops(program.graph, num_groups=6, gpus=cluster)
    rng = np.random.default_rng(seed)
    placement = rng.random((gg.num_groups, 3)) < 0.6
    placement[~placement.any(axis=1), 0] = True
    options = rng.integers(0, 4, gg.num_groups)
    assert_equal_to_one_device(run(program, gg, Strategy.from_cluster(cluster, placement, options), cluster, pool))


# ---------------------------------------------------------------------------------------------- plan = run
def test_executed_communication_is_the_compiled_plans(gpt2):
    """Every transfer and collective of the op-level TaskGraph is executed once, between the same devices,
    with the plan's bytes (whole rows here, so no rounding). One exception, counted: the compiler charges a
    use the largest of its edges, so a transfer carrying two outputs of a multi-output op (layer norm
    backward's weight and bias gradients) moves more than the plan says."""
    cluster = toy_cluster(3)
    gg = group_ops(gpt2.graph, num_groups=6, gpus=cluster)
    strategy = Strategy.from_cluster(cluster, [[1, 1, 0], [0, 1, 1], [1, 0, 1], [1, 1, 1], [0, 0, 1], [1, 1, 1]],
                                     ["allreduce", "ps", "model_parallel", "duplicate", "duplicate", "allreduce"])
    compiled = compile_strategy(gg, strategy, cluster, granularity="op")
    executed = {c[0]: c for rank in lower_plan(gpt2, compiled) for c in rank.communication()}
    tg = compiled.taskgraph
    planned = {}
    for t in range(tg.num_tasks):
        if tg.kind[t] == 1 and tg.nbytes[t] > 0:
            planned[t] = ("transfer", (int(tg.device[t]), int(tg.peer[t])), int(round(tg.nbytes[t])))
        elif tg.kind[t] == 2:
            members = tuple(sorted(int(d) for d in tg.members(t)))
            planned[t] = ("allreduce" if tg.collective[t] == 0 else "ps", members, int(round(tg.nbytes[t])))
    assert sorted(executed) == sorted(planned)
    several_outputs = 0
    for t, (kind, endpoints, nbytes) in planned.items():
        _, got_kind, got_endpoints, got_bytes, tensors = executed[t]
        assert (got_kind, tuple(got_endpoints)) == (kind, endpoints)
        if got_bytes != nbytes:
            several_outputs += 1
            assert tensors > 1 and got_bytes > nbytes
    assert several_outputs <= 2
    assert {c[1] for c in executed.values()} == {"transfer", "allreduce", "ps"}


# ---------------------------------------------------------------------------------------------- refusals
def test_batch_norm_and_dropout_are_named():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.5),
                                torch.nn.Linear(4, 1))
    program = build_program(model, (torch.randn(4, 4),), lambda out: out.square().mean(), name="bn")
    reasons = set(program.coupled.values())
    assert reasons == {"batch statistics", "random numbers"}
    assert batch_coupled_ops(program.graph) == program.coupled


def test_batch_coupled_plan_is_refused_unless_allowed(pool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8, track_running_stats=False),
                                torch.nn.Linear(8, 1))
    program = build_program(model, (torch.randn(4, 4),), lambda out: out.square().mean(), name="bn")
    cluster = toy_cluster(2)
    gg = GroupGraph.from_assignment(program.graph, np.zeros(program.graph.num_ops, dtype=np.int64), gpus=cluster)
    strategy = Strategy.data_parallel(1, cluster)
    with pytest.raises(ExecutionError, match="batch statistics.*--allow-batch-coupled"):
        run_strategy(program, gg, strategy, cluster, pool=pool)
    result = run_strategy(program, gg, strategy, cluster, steps=1, check=True, pool=pool, allow_batch_coupled=True)
    assert not result.check["applies"] and "batch-coupled" in result.check["reason"]


@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_rank_stops_the_run_and_is_named(uno, pool, how):
    cluster = toy_cluster(2)
    gg = group_ops(uno.graph, num_groups=4, gpus=cluster)
    strategy = Strategy.data_parallel(gg.num_groups, cluster)
    op = next(i for i, k in enumerate(uno.graph.kinds) if k == "aten.addmm.default")
    expected = "rank 1 failed at op" if how == "raise" else "rank 1 died"
    with pytest.raises(ExecutionError, match=expected):
        run_strategy(uno, gg, strategy, cluster, pool=pool, timeout_s=10, faults={"rank": 1, "op": op, "how": how})
    # the pool recovers: the next run works
    assert_equal_to_one_device(run(uno, gg, strategy, cluster, pool))


def test_a_replica_without_rows_is_refused(uno):
    cluster = toy_cluster(4)
    program = zoo_program("candle-uno", tiny=True, batch_size=2)
    gg = group_ops(program.graph, num_groups=4, gpus=cluster)
    with pytest.raises(ExecutionError, match="no whole row"):
        lower_plan(program, compile_strategy(gg, Strategy.data_parallel(gg.num_groups, cluster), cluster,
                                             granularity="op"))


# ---------------------------------------------------------------------------------------------- the command
def test_tag_run_command_checks_a_plan_file(tmp_path, capsys):
    """`tag run PLAN --check --json` on a plan file for the shipped toy cluster; bad input is one line, exit 2."""
    import json
    from pathlib import Path

    from tag.cli import main
    from tag.cluster import resolve_cluster
    from tag.strategy import make_plan, save_plan

    spec = str(Path(__file__).resolve().parents[1] / "examples" / "toy4.yaml")
    cluster = resolve_cluster(spec)
    program = zoo_program("candle-uno", tiny=True, batch_size=8)
    gg = group_ops(program.graph, num_groups=4, gpus=cluster)
    strategy = Strategy.from_cluster(cluster, [[1, 1, 0], [1, 1, 1], [0, 1, 1], [1, 0, 0]],
                                     ["allreduce", "ps", "model_parallel", "duplicate"])
    path = tmp_path / "plan.json"
    save_plan(make_plan(strategy, program.graph, cluster, assignment=gg.assignment), path)
    common = [str(path), "--model", "candle-uno", "--tiny", "--batch-size", "8", "--cluster", spec]
    assert main(["run", *common, "--check", "--json", "--steps", "2"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ranks"] == 4 and len(payload["losses"]) == 2 and payload["check"]["passed"]
    for extra, message in ((["--nproc", "3"], "4 devices"), (["--batch-size", "6"], "was made for model"),):
        args = [*common, *extra] if extra[0] != "--batch-size" else [*common[:4], *extra, *common[6:]]
        assert main(["run", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tag: error:") and message in err[0], err


# ---------------------------------------------------------------------------------------------- loss targets
USER_MODELS = '''
import torch
import torch.nn.functional as F
from torch import nn


def _parts():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 2, 1, 0, 2, 2, 1])
    return model, x, y


def with_targets():
    model, x, y = _parts()
    return model, (x,), lambda out, labels: F.cross_entropy(out, labels), (y,)


def captured_targets():
    model, x, y = _parts()
    return model, (x,), lambda out: F.cross_entropy(out, y)


def centred():
    """Outputs centred on their batch mean, the mean held constant: a batch-wide statistic in the loss."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    return model, (x,), lambda out: ((out - out.mean(0).detach()) ** 2).mean()
'''


def test_loss_targets_are_inputs_that_replicas_split(tmp_path, pool):
    """Labels returned beside the loss are an input of the step (their own rows on each replica); the same
    labels captured in the loss's closure are a batch-sized constant, named and refused."""
    from tag.execute.program import user_program

    source = tmp_path / "labelled.py"
    source.write_text(USER_MODELS)
    program = user_program(f"{source}:with_targets")
    labels = [op for op, r in enumerate(program.graph.args) if r.get("name") == "input:1"]
    assert labels and program.graph.batch_scaled[labels[0]] and not program.coupled
    cluster = toy_cluster(2, ("v100-16gb", "p100"))
    gg = group_ops(program.graph, num_groups=2, gpus=cluster)
    run(program, gg, Strategy.data_parallel(gg.num_groups, cluster, batch_split="speed"), cluster, pool)
    captured = user_program(f"{source}:captured_targets")
    assert "batch-sized tensor constant" in " ".join(captured.coupled.values())
    with pytest.raises(ExecutionError, match="allow-batch-coupled"):
        grouped = group_ops(captured.graph, num_groups=2, gpus=cluster)
        run_strategy(captured, grouped, Strategy.data_parallel(grouped.num_groups, cluster), cluster, pool=pool)


def test_sufficient_factor_broadcasting_runs_and_replaces_all_reduces(pool):
    """SFB (TAG §4.2.3) makes every replica compute a weight gradient on the whole batch from broadcast
    factors instead of all-reducing it: the run needs fewer collectives, more transfers, and is still the
    single-device step."""
    from tag.sfb import apply_sfb

    program = zoo_program("candle-uno", tiny=True, batch_size=4)
    cluster = build_cluster("slow", [Machine("v100-16gb", 1)] * 2, network_bandwidth=1e8)
    gg = group_ops(program.graph, num_groups=4, gpus=cluster)
    strategy = Strategy.data_parallel(gg.num_groups, cluster)
    sfb = apply_sfb(gg, strategy, cluster)
    assert sfb.duplicated_ops.size > 0
    plain = run(program, gg, strategy, cluster, pool)
    result = run(program, sfb.rewritten_group_graph(), strategy, cluster, pool)
    assert_equal_to_one_device(result)
    count = lambda r, kind: sum((c[1] == "transfer") == (kind == "transfer") for c in r.communication)  # noqa: E731
    assert count(result, "collective") < count(plain, "collective")
    assert count(result, "transfer") > count(plain, "transfer") == 0


def _program(rank: int, steps: list):
    from tag.execute.lower import RankProgram

    return RankProgram(rank, 2, {}, {}, steps, [], {})


def _item(op: int):
    from tag.execute.lower import Item

    return Item(op, op, "full", ((0, (2,), "torch.float32", 0, 0),))


def test_a_rank_waiting_on_a_message_sent_after_its_own_wait_is_a_deadlock():
    from tag.execute.fuse import deadlock_free
    from tag.execute.lower import Compute, Recv, Send

    crossed = [_program(0, [Recv(1, 1, (_item(1),)), Send(0, 1, (_item(0),))]),
               _program(1, [Recv(0, 0, (_item(0),)), Send(1, 0, (_item(1),))])]
    assert not deadlock_free(crossed)
    ordered = [_program(0, [Send(0, 1, (_item(0),)), Recv(1, 1, (_item(1),))]),
               _program(1, [Recv(0, 0, (_item(0),)), Compute(5, 1, {}), Send(1, 0, (_item(1),))])]
    assert deadlock_free(ordered)


def test_a_fusion_that_would_deadlock_is_not_made_and_a_safe_one_is():
    """Rank 0 sends t0, waits for t1 from rank 1, reads it, sends t2; rank 1 receives t0, reads it, sends t1,
    receives t2. Fusing t0 and t2 would move t0 after rank 0's wait for t1, which rank 1 sends only after
    reading t0."""
    from tag.execute.fuse import fuse_transfers
    from tag.execute.lower import Compute, Read, Recv, Send

    programs = [_program(0, [Send(0, 1, (_item(0),)), Recv(1, 1, (_item(1),)), Compute(5, 1, {1: Read("whole", 1)}),
                             Send(2, 1, (_item(2),))]),
                _program(1, [Recv(0, 0, (_item(0),)), Compute(6, 1, {0: Read("whole", 0)}), Send(1, 0, (_item(1),)),
                             Recv(2, 0, (_item(2),))])]
    assert fuse_transfers(programs, {0: "m0", 2: "m0"}) is programs
    reader = Compute(9, 1, {2: Read("whole", 2)})
    safe = [_program(0, [Send(0, 1, (_item(0),)), Compute(7, 1, {}), Send(2, 1, (_item(2),))]),
            _program(1, [Recv(0, 0, (_item(0),)), Compute(8, 1, {}), Recv(2, 0, (_item(2),)), reader])]
    fused = fuse_transfers(safe, {0: "m0", 2: "m0"})
    assert fused[0].steps == [Compute(7, 1, {}), Send(0, 1, (_item(0), _item(2)), 1)]  # sent when both are ready
    assert fused[1].steps == [Compute(8, 1, {}), Recv(0, 0, (_item(0), _item(2)), 1), reader]  # where first read


def test_a_message_packs_tensors_of_any_dtype_and_shape():
    from tag.execute.runtime import _pack, _packed_size, _unpack

    tensors = [torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([True, False, True]),
               torch.tensor(7, dtype=torch.int64), torch.zeros(0, 4), torch.arange(5, dtype=torch.float16)]
    specs = [(tuple(t.shape), t.dtype) for t in tensors]
    flat = _pack(tensors)
    assert flat.dtype == torch.uint8 and flat.numel() == _packed_size(specs) == 24 + 8 + 8 + 0 + 16
    for sent, got in zip(tensors, _unpack(flat.clone(), specs)):
        assert got.dtype == sent.dtype and got.shape == sent.shape and torch.equal(got, sent)
