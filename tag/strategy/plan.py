"""Plan files: a strategy with what it was made for (model, cluster, grouping) and free-form results.

Layout (schema_version 1)::

    {"format": "tag.plan", "schema_version": 1, "kind": "strategy",
     "model": {"name": "resnet50", "fingerprint": "<sha256 hex>"},
     "cluster": {"name": "tag-testbed", "fingerprint": "<sha256 hex>", "device_group": [0, 0, 1, ...]},
     "grouping": {"num_groups": 60, "assignment": [...], "fingerprint": "<sha256 hex>"},
     "strategy": {"placement": [[1, 0, ...], ...], "option": ["allreduce", ...], "batch_split": "even"},
     "summary": {...}}

- ``model.fingerprint`` is :func:`~tag.strategy.fingerprint.graph_fingerprint` of the op-level graph that
  was planned; ``cluster.fingerprint`` is :meth:`Cluster.fingerprint`. Names are labels, fingerprints are
  identity.
- ``cluster.device_group`` [D] is the cluster's device grouping: the cluster fingerprint leaves it out,
  and the placement's columns mean nothing without it.
- ``grouping.assignment`` [N] (op → op group) and ``grouping.fingerprint`` are each optional; when both are
  written they agree. ``num_groups`` is G, the number of placement rows.
- ``placement`` rows are 0/1 (``true``/``false`` is read too); options are names from ``OPTIONS``.
  A single-device row is normalised on load like any :class:`Strategy`.
- ``summary`` is free-form JSON (iteration time, speed-up, ...); numpy values are written as plain
  numbers and non-finite floats as ``null``.

Every problem on load is a :class:`PlanError` naming the field; a plan for another model, cluster or
grouping is a :class:`PlanMismatchError`. Files are written atomically.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tag._atomic import atomic_write_text
from tag._read import parse_json, read_input
from tag._schema import check_header
from tag.cluster import Cluster
from tag.graph import OpGraph
from tag.strategy.errors import PlanError, PlanMismatchError, StrategyError
from tag.strategy.fingerprint import graph_fingerprint, grouping_fingerprint
from tag.strategy.strategy import OPTIONS, Strategy, device_group_sizes

__all__ = [
    "PLAN_FORMAT",
    "PLAN_SCHEMA_VERSION",
    "Plan",
    "make_plan",
    "check_plan",
    "plan_to_json",
    "plan_from_json",
    "save_plan",
    "load_plan",
]

PLAN_FORMAT = "tag.plan"
PLAN_SCHEMA_VERSION = 1
_KINDS = ("strategy",)  # pipeline plans will add their own kind
_FINGERPRINT_SHOWN = 12  # hex digits of a fingerprint quoted in messages


@dataclass(frozen=True, eq=False)
class Plan:
    """A strategy and the model, cluster and grouping it was made for."""

    strategy: Strategy
    model_name: str
    model_fingerprint: str
    cluster_name: str
    cluster_fingerprint: str
    device_group: np.ndarray  # [D] int64, the cluster's device group of each device
    assignment: np.ndarray | None = None  # [N] int64 op -> op group, when known
    grouping_fingerprint: str | None = None  # of ``assignment``; computed from it when not given
    summary: dict[str, Any] = field(default_factory=dict)
    kind: str = "strategy"

    def __post_init__(self) -> None:
        device_group = np.asarray(self.device_group, dtype=np.int64).reshape(-1)
        device_group.setflags(write=False)
        object.__setattr__(self, "device_group", device_group)
        sizes = np.bincount(device_group) if device_group.size and device_group.min() >= 0 else np.zeros(0, np.int64)
        if not np.array_equal(sizes, self.strategy.device_group_sizes):
            raise StrategyError(
                f"the strategy is for device groups of {self.strategy.device_group_sizes.tolist()} devices, but "
                f"device_group {device_group.tolist()} makes groups of {sizes.tolist()}")
        if self.assignment is not None:
            assignment = np.asarray(self.assignment, dtype=np.int64).reshape(-1)
            bad = np.flatnonzero((assignment < 0) | (assignment >= self.strategy.num_groups))
            if len(bad):
                raise StrategyError(f"assignment[{bad[0]}] = {assignment[bad[0]]} is not an op group "
                                    f"(the strategy has {self.strategy.num_groups})")
            assignment.setflags(write=False)
            object.__setattr__(self, "assignment", assignment)
            fingerprint = grouping_fingerprint(assignment)
            if self.grouping_fingerprint is None:
                object.__setattr__(self, "grouping_fingerprint", fingerprint)
            elif self.grouping_fingerprint != fingerprint:
                raise StrategyError("grouping fingerprint does not match the assignment")
        if self.kind not in _KINDS:
            raise StrategyError(f"plan kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")

    def __eq__(self, other: object) -> bool:
        """Equal when they write the same JSON."""
        if not isinstance(other, Plan):
            return NotImplemented
        return plan_to_json(self) == plan_to_json(other)

    __hash__ = None  # the summary is a mutable dict


def make_plan(strategy: Strategy, graph: OpGraph, cluster: Cluster, *,
              assignment: Sequence[int] | np.ndarray | None = None, grouping_fingerprint: str | None = None,
              summary: dict[str, Any] | None = None, model_name: str | None = None) -> Plan:
    """A plan of ``strategy`` for ``graph`` on ``cluster``.

    ``graph`` is the op-level graph that was grouped (``assignment`` [N] maps its ops to the strategy's G
    op groups) or, with no assignment, the group graph itself. ``model_name`` defaults to
    ``graph.meta["model"]``.
    """
    if not np.array_equal(device_group_sizes(cluster), strategy.device_group_sizes):
        raise StrategyError(f"the strategy is for device groups of {strategy.device_group_sizes.tolist()} devices, "
                            f"cluster {cluster.name!r} has {device_group_sizes(cluster).tolist()}")
    if assignment is not None and len(assignment) != graph.num_ops:
        raise StrategyError(f"assignment has {len(assignment)} entries for {graph.num_ops} ops")
    if assignment is None and grouping_fingerprint is None and graph.num_ops != strategy.num_groups:
        raise StrategyError(f"the strategy has {strategy.num_groups} op groups but the graph has {graph.num_ops} ops: "
                            "give the assignment of ops to groups (or its fingerprint)")
    return Plan(
        strategy=strategy,
        model_name=model_name or str(graph.meta.get("model", "model")),
        model_fingerprint=graph_fingerprint(graph),
        cluster_name=cluster.name,
        cluster_fingerprint=cluster.fingerprint(),
        device_group=cluster.device_group.copy(),
        assignment=None if assignment is None else np.asarray(assignment, dtype=np.int64),
        grouping_fingerprint=grouping_fingerprint,
        summary=dict(summary or {}),
    )


def check_fingerprints(plan: Any, *, graph: OpGraph | None = None, cluster: Cluster | None = None,
                       where: str = "plan") -> None:
    """PlanMismatchError unless a plan file of any kind (with ``model_name``, ``model_fingerprint``,
    ``cluster_name`` and ``cluster_fingerprint``) was made for ``graph`` and ``cluster`` (each checked when
    given)."""
    if graph is not None:
        fingerprint = graph_fingerprint(graph)
        if fingerprint != plan.model_fingerprint:
            name = graph.meta.get("model", "model")
            raise PlanMismatchError(
                f"{where} was made for model {plan.model_name!r} (fingerprint {_short(plan.model_fingerprint)}), "
                f"not {name!r} ({_short(fingerprint)})")
    if cluster is not None:
        fingerprint = cluster.fingerprint()
        if fingerprint != plan.cluster_fingerprint:
            raise PlanMismatchError(
                f"{where} was made for cluster {plan.cluster_name!r} (fingerprint "
                f"{_short(plan.cluster_fingerprint)}), not {cluster.name!r} ({_short(fingerprint)})")


def check_plan(plan: Plan, *, graph: OpGraph | None = None, cluster: Cluster | None = None,
               where: str = "plan") -> None:
    """PlanMismatchError unless ``plan`` was made for ``graph`` and ``cluster`` (each checked when given)."""
    check_fingerprints(plan, graph=graph, cluster=cluster, where=where)
    if graph is not None and plan.assignment is not None and len(plan.assignment) != graph.num_ops:
        raise PlanMismatchError(f"{where}: grouping.assignment has {len(plan.assignment)} entries for "
                                f"{graph.num_ops} ops")
    if cluster is not None:
        if not np.array_equal(cluster.device_group, plan.device_group):
            raise PlanMismatchError(
                f"{where} groups the devices of cluster {cluster.name!r} as {plan.device_group.tolist()}, "
                f"but the cluster given groups them as {cluster.device_group.tolist()}")


# --------------------------------------------------------------------------------------- JSON


def plan_to_json(plan: Plan) -> dict[str, Any]:
    grouping: dict[str, Any] = {"num_groups": plan.strategy.num_groups}
    if plan.assignment is not None:
        grouping["assignment"] = plan.assignment.tolist()
    if plan.grouping_fingerprint is not None:
        grouping["fingerprint"] = plan.grouping_fingerprint
    return {
        "format": PLAN_FORMAT,
        "schema_version": PLAN_SCHEMA_VERSION,
        "kind": plan.kind,
        "model": {"name": plan.model_name, "fingerprint": plan.model_fingerprint},
        "cluster": {"name": plan.cluster_name, "fingerprint": plan.cluster_fingerprint,
                    "device_group": plan.device_group.tolist()},
        "grouping": grouping,
        "strategy": {
            "placement": plan.strategy.placement.astype(np.int64).tolist(),
            "option": plan.strategy.option_names(),
            "batch_split": plan.strategy.batch_split,
        },
        "summary": _jsonable(plan.summary),
    }


def plan_from_json(doc: Any, *, where: str = "plan") -> Plan:
    """Validate a decoded plan document; PlanError names the first bad field."""
    check_header(doc, fmt=PLAN_FORMAT, version=PLAN_SCHEMA_VERSION, where=where, error=PlanError)
    kind = _field(doc, "kind", str, where)
    if kind not in _KINDS:
        raise PlanError(f"{where}: field 'kind' is {kind!r}; expected one of {', '.join(_KINDS)}")
    model = _field(doc, "model", dict, where)
    cluster = _field(doc, "cluster", dict, where)
    grouping = _field(doc, "grouping", dict, where)
    section = _field(doc, "strategy", dict, where)
    device_group = _int_list(_field(cluster, "device_group", list, where, "cluster."), "cluster.device_group", where)
    num_groups = _field(grouping, "num_groups", int, where, "grouping.")
    assignment = grouping.get("assignment")
    if assignment is not None:
        assignment = _int_list(_field(grouping, "assignment", list, where, "grouping."), "grouping.assignment", where)
    grouping_fp = grouping.get("fingerprint")
    if grouping_fp is not None:
        grouping_fp = _field(grouping, "fingerprint", str, where, "grouping.")
    strategy = _strategy_from_json(section, device_group, where)
    if strategy.num_groups != num_groups:
        raise PlanError(f"{where}: grouping.num_groups is {num_groups} but strategy.placement has "
                        f"{strategy.num_groups} rows")
    summary = doc.get("summary", {})
    if not isinstance(summary, dict):
        raise PlanError(f"{where}: field 'summary' must be an object, got {type(summary).__name__}")
    _check_summary(summary, num_groups, where)
    try:
        return Plan(
            strategy=strategy,
            model_name=_field(model, "name", str, where, "model."),
            model_fingerprint=_field(model, "fingerprint", str, where, "model."),
            cluster_name=_field(cluster, "name", str, where, "cluster."),
            cluster_fingerprint=_field(cluster, "fingerprint", str, where, "cluster."),
            device_group=device_group,
            assignment=assignment,
            grouping_fingerprint=grouping_fp,
            summary=summary,
            kind=kind,
        )
    except StrategyError as error:
        raise PlanError(f"{where}: {error}") from None


def _strategy_from_json(section: dict, device_group: np.ndarray, where: str) -> Strategy:
    placement = _field(section, "placement", list, where, "strategy.")
    for g, row in enumerate(placement):
        if not isinstance(row, list) or not all(v in (0, 1) and not isinstance(v, float) for v in row):
            raise PlanError(f"{where}: strategy.placement[{g}] must be a list of 0/1")
    options = _field(section, "option", list, where, "strategy.")
    for g, name in enumerate(options):
        if name not in OPTIONS:
            raise PlanError(f"{where}: strategy.option[{g}] is {name!r}; expected one of {', '.join(OPTIONS)}")
    batch_split = _field(section, "batch_split", str, where, "strategy.")
    if device_group.size == 0 or device_group.min() < 0:
        raise PlanError(f"{where}: cluster.device_group must list one non-negative group id per device")
    sizes = np.bincount(device_group)
    if (sizes == 0).any():
        raise PlanError(f"{where}: cluster.device_group skips group {int(np.argmax(sizes == 0))} "
                        "(ids must be 0..M-1, each used)")
    try:
        return Strategy(np.array(placement, dtype=np.int64) if placement else np.zeros((0, len(sizes))),
                        options, sizes, batch_split)
    except (StrategyError, ValueError) as error:
        raise PlanError(f"{where}: strategy: {error}") from None


def _field(doc: dict, key: str, kind: type, where: str, prefix: str = "") -> Any:
    if key not in doc:
        raise PlanError(f"{where}: missing field {prefix + key!r}")
    value = doc[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise PlanError(f"{where}: field {prefix + key!r} must be {_KIND_NAMES.get(kind, kind.__name__)}, "
                        f"got {type(value).__name__}")
    return value


_KIND_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer"}


def _int_list(values: list, name: str, where: str) -> np.ndarray:
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or not -2**63 <= value < 2**63:
            raise PlanError(f"{where}: {name}[{i}] must be a 64-bit integer, got {value!r}")
    return np.array(values, dtype=np.int64)


def _check_summary(summary: dict, num_groups: int, where: str) -> None:
    """The summary fields `tag simulate` reads back: the fusion threshold and the SFB groups kept."""
    fusion = summary.get("fusion_bytes")
    if fusion is not None and (isinstance(fusion, bool) or not isinstance(fusion, (int, float))
                               or not 1 <= fusion < math.inf):
        raise PlanError(f"{where}: summary.fusion_bytes must be a number of bytes >= 1 or null, got {fusion!r}")
    groups = summary.get("sfb_groups")
    if groups is None:
        return
    if not isinstance(groups, list):
        raise PlanError(f"{where}: summary.sfb_groups must be a list of op group ids, got {groups!r}")
    ids = _int_list(groups, "summary.sfb_groups", where)
    if ids.size and (ids.min() < 0 or ids.max() >= num_groups or np.unique(ids).size != ids.size):
        raise PlanError(f"{where}: summary.sfb_groups must hold distinct op group ids in 0..{num_groups - 1}")


def _jsonable(value: Any) -> Any:
    """numpy values as Python ones, tuples as lists, non-finite floats as None; the rest unchanged."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _short(fingerprint: str) -> str:
    return fingerprint[:_FINGERPRINT_SHOWN] + "…"


# --------------------------------------------------------------------------------------- files

# An innermost JSON list (no nested list or object) that json.dumps(indent=...) spread over lines.
_INNER_LIST = re.compile(r"\[[^\[\]{}]*\]")


def _dumps(doc: dict[str, Any]) -> str:
    """Indented JSON with each innermost list on one line (a placement row per line)."""
    text = json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)
    # JSON strings cannot hold a raw newline, so dropping newline + indent never touches a string.
    return _INNER_LIST.sub(lambda m: re.sub(r"\n\s*", "", m.group(0)), text) + "\n"


def save_plan(plan: Plan, path: str | os.PathLike) -> None:
    """Write ``plan`` to ``path`` as JSON, atomically (same argument order as ``save_graph``)."""
    if not isinstance(plan, Plan):
        raise TypeError(f"save_plan(plan, path): expected a Plan first, got {type(plan).__name__}")
    atomic_write_text(path, _dumps(plan_to_json(plan)))


def load_plan(path: str | os.PathLike, *, graph: OpGraph | None = None, cluster: Cluster | None = None) -> Plan:
    """Read and validate a plan file; with ``graph``/``cluster``, also check it was made for them."""
    path = Path(path)
    plan = plan_from_json(read_plan_document(path), where=str(path))
    check_plan(plan, graph=graph, cluster=cluster, where=str(path))
    return plan


def read_plan_document(path: str | os.PathLike) -> Any:
    """The decoded JSON of a plan file (either kind); PlanError when it cannot be read or parsed."""
    raw = read_input(path, what="plan file", error=PlanError)
    return parse_json(raw, where=str(path), error=PlanError, malformed="not a valid JSON plan file")
