"""Generated topologies: Parmesan's meshes, tori and random look-up tables (App. D-B, Table IX) and TAG's
random clusters (§5.2, §5.7). Every random generator takes ``seed``: an int, ``None`` or a Generator.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from tag.cluster.build import MAX_DEVICES, INTRA_LATENCY_S, NETWORK_LATENCY_S, Machine, build_cluster
from tag.cluster.cluster import Cluster
from tag.cluster.gpus import gpu_type
from tag._rng import as_rng
from tag.errors import ClusterError

__all__ = [
    "as_rng",
    "grid_cluster",
    "hop_bandwidth",
    "random_blk_1",
    "random_blk_2",
    "uniform_dist",
    "tag_random",
    "random_node_sizes",
    "TAG_RANDOM_GPUS",
]

_GB = 1e9
_GBPS = 1e9 / 8
# Parmesan App. D-B states random bandwidths in MB/us with 1 GB/s = 1024/10^6 MB/us.
_MB_PER_US = 1e6 / 1024 * _GB

# Parmesan Table IX: bandwidth (GB/s) between two devices of a mesh or torus by their hop count.
_HOP_BANDWIDTH_GBS = (78.1, 39.0, 24.4, 14.6, 9.77, 7.81, 5.86, 4.4, 2.93, 1.46,
                      0.88, 0.78, 0.68, 0.59, 0.49, 0.39, 0.29, 0.19, 0.098, 0.098)  # hops 1..20
_FAR_HOP_BANDWIDTH_GBS = ((31, 0.088), (51, 0.078))  # hops 21..31, 32..51 (the table's "31-51")
_FARTHEST_HOP_BANDWIDTH_GBS = 0.068  # hops >= 52
# Latency of one hop of a mesh or torus (Parmesan's tables carry bandwidth only).
_HOP_LATENCY_S = 1e-6
# Node sizes of random_blk_1/2: Parmesan draws "a list of random integers summing to D" without saying
# how; we draw sizes uniformly from 1..8 (a machine's worth of GPUs) and cut the last to fit.
_MAX_NODE_SIZE = 8
# TAG §5.2: GPU types, machine and GPU counts and bandwidth ranges of a random device topology.
TAG_RANDOM_GPUS = ("v100-32gb", "1080ti", "p100")
_TAG_MACHINES = (1, 6)
_TAG_GPUS_PER_MACHINE = (1, 8)
_TAG_INTRA_GBPS = (64.0, 160.0)
_TAG_INTER_GBPS = (20.0, 50.0)


# --------------------------------------------------------------------------------------- mesh / torus


def hop_bandwidth(hops: np.ndarray | int) -> np.ndarray:
    """Bytes/s between two mesh/torus devices ``hops`` apart (Parmesan Table IX); ``inf`` at 0 hops."""
    hops = np.asarray(hops, dtype=np.int64)
    table = np.array((np.inf,) + _HOP_BANDWIDTH_GBS) * _GB
    out = np.full(hops.shape, _FARTHEST_HOP_BANDWIDTH_GBS * _GB)
    for last, value in reversed(_FAR_HOP_BANDWIDTH_GBS):
        out[hops <= last] = value * _GB
    near = hops <= len(_HOP_BANDWIDTH_GBS)
    out[near] = table[hops[near]]
    return out


def grid_cluster(shape: Sequence[int], *, torus: bool = False, gpu: str = "v100-32gb",
                 hop_latency: float = _HOP_LATENCY_S, name: str | None = None) -> Cluster:
    """One device per point of a 2D/3D grid, each its own machine with no shared NIC; bandwidth from
    the Manhattan hop count (wrapping around on a torus), latency ``hop_latency`` per hop."""
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 1 for s in shape):
        raise ClusterError(f"grid shape must be positive integers, got {shape}")
    _positive(int(np.prod(shape)))
    points = np.array(list(itertools.product(*(range(s) for s in shape))))  # [D, ndim], row-major
    delta = np.abs(points[:, None, :] - points[None, :, :])  # [D, D, ndim]
    if torus:
        delta = np.minimum(delta, np.array(shape) - delta)
    hops = delta.sum(axis=-1)  # [D, D]
    kind = ("torus" if torus else "mesh") + f"{len(shape)}d"
    num_devices = len(points)
    return Cluster(
        name=name or f"{kind}-{'x'.join(map(str, shape))}",
        types=(gpu_type(gpu),),
        device_type=np.zeros(num_devices, dtype=np.int64),
        machine=np.arange(num_devices),
        bandwidth=hop_bandwidth(hops),
        latency=hops * hop_latency,
    )


# --------------------------------------------------------------------------------------- Parmesan random LUTs


def random_node_sizes(num_devices: int, rng: np.random.Generator) -> list[int]:
    """A random integer composition of ``num_devices``: sizes uniform in 1.._MAX_NODE_SIZE, last cut to fit."""
    sizes: list[int] = []
    while sum(sizes) < num_devices:
        sizes.append(int(rng.integers(1, _MAX_NODE_SIZE + 1)))
    sizes[-1] -= sum(sizes) - num_devices
    return sizes


def random_blk_1(num_devices: int, *, seed: int | np.random.Generator | None = 0, gpu: str = "v100-32gb",
                 name: str | None = None) -> Cluster:
    """Parmesan random_blk_1: nodes of random sizes, each with one intra-node bandwidth drawn from
    U[1e-4, 1e-2] MB/us, and 1e-4 MB/us between nodes. Machines are the nodes; no shared NIC."""
    rng = as_rng(seed)
    sizes = random_node_sizes(_positive(num_devices), rng)
    node = np.repeat(np.arange(len(sizes)), sizes)  # [D]
    intra = rng.uniform(1e-4, 1e-2, size=len(sizes)) * _MB_PER_US  # [L]
    bandwidth = np.where(node[:, None] == node[None, :], intra[node][:, None], 1e-4 * _MB_PER_US)
    return _lut_cluster(name or _lut_name("random-blk-1", num_devices, seed), gpu, node, bandwidth)


def random_blk_2(num_devices: int, *, seed: int | np.random.Generator | None = 0, gpu: str = "v100-32gb",
                 name: str | None = None) -> Cluster:
    """Parmesan random_blk_2: nodes of random sizes; every intra-node pair drawn from U[1e-5, 1e-2]
    MB/us; between nodes i and j, mean(intra) / 10 / |i - j|. Machines are the nodes; no shared NIC."""
    rng = as_rng(seed)
    sizes = random_node_sizes(_positive(num_devices), rng)
    node = np.repeat(np.arange(len(sizes)), sizes)  # [D]
    same = node[:, None] == node[None, :]
    pairs = _symmetric_uniform(rng, num_devices, 1e-5, 1e-2) * _MB_PER_US
    intra_pairs = same & ~np.eye(num_devices, dtype=bool)
    # With only single-device nodes there is no intra-node pair to average: use the distribution's mean.
    mean_intra = pairs[intra_pairs].mean() if intra_pairs.any() else (1e-5 + 1e-2) / 2 * _MB_PER_US
    base_inter = mean_intra / 10
    distance = np.abs(node[:, None] - node[None, :])
    bandwidth = np.where(same, pairs, base_inter / np.maximum(distance, 1))
    return _lut_cluster(name or _lut_name("random-blk-2", num_devices, seed), gpu, node, bandwidth)


def uniform_dist(num_devices: int, *, seed: int | np.random.Generator | None = 0, gpu: str = "v100-32gb",
                 name: str | None = None) -> Cluster:
    """Parmesan uniform_dist: every device pair drawn from U[1e-5, 1e-2] MB/us; one machine per device."""
    rng = as_rng(seed)
    bandwidth = _symmetric_uniform(rng, _positive(num_devices), 1e-5, 1e-2) * _MB_PER_US
    return _lut_cluster(name or _lut_name("uniform-dist", num_devices, seed), gpu, np.arange(num_devices), bandwidth)


def _symmetric_uniform(rng: np.random.Generator, size: int, low: float, high: float) -> np.ndarray:
    """[size, size] symmetric, upper triangle drawn row by row, diagonal inf."""
    out = np.full((size, size), np.inf)
    upper = np.triu_indices(size, k=1)
    out[upper] = rng.uniform(low, high, size=len(upper[0]))
    out[(upper[1], upper[0])] = out[upper]
    return out


def _lut_cluster(name: str, gpu: str, machine: np.ndarray, bandwidth: np.ndarray) -> Cluster:
    """A look-up-table cluster as in Parmesan's experiments: bandwidth only, so latency 0, no NIC."""
    num_devices = len(machine)
    return Cluster(name=name, types=(gpu_type(gpu),), device_type=np.zeros(num_devices, dtype=np.int64),
                   machine=machine, bandwidth=bandwidth, latency=np.zeros((num_devices, num_devices)))


def _lut_name(kind: str, num_devices: int, seed: object) -> str:
    return f"{kind}-{num_devices}-s{seed}" if isinstance(seed, (int, np.integer)) else f"{kind}-{num_devices}"


def _positive(num_devices: int) -> int:
    if isinstance(num_devices, bool) or not isinstance(num_devices, (int, np.integer)) or num_devices < 1:
        raise ClusterError(f"number of devices must be a positive integer, got {num_devices!r}")
    if num_devices > MAX_DEVICES:
        raise ClusterError(f"{num_devices} devices asked for; tag plans for at most {MAX_DEVICES}")
    return int(num_devices)


# --------------------------------------------------------------------------------------- TAG random


def tag_random(*, seed: int | np.random.Generator | None = 0, machines: int | None = None,
               name: str | None = None) -> Cluster:
    """TAG's random device topology (§5.2, used again in §5.7): 1–6 machines (or ``machines``), each
    with 1–8 GPUs of one type among v100-32gb, 1080ti and p100 and an intra-machine bandwidth from
    U[64, 160] Gbps; one inter-machine bandwidth from U[20, 50] Gbps for the whole cluster, which is
    also every machine's NIC."""
    rng = as_rng(seed)
    if machines is None:
        machines = int(rng.integers(_TAG_MACHINES[0], _TAG_MACHINES[1] + 1))
    machines = _positive(machines)
    specs = []
    for _ in range(machines):
        count = int(rng.integers(_TAG_GPUS_PER_MACHINE[0], _TAG_GPUS_PER_MACHINE[1] + 1))
        gpu = TAG_RANDOM_GPUS[int(rng.integers(len(TAG_RANDOM_GPUS)))]
        intra = float(rng.uniform(*_TAG_INTRA_GBPS)) * _GBPS
        specs.append(Machine(gpu=gpu, count=count, bandwidth=intra, latency=INTRA_LATENCY_S))
    inter = float(rng.uniform(*_TAG_INTER_GBPS)) * _GBPS
    if name is None:
        name = f"tag-random-s{seed}" if isinstance(seed, (int, np.integer)) else "tag-random"
    return build_cluster(name, specs, network_bandwidth=inter, network_latency=NETWORK_LATENCY_S)
