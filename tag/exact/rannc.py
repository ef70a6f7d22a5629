"""RaNNC's stage-level partitioning (§III-C): a DP over contiguous block ranges with per-stage replica
counts (Algorithm 1) and the search over nodes, stages and micro-batches (Algorithm 2).

Blocks are B nodes in a topological order (any prefix of a topological order is a downset, so every
contiguous range is a valid stage). Stage i holds blocks [b_{i−1}, b_i) on d_i devices of each of the R
pipeline copies; its micro-batch share is ⌊BS / R / MB / d_i⌋ samples (RaNNC's ``profile`` batch), so
its fraction of the reference batch is that over BS, and none fits when the share is 0. The
``profile`` step is the cost model:

    t^f = Σ fwd(blocks) + bytes sent to later stages / β,   t^b = Σ bwd(blocks) + bytes received / β,
    m   = 4 · parameters + inflight_i · (activations kept + inputs received)

with ``inflight_i`` the micro-batches stage i holds (1F1B: min(S − i, MB)). Algorithm 1 keeps, per
(s, b, d), the pair (max t^f, max t^b) of least sum V = max t^f + max t^b, and RaNNC's objective is
V at (S, |B|, D). Keeping only the best pair is what the paper does; it is exact when t^b / t^f is the
same for every range (then V = (1 + ratio) · max t^f, a bottleneck DP) and a heuristic otherwise.
RaNNC's d_min pruning (stop lowering d once no solution exists) only saves time under monotone memory;
here numpy evaluates every (b', d') of a cell at once, so it is left out.

:func:`rannc_dp` is the kernel (arrays in, ``(value, solution)`` out); :func:`form_stage` is
Algorithm 2, with a caller-supplied ``evaluate`` (the pipeline simulator) picking among the solutions
found for the first node count that has any.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from tag.exact.stage_graph import PartitionError, inflight_micro_batches

__all__ = ["BlockCosts", "RannCSolution", "rannc_dp", "rannc_stage_times", "form_stage", "range_bytes"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlockCosts:
    """B blocks in a topological order, at the reference batch ``batch_size`` on one GPU type."""

    fwd_fixed: np.ndarray  # [B] seconds
    fwd_scaled: np.ndarray  # [B] seconds that scale with the batch
    bwd_fixed: np.ndarray  # [B]
    bwd_scaled: np.ndarray  # [B]
    static: np.ndarray  # [B] bytes (parameters × 4)
    act_fixed: np.ndarray  # [B] bytes kept for backward
    act_scaled: np.ndarray  # [B]
    edge_src: np.ndarray  # [E] block id
    edge_dst: np.ndarray  # [E] block id >= edge_src
    edge_fixed: np.ndarray  # [E] bytes
    edge_scaled: np.ndarray  # [E]
    batch_size: int

    @property
    def num_blocks(self) -> int:
        return int(self.fwd_fixed.shape[0])


class RannCSolution(NamedTuple):
    value: float  # max t^f + max t^b, seconds per micro-batch
    bounds: tuple[int, ...]  # [S + 1] 0 = b_0 < b_1 < … < b_S = B
    devices: tuple[int, ...]  # [S] d_i, devices of each stage per pipeline copy
    copies: int  # R
    micro_batches: int  # MB


def range_bytes(num_blocks: int, edge_src: np.ndarray, edge_dst: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """[B+1, B+1] X[a, c] = bytes of edges with source < a and target >= c.

    Range [b', b) sends X[b, b] − X[b', b] to later blocks and receives X[b', b'] − X[b', b].
    """
    matrix = np.zeros((num_blocks + 1, num_blocks + 1))
    np.add.at(matrix, (edge_src + 1, edge_dst), weight)
    # Rows: sources < a (prefix sum downwards); columns: targets >= c (suffix sum leftwards).
    return np.cumsum(np.cumsum(matrix, axis=0)[:, ::-1], axis=1)[:, ::-1]


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)])


def rannc_stage_times(blocks: BlockCosts, *, copies: int, micro_batches: int, max_devices: int,
                      comm_scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(t^f, t^b, fixed memory, memory per micro-batch in flight), each [B+1, B+1, max_devices+1] over
    (b', b, d): blocks [b', b) on d devices; ``inf`` times where b' >= b, d = 0 or the share is empty."""
    n = blocks.num_blocks
    lo = np.arange(n + 1)[:, None, None]
    hi = np.arange(n + 1)[None, :, None]
    devices = np.arange(max_devices + 1)[None, None, :]
    samples = np.floor(blocks.batch_size / copies / micro_batches / np.maximum(devices, 1))
    fraction = samples / blocks.batch_size  # [1, 1, d]
    valid = (lo < hi) & (devices >= 1) & (samples >= 1)

    def ranged(fixed: np.ndarray, scaled: np.ndarray) -> np.ndarray:
        pf, ps = _prefix(fixed), _prefix(scaled)
        return (pf[hi] - pf[lo]) + fraction * (ps[hi] - ps[lo])

    x_fixed = range_bytes(n, blocks.edge_src, blocks.edge_dst, blocks.edge_fixed)
    x_scaled = range_bytes(n, blocks.edge_src, blocks.edge_dst, blocks.edge_scaled)
    # [b', b, 1] bytes the range [b', b) sends to later blocks and receives from earlier ones
    sent = (np.diag(x_fixed)[None, :] - x_fixed)[..., None] + fraction * (np.diag(x_scaled)[None, :] - x_scaled)[..., None]
    received = (np.diag(x_fixed)[:, None] - x_fixed)[..., None] + fraction * (np.diag(x_scaled)[:, None] - x_scaled)[..., None]
    t_fwd = np.where(valid, ranged(blocks.fwd_fixed, blocks.fwd_scaled) + comm_scale * sent, np.inf)
    t_bwd = np.where(valid, ranged(blocks.bwd_fixed, blocks.bwd_scaled) + comm_scale * received, np.inf)
    static = _prefix(blocks.static)
    memory_fixed = np.broadcast_to((static[hi] - static[lo]), t_fwd.shape)
    memory_per_micro_batch = ranged(blocks.act_fixed, blocks.act_scaled) + received
    return t_fwd, t_bwd, memory_fixed, np.broadcast_to(memory_per_micro_batch, t_fwd.shape)


def rannc_dp(blocks: BlockCosts, *, stages: int, devices: int, copies: int = 1, micro_batches: int = 1,
             capacity: float = np.inf, comm_scale: float = 0.0, schedule: str = "1f1b") -> RannCSolution | None:
    """Algorithm 1 ``form_stage_dp(B, S, D, BS, R, MB)``: ``stages`` contiguous ranges on exactly
    ``devices`` devices per pipeline copy; None when infeasible (RaNNC's INFEASIBLE)."""
    n = blocks.num_blocks
    if stages < 1 or stages > n or devices < stages:
        return None
    t_fwd, t_bwd, mem_fixed, mem_act = rannc_stage_times(blocks, copies=copies, micro_batches=micro_batches,
                                                         max_devices=devices, comm_scale=comm_scale)
    inflight = inflight_micro_batches(stages, micro_batches, schedule)
    shape = (n + 1, devices + 1)
    value = np.full(shape, np.inf)  # [b, d] V_{s, b, d}
    value[0, 0] = 0.0
    best_f, best_b = np.zeros(shape), np.zeros(shape)  # t^f, t^b of the best pair kept per cell
    back = np.zeros((stages, n + 1, devices + 1, 2), dtype=np.int64)  # argmin (b', d') per cell
    d_new = np.arange(devices + 1)[:, None] - np.arange(devices + 1)[None, :]  # [d, d'] devices of the new stage
    usable = d_new >= 1
    r_index = np.clip(d_new, 0, devices)
    for s in range(stages):
        # candidates over (b', b, d', d): new stage [b', b) with d − d' devices after (b', d')
        tf = t_fwd[:, :, r_index]  # [b', b, d, d']
        tb = t_bwd[:, :, r_index]
        fits = (mem_fixed[:, :, r_index] + inflight[s] * mem_act[:, :, r_index] <= capacity) & usable[None, None]
        prev = np.isfinite(value)[:, None, None, :]  # [b', 1, 1, d']
        cand_f = np.maximum(best_f[:, None, None, :], tf)
        cand_b = np.maximum(best_b[:, None, None, :], tb)
        total = np.where(fits & prev, cand_f + cand_b, np.inf)  # [b', b, d, d']
        flat = total.transpose(1, 2, 0, 3).reshape(n + 1, devices + 1, -1)  # [b, d, b'·d']
        arg = np.argmin(flat, axis=2)
        bp, dp = np.divmod(arg, devices + 1)
        b_grid, d_grid = np.meshgrid(np.arange(n + 1), np.arange(devices + 1), indexing="ij")
        value = total[bp, b_grid, d_grid, dp]
        best_f = np.where(np.isfinite(value), cand_f[bp, b_grid, d_grid, dp], 0.0)
        best_b = np.where(np.isfinite(value), cand_b[bp, b_grid, d_grid, dp], 0.0)
        back[s, ..., 0], back[s, ..., 1] = bp, dp
    if not np.isfinite(value[n, devices]):
        return None
    bounds, counts = [n], []
    b, d = n, devices
    for s in range(stages - 1, -1, -1):
        bp, dp = back[s, b, d]
        counts.append(int(d - dp))
        bounds.append(int(bp))
        b, d = int(bp), int(dp)
    return RannCSolution(float(value[n, devices]), tuple(bounds[::-1]), tuple(counts[::-1]), copies, micro_batches)


def form_stage(blocks: BlockCosts, *, nodes: int, devices_per_node: int, capacity: float = np.inf,
               comm_scale: float = 0.0, schedule: str = "1f1b",
               evaluate: Callable[[RannCSolution], float] | None = None,
               max_micro_batches: int | None = None) -> RannCSolution:
    """Algorithm 2 ``form_stage(N, D_node, BS)``: for n = 1, 2, 4, … nodes per pipeline copy (R = N // n
    copies), S from D_node·(n−1)+1 to D_node·n, MB = 1, 2, 4, … ≤ ⌊BS / R⌋, collect the feasible DP
    solutions of the first n that has any and return the best by ``evaluate`` (default: the DP value
    scaled by the pipeline's (MB + S − 1) / MB fill). PartitionError when none is feasible."""
    if nodes < 1 or devices_per_node < 1:
        raise PartitionError(f"nodes and devices_per_node must be positive, got {nodes}, {devices_per_node}")
    score = evaluate or (lambda sol: sol.value * (sol.micro_batches + len(sol.devices) - 1) / sol.micro_batches)
    n = 1
    while n <= nodes:
        copies = nodes // n
        devices = devices_per_node * n
        found: list[RannCSolution] = []
        for stages in range(devices_per_node * (n - 1) + 1, min(devices, blocks.num_blocks) + 1):
            mb = 1
            limit = blocks.batch_size // copies
            limit = limit if max_micro_batches is None else min(max_micro_batches, limit)
            while mb <= limit:
                solution = rannc_dp(blocks, stages=stages, devices=devices, copies=copies, micro_batches=mb,
                                    capacity=capacity, comm_scale=comm_scale, schedule=schedule)
                if solution is not None:
                    found.append(solution)
                mb *= 2
        if found:
            log.info("RaNNC: %d feasible configurations with %d node(s) per pipeline", len(found), n)
            return min(found, key=score)
        n *= 2
    raise PartitionError(f"RaNNC found no feasible stage partition on {nodes} nodes of {devices_per_node} devices")


def blocks_from_groups(order_group: np.ndarray, fwd_fixed: np.ndarray, fwd_scaled: np.ndarray, bwd_fixed: np.ndarray,
                       bwd_scaled: np.ndarray, static: np.ndarray, act_fixed: np.ndarray, act_scaled: np.ndarray,
                       edge_src: np.ndarray, edge_dst: np.ndarray, edge_fixed: np.ndarray, edge_scaled: np.ndarray,
                       batch_size: int) -> BlockCosts:
    """Sum node arrays [F] into the blocks of ``order_group`` [F] (ids 0..B-1 in topological order)."""
    num = int(order_group.max()) + 1

    def total(x: np.ndarray) -> np.ndarray:
        return np.bincount(order_group, weights=x, minlength=num)

    a, b = order_group[edge_src], order_group[edge_dst]
    cross = a != b
    return BlockCosts(total(fwd_fixed), total(fwd_scaled), total(bwd_fixed), total(bwd_scaled), total(static),
                      total(act_fixed), total(act_scaled), a[cross], b[cross], edge_fixed[cross], edge_scaled[cross],
                      batch_size)


def solution_stages(solution: RannCSolution, block_of_node: Sequence[int]) -> np.ndarray:
    """[F] stage of each node from a solution's block bounds."""
    block_of_node = np.asarray(block_of_node, dtype=np.int64)
    bounds = np.asarray(solution.bounds)
    return np.searchsorted(bounds, block_of_node, side="right") - 1
