"""Build a Cluster from machines, a network and direct links, the way a spec file or a preset states it.

Machines hold devices joined by one intra-machine link each; machines meet through a switched network
whose pair bandwidth is the lesser of the two NICs; per-pair links override either. Pairs left without
a direct link (no network, a sparse bandwidth matrix) are routed over the widest path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tag.cluster.cluster import Cluster, widest_paths
from tag.cluster.gpus import GPUType, gpu_type
from tag.errors import ClusterError

__all__ = ["Machine", "Link", "build_cluster", "INTRA_LATENCY_S", "NETWORK_LATENCY_S"]

# Latencies used where a spec or a preset does not give one: a GPU-to-GPU copy inside a machine
# (NVLink or PCIe) costs a couple of microseconds, a hop through a NIC and a switch a few more.
INTRA_LATENCY_S = 2e-6
NETWORK_LATENCY_S = 5e-6


@dataclass(frozen=True)
class Machine:
    """``count`` devices of one GPU type joined pairwise by ``bandwidth`` bytes/s (``None`` for a
    single device, or when a bandwidth matrix gives the pairs). ``nic`` overrides the network's NIC."""

    gpu: str | GPUType
    count: int = 1
    bandwidth: float | None = None
    latency: float = INTRA_LATENCY_S
    nic: float | None = None


@dataclass(frozen=True)
class Link:
    """A direct link between global devices ``a`` and ``b``; ``latency=None`` keeps the pair's own."""

    a: int
    b: int
    bandwidth: float
    latency: float | None = None


# Bandwidth tables are D x D and routing is cubic in D: beyond this, a spec is almost surely a mistake.
MAX_DEVICES = 4096


def build_cluster(
    name: str,
    machines: Sequence[Machine],
    *,
    network_bandwidth: float | None = None,
    network_latency: float = NETWORK_LATENCY_S,
    links: Sequence[Link] = (),
    bandwidth_matrix: np.ndarray | None = None,
    latency_matrix: np.ndarray | None = None,
) -> Cluster:
    """A Cluster with devices numbered machine by machine.

    ``bandwidth_matrix`` [D, D] (bytes/s; NaN where two devices have no direct link) replaces the
    machine and network bandwidths; ``latency_matrix`` [D, D] likewise replaces the latencies. Without
    a network, devices of different machines are linked only by ``links`` (then routed). Each machine's
    NIC is its ``nic``, else the network bandwidth, else ``inf`` (no shared NIC).
    """
    if not machines:
        raise ClusterError(f"cluster {name!r} has no machines")
    types: list[GPUType] = []
    device_type: list[int] = []
    machine_of: list[int] = []
    for m, spec in enumerate(machines):
        gpu = spec.gpu if isinstance(spec.gpu, GPUType) else gpu_type(spec.gpu)
        if gpu not in types:
            types.append(gpu)
        if not isinstance(spec.count, (int, np.integer)) or spec.count < 1:
            raise ClusterError(f"machine {m}: count must be a positive integer, got {spec.count!r}")
        device_type += [types.index(gpu)] * spec.count
        machine_of += [m] * spec.count
        if len(device_type) > MAX_DEVICES:
            raise ClusterError(f"cluster {name!r} has more than {MAX_DEVICES} devices; tag plans for at most {MAX_DEVICES}")
    machine = np.array(machine_of)
    num_devices = len(machine)
    same_machine = machine[:, None] == machine[None, :]

    bandwidth = np.zeros((num_devices, num_devices))
    latency = np.zeros((num_devices, num_devices))
    linked = np.zeros((num_devices, num_devices), dtype=bool)
    nic = np.array([_nic(spec, network_bandwidth) for spec in machines])
    if bandwidth_matrix is not None:
        bandwidth = np.array(bandwidth_matrix, dtype=np.float64)
        if bandwidth.shape != (num_devices, num_devices):
            raise ClusterError(f"bandwidth matrix must be {num_devices}x{num_devices} for {num_devices} devices, "
                               f"got {'x'.join(map(str, bandwidth.shape))}")
        linked = ~np.isnan(bandwidth)
    for m, spec in enumerate(machines):
        inside = machine == m
        block = np.ix_(inside, inside)
        if bandwidth_matrix is None and spec.count > 1:
            if spec.bandwidth is None:
                raise ClusterError(f"machine {m}: {spec.count} devices need an intra-machine bandwidth")
            bandwidth[block] = spec.bandwidth
            linked[block] = True
        _check_latency(spec.latency, f"machine {m}: latency")
        latency[block] = spec.latency
    if bandwidth_matrix is None and network_bandwidth is not None:
        between = ~same_machine
        bandwidth[between] = np.minimum(nic[:, None], nic[None, :])[machine][:, machine][between]
        linked |= between
    _check_latency(network_latency, "network latency")
    latency[~same_machine] = network_latency
    if latency_matrix is not None:
        latency = np.array(latency_matrix, dtype=np.float64)
        if latency.shape != (num_devices, num_devices):
            raise ClusterError(f"latency matrix must be {num_devices}x{num_devices}, got {latency.shape}")
    for k, link in enumerate(links):
        _apply_link(link, k, bandwidth, latency, linked)

    np.fill_diagonal(linked, False)
    declared = bandwidth[linked]
    bad = np.flatnonzero(np.isnan(declared) | (declared <= 0) | np.isinf(declared))
    if len(bad):
        i, j = np.argwhere(linked)[bad[0]]
        raise ClusterError(f"bandwidth between devices {i} and {j} is {bandwidth[i, j]}: must be positive and finite")
    _check_latency(latency[~np.eye(num_devices, dtype=bool)], "latency")
    bandwidth, latency = widest_paths(bandwidth, latency, linked)
    return Cluster(name=name, types=tuple(types), device_type=np.array(device_type), machine=machine,
                   bandwidth=bandwidth, latency=latency, nic_bandwidth=nic)


def _nic(spec: Machine, network_bandwidth: float | None) -> float:
    nic = spec.nic if spec.nic is not None else network_bandwidth
    if nic is None:
        return np.inf
    if not nic > 0:
        raise ClusterError(f"NIC bandwidth must be positive, got {nic}")
    return float(nic)


def _apply_link(link: Link, k: int, bandwidth: np.ndarray, latency: np.ndarray, linked: np.ndarray) -> None:
    num_devices = len(bandwidth)
    for end in (link.a, link.b):
        if not isinstance(end, (int, np.integer)) or not 0 <= end < num_devices:
            raise ClusterError(f"link {k}: device {end!r} is not in 0..{num_devices - 1}")
    if link.a == link.b:
        raise ClusterError(f"link {k}: joins device {link.a} to itself")
    for i, j in ((link.a, link.b), (link.b, link.a)):
        bandwidth[i, j] = link.bandwidth
        if link.latency is not None:
            latency[i, j] = link.latency
        linked[i, j] = True


def _check_latency(value: float | np.ndarray, what: str) -> None:
    values = np.atleast_1d(np.asarray(value, dtype=np.float64))
    bad = values[np.isnan(values) | (values < 0) | np.isinf(values)]
    if len(bad):
        raise ClusterError(f"{what} is {bad[0]}: must be finite and non-negative")
