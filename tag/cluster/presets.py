"""Named clusters from the papers, addressed ``NAME[:ARGS]`` (``mesh2d:8x8``, ``tag-random:seed=3``).

ARGS is a comma-separated list: at most one positional value (a grid shape or a device count) and
``key=value`` pairs. :func:`resolve_cluster` also takes a path to a spec file.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

from tag.cluster.build import MAX_DEVICES, Link, Machine, build_cluster
from tag.cluster.cluster import Cluster
from tag.cluster.generators import grid_cluster, random_blk_1, random_blk_2, tag_random, uniform_dist
from tag.cluster.gpus import GPU_TYPES, gpu_type
from tag.cluster.spec import _BANDWIDTH, _MAX_LATENCY_S, SPEC_SUFFIXES, load_cluster
from tag.errors import ClusterError, SpecError
from tag.units import parse_bandwidth, parse_time

__all__ = [
    "PRESETS",
    "PresetInfo",
    "list_presets",
    "resolve_cluster",
    "tag_testbed",
    "tag_cloud",
    "two_level",
    "dgx1x4",
    "local_cluster",
    "LocalCluster",
    "LOCAL_BANDWIDTH",
    "LOCAL_LATENCY_S",
    "DGX1_NVLINK_SINGLE",
    "DGX1_NVLINK_DOUBLE",
]

_GB = 1e9
_GBPS = 1e9 / 8
_NVLINK_V100 = 130 * _GB  # TAG testbed and cloud: V100 machines with NVLink
_PCIE = 10 * _GB  # TAG testbed and cloud: machines without NVLink

# DGX-1V hybrid cube mesh (local GPU ids): pairs joined by one NVLink and by two. Each GPU has 6 lanes.
DGX1_NVLINK_SINGLE = ((0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7))
DGX1_NVLINK_DOUBLE = ((0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7))
# Parmesan App. D-B: profiled bandwidths of the Alibaba cloud 4x DGX-1 machines.
_DGX1_DOUBLE, _DGX1_SINGLE, _DGX1_PCIE, _DGX1_ETHERNET = 43.2 * _GB, 21.4 * _GB, 10.1 * _GB, 1.4 * _GB
# `local:N` without a measurement: gloo between two processes of one host over the loopback, as
# `tag profile` measured it on a 2-core build machine (1 MiB-16 MiB messages at 2-4 GB/s; small messages
# at 0.1-2 ms, the wake-up latency of a loaded host). A profile's own curve replaces both.
LOCAL_BANDWIDTH = 2 * _GB
LOCAL_LATENCY_S = 2e-4


def tag_testbed() -> Cluster:
    """TAG §5.2 testbed: 1 machine of 4 V100-32GB over NVLink, 4 of 2 GTX 1080Ti and 2 of 2 P100 over
    PCIe, on a 100 Gbps switch. 16 GPUs."""
    machines = ([Machine("v100-32gb", 4, _NVLINK_V100)] + [Machine("1080ti", 2, _PCIE)] * 4
                + [Machine("p100", 2, _PCIE)] * 2)
    return build_cluster("tag-testbed", machines, network_bandwidth=100 * _GBPS)


def tag_cloud() -> Cluster:
    """TAG §5.2 cloud: 2 machines of 8 V100-16GB over NVLink, 4 of 4 T4 over PCIe, 10 Gbps. 32 GPUs."""
    machines = [Machine("v100-16gb", 8, _NVLINK_V100)] * 2 + [Machine("t4", 4, _PCIE)] * 4
    return build_cluster("tag-cloud", machines, network_bandwidth=10 * _GBPS)


def two_level() -> Cluster:
    """Parmesan's two-level hierarchy (App. D-B): 4 machines of 4 Titan V, 11 GB/s PCIe inside,
    1.1 GB/s Ethernet between. 16 GPUs."""
    return build_cluster("two-level", [Machine("titan-v", 4, 11 * _GB)] * 4, network_bandwidth=1.1 * _GB)


def dgx1x4() -> Cluster:
    """Parmesan's 4x DGX-1 (App. D-B): 4 machines of 8 V100-32GB; inside, double NVLink 43.2 GB/s,
    single NVLink 21.4 GB/s, otherwise PCIe 10.1 GB/s; 1.4 GB/s Ethernet between machines. 32 GPUs."""
    num_machines, per_machine = 4, 8
    links = [Link(m * per_machine + a, m * per_machine + b, bandwidth)
             for m in range(num_machines)
             for pairs, bandwidth in ((DGX1_NVLINK_SINGLE, _DGX1_SINGLE), (DGX1_NVLINK_DOUBLE, _DGX1_DOUBLE))
             for a, b in pairs]
    machines = [Machine("v100-32gb", per_machine, _DGX1_PCIE)] * num_machines
    return build_cluster("dgx1x4", machines, network_bandwidth=_DGX1_ETHERNET, links=links)


@dataclass(eq=False)
class LocalCluster(Cluster):
    """``local:N``: processes of this host, whose collectives may have a measured latency and bandwidth of
    their own. A gloo collective between processes waits once for its last rank and wakes the ones that
    waited, where the ring formula at the point-to-point latency charges 2(n−1) hand-overs; a profile's
    all-reduce curve, fitted as the ring formula's per-hop α and β (:mod:`tag.profile.comm`), prices them
    as measured (:func:`tag.cost.comm.collective_figures`). None: the links price them."""

    collective_latency_s: float | None = None  # α per ring hop of the measured all-reduce
    collective_bandwidth: float | None = None  # β per ring hop, bytes/s

    def _measured(self) -> dict[str, Any]:
        return {"collective_latency_s": self.collective_latency_s, "collective_bandwidth": self.collective_bandwidth}


def local_cluster(processes: int = 2, *, gpu: str = "cpu", profile: Any = None, bandwidth: float | None = None,
                  latency: float | None = None, collective_latency: float | None = None,
                  collective_bandwidth: float | None = None) -> LocalCluster:
    """``processes`` processes of this host, what `tag run` starts for a plan (one per device), pairwise
    joined by the backend's point-to-point curve: ``bandwidth``/``latency`` where given, else the fit of a
    profile's measured point-to-point curve (``profile``: a :class:`tag.profile.Profile`; the curve
    measured with device ``gpu``, else the profile's only one), else LOCAL_BANDWIDTH and LOCAL_LATENCY_S.
    Collectives: ``collective_latency``/``collective_bandwidth`` (per ring hop) where given, else the
    profile's all-reduce fit where it has one, else the links' (:class:`LocalCluster`).
    ``gpu``: the device type of a process (``cpu``: the ranks of `tag run` compute on the CPU).

    Each process is its own "machine" of one device, so each is its own device group, the unit a
    placement plan places op groups on (one machine of N equal devices would be one device group, and a
    plan could only replicate, duplicate or split every op group over all N); each process's socket is
    its NIC, shared by the streams of one collective as the network model shares a NIC."""
    if processes > MAX_DEVICES:  # checked before the list of machines is built
        raise ClusterError(f"{processes} devices asked for; tag plans for at most {MAX_DEVICES}")
    curve = _profile_curve(profile, gpu, "p2p") if profile is not None else None
    if bandwidth is None:
        bandwidth = curve.bandwidth if curve is not None else LOCAL_BANDWIDTH
    if latency is None:
        latency = curve.latency_s if curve is not None else LOCAL_LATENCY_S
    collective = _profile_curve(profile, gpu, "allreduce", required=False) if profile is not None else None
    if collective is not None:
        collective_latency = collective.latency_s if collective_latency is None else collective_latency
        collective_bandwidth = collective.bandwidth if collective_bandwidth is None else collective_bandwidth
    links = build_cluster(f"local:{processes}", [Machine(gpu, 1)] * processes, network_bandwidth=bandwidth,
                          network_latency=latency)
    return LocalCluster(**{f.name: getattr(links, f.name) for f in dataclasses.fields(Cluster)},
                        collective_latency_s=collective_latency, collective_bandwidth=collective_bandwidth)


def _profile_curve(profile: Any, gpu: str, kind: str, *, required: bool = True):
    """The ``kind`` (p2p, allreduce) curve of ``profile`` for processes of type ``gpu`` (or its only one);
    None where it has none and it is not ``required``."""
    curves = {name: device.comm[kind] for name, device in profile.devices.items() if kind in device.comm}
    if gpu in curves:
        return curves[gpu]
    if len(curves) == 1:
        return next(iter(curves.values()))
    if not required:
        return None
    measured = ", ".join(curves) or "none"
    raise SpecError(f"cluster preset local: the profile has no point-to-point measurement for {gpu!r} "
                    f"(measured: {measured}); run `tag profile` on this host without --no-comm")


# --------------------------------------------------------------------------------------- registry


def _parse_shape(ndim: int) -> Callable[[str], tuple[int, ...]]:
    def parse(text: str) -> tuple[int, ...]:
        parts = text.lower().split("x")
        if len(parts) != ndim or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"grid shape must be {'x'.join('ABC'[:ndim])} with positive integers, got {text!r}")
        return tuple(int(p) for p in parts)
    return parse


def _parse_count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return int(text)


def _parse_seed(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"expected a non-negative integer seed, got {text!r}")
    return int(text)


def _parse_profile(text: str) -> Any:
    from tag.profile.data import load_profile  # a leaf module: the data model of `tag profile`'s files

    return load_profile(text)


def _parse_bandwidth(text: str) -> float:
    value = parse_bandwidth(text, what="bandwidth")
    low, high = _BANDWIDTH  # the range a spec file's bandwidths must be in
    if not low <= value <= high:
        raise ValueError(f"bandwidth must be in {low:g}..{high:g} bytes/s, got {text!r}")
    return value


def _parse_latency(text: str) -> float:
    value = parse_time(text, what="latency")
    if not 0 <= value <= _MAX_LATENCY_S:
        raise ValueError(f"latency must be in 0..{_MAX_LATENCY_S:g} s, got {text!r}")
    return value


def _parse_gpu(text: str) -> str:
    try:
        return gpu_type(text).name
    except ClusterError:
        raise ValueError(f"unknown GPU type {text!r} (known: {', '.join(GPU_TYPES)})") from None


class PresetInfo(NamedTuple):
    name: str
    usage: str  # the address grammar, e.g. "mesh2d:AxB[,gpu=TYPE]"
    example: str  # an address that works
    devices: int | str  # devices of ``example``; "varies" when the preset draws it
    description: str
    build: Callable[..., Cluster]
    positional: tuple[str, Callable[[str], Any]] | None = None  # (keyword it fills, parser)
    keywords: dict[str, Callable[[str], Any]] = {}


def _grid(ndim: int, torus: bool) -> PresetInfo:
    kind = ("torus" if torus else "mesh") + f"{ndim}d"
    shape = "x".join("ABC"[:ndim])
    default = (8, 8) if ndim == 2 else (4, 4, 4)
    example = "x".join(map(str, default))
    wrap = ", wrapping around" if torus else ""
    return PresetInfo(
        kind, f"{kind}:{shape}[,gpu=TYPE]", f"{kind}:{example}", 64,
        f"{ndim}D {'torus' if torus else 'mesh'}, one device per point, bandwidth by hop count{wrap} "
        "(Parmesan Table IX)",
        lambda shape=default, gpu="v100-32gb": grid_cluster(shape, torus=torus, gpu=gpu),
        ("shape", _parse_shape(ndim)), {"gpu": _parse_gpu},
    )


def _lut(name: str, build: Callable[..., Cluster], description: str) -> PresetInfo:
    return PresetInfo(
        name, f"{name}:D[,seed=N][,gpu=TYPE]", f"{name}:64", 64, description,
        lambda devices=64, seed=0, gpu="v100-32gb": build(devices, seed=seed, gpu=gpu),
        ("devices", _parse_count), {"seed": _parse_seed, "gpu": _parse_gpu},
    )


PRESETS: dict[str, PresetInfo] = {
    info.name: info
    for info in (
        PresetInfo("tag-testbed", "tag-testbed", "tag-testbed", 16,
                   "TAG testbed: 1x4 V100 NVLink, 4x2 1080Ti, 2x2 P100 PCIe, 100 Gbps", tag_testbed),
        PresetInfo("tag-cloud", "tag-cloud", "tag-cloud", 32,
                   "TAG cloud: 2x8 V100-16GB NVLink, 4x4 T4 PCIe, 10 Gbps", tag_cloud),
        PresetInfo("two-level", "two-level", "two-level", 16,
                   "Parmesan two-level: 4x4 Titan V, 11 GB/s intra, 1.1 GB/s inter", two_level),
        PresetInfo("dgx1x4", "dgx1x4", "dgx1x4", 32,
                   "Parmesan 4x DGX-1 V100: NVLink 43.2/21.4 GB/s, PCIe 10.1 GB/s, Ethernet 1.4 GB/s", dgx1x4),
        _grid(2, False), _grid(2, True), _grid(3, False), _grid(3, True),
        _lut("random-blk-1", random_blk_1,
             "Parmesan random_blk_1: random nodes, one random intra bandwidth each, fixed inter"),
        _lut("random-blk-2", random_blk_2,
             "Parmesan random_blk_2: random nodes, random pair bandwidths, inter falls with node distance"),
        _lut("uniform-dist", uniform_dist, "Parmesan uniform_dist: every pair bandwidth random"),
        PresetInfo("local", "local:N[,profile=FILE][,bandwidth=BW][,latency=T][,gpu=TYPE]", "local:2", 2,
                   "N processes on this host (what tag run starts), gloo between them: the point-to-point "
                   "and all-reduce curves of a tag profile, else 2 GB/s and 200 us", local_cluster,
                   ("processes", _parse_count), {"profile": _parse_profile, "bandwidth": _parse_bandwidth,
                                                 "latency": _parse_latency, "gpu": _parse_gpu}),
        PresetInfo("tag-random", "tag-random[:seed=N][,machines=M]", "tag-random:seed=3", "varies",
                   "TAG random topology: 1-6 machines of 1-8 GPUs (V100/1080Ti/P100), 64-160 / 20-50 Gbps",
                   lambda seed=0, machines=None: tag_random(seed=seed, machines=machines),
                   None, {"seed": _parse_seed, "machines": _parse_count}),
    )
}


def list_presets() -> list[dict[str, Any]]:
    """One row per preset for ``tag clusters``: name, address (an example), devices, description."""
    return [{"name": p.name, "address": p.example, "devices": p.devices, "description": p.description}
            for p in PRESETS.values()]


def resolve_cluster(address: str | os.PathLike) -> Cluster:
    """The cluster a command line names: a spec file (.yaml, .yml, .json) or ``PRESET[:ARGS]``."""
    if isinstance(address, Cluster):
        return address
    text = os.fspath(address).strip() if isinstance(address, (str, os.PathLike)) else None
    if not text:
        raise SpecError(f"cluster address must be a preset name or a spec file path, got {address!r}")
    name, _, args = text.partition(":")
    key = name.strip().lower().replace("_", "-")
    if Path(text).suffix.lower() in SPEC_SUFFIXES and not (key in PRESETS and args):  # local:2,profile=p.json
        return load_cluster(text)
    info = PRESETS.get(key)
    if info is None:
        raise SpecError(f"unknown cluster preset {name!r}; known presets: {', '.join(PRESETS)} "
                        f"(or a path to a {'/'.join(SPEC_SUFFIXES)} spec file)")
    return info.build(**_parse_args(info, args, text))


def _parse_args(info: PresetInfo, args: str, address: str) -> dict[str, Any]:
    def fail(problem: str) -> SpecError:
        takes = info.usage if info.positional or info.keywords else f"{info.name} (takes no arguments)"
        return SpecError(f"cluster preset {address!r}: {problem}; usage: {takes}")

    kwargs: dict[str, Any] = {}
    tokens = [t.strip() for t in args.split(",")] if args.strip() else []
    for position, token in enumerate(tokens):
        if not token:
            raise fail("empty argument")
        key, eq, value = token.partition("=")
        if eq:
            key = key.strip().lower()
            if key not in info.keywords:
                raise fail(f"unknown argument {key!r}")
            field, parser = key, info.keywords[key]
        else:
            if info.positional is None or position > 0:
                raise fail(f"unexpected argument {token!r}")
            (field, parser), value = info.positional, token
        if field in kwargs:
            raise fail(f"{field} given twice")
        try:
            kwargs[field] = parser(value.strip())
        except ValueError as exc:
            raise fail(str(exc)) from None
    return kwargs
