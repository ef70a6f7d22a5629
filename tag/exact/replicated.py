"""Partitioning with a replica count per stage (PipeDream's optimizer, RaNNC's Algorithm 1 on downsets).

Three layers (STYLE item 8):

- **tables** (:func:`replica_tables`): for every replica count r = 1..R, the stage tables of
  :func:`tag.exact.partition.stage_tables` at that stage's micro-batch share 1 / (M·r), plus the weight
  synchronisation a stage of r replicas adds per micro-batch: a ring all-reduce of its parameters,
  2(r − 1)/r · params / bandwidth, amortised over the M micro-batches of an iteration (PipeDream's
  model; the simulator overlaps it with the last backward pass, and re-scores every candidate);
- **kernel** (:func:`dp_with_replicas`): eq. (13) with per-stage replica counts,
  T[F, s, d] = min over F' ⊂ F and r ≤ d of max(T[F', s − 1, d − r], t_r(F − F')), over downsets F
  and devices used d, a stage infinite where it does not fit memory with the micro-batches it holds
  in flight at its position; it returns ``(cost, cuts, replicas)``;
- **driver** (:func:`partition_replicated`): the PipeDream-style cut (contiguous chunks of one
  topological order, coarsened to at most ``max_blocks`` blocks of equal compute) for S stages over
  at most D devices.
"""

from __future__ import annotations

import time

import numpy as np

from tag.exact.clustering import quotient_edges
from tag.exact.partition import COMM_CROSSINGS, PartitionResult, StageTables, stage_tables
from tag.exact.stage_graph import ADAM_MEMORY_COPIES, ForwardGraph, PartitionError, inflight_micro_batches

__all__ = ["replica_tables", "dp_with_replicas", "partition_replicated", "DEFAULT_MAX_BLOCKS"]

DEFAULT_MAX_BLOCKS = 64  # blocks of the topological order the replicated DP cuts between


def replica_tables(members: np.ndarray, subset: np.ndarray, fg_blocks: dict[str, np.ndarray], *, max_replicas: int,
                   micro_batches: int, bandwidth: float, sync_bandwidth: float) -> list[StageTables]:
    """[R] stage tables with r = 1..R replicas per stage (module docstring). ``fg_blocks`` holds the
    block arrays: ``fixed`` / ``scaled`` [K] fwd + bwd seconds at the whole batch, ``static`` [K],
    ``act_fixed`` / ``act_scaled`` [K], ``edge_src`` / ``edge_dst`` [E], ``edge_fixed`` / ``edge_scaled`` [E]."""
    b = fg_blocks
    comm_scale = COMM_CROSSINGS / bandwidth
    params = np.asarray(members, dtype=np.float64) @ (b["static"] / ADAM_MEMORY_COPIES)  # [D]
    stage_params = np.subtract.outer(params, params)  # [D, D] parameters of F_i − F_j
    out = []
    for r in range(1, max_replicas + 1):
        fraction = 1.0 / (micro_batches * r)
        tables = stage_tables(members, subset, b["fixed"] + fraction * b["scaled"], b["static"],
                              b["act_fixed"] + fraction * b["act_scaled"], b["edge_src"], b["edge_dst"],
                              b["edge_fixed"] + fraction * b["edge_scaled"], comm_scale)
        if r > 1:
            sync = 2.0 * (r - 1) / r * np.maximum(stage_params, 0.0) / sync_bandwidth / micro_batches
            tables = StageTables(tables.stage_time + sync, tables.memory_fixed, tables.memory_per_micro_batch,
                                 tables.members)
        out.append(tables)
    return out


def dp_with_replicas(tables: list[StageTables], inflight: np.ndarray, capacity: float,
                     num_devices: int) -> tuple[float, list[int] | None, list[int] | None]:
    """The least largest stage time over chains of S = len(inflight) stages with r_s ≥ 1 replicas each and
    Σ r_s ≤ ``num_devices``; ``tables[r − 1]`` prices a stage of r replicas. Returns ``(cost, cuts,
    replicas)``: cuts as :func:`tag.exact.partition.dp_over_downsets` gives them, replicas [S]; or
    ``(inf, None, None)`` when no chain fits."""
    num_downsets = tables[0].stage_time.shape[0]
    num_stages = len(inflight)
    width = num_devices + 1
    best = np.full((num_downsets, width), np.inf)  # [D, d] T[F, s, d] for the stages placed so far
    best[0, 0] = 0.0
    choice_cut = np.zeros((num_stages, num_downsets, width), dtype=np.int64)
    choice_r = np.zeros((num_stages, num_downsets, width), dtype=np.int64)
    for s in range(num_stages):
        new = np.full((num_downsets, width), np.inf)
        for r, t in enumerate(tables, start=1):
            if r > num_devices:
                break
            stage = t.stage_time
            if np.isfinite(capacity):
                stage = np.where(t.memory_fixed + inflight[s] * t.memory_per_micro_batch > capacity, np.inf, stage)
            candidate = np.maximum(best[None, :, :width - r], stage[:, :, None])  # [D(F), D(F'), d - r]
            cut = candidate.argmin(axis=1)  # [D, d - r]
            value = np.take_along_axis(candidate, cut[:, None, :], axis=1)[:, 0, :]
            better = value < new[:, r:]
            new[:, r:] = np.where(better, value, new[:, r:])
            choice_cut[s][:, r:] = np.where(better, cut, choice_cut[s][:, r:])
            choice_r[s][:, r:] = np.where(better, r, choice_r[s][:, r:])
        best = new
    used = int(np.argmin(best[-1]))
    cost = float(best[-1, used])
    if not np.isfinite(cost):
        return np.inf, None, None
    cuts, replicas, j = [num_downsets - 1], [], num_downsets - 1
    for s in range(num_stages - 1, -1, -1):
        r = int(choice_r[s, j, used])
        j = int(choice_cut[s, j, used])
        cuts.append(j)
        replicas.append(r)
        used -= r
    return cost, cuts[::-1], replicas[::-1]


def _blocks(fg: ForwardGraph, reference_type: int, max_blocks: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """[F] block of every forward node (contiguous runs of the topological order, about equal compute)
    and the block arrays of :func:`replica_tables`."""
    t = reference_type
    work = fg.compute_time(1.0, t)
    num_blocks = min(fg.num_nodes, max_blocks)
    share = np.cumsum(work) / max(float(work.sum()), 1e-30)
    group = np.minimum((share * num_blocks - 1e-9).astype(np.int64), num_blocks - 1)  # [F] non-decreasing
    group = np.unique(group, return_inverse=True)[1]
    k = int(group.max()) + 1

    def per_block(values: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=values, minlength=k)

    src, dst, fixed = quotient_edges(group, fg.edge_src, fg.edge_dst, fg.edge_fixed)
    _, _, scaled = quotient_edges(group, fg.edge_src, fg.edge_dst, fg.edge_scaled)
    arrays = {"fixed": per_block(fg.fwd_fixed[:, t] + fg.bwd_fixed[:, t]),
              "scaled": per_block(fg.fwd_scaled[:, t] + fg.bwd_scaled[:, t]),
              "static": per_block(fg.static_bytes()), "act_fixed": per_block(fg.act_fixed),
              "act_scaled": per_block(fg.act_scaled), "edge_src": src, "edge_dst": dst,
              "edge_fixed": fixed, "edge_scaled": scaled}
    return group, arrays


def partition_replicated(fg: ForwardGraph, *, stages: int, devices: int, micro_batches: int, bandwidth: float,
                         sync_bandwidth: float | None = None, capacity: float = np.inf, reference_type: int = 0,
                         schedule: str = "1f1b", max_blocks: int = DEFAULT_MAX_BLOCKS) -> PartitionResult:
    """S contiguous stages of the topological order, each with its own replica count, on at most
    ``devices`` devices (module docstring); ``info["replicas"]`` lists the counts."""
    if stages > min(devices, fg.num_nodes):
        raise PartitionError(f"cannot cut {fg.num_nodes} forward ops into {stages} stages on {devices} devices")
    start = time.perf_counter()
    group, arrays = _blocks(fg, reference_type, max_blocks)
    k = int(group.max()) + 1
    if k < stages:
        raise PartitionError(f"{k} blocks are fewer than {stages} stages")
    members = np.arange(k + 1)[:, None] > np.arange(k)[None, :]  # prefix d holds blocks 0..d-1
    subset = np.arange(k + 1)[None, :] < np.arange(k + 1)[:, None]
    max_replicas = min(devices - stages + 1, max(1, fg.batch_size // micro_batches))
    tables = replica_tables(members, subset, arrays, max_replicas=max_replicas, micro_batches=micro_batches,
                            bandwidth=bandwidth, sync_bandwidth=sync_bandwidth or bandwidth)
    cost, cuts, replicas = dp_with_replicas(tables, inflight_micro_batches(stages, micro_batches, schedule),
                                            capacity, devices)
    if cuts is None:
        raise PartitionError(f"no cut into {stages} stages with per-stage replicas fits device memory")
    block_stage = np.searchsorted(np.asarray(cuts[1:-1]), np.arange(k), side="right")
    return PartitionResult(block_stage[group], cost, cost,
                           {"method": "pipedream-replicated", "replicas": replicas, "blocks": k,
                            "dp_s": time.perf_counter() - start})
