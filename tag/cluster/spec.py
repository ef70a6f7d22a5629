"""Cluster spec files (YAML or JSON) → Cluster. Errors name the file and the field.

```yaml
name: my-lab
network: {bandwidth: 100Gbps, latency: 5us}      # between machines; every NIC unless a machine gives nic
gpus:                                            # optional GPU types missing from the catalogue
  rtx3090: {memory: 24GiB, memory_bandwidth: 936GB/s, fp32: 35.6TFLOPS, fp16: 71TFLOPS}
machines:
  - {gpu: v100-32gb, count: 4, bandwidth: 130GB/s, latency: 2us}   # intra-machine link
  - {gpu: 1080ti, count: 2, bandwidth: 10GB/s, repeat: 4}          # 4 such machines
links:                                                          # optional overrides, global device ids
  - {between: [0, 1], bandwidth: 43.2GB/s}
bandwidth_matrix: [[...], ...]   # optional DxD (bytes/s or strings with units, null = no direct link);
latency_matrix: [[...], ...]     # then machines give only GPU types and counts
```

A file written by ``Cluster.to_json`` (``format: tag.cluster``) loads as that cluster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tag._read import parse_json, parse_yaml, read_input
from tag.cluster.build import INTRA_LATENCY_S, MAX_DEVICES, NETWORK_LATENCY_S, Link, Machine, build_cluster
from tag.cluster.cluster import CLUSTER_FORMAT, Cluster
from tag.cluster.gpus import DTYPES, GPU_TYPES, GPUType, gpu_type
from tag.errors import ClusterError, SpecError, TagError
from tag.units import parse_bandwidth, parse_bytes, parse_flops, parse_time

__all__ = ["load_cluster", "parse_cluster_spec", "SPEC_SUFFIXES"]

SPEC_SUFFIXES = (".yaml", ".yml", ".json")
_TOP_FIELDS = ("name", "description", "network", "gpus", "machines", "links", "bandwidth_matrix", "latency_matrix")
_MACHINE_FIELDS = ("gpu", "count", "bandwidth", "latency", "nic", "repeat")
_LINK_FIELDS = ("between", "bandwidth", "latency")
_NETWORK_FIELDS = ("bandwidth", "latency")
_GPU_FIELDS = ("memory", "memory_bandwidth", "launch_overhead") + DTYPES
# Plausible ranges of a spec's quantities, far beyond any real hardware on both sides.
_BANDWIDTH = (1e3, 1e16)  # bytes/s: 1 kB/s .. 10 PB/s
_FLOPS = (1e6, 1e19)  # FLOP/s: 1 MFLOPS .. 10 EFLOPS
_MEMORY_BYTES = (1 << 20, 1 << 50)  # 1 MiB .. 1 PiB
_MAX_LATENCY_S = 1e3
_UNITS = {_BANDWIDTH: "bytes/s", _FLOPS: "FLOP/s", _MEMORY_BYTES: "bytes"}


def load_cluster(path: str | os.PathLike) -> Cluster:
    """Read a cluster spec (or a saved cluster) from a .yaml, .yml or .json file."""
    path = Path(path)
    source = str(path)
    raw = read_input(path, what="cluster spec file", error=SpecError, missing=f"{source}: cluster spec file not found")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{source}: cannot read cluster spec: {exc}") from None
    if path.suffix.lower() == ".json":
        data = parse_json(text, where=source, error=SpecError, malformed="malformed JSON")
    else:
        data = parse_yaml(text, where=source, error=SpecError)
    return parse_cluster_spec(data, source=source, default_name=path.stem)


def parse_cluster_spec(data: Any, *, source: str = "cluster spec", default_name: str = "cluster") -> Cluster:
    """A Cluster from a parsed spec document; errors read ``"{source}: {field}: {problem}"``."""
    try:
        if isinstance(data, dict) and (data.get("format") == CLUSTER_FORMAT or "device_type" in data):
            return Cluster.from_json(data)
        return _parse_spec(data, default_name)
    except TagError as exc:
        raise type(exc)(f"{source}: {exc}") from None


def _parse_spec(data: Any, default_name: str) -> Cluster:
    if data is None:
        raise SpecError("the spec is empty")
    if not isinstance(data, dict):
        raise SpecError(f"the spec must be a mapping of fields, got {type(data).__name__}")
    _check_fields(data, _TOP_FIELDS, "")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"name: expected a non-empty string, got {name!r}")
    custom = _parse_gpus(data.get("gpus", {}))
    network_bandwidth, network_latency = _parse_network(data.get("network"))
    has_matrix = data.get("bandwidth_matrix") is not None
    machines = _parse_machines(data.get("machines"), custom, has_matrix)
    num_devices = sum(m.count for m in machines)
    bandwidth_matrix = latency_matrix = None
    if has_matrix:
        bandwidth_matrix = _parse_matrix(data["bandwidth_matrix"], num_devices, "bandwidth_matrix", _bandwidth)
    if data.get("latency_matrix") is not None:
        latency_matrix = _parse_matrix(data["latency_matrix"], num_devices, "latency_matrix", _latency)
        if np.isnan(latency_matrix[~np.eye(num_devices, dtype=bool)]).any():
            raise SpecError("latency_matrix: every off-diagonal entry needs a value")
        np.fill_diagonal(latency_matrix, 0.0)
    links = _parse_links(data.get("links", []), num_devices)
    if len(machines) > 1 and network_bandwidth is None and bandwidth_matrix is None and not links:
        raise ClusterError(f"disconnected cluster: {len(machines)} machines and no network, links or "
                           "bandwidth_matrix to join them")
    return build_cluster(name.strip(), machines, network_bandwidth=network_bandwidth,
                         network_latency=network_latency, links=links,
                         bandwidth_matrix=bandwidth_matrix, latency_matrix=latency_matrix)


def _parse_network(network: Any) -> tuple[float | None, float]:
    if network is None:
        return None, NETWORK_LATENCY_S
    if isinstance(network, (str, int, float)) and not isinstance(network, bool):
        return _bandwidth(network, "network"), NETWORK_LATENCY_S
    if not isinstance(network, dict):
        raise SpecError(f"network: expected {{bandwidth: ..., latency: ...}}, got {network!r}")
    _check_fields(network, _NETWORK_FIELDS, "network.")
    if "bandwidth" not in network:
        raise SpecError("network.bandwidth: missing")
    return (_bandwidth(network["bandwidth"], "network.bandwidth"),
            _latency(network.get("latency", NETWORK_LATENCY_S), "network.latency"))


def _parse_machines(entries: Any, custom: dict[str, GPUType], has_matrix: bool) -> list[Machine]:
    if entries is None:
        raise SpecError("machines: missing; list at least one machine")
    if not isinstance(entries, list) or not entries:
        raise SpecError("machines: expected a non-empty list of machines")
    machines: list[Machine] = []
    num_devices = 0
    for i, entry in enumerate(entries):
        where = f"machines[{i}]"
        if not isinstance(entry, dict):
            raise SpecError(f"{where}: expected a mapping such as {{gpu: v100-32gb, count: 4, bandwidth: 130GB/s}}")
        _check_fields(entry, _MACHINE_FIELDS, f"{where}.")
        if "gpu" not in entry:
            raise SpecError(f"{where}.gpu: missing")
        gpu = _gpu(entry["gpu"], custom, f"{where}.gpu")
        count = _positive_int(entry.get("count", 1), f"{where}.count")
        repeat = _positive_int(entry.get("repeat", 1), f"{where}.repeat")
        num_devices += count * repeat  # checked before the list of machines is built
        if num_devices > MAX_DEVICES:
            raise ClusterError(f"{where}: brings the cluster to {num_devices:,} devices; tag plans for at most "
                               f"{MAX_DEVICES}")
        bandwidth = entry.get("bandwidth")
        if has_matrix and bandwidth is not None:
            raise SpecError(f"{where}.bandwidth: conflicts with bandwidth_matrix; give one or the other")
        if bandwidth is not None:
            bandwidth = _bandwidth(bandwidth, f"{where}.bandwidth")
        elif count > 1 and not has_matrix:
            raise SpecError(f"{where}.bandwidth: missing; {count} GPUs in one machine need an intra-machine bandwidth")
        latency = _latency(entry.get("latency", INTRA_LATENCY_S), f"{where}.latency")
        nic = _bandwidth(entry["nic"], f"{where}.nic") if entry.get("nic") is not None else None
        machines += [Machine(gpu, count, bandwidth, latency, nic)] * repeat
    return machines


def _parse_links(entries: Any, num_devices: int) -> list[Link]:
    if not isinstance(entries, list):
        raise SpecError("links: expected a list of {between: [a, b], bandwidth: ...}")
    links = []
    seen: dict[tuple[int, int], int] = {}  # device pair -> the link entry that gave it
    for k, entry in enumerate(entries):
        where = f"links[{k}]"
        if not isinstance(entry, dict):
            raise SpecError(f"{where}: expected a mapping {{between: [a, b], bandwidth: ...}}")
        _check_fields(entry, _LINK_FIELDS, f"{where}.")
        between = entry.get("between")
        if (not isinstance(between, list) or len(between) != 2
                or not all(isinstance(d, int) and not isinstance(d, bool) for d in between)):
            raise SpecError(f"{where}.between: expected two device ids [a, b], got {between!r}")
        a, b = between
        if not (0 <= a < num_devices and 0 <= b < num_devices):
            raise SpecError(f"{where}.between: device ids must be in 0..{num_devices - 1}, got {between}")
        if a == b:
            raise SpecError(f"{where}.between: joins device {a} to itself")
        if (min(a, b), max(a, b)) in seen:
            raise SpecError(f"{where}.between: devices {a} and {b} are already linked by "
                            f"links[{seen[min(a, b), max(a, b)]}]")
        seen[min(a, b), max(a, b)] = k
        if "bandwidth" not in entry:
            raise SpecError(f"{where}.bandwidth: missing")
        latency = _latency(entry["latency"], f"{where}.latency") if entry.get("latency") is not None else None
        links.append(Link(a, b, _bandwidth(entry["bandwidth"], f"{where}.bandwidth"), latency))
    return links


def _parse_matrix(rows: Any, size: int, field: str, parse) -> np.ndarray:
    """[size, size] float64; ``null`` off the diagonal becomes NaN, the diagonal is not read."""
    if not isinstance(rows, list) or len(rows) != size or not all(isinstance(r, list) and len(r) == size for r in rows):
        raise SpecError(f"{field}: expected {size} rows of {size} entries (one per device)")
    out = np.full((size, size), np.nan)
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            if i != j and value is not None:
                out[i, j] = parse(value, f"{field}[{i}][{j}]")
    asymmetric = np.argwhere(~((out == out.T) | (np.isnan(out) & np.isnan(out.T))))
    if len(asymmetric):
        i, j = asymmetric[0]
        raise SpecError(f"{field}: not symmetric: [{i}][{j}] = {rows[i][j]!r} but [{j}][{i}] = {rows[j][i]!r}")
    return out


def _parse_gpus(entries: Any) -> dict[str, GPUType]:
    if not isinstance(entries, dict):
        raise SpecError("gpus: expected a mapping of GPU type name to {memory, memory_bandwidth, fp32, ...}")
    custom = {}
    for name, entry in entries.items():
        where = f"gpus.{name}"
        key = str(name).strip().lower()
        if key in GPU_TYPES:
            raise SpecError(f"{where}: {key!r} is already in the GPU catalogue; choose another name")
        if key in custom:  # names are case-insensitive: "RTX" and "rtx" are one type
            raise SpecError(f"{where}: {key!r} is defined twice (GPU type names ignore case)")
        if not isinstance(entry, dict):
            raise SpecError(f"{where}: expected a mapping {{memory, memory_bandwidth, fp32, ...}}")
        _check_fields(entry, _GPU_FIELDS, f"{where}.")
        for required in ("memory", "memory_bandwidth", "fp32"):
            if required not in entry:
                raise SpecError(f"{where}.{required}: missing")
        peaks = tuple((dtype, parse_flops(entry[dtype], what=f"{where}.{dtype}")) for dtype in DTYPES if dtype in entry)
        custom[key] = GPUType(
            name=key,
            memory_bytes=_in_range(parse_bytes(entry["memory"], what=f"{where}.memory"), _MEMORY_BYTES,
                                   f"{where}.memory", entry["memory"]),
            memory_bandwidth=_bandwidth(entry["memory_bandwidth"], f"{where}.memory_bandwidth"),
            peak_flops=peaks,
            launch_overhead_s=_latency(entry.get("launch_overhead", 5e-6), f"{where}.launch_overhead"),
            description="defined in the spec",
        )
        for dtype, value in peaks:
            _in_range(value, _FLOPS, f"{where}.{dtype}", entry[dtype])
    return custom


# --------------------------------------------------------------------------------------- fields


def _check_fields(entry: dict, allowed: tuple[str, ...], prefix: str) -> None:
    unknown = [k for k in entry if k not in allowed]
    if unknown:
        raise SpecError(f"{prefix}{unknown[0]}: unknown field (expected one of {', '.join(allowed)})")


def _gpu(name: Any, custom: dict[str, GPUType], where: str) -> GPUType:
    if isinstance(name, str) and name.strip().lower() in custom:
        return custom[name.strip().lower()]
    try:
        return gpu_type(name)
    except ClusterError:
        known = ", ".join(list(GPU_TYPES) + list(custom))
        raise ClusterError(f"{where}: unknown GPU type {name!r} (known: {known})") from None


def _bandwidth(value: Any, where: str) -> float:
    return _in_range(_signed(parse_bandwidth, value, where), _BANDWIDTH, where, value)


def _latency(value: Any, where: str) -> float:
    seconds = _signed(parse_time, value, where)
    if not np.isfinite(seconds) or seconds < 0:
        raise ClusterError(f"{where}: latency must be finite and non-negative, got {value!r}")
    if seconds > _MAX_LATENCY_S:
        raise ClusterError(f"{where}: latency must be at most {_MAX_LATENCY_S:g} s, got {value!r}")
    return seconds


def _signed(parse, value: Any, where: str) -> float:
    """``parse`` that also reads a leading minus, so that "-2us" is reported as negative, not unreadable."""
    if isinstance(value, str) and value.strip().startswith("-"):
        return -parse(value.strip()[1:], what=where)
    return parse(value, what=where)


def _in_range(number: float, bounds: tuple[float, float], where: str, shown: Any) -> float:
    """``number`` if it is positive and within ``bounds`` (far outside them the simulator's times overflow or
    underflow, and its errors would name a task instead of this field)."""
    if not np.isfinite(number) or number <= 0:
        raise ClusterError(f"{where}: must be positive and finite, got {shown!r}")
    low, high = bounds
    if not low <= number <= high:
        raise ClusterError(f"{where}: must be in {low:g}..{high:g} ({_UNITS[bounds]}), got {shown!r}")
    return number


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEVICES:
        raise SpecError(f"{where}: expected an integer in 1..{MAX_DEVICES}, got {value!r}")
    return value

