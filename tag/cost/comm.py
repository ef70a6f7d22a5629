"""Communication times: pure formulas over numbers, and wrappers that read them off a Cluster.

Units: bytes, bytes/s, seconds. α is a per-message latency, β a bandwidth. A transfer of 0 bytes, or a
collective over fewer than two devices, costs 0.

Pure formulas:

- ``p2p_time``: α + S/β.
- ``ring_allreduce_time``: reduce-scatter then all-gather around a ring of n devices, each moving
  (n−1)/n · S in each phase through its slowest hop: 2(n−1)/n · S/β + 2(n−1)·α.
- ``ps_push_pull_time``: w workers push S bytes of gradient to a parameter server, then pull S bytes of
  parameters back. The PS's link is the bottleneck: it takes the w streams one after another, so each
  phase lasts α + w·S/β, and the whole 2·(α + w·S/β). A PS on one of the training devices has
  w = n − 1 (its own share does not cross a link).
- ``chain_broadcast_time``: a pipelined chain broadcast of S bytes from a root to n − 1 others in k
  chunks, T(k) = (k + n − 2)·(α + S/(k·β)), at the best whole k (near √((n−2)·S/(α·β))). With α = 0 it
  tends to S/β; with n = 2 it is α + S/β. Bandwidth-optimal for the large tensors planners move, and
  never slower than a binary tree by more than the latency terms.

Cluster wrappers (``cluster.bandwidth [D, D]``, ``cluster.latency [D, D]``, ``cluster.machine [D]``,
``cluster.nic_bandwidth [M]``, ``inf`` = no shared NIC) model **NIC sharing**: the hops of one
collective that leave a machine share its NIC's egress bandwidth and those that enter it share its
ingress (full duplex), so a hop from machine a to machine b gets at most
min(bandwidth[i, j], nic[a] / hops out of a, nic[b] / hops into b). A ring in device order whose
machines are contiguous has one hop out of and one into each machine; an interleaved order has more,
and pays for it. Collectives are flat (no hierarchical all-reduce).

Measured collectives: a cluster of processes measured by ``tag profile`` (``local:N``,
:class:`tag.cluster.presets.LocalCluster`) carries the per-hop α and β of its measured all-reduce
(:func:`collective_figures`). Its rings are priced by them instead of by the links
(:func:`ring_parameters`), and so is the latency of each phase of a parameter server, whose push and pull
the runtime runs as a gloo reduce and broadcast (:func:`ps_phase_latency`): a gloo collective waits once
for its last rank and wakes those that waited, which the links' point-to-point latency (a hand-over per
message) does not describe.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from tag.errors import ClusterError

__all__ = [
    "p2p_time",
    "ring_allreduce_time",
    "ring_parameters",
    "ps_push_pull_time",
    "chain_broadcast_time",
    "transfer_time",
    "allreduce_time",
    "ps_time",
    "broadcast_time",
    "hop_bandwidths",
    "collective_figures",
    "ps_phase_latency",
]


def _check(nbytes: float, bandwidth: float, latency: float) -> None:
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be non-negative, got {nbytes!r}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth!r}")
    if not latency >= 0:
        raise ValueError(f"latency must be non-negative, got {latency!r}")


# -------------------------------------------------------------------------------------------- pure formulas


def p2p_time(nbytes, bandwidth, latency=0.0):
    """α + S/β; 0 for 0 bytes. Broadcasts over numpy arrays (then returns an array)."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    bandwidth = np.asarray(bandwidth, dtype=np.float64)
    latency = np.asarray(latency, dtype=np.float64)
    if (nbytes < 0).any() or not (bandwidth > 0).all() or (latency < 0).any():
        raise ValueError("p2p_time: nbytes and latency must be non-negative and bandwidth positive")
    out = np.where(nbytes > 0, latency + nbytes / bandwidth, 0.0)
    return float(out) if out.ndim == 0 else out


def ring_allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    """2(n−1)/n · S/β + 2(n−1)·α over a ring of ``n`` devices whose slowest hop has bandwidth β."""
    _check(nbytes, bandwidth, latency)
    if n <= 1 or nbytes == 0:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / bandwidth + 2.0 * (n - 1) * latency


def ps_push_pull_time(nbytes: float, workers: int, bandwidth: float, latency: float = 0.0) -> float:
    """2 · (α + w·S/β): ``workers`` push S bytes each through the PS's link, then pull S bytes each."""
    _check(nbytes, bandwidth, latency)
    if workers <= 0 or nbytes == 0:
        return 0.0
    return 2.0 * (latency + workers * nbytes / bandwidth)


def chain_broadcast_time(nbytes: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    """Pipelined chain broadcast of S bytes to ``n`` devices (root included): min over k of
    (k + n − 2)·(α + S/(k·β))."""
    _check(nbytes, bandwidth, latency)
    if n <= 1 or nbytes == 0:
        return 0.0
    if n == 2:
        return latency + nbytes / bandwidth
    if latency == 0:
        return nbytes / bandwidth
    best = math.sqrt((n - 2) * nbytes / (latency * bandwidth))
    candidates = {max(1, math.floor(best)), max(1, math.ceil(best))}
    return min((k + n - 2) * (latency + nbytes / (k * bandwidth)) for k in candidates)


# -------------------------------------------------------------------------------------------- cluster wrappers


def _devices(cluster: Any, devices: Sequence[int], what: str) -> list[int]:
    ids = [int(d) for d in devices]
    num_devices = len(cluster.machine)
    bad = [d for d in ids if not 0 <= d < num_devices]
    if bad:
        raise ClusterError(f"{what}: device {bad[0]} is not in the cluster (devices 0..{num_devices - 1})")
    if len(set(ids)) != len(ids):
        raise ClusterError(f"{what}: device set {ids} repeats a device")
    return ids


def hop_bandwidths(cluster: Any, hops: Sequence[tuple[int, int]]) -> np.ndarray:
    """[H] bandwidth of each hop (i, j) of one collective, with NIC sharing (module docstring)."""
    if len(hops) == 0:
        return np.zeros(0)
    src = np.array([a for a, _ in hops], dtype=np.int64)
    dst = np.array([b for _, b in hops], dtype=np.int64)
    machine = np.asarray(cluster.machine)
    nic = np.asarray(cluster.nic_bandwidth, dtype=np.float64)
    out = np.asarray(cluster.bandwidth, dtype=np.float64)[src, dst].copy()
    cross = machine[src] != machine[dst]
    if cross.any():
        egress = np.bincount(machine[src][cross], minlength=len(nic))  # hops leaving each machine
        ingress = np.bincount(machine[dst][cross], minlength=len(nic))  # hops entering each machine
        m_src, m_dst = machine[src][cross], machine[dst][cross]
        out[cross] = np.minimum.reduce([out[cross], nic[m_src] / egress[m_src], nic[m_dst] / ingress[m_dst]])
    return out


def transfer_time(cluster: Any, src: int, dst: int, nbytes: float) -> float:
    """Point-to-point time from device ``src`` to ``dst``: α + S/β, β capped by the NICs between machines."""
    src, dst = _devices(cluster, [src], "transfer_time")[0], _devices(cluster, [dst], "transfer_time")[0]
    if src == dst or nbytes == 0:
        return 0.0
    bandwidth = hop_bandwidths(cluster, [(src, dst)])[0]
    return p2p_time(nbytes, bandwidth, float(cluster.latency[src, dst]))


def allreduce_time(cluster: Any, devices: Sequence[int], nbytes: float) -> float:
    """Ring all-reduce of S bytes over ``devices`` in the order given (the ring closes back to the first).

    β is the slowest ring hop after NIC sharing, α the largest hop latency.
    """
    n, bandwidth, latency = ring_parameters(cluster, devices)
    if n <= 1 or nbytes == 0:
        return 0.0
    return ring_allreduce_time(nbytes, n, bandwidth, latency)


def ring_parameters(cluster: Any, devices: Sequence[int]) -> tuple[int, float, float]:
    """(n, β, α) of the ring over ``devices`` in the order given that :func:`allreduce_time` prices:
    β the slowest hop after NIC sharing, α the largest hop latency, or the cluster's measured collective
    figures where it has them (module docstring; inf, 0 for one device); for pricing many all-reduces
    over one ring with :func:`ring_allreduce_time`."""
    ring = _devices(cluster, devices, "allreduce_time")
    n = len(ring)
    if n <= 1:
        return n, float("inf"), 0.0
    measured = collective_figures(cluster)
    if measured is not None:
        return n, measured[1], measured[0]
    hops = [(ring[k], ring[(k + 1) % n]) for k in range(n)]
    return n, float(hop_bandwidths(cluster, hops).min()), max(float(cluster.latency[a, b]) for a, b in hops)


def collective_figures(cluster: Any) -> tuple[float, float] | None:
    """(α, β) per ring hop of the collectives measured on ``cluster``'s processes, or None where its links
    price its collectives (module docstring)."""
    latency = getattr(cluster, "collective_latency_s", None)  # LocalCluster's; other clusters have none
    bandwidth = getattr(cluster, "collective_bandwidth", None)
    if latency is None or bandwidth is None:
        return None
    return float(latency), float(bandwidth)


def ps_phase_latency(cluster: Any, members: int, link_latency: float) -> float:
    """Latency of one push or one pull of a parameter server over ``members`` devices (server included):
    the largest latency of its workers' links ``link_latency``, or on a cluster with measured collectives
    the latency of one whole collective over them, 2(n−1)·α (module docstring)."""
    measured = collective_figures(cluster)
    if measured is None or members <= 1:
        return link_latency
    return 2.0 * (members - 1) * measured[0]


def ps_time(cluster: Any, devices: Sequence[int], ps_device: int, nbytes: float) -> float:
    """Gradient sync of S bytes through a parameter server on ``ps_device``: every other device of
    ``devices`` pushes S bytes, then pulls S bytes.

    The PS takes one stream at a time (its link is the bottleneck), so each phase lasts
    max α + Σ_w S / β_w, with β_w the bandwidth from worker w to the PS, capped by the NICs when they
    are on different machines: 2·(max α + Σ_w S/β_w) in all; ``ps_push_pull_time`` when all β_w are equal.
    """
    members = _devices(cluster, devices, "ps_time")
    ps = _devices(cluster, [ps_device], "ps_time")[0]
    workers = [d for d in members if d != ps]
    if not workers or nbytes == 0:
        return 0.0
    if nbytes < 0:
        raise ValueError(f"nbytes must be non-negative, got {nbytes!r}")
    bandwidth = np.array([hop_bandwidths(cluster, [(w, ps)])[0] for w in workers])
    latency = ps_phase_latency(cluster, len(workers) + 1, max(float(cluster.latency[w, ps]) for w in workers))
    return 2.0 * (latency + float(np.sum(nbytes / bandwidth)))


def broadcast_time(cluster: Any, src: int, devices: Sequence[int], nbytes: float) -> float:
    """Pipelined chain broadcast of S bytes from ``src`` through ``devices`` in the order given (``src``
    is skipped if listed). β is the slowest chain hop after NIC sharing, α the largest hop latency."""
    root = _devices(cluster, [src], "broadcast_time")[0]
    chain = [root] + [d for d in _devices(cluster, devices, "broadcast_time") if d != root]
    if len(chain) <= 1 or nbytes == 0:
        return 0.0
    hops = list(zip(chain[:-1], chain[1:]))
    bandwidth = float(hop_bandwidths(cluster, hops).min())
    latency = max(float(cluster.latency[a, b]) for a, b in hops)
    return chain_broadcast_time(nbytes, len(chain), bandwidth, latency)
