"""Pipeline plan files: S stages × R replicas cut from a model and placed on a cluster's devices.

Layout (the plan-file header of :mod:`tag.strategy.plan`, kind ``"pipeline"``)::

    {"format": "tag.plan", "schema_version": 1, "kind": "pipeline",
     "model": {"name": "bert-large", "fingerprint": "<sha256 hex>"},
     "cluster": {"name": "two-level", "fingerprint": "<sha256 hex>", "num_devices": 16},
     "pipeline": {"partitioner": "parmesan", "schedule": "1f1b", "micro_batches": 8,
                  "replicas": [2, 2, 2, 2], "reference_gpu": "titan-v",
                  "forward_assignment": [0, 0, 1, ...], "mapping": [[0, 1], [2, 3], ...],
                  "links": "data"},
     "summary": {...}}

- ``forward_assignment`` [F]: the stage of every forward op of the model's forward view
  (:class:`tag.exact.ForwardGraph`, in its node order); every other op follows its owner, so this
  and the model rebuild the whole StageGraph.
- ``replicas`` [S] and ``mapping`` [S][R_s]: device ids of each stage's replicas (row s is its ring).
- ``reference_gpu``: the GPU type the stage times of the summary were taken on.
- ``links``: ``"data"`` (stages send activations directly) or ``"chain"`` (a sequential runtime:
  stage s sends to s + 1 only); :mod:`tag.exact.stage_graph`, Links. Absent means ``"data"``.

Fingerprints are identity, as for strategy plans: a plan for another model or cluster is a
:class:`PlanMismatchError`; any other problem a :class:`PlanError` naming the field. Written atomically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tag._atomic import atomic_write_text
from tag._schema import check_header
from tag.cluster import Cluster
from tag.graph import OpGraph
from tag.strategy.errors import PlanError
from tag.strategy.fingerprint import graph_fingerprint
from tag.strategy.plan import (PLAN_FORMAT, PLAN_SCHEMA_VERSION, _dumps, _field, _int_list, _jsonable,
                                check_fingerprints, read_plan_document)

__all__ = [
    "PIPELINE_KIND",
    "PipelinePlanFile",
    "make_pipeline_plan",
    "check_pipeline_plan",
    "pipeline_plan_to_json",
    "pipeline_plan_from_json",
    "save_pipeline_plan",
    "load_pipeline_plan",
    "plan_kind",
]

PIPELINE_KIND = "pipeline"
# stage edges of a pipeline (tag.exact.stage_graph, Links): direct data edges, or a sequential chain
LINKS = ("data", "chain")
MAX_MICRO_BATCHES = 4096  # far past any useful pipeline; the task graph grows with S x M


@dataclass(frozen=True, eq=False)
class PipelinePlanFile:
    """A pipeline plan and the model and cluster it was made for."""

    model_name: str
    model_fingerprint: str
    cluster_name: str
    cluster_fingerprint: str
    num_devices: int  # D of the cluster
    partitioner: str
    schedule: str
    micro_batches: int  # M
    replicas: tuple[int, ...]  # [S]
    reference_gpu: str
    forward_assignment: np.ndarray  # [F] int64 stage of each forward op
    mapping: tuple[tuple[int, ...], ...]  # [S][R_s] device ids
    summary: dict[str, Any] = field(default_factory=dict)
    links: str = "data"  # stage edges: "data" or "chain"

    def __post_init__(self) -> None:
        assignment = np.asarray(self.forward_assignment, dtype=np.int64).reshape(-1)
        assignment.setflags(write=False)
        object.__setattr__(self, "forward_assignment", assignment)
        object.__setattr__(self, "replicas", tuple(int(r) for r in self.replicas))
        object.__setattr__(self, "mapping", tuple(tuple(int(d) for d in row) for row in self.mapping))
        _check_layout(self.num_devices, self.micro_batches, self.replicas, self.mapping, assignment)
        if self.links not in LINKS:
            raise PlanError(f"pipeline plan: pipeline.links must be one of {', '.join(LINKS)}, got {self.links!r}")

    @property
    def num_stages(self) -> int:
        return len(self.replicas)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PipelinePlanFile):
            return NotImplemented
        return pipeline_plan_to_json(self) == pipeline_plan_to_json(other)

    __hash__ = None  # the summary is a mutable dict


def _check_layout(num_devices: int, micro_batches: int, replicas: Sequence[int], mapping: Sequence[Sequence[int]],
                  assignment: np.ndarray, where: str = "pipeline plan") -> None:
    """PlanError unless stages, replicas, mapping and assignment agree."""
    num_stages = len(replicas)
    if not 1 <= micro_batches <= MAX_MICRO_BATCHES:
        raise PlanError(f"{where}: pipeline.micro_batches must be in 1..{MAX_MICRO_BATCHES}, got {micro_batches}")
    if not replicas or min(replicas) < 1:
        raise PlanError(f"{where}: pipeline.replicas must list a positive count per stage, got {list(replicas)}")
    if len(mapping) != num_stages:
        raise PlanError(f"{where}: pipeline.mapping has {len(mapping)} rows for {num_stages} stages")
    for s, row in enumerate(mapping):
        if len(row) != replicas[s]:
            raise PlanError(f"{where}: pipeline.mapping[{s}] has {len(row)} devices for {replicas[s]} replicas")
    flat = [d for row in mapping for d in row]
    bad = [d for d in flat if not 0 <= d < num_devices]
    if bad:
        raise PlanError(f"{where}: pipeline.mapping uses device {bad[0]}; the cluster has devices 0..{num_devices - 1}")
    if len(set(flat)) != len(flat):
        values, counts = np.unique(flat, return_counts=True)
        raise PlanError(f"{where}: pipeline.mapping places two stage replicas on device {int(values[counts > 1][0])}")
    if assignment.size == 0:
        raise PlanError(f"{where}: pipeline.forward_assignment is empty")
    if assignment.min() < 0 or assignment.max() >= num_stages:
        raise PlanError(f"{where}: pipeline.forward_assignment holds stage ids outside 0..{num_stages - 1}")
    counts = np.bincount(assignment, minlength=num_stages)
    if (counts == 0).any():
        raise PlanError(f"{where}: pipeline.forward_assignment gives stage {int(np.argmax(counts == 0))} no forward op")


def make_pipeline_plan(graph: OpGraph, cluster: Cluster, *, partitioner: str, schedule: str, micro_batches: int,
                       replicas: Sequence[int], reference_gpu: str, forward_assignment: Sequence[int] | np.ndarray,
                       mapping: Sequence[Sequence[int]], summary: dict[str, Any] | None = None,
                       model_name: str | None = None, links: str = "data") -> PipelinePlanFile:
    """A pipeline plan for ``graph`` (the op-level graph that was partitioned) on ``cluster``."""
    return PipelinePlanFile(
        model_name=model_name or str(graph.meta.get("model", "model")),
        model_fingerprint=graph_fingerprint(graph),
        cluster_name=cluster.name,
        cluster_fingerprint=cluster.fingerprint(),
        num_devices=cluster.num_devices,
        partitioner=partitioner,
        schedule=schedule,
        micro_batches=int(micro_batches),
        replicas=tuple(int(r) for r in replicas),
        reference_gpu=reference_gpu,
        forward_assignment=np.asarray(forward_assignment, dtype=np.int64),
        mapping=tuple(tuple(int(d) for d in row) for row in mapping),
        summary=dict(summary or {}),
        links=links,
    )


def check_pipeline_plan(plan: PipelinePlanFile, *, graph: OpGraph | None = None, cluster: Cluster | None = None,
                        where: str = "plan") -> None:
    """PlanMismatchError unless ``plan`` was made for ``graph`` and ``cluster`` (each checked when given);
    PlanError when its micro-batches do not fit the graph's batch or its reference GPU is not the cluster's."""
    check_fingerprints(plan, graph=graph, cluster=cluster, where=where)
    # `tag pipeline` refuses these too: each replica's micro-batch needs a sample (GraphPipe: each micro-batch)
    widest = 1 if plan.partitioner == "graphpipe" else max(plan.replicas)
    if graph is not None and plan.micro_batches * widest > graph.batch_size:
        raise PlanError(f"{where}: pipeline.micro_batches {plan.micro_batches} x {widest} replicas exceed the "
                        f"batch of {graph.batch_size} samples")
    if cluster is not None and plan.num_devices != cluster.num_devices:
        raise PlanError(f"{where}: cluster.num_devices is {plan.num_devices}; the cluster has {cluster.num_devices}")
    if cluster is not None and plan.reference_gpu not in {gpu.name for gpu in cluster.types}:
        raise PlanError(f"{where}: pipeline.reference_gpu {plan.reference_gpu!r} is not a GPU type of the cluster "
                        f"({', '.join(gpu.name for gpu in cluster.types)})")


# --------------------------------------------------------------------------------------- JSON


def pipeline_plan_to_json(plan: PipelinePlanFile) -> dict[str, Any]:
    return {
        "format": PLAN_FORMAT,
        "schema_version": PLAN_SCHEMA_VERSION,
        "kind": PIPELINE_KIND,
        "model": {"name": plan.model_name, "fingerprint": plan.model_fingerprint},
        "cluster": {"name": plan.cluster_name, "fingerprint": plan.cluster_fingerprint,
                    "num_devices": plan.num_devices},
        "pipeline": {
            "partitioner": plan.partitioner,
            "schedule": plan.schedule,
            "micro_batches": plan.micro_batches,
            "replicas": list(plan.replicas),
            "reference_gpu": plan.reference_gpu,
            "forward_assignment": plan.forward_assignment.tolist(),
            "mapping": [list(row) for row in plan.mapping],
            "links": plan.links,
        },
        "summary": _jsonable(plan.summary),
    }


def pipeline_plan_from_json(doc: Any, *, where: str = "plan") -> PipelinePlanFile:
    """Validate a decoded pipeline plan document; PlanError names the first bad field."""
    check_header(doc, fmt=PLAN_FORMAT, version=PLAN_SCHEMA_VERSION, where=where, error=PlanError)
    kind = _field(doc, "kind", str, where)
    if kind != PIPELINE_KIND:
        raise PlanError(f"{where}: field 'kind' is {kind!r}; expected {PIPELINE_KIND!r}")
    model = _field(doc, "model", dict, where)
    cluster = _field(doc, "cluster", dict, where)
    section = _field(doc, "pipeline", dict, where)
    mapping = _field(section, "mapping", list, where, "pipeline.")
    rows = []
    for s, row in enumerate(mapping):
        if not isinstance(row, list):
            raise PlanError(f"{where}: pipeline.mapping[{s}] must be a list of device ids")
        rows.append(_int_list(row, f"pipeline.mapping[{s}]", where).tolist())
    summary = doc.get("summary", {})
    if not isinstance(summary, dict):
        raise PlanError(f"{where}: field 'summary' must be an object, got {type(summary).__name__}")
    values = dict(
        model_name=_field(model, "name", str, where, "model."),
        model_fingerprint=_field(model, "fingerprint", str, where, "model."),
        cluster_name=_field(cluster, "name", str, where, "cluster."),
        cluster_fingerprint=_field(cluster, "fingerprint", str, where, "cluster."),
        num_devices=_field(cluster, "num_devices", int, where, "cluster."),
        partitioner=_field(section, "partitioner", str, where, "pipeline."),
        schedule=_field(section, "schedule", str, where, "pipeline."),
        micro_batches=_field(section, "micro_batches", int, where, "pipeline."),
        replicas=tuple(_int_list(_field(section, "replicas", list, where, "pipeline."), "pipeline.replicas",
                                 where).tolist()),
        reference_gpu=_field(section, "reference_gpu", str, where, "pipeline."),
        forward_assignment=_int_list(_field(section, "forward_assignment", list, where, "pipeline."),
                                     "pipeline.forward_assignment", where),
        mapping=tuple(tuple(row) for row in rows),
        summary=summary,
        links=section.get("links", "data"),
    )
    if values["links"] not in LINKS:
        raise PlanError(f"{where}: pipeline.links must be one of {', '.join(LINKS)}, got {values['links']!r}")
    _check_layout(values["num_devices"], values["micro_batches"], values["replicas"], values["mapping"],
                  values["forward_assignment"], where)
    return PipelinePlanFile(**values)


def save_pipeline_plan(plan: PipelinePlanFile, path: str | os.PathLike) -> None:
    """Write ``plan`` to ``path`` as JSON, atomically."""
    if not isinstance(plan, PipelinePlanFile):
        raise TypeError(f"save_pipeline_plan(plan, path): expected a PipelinePlanFile, got {type(plan).__name__}")
    atomic_write_text(path, _dumps(pipeline_plan_to_json(plan)))


def load_pipeline_plan(path: str | os.PathLike, *, graph: OpGraph | None = None,
                       cluster: Cluster | None = None) -> PipelinePlanFile:
    """Read and validate a pipeline plan file; with ``graph``/``cluster``, also check it was made for them."""
    path = Path(path)
    plan = pipeline_plan_from_json(read_plan_document(path), where=str(path))
    check_pipeline_plan(plan, graph=graph, cluster=cluster, where=str(path))
    return plan


def plan_kind(path: str | os.PathLike) -> str | None:
    """The ``kind`` of a plan file ("strategy", "pipeline"), or None when the file cannot tell (missing,
    not JSON, no kind): the loaders then say what is wrong."""
    try:
        doc = read_plan_document(path)
    except PlanError:
        return None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    return kind if isinstance(kind, str) else None
