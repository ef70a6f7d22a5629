"""Baselines of TAG §5 on the same compiler and simulator: DP-NCCL, DP-NCCL-P, Horovod, one device, METIS MP.

Each baseline is a :class:`~tag.strategy.Strategy` over the op groups, compiled by
:func:`tag.compiler.compile_strategy` and run by the fast simulator, so it is scored exactly like a TAG
strategy:

- **DP-NCCL** — every group on every device, the batch split evenly, each bundle of gradients
  all-reduced (ring) as soon as the backward tasks producing it finish;
- **DP-NCCL-P** — the same with batch fractions proportional to the devices' peak FLOP/s;
- **Horovod** — DP-NCCL with tensor fusion: the all-reduces are fused, in the order their gradients are
  produced, into buckets of at least ``fusion_bytes`` (25 MB), each waiting only for the backward tasks
  that produce its gradients, so communication overlaps the rest of the backward pass;
- **single device** — the whole model on one device: of one device of each GPU type, the fastest whose
  peak memory fits (OOM, naming the largest device, if none does);
- **METIS MP** — model parallelism without replication, each group on one device with compute
  proportional to the devices' peak FLOP/s: the faster of a METIS k-way partition of the group graph
  (``tpwgts`` ∝ speed; it keeps a layer's forward and backward groups together) and contiguous runs of a
  topological order of the groups (:func:`tag.grouping.split_group`, convex). Strategies place groups
  on device groups, so this one is expressed on the cluster with one device group per device.

A result whose plan does not fit reports ``oom`` and the device most over capacity; its time is what the
plan would take with unlimited memory.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from tag.cluster import Cluster
from tag.compiler import DEFAULT_FUSION_BYTES, CompiledPlan, compile_strategy
from tag.cost import CostModel
from tag.graph.opgraph import OpGraph
from tag.grouping import DEFAULT_NUM_GROUPS, GroupGraph, group_ops, split_group
from tag.grouping.metis import metis_parts
from tag.strategy import ALLREDUCE, Strategy

__all__ = [
    "BaselineResult",
    "BASELINES",
    "run_baselines",
    "dp_nccl",
    "dp_nccl_p",
    "horovod",
    "single_device",
    "metis_mp",
    "baselines_table",
]


class BaselineResult(NamedTuple):
    """One baseline, simulated. D devices of the cluster given to :func:`run_baselines`."""

    name: str
    iteration_time_s: float  # simulated seconds per iteration (with unlimited memory when oom)
    samples_per_s: float  # batch size / iteration time
    peak_memory: np.ndarray  # [D] bytes on each device of the original cluster (0 where unused)
    oom: bool
    oom_device: int  # device of the original cluster most over its capacity, -1 if none
    strategy: Strategy | None  # over ``plan_cluster``'s device groups
    compiled: CompiledPlan | None
    plan_cluster: Cluster  # the cluster the strategy is for (a one-device subset, per-device groups, ...)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "iteration_time_s": self.iteration_time_s, "samples_per_s": self.samples_per_s,
                "peak_memory_bytes": self.peak_memory.tolist(), "max_peak_memory_bytes": float(self.peak_memory.max()),
                "oom": self.oom, "oom_device": self.oom_device, "note": self.note}


def _evaluate(name: str, group_graph: GroupGraph, strategy: Strategy, plan_cluster: Cluster, devices: np.ndarray,
              num_devices: int, *, cost: CostModel | None, granularity: str, fusion_bytes: float | None = None,
              note: str = "") -> BaselineResult:
    """Compile and simulate; map the per-device figures of ``plan_cluster`` back through ``devices``."""
    compiled = compile_strategy(group_graph, strategy, plan_cluster, cost=cost, granularity=granularity,
                                fusion_bytes=fusion_bytes)
    result = compiled.simulate(feedback=False)
    peak = np.zeros(num_devices)
    peak[devices] = result.peak_memory
    oom_device = int(devices[result.oom_device]) if result.oom_device >= 0 else -1
    batch = group_graph.op_graph.batch_size
    rate = batch / result.iteration_time if result.iteration_time > 0 else float("inf")
    return BaselineResult(name, result.iteration_time, rate, peak, not result.feasible, oom_device, strategy,
                          compiled, plan_cluster, note)


def dp_nccl(group_graph: GroupGraph, cluster: Cluster, *, cost: CostModel | None = None,
            granularity: str = "group") -> BaselineResult:
    """Data parallelism, even batch, ring all-reduce per bundle of gradients."""
    strategy = Strategy.data_parallel(group_graph.num_groups, cluster, option=ALLREDUCE)
    return _evaluate("DP-NCCL", group_graph, strategy, cluster, np.arange(cluster.num_devices), cluster.num_devices,
                     cost=cost, granularity=granularity)


def dp_nccl_p(group_graph: GroupGraph, cluster: Cluster, *, cost: CostModel | None = None,
              granularity: str = "group") -> BaselineResult:
    """Data parallelism with batch fractions ∝ device peak FLOP/s."""
    strategy = Strategy.data_parallel(group_graph.num_groups, cluster, option=ALLREDUCE, batch_split="speed")
    return _evaluate("DP-NCCL-P", group_graph, strategy, cluster, np.arange(cluster.num_devices), cluster.num_devices,
                     cost=cost, granularity=granularity)


def horovod(group_graph: GroupGraph, cluster: Cluster, *, cost: CostModel | None = None, granularity: str = "group",
            fusion_bytes: float = DEFAULT_FUSION_BYTES) -> BaselineResult:
    """Data parallelism with all-reduces fused into buckets of ``fusion_bytes`` overlapping the backward pass."""
    strategy = Strategy.data_parallel(group_graph.num_groups, cluster, option=ALLREDUCE)
    return _evaluate("Horovod", group_graph, strategy, cluster, np.arange(cluster.num_devices), cluster.num_devices,
                     cost=cost, granularity=granularity, fusion_bytes=fusion_bytes,
                     note=f"fusion buckets of {fusion_bytes / 1e6:g} MB")


def single_device(group_graph: GroupGraph, cluster: Cluster, *, cost: CostModel | None = None,
                  granularity: str = "group") -> BaselineResult:
    """The whole model on the fastest single device that fits (one device of each GPU type is tried)."""
    candidates = [int(np.flatnonzero(cluster.device_type == t)[0]) for t in range(len(cluster.types))]
    results = []
    for device in candidates:
        sub = cluster.subset([device], name=f"{cluster.name}-device{device}")
        strategy = Strategy.single_device(group_graph.num_groups, sub, 0)
        results.append(_evaluate("single device", group_graph, strategy, sub, np.array([device]), cluster.num_devices,
                                 cost=cost, granularity=granularity,
                                 note=f"device {device} ({cluster.gpu(device).name})"))
    fitting = [r for r in results if not r.oom]
    if fitting:
        return min(fitting, key=lambda r: r.iteration_time_s)
    # None fits: report the device with the most memory.
    largest = max(range(len(candidates)), key=lambda k: cluster.gpu(candidates[k]).memory_bytes)
    return results[largest]._replace(note=results[largest].note + "; no single device fits")


def metis_mp(group_graph: GroupGraph, cluster: Cluster, *, cost: CostModel | None = None,
             granularity: str = "group", seed: int = 0) -> BaselineResult:
    """Model parallelism without replication: each group on one device, compute ∝ device speed.

    Two assignments are simulated and the faster kept: METIS over the group graph (vertex weight: group
    compute time, edge weight: bytes between groups, ``tpwgts`` ∝ peak FLOP/s), which keeps a layer's
    forward and backward groups together; and contiguous runs of a topological order of the groups
    (:func:`tag.grouping.split_group`, convex), the classic layer-wise split.
    """
    per_device = dataclasses.replace(cluster, name=f"{cluster.name}-per-device",
                                     device_group=np.arange(cluster.num_devices))
    speeds = cluster.peak_flops()
    types, counts = np.unique(cluster.device_type, return_counts=True)
    gpu = cluster.types[int(types[np.argmax(counts)])]
    contiguous = split_group(group_graph.graph, np.arange(group_graph.num_groups), speeds,
                             cost=cost if cost is not None else group_graph.cost, gpu=gpu, convex=True)
    candidates = {"contiguous": contiguous}
    if group_graph.num_groups > cluster.num_devices > 1:
        candidates["METIS"] = _metis_assignment(group_graph, cluster, speeds, seed=seed)
    results = []
    for how, where in candidates.items():
        placement = np.zeros((group_graph.num_groups, cluster.num_devices), dtype=bool)
        placement[np.arange(group_graph.num_groups), where] = True
        strategy = Strategy.from_cluster(per_device, placement, np.zeros(group_graph.num_groups, dtype=np.int64))
        results.append(_evaluate("METIS MP", group_graph, strategy, per_device, np.arange(cluster.num_devices),
                                 cluster.num_devices, cost=cost, granularity=granularity,
                                 note=f"{how} split, {np.unique(where).size} of {cluster.num_devices} devices used"))
    return min(results, key=lambda r: (r.oom, r.iteration_time_s))


def _metis_assignment(group_graph: GroupGraph, cluster: Cluster, speeds: np.ndarray, *, seed: int) -> np.ndarray:
    """[G] device of each group: METIS k-way over the undirected group graph with ``tpwgts`` ∝ speed."""
    graph = group_graph.graph
    compute = group_graph.compute_table(cluster).mean(axis=1)
    return metis_parts(graph.num_ops, graph.edge_src, graph.edge_dst, graph.edge_bytes, compute, cluster.num_devices,
                       ufactor=_METIS_DEFAULT_UFACTOR, seed=seed, tpwgts=speeds / speeds.sum())


# METIS's own default imbalance for k-way partitioning (3%).
_METIS_DEFAULT_UFACTOR = 30


BASELINES = {"dp-nccl": dp_nccl, "dp-nccl-p": dp_nccl_p, "horovod": horovod, "single-device": single_device,
             "metis-mp": metis_mp}


def run_baselines(graph: OpGraph | GroupGraph, cluster: Cluster, *, num_groups: int = DEFAULT_NUM_GROUPS,
                  cost: CostModel | None = None, granularity: str = "group",
                  names: tuple[str, ...] = tuple(BASELINES), seed: int = 0) -> list[BaselineResult]:
    """Every baseline in ``names`` for ``graph`` (grouped into ``num_groups`` by METIS, unless a GroupGraph
    is given) on ``cluster``, in order."""
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline {unknown[0]!r}; expected one of {', '.join(BASELINES)}")
    if isinstance(graph, GroupGraph):
        group_graph = graph
    else:
        group_graph = group_ops(graph, num_groups=num_groups, cost=cost, gpus=cluster, seed=seed)
    return [BASELINES[name](group_graph, cluster, cost=cost, granularity=granularity) for name in names]


def baselines_table(results: list[BaselineResult], *, reference: str = "DP-NCCL") -> list[dict[str, Any]]:
    """Rows for printing: name, time, samples/s, speed-up over ``reference``, largest peak memory, OOM."""
    base = next((r.iteration_time_s for r in results if r.name == reference), None)
    rows = []
    for r in results:
        rows.append({
            "name": r.name, "iteration_time_s": r.iteration_time_s, "samples_per_s": r.samples_per_s,
            "speedup": (base / r.iteration_time_s) if base and r.iteration_time_s > 0 else None,
            "max_peak_memory_bytes": float(r.peak_memory.max()), "oom": r.oom,
            "oom_device": r.oom_device if r.oom else None, "note": r.note,
        })
    return rows
