"""Sequential pipelines with equal replicas on ``torch.distributed.pipelining``.

A pipeline plan whose stages form a chain, with the same number R of replicas per stage, a GPipe or
1F1B schedule and micro-batches of equal rows, is what torch's own pipelining runs: each rank builds one
``PipelineStage`` and the schedule the plan names (``ScheduleGPipe`` / ``Schedule1F1B``), and the stage's
replicas sum their gradients over the data-parallel dimension of a 2-D ``DeviceMesh`` (R × S, dims
``("dp", "pp")``: process ``r·S + s`` is replica r of stage s, and under NCCL it computes on the GPU of
the plan's device of that replica).

**Stage modules.** Each stage is an ``nn.Module`` that replays the recorded forward calls of its ops
(the program's records at the micro-batch's rows) on its own ``nn.Parameter``s; autograd differentiates
the replayed calls. The stage takes the values that cross into it and returns the values later stages
read (so a value read two stages on is passed through the stage between: torch's pipelining sends only to
the next stage); the data inputs enter at stage 0; a weight a later stage reads (a tied embedding) leaves
its stage as an activation, and its gradient comes back with the activation gradients. The last stage
returns the loss, which is the schedule's ``loss_fn``.

**Same step as one device.** Micro-batch losses are means over their rows, the schedule divides the
accumulated gradients by M (``scale_grads``) and the replicas average theirs, which is the gradient of
the batch mean when every micro-batch has the same rows and a loss normalised by its row count (true of
the zoo's losses; a cross-entropy with ignored targets normalises by their count instead, and ``--check``
would show it). The update is the traced step's own Adam (:mod:`tag.graph.tracer`), so ``--check`` holds
it against the single-device step like any other run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from tag.execute.launch import DEFAULT_TIMEOUT_S, WorkerPool, launch
from tag.execute.lower import ExecutionError, _dtype_size, _references
from tag.execute.pipeline import GRAPHPIPE, PipelineView
from tag.execute.program import Program, batch_statistics
from tag.execute.run import RunResult, compare_steps, reference_steps
from tag.graph.opgraph import ROLE_FORWARD

__all__ = ["torch_pipeline_reason", "StageJob", "stage_jobs", "TorchStageRuntime", "TORCH_SCHEDULES",
           "run_torch_pipeline"]

TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def torch_pipeline_reason(program: Program, view: PipelineView, partitioner: str) -> str | None:
    """Why torch's pipelining cannot run this plan (None when it can)."""
    sg = view.stage_graph
    replicas = {len(row) for row in view.mapping}
    if partitioner == GRAPHPIPE:
        return "a graph pipeline's stages run GraphPipe's own orders"
    if len(replicas) != 1:
        return f"stages have unequal replica counts {[len(row) for row in view.mapping]}"
    if view.schedule not in TORCH_SCHEDULES:
        return f"schedule {view.schedule!r}"
    edges = set(zip(sg.edge_src.tolist(), sg.edge_dst.tolist()))
    if any(b <= a for a, b in edges):
        return "a stage feeds an earlier stage"
    rows = program.batch_size / (replicas.pop() * view.micro_batches)
    if rows != int(rows):
        return f"a batch of {program.batch_size} does not split into equal micro-batches"
    graph = program.graph
    loss = graph.meta["outputs"]["loss"]
    if not isinstance(loss, dict) or "ref" not in loss or sg.assignment[int(loss["ref"])] != sg.num_stages - 1:
        return "the loss is not computed by the last stage"
    for op, record in enumerate(graph.args):
        if record.get("target") == "placeholder" and record.get("name", "").startswith("input:") \
                and graph.batch_scaled[op] and program.batch_dim(op, 0) not in (None,) \
                and program.batch_dim(op, 0)[0] != 0:
            return f"input {record['name']} holds its batch in dim {program.batch_dim(op, 0)[0]}, not 0"
    return None


@dataclass
class StageJob:
    """What one process of a torch pipeline runs (picklable; :class:`TorchStageRuntime` runs it)."""

    rank: int
    stage: int
    replica: int
    num_stages: int
    replicas: int
    micro_batches: int
    schedule: str
    records: dict  # op -> argument record at the micro-batch's rows
    ops: list  # the stage's forward ops, in order
    inputs: list  # [(op, out)] the values the stage takes, in order
    outputs: list  # [(op, out)] the values it returns (the last stage: the loss reference)
    params: dict  # op -> parameter key (its placeholder is "parameter:KEY")
    constants: dict  # op -> placeholder name (buffers, read as they are)
    data: list  # [(op, placeholder name)] data inputs: stage 0 takes them all (``inputs``), a later stage
    # slices the micro-batch's rows of those it reads itself (labels do not travel through the pipeline)
    rows: tuple  # rows [lo, hi) of the batch this replica takes
    loss: dict | None = None  # the last stage: the loss reference
    device: int = -1  # the plan's device of this replica
    keys: list = field(default_factory=list)  # parameter keys of the stage, in order

    def make_runtime(self, tensors: dict, device: torch.device | None = None) -> TorchStageRuntime:
        return TorchStageRuntime(self, tensors, device or torch.device("cpu"))


def _forward_ops(program: Program, stage_of: np.ndarray) -> list[list[int]]:
    graph = program.graph
    ops: list[list[int]] = [[] for _ in range(int(stage_of.max()) + 1)]
    for op in graph.topological_order().tolist():
        if graph.role[op] == ROLE_FORWARD and graph.args[op].get("target") not in ("placeholder", "get_attr"):
            ops[int(stage_of[op])].append(op)
    return ops


def stage_jobs(program: Program, view: PipelineView) -> list[StageJob]:
    """One job per process (``r·S + s``) of the plan (module docstring)."""
    graph, sg = program.graph, view.stage_graph
    stages, replicas, micro = sg.num_stages, len(view.mapping[0]), view.micro_batches
    rows = program.batch_size // (replicas * micro)
    records = program.at(rows)
    stage_of = np.asarray(sg.assignment, dtype=np.int64)
    ops = _forward_ops(program, stage_of)
    names = {op: r.get("name", "") for op, r in enumerate(graph.args) if r.get("target") in ("placeholder", "get_attr")}
    data = [op for op, name in sorted(names.items()) if name.startswith("input:")]
    reads = [sorted({ref for op in stage_ops for ref in _references([records[op]["args"], records[op]["kwargs"]])})
             for stage_ops in ops]
    loss = graph.meta["outputs"]["loss"]
    made = [set(stage_ops) for stage_ops in ops]
    owned_params = [{p for p, _ in reads[s] if names.get(p, "").startswith("parameter:") and stage_of[p] == s}
                    for s in range(stages)]
    crossing = []  # crossing[s]: what enters stage s
    for s in range(stages):
        later = {ref for t in range(s, stages) for ref in reads[t]} | ({(int(loss["ref"]), int(loss["out"]))})
        before = set().union(*made[:s], *owned_params[:s]) if s else set()
        entering = sorted(ref for ref in later if ref[0] in before)  # data inputs are sliced where read
        crossing.append(entering if s else [(op, 0) for op in data])
    jobs = []
    for r in range(replicas):
        lo = r * program.batch_size // replicas
        for s in range(stages):
            outputs = crossing[s + 1] if s + 1 < stages else [(int(loss["ref"]), int(loss["out"]))]
            params = {p: names[p].partition(":")[2] for p in sorted(owned_params[s])
                      if names[p].startswith("parameter:")}
            constants = {p: names[p] for p, _ in reads[s] if names.get(p, "").startswith("buffer:")}
            jobs.append(StageJob(rank=r * stages + s, stage=s, replica=r, num_stages=stages, replicas=replicas,
                                 micro_batches=micro, schedule=view.schedule,
                                 records={op: records[op] for op in ops[s]}, ops=ops[s], inputs=crossing[s],
                                 outputs=outputs, params=params, constants=constants,
                                 data=[(op, names[op]) for op in data] if s == 0 else
                                 [(op, names[op]) for op in data if any(ref[0] == op for ref in reads[s])],
                                 rows=(lo, lo + program.batch_size // replicas),
                                 loss=loss if s == stages - 1 else None, device=view.mapping[s][r],
                                 keys=list(params.values())))
    return jobs


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose gradient is made contiguous: the gradient of a stage input is sent back to the previous
    stage as it is laid out, and a transposed one cannot be received into a plain buffer."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _contiguous_grad(x):
    return _ContiguousGrad.apply(x) if isinstance(x, torch.Tensor) and x.requires_grad else x


class _StageModule(nn.Module):
    """One stage's forward calls replayed on its own parameters."""

    def __init__(self, job: StageJob, tensors: dict, device: torch.device) -> None:
        super().__init__()
        self.job, self.device = job, device
        self.weights = nn.ParameterList([nn.Parameter(tensors[f"parameter:{key}"].detach().to(device, copy=True))
                                         for key in job.keys])
        self.param_index = {op: k for k, op in enumerate(job.params)}
        self.constants = {op: tensors[name].to(device) for op, name in job.constants.items()}
        lo, hi = job.rows
        self.local = {op: tensors[name][lo:hi].to(device) for op, name in job.data} if job.stage else {}
        self.micro_batch = 0  # set by _Stage before each forward pass (shape inference keeps the last)

    def forward(self, *args: torch.Tensor):
        from tag.execute.runtime import call_record, decode

        given = dict(zip(self.job.inputs, (_contiguous_grad(a) for a in args)))
        if self.local:
            rows, m = (self.job.rows[1] - self.job.rows[0]) // self.job.micro_batches, self.micro_batch
            given.update({(op, 0): value[m * rows:(m + 1) * rows] for op, value in self.local.items()})
        values: dict[int, Any] = {}

        def resolve(p: int, out: int):
            if (p, out) in given:
                return given[(p, out)]
            if p in self.param_index:
                return self.weights[self.param_index[p]]
            if p in self.constants:
                return self.constants[p]
            value = values[p]
            return value[out] if isinstance(value, (tuple, list)) else value

        for op in self.job.ops:
            values[op] = call_record(self.job.records[op], resolve, self.device)
        if self.job.loss is not None:
            return decode(self.job.loss, resolve, self.device)
        return tuple(resolve(p, out).contiguous() for p, out in self.job.outputs)  # sent as they are laid out


def _stage_class():
    """``PipelineStage`` that tells its module which micro-batch a forward pass is for (a later stage slices
    that micro-batch's rows of the data inputs it reads)."""
    from torch.distributed.pipelining import PipelineStage

    class _Stage(PipelineStage):
        def forward_one_chunk(self, fwd_chunk_id: int, *args, **kwargs):
            self.submod.micro_batch = fwd_chunk_id
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    return _Stage


class TorchStageRuntime:
    """Runs a :class:`StageJob` step after step (the rank runtime's interface: step, carry, describe)."""

    def __init__(self, job: StageJob, tensors: dict, device: torch.device) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

        self.job = job
        self.current = "start-up"
        mesh = init_device_mesh(device.type, (job.replicas, job.num_stages), mesh_dim_names=("dp", "pp"))
        self.dp_group = mesh["dp"].get_group()
        self.module = _StageModule(job, tensors, device)
        stage = _stage_class()(self.module, job.stage, job.num_stages, device, group=mesh["pp"].get_group())
        schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[job.schedule]
        self.schedule = schedule(stage, n_microbatches=job.micro_batches, loss_fn=lambda out, target: out,
                                 scale_grads=True)
        lo, hi = job.rows
        self.data = [tensors[name][lo:hi].to(device) for _, name in job.data]
        self.target = torch.zeros(hi - lo, device=device)
        self.exp_avg = [tensors[f"exp_avg:{key}"].to(device, copy=True) for key in job.keys]
        self.exp_avg_sq = [tensors[f"exp_avg_sq:{key}"].to(device, copy=True) for key in job.keys]

    def step(self) -> dict[str, torch.Tensor]:
        import torch.distributed as dist

        from tag.graph.tracer import _adam_update  # the traced step's own update (step count 1, see tracer)

        job = self.job
        for p in self.module.weights:
            p.grad = None
        self.current = f"the {job.schedule} schedule of stage {job.stage}"
        losses: list = []
        last = job.stage == job.num_stages - 1
        args = self.data if job.stage == 0 else []
        kwargs = {"target": self.target, "losses": losses, "return_outputs": False} if last else {}
        self.schedule.step(*args, **kwargs)
        self.current = f"the gradient all-reduce of stage {job.stage}"
        out: dict[str, torch.Tensor] = {}
        for key, p in zip(job.keys, self.module.weights):
            grad = p.grad if p.grad is not None else torch.zeros_like(p)
            if job.replicas > 1:
                dist.all_reduce(grad, group=self.dp_group)
                grad = grad / job.replicas
            out[f"grads:{key}"] = grad.detach().clone()  # moved to the CPU below, after the update
        self.current = f"the optimizer of stage {job.stage}"
        with torch.no_grad():
            for k, (key, p) in enumerate(zip(job.keys, self.module.weights)):
                new, self.exp_avg[k], self.exp_avg_sq[k] = _adam_update(p.detach(), out[f"grads:{key}"],
                                                                          self.exp_avg[k], self.exp_avg_sq[k])
                p.copy_(new)
                out[f"params:{key}"] = new.detach().clone()
        if last:
            loss = torch.stack([x.detach() for x in losses]).mean()
            if job.replicas > 1:
                dist.all_reduce(loss, group=self.dp_group)
                loss = loss / job.replicas
            out["loss:loss"] = loss
        self.current = None
        return {name: value.to("cpu") for name, value in out.items()}

    def carry(self) -> None:
        """Parameters and optimizer states stay in the module between steps."""

    def describe(self) -> str:
        return self.current or "between steps"


def combine_stage_reports(reports: list[dict], step: int) -> dict[str, torch.Tensor]:
    """name → value from replica 0 of every stage (the replicas agree: they all-reduced)."""
    combined: dict[str, torch.Tensor] = {}
    for report in reports:
        for name, value in report["results"][step].items():
            combined.setdefault(name, value)
    if "loss:loss" not in combined:
        raise ExecutionError("no stage reported the loss")
    if not math.isfinite(float(combined["loss:loss"])):
        raise ExecutionError("the loss is not finite")
    return combined


def _communication(program: Program, jobs: list[StageJob]) -> list[tuple]:
    """(task, kind, endpoints, bytes, tensors) of one step as torch's schedule runs it, endpoints as the
    plan's devices: every value a stage returns goes to the next stage once per micro-batch, its gradient
    (floating values) comes back, and each stage's replicas all-reduce its gradients. Counted from the
    stage modules' outputs, not observed."""
    rows = program.batch_size // (jobs[0].replicas * jobs[0].micro_batches)
    out = []
    for job in jobs:
        if job.loss is None:
            specs = [program.spec(p, k, rows) for p, k in job.outputs]
            nbytes = sum(int(np.prod(shape)) * _dtype_size(dtype) for shape, dtype in specs)
            grads = sum(int(np.prod(shape)) * _dtype_size(dtype) for shape, dtype in specs if "float" in dtype)
            peer = jobs[job.rank + 1].device
            for _ in range(job.micro_batches):
                out.append((-1, "transfer", (job.device, peer), nbytes, len(specs)))
                if grads:
                    out.append((-1, "transfer", (peer, job.device), grads, len(specs)))
        if job.replicas > 1 and job.replica == 0:
            members = tuple(sorted(jobs[r * job.num_stages + job.stage].device for r in range(job.replicas)))
            nbytes = sum(int(np.prod(shape)) * _dtype_size(dtype)
                         for shape, dtype in (program.spec(p, 0, rows) for p in job.params))
            out.append((-1, "allreduce", members, nbytes, len(job.params)))
    return out


def run_torch_pipeline(program: Program, view: PipelineView, *, steps: int = 2, check: bool = False,
                       backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S, pool: WorkerPool | None = None,
                       port: int | None = None, progress=None) -> RunResult | None:
    """Run the pipeline of ``view`` on torch's pipelining, one process per stage replica (module docstring)."""
    jobs = stage_jobs(program, view)
    reports = launch(jobs, program.tensors, steps=steps, backend=backend, port=port, timeout_s=timeout_s, pool=pool,
                     progress=progress)
    if reports is None:
        return None  # a torchrun rank other than 0: rank 0 reports
    values = [combine_stage_reports(reports, k) for k in range(steps)]
    per_micro_batch = [program.graph.names[op] for op in batch_statistics(program.graph)]
    result = RunResult(losses=[float(v["loss:loss"]) for v in values],
                       step_times_s=[[r["times"][k] for r in reports] for k in range(steps)],
                       communication=_communication(program, jobs), values=values,
                       schedule={"followed": True, "waits_on": [], "runtime": "torch.distributed.pipelining",
                                 "per_micro_batch": per_micro_batch})
    if check:
        result.check = compare_steps(values, reference_steps(program, steps), {})
    return result
