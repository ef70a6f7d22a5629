"""Executed pipeline plans against the single-device step (gloo on the CPU, at most 4 processes, one pool)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from test_execute import assert_equal_to_one_device as equal_to_one_device
from test_execute import toy_cluster

from tag.cli import main
from tag.cluster import resolve_cluster
from tag.exact import plan_pipeline
from tag.exact.schedules import stage_order
from tag.execute import ExecutionError, lower_pipeline, run_pipeline, zoo_program
from tag.execute.fuse import deadlock_free
from tag.execute.lower import Send
from tag.execute.pipeline import choose_runtime, pipeline_view
from tag.execute.torch_pipeline import stage_jobs, torch_pipeline_reason
from tag.graphpipe import plan_graph_pipeline
from tag.graphpipe.scheduler import graph_stage_orders, stage_inflight
from tag.sim import TASK_TRANSFER
from tag.strategy import make_pipeline_plan


@pytest.fixture(scope="module")
def gpt2():
    return zoo_program("gpt2", tiny=True, batch_size=8)


@pytest.fixture(scope="module")
def uno():
    return zoo_program("candle-uno", tiny=True, batch_size=8)


def sequential(program, cluster, *, stages, replicas, micro_batches, schedule="1f1b", replica_counts=None,
               mapping=None):
    """A Parmesan plan of ``program`` as a plan file record (optionally with other replica counts)."""
    plan = plan_pipeline(program.graph, cluster, stages=stages, replicas=replicas, micro_batches=micro_batches,
                         schedule=schedule)
    sg = plan.stage_graph
    return plan, make_pipeline_plan(program.graph, cluster, partitioner=plan.partitioner, schedule=schedule,
                                    micro_batches=micro_batches, replicas=replica_counts or sg.replicas.tolist(),
                                    reference_gpu=sg.gpu_types[sg.reference_type].name,
                                    forward_assignment=sg.forward_assignment, mapping=mapping or plan.mapping)


def assert_equal_to_one_device(result):
    equal_to_one_device(result)
    assert result.check["passed"] and len(result.losses) == 2 and result.losses[1] < result.losses[0]


def expected_actions(order) -> list[str]:
    return [f"{a.kind}{a.micro_batch}" for a in order]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_two_stages_follow_the_schedule_and_equal_one_device(uno, pool, schedule):
    cluster = toy_cluster(2)
    _, record = sequential(uno, cluster, stages=2, replicas=1, micro_batches=4, schedule=schedule)
    lowered = lower_pipeline(uno, record, cluster)
    for s, (rank,) in enumerate(record.mapping):
        assert lowered.actions(rank, uno.graph) == expected_actions(stage_order(s, 2, 4, schedule))
    result = run_pipeline(uno, record, cluster, steps=2, check=True, pool=pool, runtime="tag")
    assert_equal_to_one_device(result)
    assert result.schedule == {"followed": True, "waits_on": [], "runtime": "tag"}
    assert sum(c[1] != "transfer" for c in result.communication) == 0  # one replica per stage: nothing to reduce


def test_a_batch_wide_loss_normaliser_is_named_when_it_stops_1f1b(gpt2, pool):
    """Cross-entropy divides by the count of counted targets over the whole batch, which no micro-batch's
    backward pass can know before every forward pass: the run is still exact, and says why it is not 1F1B."""
    cluster = toy_cluster(2)
    _, record = sequential(gpt2, cluster, stages=2, replicas=1, micro_batches=2)
    result = run_pipeline(gpt2, record, cluster, steps=2, check=True, pool=pool, runtime="auto")
    assert_equal_to_one_device(result)
    assert result.schedule["runtime"] == "tag" and not result.schedule["followed"]
    assert any("nll_loss_forward" in what for what in result.schedule["waits_on"])


def test_stage_replicas_sum_gradients_over_their_ranks(gpt2, pool):
    cluster = toy_cluster(4)
    _, record = sequential(gpt2, cluster, stages=2, replicas=2, micro_batches=2)
    result = run_pipeline(gpt2, record, cluster, steps=2, check=True, pool=pool, runtime="tag")
    assert_equal_to_one_device(result)
    reduced_over = {tuple(c[2]) for c in result.communication if c[1] == "allreduce"}
    assert reduced_over == {tuple(sorted(row)) for row in record.mapping}  # each stage over its own replicas


def test_unequal_replica_counts(uno, pool):
    cluster = toy_cluster(3)
    _, record = sequential(uno, cluster, stages=2, replicas=1, micro_batches=2, replica_counts=[1, 2],
                           mapping=[[0], [1, 2]])
    assert_equal_to_one_device(run_pipeline(uno, record, cluster, steps=2, check=True, pool=pool, runtime="tag"))


def test_graph_pipeline_of_a_branched_model(uno, pool):
    cluster = resolve_cluster("examples/toy4.yaml")
    plan = plan_graph_pipeline(uno.graph, cluster, micro_batches=2)
    sg = plan.stage_graph
    assert np.bincount(sg.edge_dst, minlength=sg.num_stages).max() > 1  # a stage joins two branches
    record = make_pipeline_plan(uno.graph, cluster, partitioner="graphpipe", schedule="1f1b", micro_batches=2,
                                replicas=sg.replicas.tolist(), reference_gpu=sg.gpu_types[sg.reference_type].name,
                                forward_assignment=sg.forward_assignment, mapping=plan.mapping,
                                links=sg.info.get("links", "data"))
    lowered = lower_pipeline(uno, record, cluster)
    orders = graph_stage_orders(stage_inflight(sg.num_stages, sg.edge_src, sg.edge_dst, micro_batches=2), 2)
    for s, row in enumerate(record.mapping):
        for rank in row:
            assert lowered.actions(rank, uno.graph) == expected_actions(orders[s])
    assert_equal_to_one_device(run_pipeline(uno, record, cluster, steps=2, check=True, pool=pool, runtime="tag"))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_torch_pipelining_runs_a_chain_and_equals_one_device(uno, pool, schedule):
    cluster = toy_cluster(2)
    _, record = sequential(uno, cluster, stages=2, replicas=1, micro_batches=4, schedule=schedule)
    result = run_pipeline(uno, record, cluster, steps=2, check=True, pool=pool, runtime="torch")
    assert_equal_to_one_device(result)
    assert result.schedule["runtime"] == "torch.distributed.pipelining"
    assert sum(c[1] == "transfer" for c in result.communication) == 8  # 4 micro-batches, forward and back


def test_torch_pipelining_stage_replicas_on_a_device_mesh_with_a_tied_weight(gpt2, pool):
    """gpt2's output layer reads the embedding of stage 0: it leaves stage 0 as an activation and its
    gradient comes back; each stage's two replicas average their gradients over the mesh's dp dimension.
    Its cross-entropy divides by the count of counted targets, the same in every micro-batch here, so
    torch's 1F1B is exact here (asked for: `auto` leaves such a loss to tag's runtime)."""
    cluster = toy_cluster(4)
    _, record = sequential(gpt2, cluster, stages=2, replicas=2, micro_batches=2)
    jobs = stage_jobs(gpt2, pipeline_view(gpt2, record, cluster))
    embedding = [op for op, key in jobs[0].params.items() if key == "token_embedding.weight"]
    assert embedding and (embedding[0], 0) in jobs[1].inputs  # passed from stage 0 to stage 1
    result = run_pipeline(gpt2, record, cluster, steps=2, check=True, pool=pool, runtime="torch")
    assert_equal_to_one_device(result)
    assert result.schedule["runtime"] == "torch.distributed.pipelining"
    assert {c[2] for c in result.communication if c[1] == "allreduce"} == {tuple(sorted(r)) for r in record.mapping}


def test_what_torch_pipelining_cannot_run_goes_to_tags_runtime(uno):
    cluster = toy_cluster(3)
    _, record = sequential(uno, cluster, stages=2, replicas=1, micro_batches=2, replica_counts=[1, 2],
                           mapping=[[0], [1, 2]])
    view = pipeline_view(uno, record, cluster)
    assert "unequal replica counts" in torch_pipeline_reason(uno, view, record.partitioner)
    with pytest.raises(ExecutionError, match="cannot run this plan"):
        run_pipeline(uno, record, cluster, runtime="torch")
    odd = zoo_program("candle-uno", tiny=True, batch_size=6)
    _, chain = sequential(odd, toy_cluster(2), stages=2, replicas=1, micro_batches=4)
    assert "equal micro-batches" in torch_pipeline_reason(odd, pipeline_view(odd, chain, toy_cluster(2)), "parmesan")


def executed_messages(lowered) -> list:
    return [c for p in lowered.programs for c in p.communication() if c[1] == "transfer"]


def test_executed_transfers_are_the_simulated_ones(uno):
    """Activation rows forward and their gradients back, once per micro-batch and stage edge: the same
    count and bytes as the pipeline simulator's transfer tasks."""
    cluster = toy_cluster(2)
    plan, record = sequential(uno, cluster, stages=2, replicas=1, micro_batches=2)
    tg = plan.taskgraph
    simulated = tg.kind == TASK_TRANSFER
    executed = executed_messages(lower_pipeline(uno, record, cluster))
    assert len(executed) == int(simulated.sum()) == 4
    assert sum(c[3] for c in executed) == pytest.approx(float(tg.nbytes[simulated].sum()))


def test_what_crosses_a_cut_for_one_micro_batch_is_one_message(gpt2):
    """gpt2's stage cut carries more than the activation: the causal mask and the tied embedding forward,
    the embedding's gradient partial back beside the activation's gradient. Fused per micro-batch and
    direction, the forward and backward messages are the simulator's transfer tasks; one more message, the
    tied embedding's optimizer values from stage 1 to stage 0, crosses after the backward pass (the
    pipeline simulator has no optimizer transfers)."""
    from tag.graph.opgraph import ROLE_OPTIMIZER

    cluster = toy_cluster(2)
    plan, record = sequential(gpt2, cluster, stages=2, replicas=1, micro_batches=2)
    simulated = int((plan.taskgraph.kind == TASK_TRANSFER).sum())
    fused, unfused = lower_pipeline(gpt2, record, cluster), lower_pipeline(gpt2, record, cluster, fuse=False)
    n = gpt2.graph.num_ops
    optimizer = {s.task for p in fused.programs for s in p.steps if isinstance(s, Send)
                 and all(gpt2.graph.role[item.op % n] == ROLE_OPTIMIZER for item in s.items)}
    executed = executed_messages(fused)
    assert simulated == 4 and len(optimizer) == 1
    assert len([c for c in executed if c[0] not in optimizer]) == simulated
    assert len(executed_messages(unfused)) == 10  # every tensor on its own
    assert sum(c[3] for c in executed) == sum(c[3] for c in executed_messages(unfused))  # the same bytes
    assert sum(c[4] for c in executed) == sum(c[4] for c in executed_messages(unfused))


def _plans_the_tests_run(uno, gpt2):
    toy4 = resolve_cluster("examples/toy4.yaml")
    graph_plan = plan_graph_pipeline(uno.graph, toy4, micro_batches=2)
    sg = graph_plan.stage_graph
    yield uno, toy4, make_pipeline_plan(uno.graph, toy4, partitioner="graphpipe", schedule="1f1b", micro_batches=2,
                                        replicas=sg.replicas.tolist(),
                                        reference_gpu=sg.gpu_types[sg.reference_type].name,
                                        forward_assignment=sg.forward_assignment, mapping=graph_plan.mapping,
                                        links=sg.info.get("links", "data"))
    for schedule in ("1f1b", "gpipe"):
        yield uno, toy_cluster(2), sequential(uno, toy_cluster(2), stages=2, replicas=1, micro_batches=4,
                                              schedule=schedule)[1]
        yield gpt2, toy_cluster(2), sequential(gpt2, toy_cluster(2), stages=2, replicas=1, micro_batches=4,
                                               schedule=schedule)[1]
    yield gpt2, toy_cluster(4), sequential(gpt2, toy_cluster(4), stages=2, replicas=2, micro_batches=2)[1]
    yield uno, toy_cluster(3), sequential(uno, toy_cluster(3), stages=2, replicas=1, micro_batches=2,
                                          replica_counts=[1, 2], mapping=[[0], [1, 2]])[1]


def test_fused_programs_of_every_tested_plan_run_to_the_end(uno, gpt2):
    """Every rank's instruction list played against the others (a send never waits, a receive waits for
    its message, a collective for all its members) gets through the step, fused as unfused; fusion sends
    no more messages and the same tensors."""
    fewer = 0
    for program, cluster, record in _plans_the_tests_run(uno, gpt2):
        fused, unfused = lower_pipeline(program, record, cluster), lower_pipeline(program, record, cluster, fuse=False)
        assert deadlock_free(unfused.programs) and deadlock_free(fused.programs)
        assert sum(c[4] for c in executed_messages(fused)) == sum(c[4] for c in executed_messages(unfused))
        assert len(executed_messages(fused)) <= len(executed_messages(unfused))
        fewer += len(executed_messages(fused)) < len(executed_messages(unfused))
        tags = [(p.rank, s.dst, s.tag) for p in fused.programs for s in p.steps if isinstance(s, Send)]
        assert len(set(tags)) == len(tags) or not any(tag for *_, tag in tags)  # tagged, or sent in order
    assert fewer >= 3


def test_too_many_micro_batches_for_the_batch_is_one_clear_error(uno):
    program = zoo_program("candle-uno", tiny=True, batch_size=2)
    cluster = toy_cluster(2)
    _, record = sequential(program, cluster, stages=2, replicas=1, micro_batches=2)
    bad = make_pipeline_plan(program.graph, cluster, partitioner=record.partitioner, schedule="1f1b",
                             micro_batches=2, replicas=[1, 1], reference_gpu=record.reference_gpu,
                             forward_assignment=record.forward_assignment, mapping=record.mapping)
    lowered = lower_pipeline(program, bad, cluster)  # 2 micro-batches of 1 row: fine
    assert len(lowered.programs) == 2
    wide = make_pipeline_plan(program.graph, toy_cluster(3), partitioner=record.partitioner, schedule="1f1b",
                              micro_batches=2, replicas=[1, 2], reference_gpu=record.reference_gpu,
                              forward_assignment=record.forward_assignment, mapping=[[0], [1, 2]])
    with pytest.raises(ExecutionError, match="no row"):
        lower_pipeline(program, wide, toy_cluster(3))


def test_cli_runs_a_pipeline_plan_file(tmp_path, capsys):
    plan = tmp_path / "pipe.json"
    common = ["--tiny", "--batch-size", "8", "--cluster", "examples/toy4.yaml"]
    assert main(["pipeline", "gpt2", *common, "--stages", "2", "--replicas", "2", "--micro-batches", "2",
                 "--out", str(plan), "--json"]) == 0
    capsys.readouterr()
    assert main(["run", str(plan), "--model", "gpt2", "--tiny", "--batch-size", "8", "--cluster",
                 "examples/toy4.yaml", "--check", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ranks"] == 4 and payload["check"]["passed"] and payload["check"]["applies"]
    assert payload["collectives"] > 0 and payload["transfers"] > 0


def test_cli_runs_the_plan_tag_plan_makes(tmp_path, capsys):
    """The user's path: `tag plan` searches a placement for a tiny transformer on the 4-device toy cluster,
    `tag run --check` executes it and matches one device."""
    plan = tmp_path / "plan.json"
    common = ["--tiny", "--batch-size", "8", "--cluster", "examples/toy4.yaml"]
    assert main(["plan", "gpt2", *common, "--family", "placement", "--num-groups", "8", "--budget", "30",
                 "--out", str(plan), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main(["run", str(plan), "--model", "gpt2", *common, "--check", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["ranks"] == 4 and payload["check"]["passed"] and payload["check"]["applies"]
    assert planned["files"]["plan"] == str(plan)


def test_torchrun_starts_the_ranks_and_rank_0_reports(tmp_path):
    """The multi-host path on one host: torchrun starts 2 processes of `python -m tag run`; each runs its
    rank, rank 0 gathers the reports and alone prints the result."""
    import os
    import subprocess
    import sys

    from tag.execute.launch import free_port

    spec = tmp_path / "two.yaml"
    spec.write_text("name: two\nnetwork: {bandwidth: 10Gbps}\nmachines:\n  - {gpu: v100-16gb}\n  - {gpu: t4}\n")
    plan = tmp_path / "pipe.json"
    common = ["--tiny", "--batch-size", "8", "--cluster", str(spec)]
    assert main(["pipeline", "candle-uno", *common, "--stages", "2", "--replicas", "1", "--micro-batches", "2",
                 "--out", str(plan), "--json"]) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), "-m", "tag", "run", str(plan), "--model", "candle-uno", *common,
                           "--runtime", "tag", "--check", "--json"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 0 only
    payload = json.loads(lines[0])
    assert payload["check"]["passed"] and payload["ranks"] == 2


def test_progress_is_reported_after_every_step(uno):
    cluster = toy_cluster(2)
    _, record = sequential(uno, cluster, stages=2, replicas=1, micro_batches=2)
    seen = []
    run_pipeline(uno, record, cluster, steps=3, runtime="tag", progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (3, 3)  # the launcher polls: a fast step can be seen together with the next
    assert [done for done, _ in seen] == sorted({done for done, _ in seen})


@pytest.mark.parametrize("runtime", ["torch", "tag"])
def test_loss_targets_reach_the_last_stage_micro_batch_by_micro_batch(tmp_path, pool, runtime):
    """Labels are a step input read by the last stage: on torch's runtime that stage slices each
    micro-batch's rows itself (they do not travel through the pipeline), on tag's they are rows like any."""
    from test_execute import USER_MODELS

    from tag.execute.program import user_program

    source = tmp_path / "labelled.py"
    source.write_text(USER_MODELS)
    program = user_program(f"{source}:with_targets")
    cluster = toy_cluster(4)
    _, record = sequential(program, cluster, stages=2, replicas=2, micro_batches=2)
    if runtime == "torch":
        jobs = stage_jobs(program, pipeline_view(program, record, cluster))
        assert [name for _, name in jobs[1].data] == ["input:1"] and len(jobs[1].inputs) == 1
    result = run_pipeline(program, record, cluster, steps=2, check=True, pool=pool, runtime=runtime)
    assert_equal_to_one_device(result)


def test_a_loss_with_a_batch_statistic_stays_exact_and_off_torchs_schedule(tmp_path, pool):
    """A loss centred on its batch mean: tag's runtime centres every micro-batch on the mean over all of
    them (1F1B and GPipe pass --check); torch's schedule would centre each micro-batch on its own mean, so
    `auto` does not take it, and asked for, it computes another step."""
    from test_execute import USER_MODELS

    from tag.execute.program import batch_statistics, user_program

    source = tmp_path / "centred.py"
    source.write_text(USER_MODELS)
    program = user_program(f"{source}:centred")
    assert [program.graph.kinds[op] for op in batch_statistics(program.graph)] == ["aten.mean.dim"]
    cluster = toy_cluster(2)
    for schedule in ("1f1b", "gpipe"):
        _, record = sequential(program, cluster, stages=2, replicas=1, micro_batches=2, schedule=schedule)
        assert choose_runtime(program, record, cluster)[0] == "tag"
        result = run_pipeline(program, record, cluster, steps=2, check=True, pool=pool)
        assert_equal_to_one_device(result)
        assert result.schedule["runtime"] == "tag"
    forced = run_pipeline(program, record, cluster, steps=2, check=True, pool=pool, runtime="torch")
    assert not forced.check["passed"] and forced.schedule["per_micro_batch"]


def test_one_micro_batch_per_rank_follows_the_schedule(uno):
    cluster = toy_cluster(3)
    _, record = sequential(uno, cluster, stages=2, replicas=1, micro_batches=1, replica_counts=[1, 2],
                           mapping=[[0], [1, 2]])
    lowered = lower_pipeline(uno, record, cluster)
    assert [lowered.actions(rank, uno.graph) for rank in range(3)] == [["F0", "B0"]] * 3
    assert lowered.schedule_report(uno.graph) == {"followed": True, "waits_on": []}
