"""The Cluster: devices, machines, the device-to-device bandwidth/latency table and TAG's device groups.

D devices on M machines. ``bandwidth[i, j]`` is the effective point-to-point bandwidth of the path from
device i to device j (Parmesan's look-up table), already routed where the two have no direct link, so
every consumer reads a full table. Transfers between machines also share each machine's NIC
(``nic_bandwidth``), which the simulator models as a resource; clusters given only by a table (meshes,
Parmesan's random LUTs) have no shared NIC and store ``inf`` there.

A device group (TAG §4.2.1) is a set of devices of one GPU type on one machine with equal pairwise
bandwidth; the GNN and the search place op groups on device groups, not on single devices.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import networkx as nx
import numpy as np

from tag.cluster.gpus import GPU_TYPES, GPUType, gpu_type
from tag.errors import ClusterError, SchemaError

__all__ = ["Cluster", "CLUSTER_FORMAT", "CLUSTER_VERSION", "widest_paths"]

CLUSTER_FORMAT = "tag.cluster"
CLUSTER_VERSION = 1

# Two links whose bandwidths differ by less than this fraction count as equal when forming device groups.
_EQUAL_BANDWIDTH_RTOL = 1e-9
# Significant digits kept by the fingerprint, so that recomputing a table by another path of float
# arithmetic does not change the identity of the cluster.
_FINGERPRINT_DIGITS = 9


@dataclass(eq=False)
class Cluster:
    """D devices on M machines with a full bandwidth/latency table. Units: bytes/s, seconds.

    ``types`` lists the distinct GPU types present (strings are looked up in the catalogue). Machine
    ids must be 0..M-1, each used; every type in ``types`` must be used by some device. The diagonals
    of ``bandwidth`` and ``latency`` are set to ``inf`` and 0. ``device_group`` is computed when not
    given (see :meth:`_group_devices`); a given one must keep each group on one machine and one type.
    """

    name: str
    types: tuple[GPUType, ...]
    device_type: np.ndarray  # [D] int64, index into types
    machine: np.ndarray  # [D] int64, machine id 0..M-1
    bandwidth: np.ndarray  # [D, D] float64 bytes/s, routed path; diagonal inf
    latency: np.ndarray  # [D, D] float64 seconds; diagonal 0
    nic_bandwidth: np.ndarray | None = None  # [M] float64 bytes/s; inf where no shared NIC (default)
    device_group: np.ndarray | None = None  # [D] int64, TAG device group 0..G-1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ClusterError(f"cluster name must be a non-empty string, got {self.name!r}")
        self.types = _check_types(self.types)
        self.device_type = _int_vector(self.device_type, "device_type")
        num_devices = len(self.device_type)
        if num_devices == 0:
            raise ClusterError(f"cluster {self.name!r} has no devices")
        self.machine = _int_vector(self.machine, "machine")
        if len(self.machine) != num_devices:
            raise ClusterError(f"machine has {len(self.machine)} entries, device_type has {num_devices}")
        _check_indices(self.device_type, len(self.types), "device_type", "types")
        _check_contiguous(self.machine, "machine")
        self.bandwidth = _square(self.bandwidth, num_devices, "bandwidth")
        self.latency = _square(self.latency, num_devices, "latency")
        np.fill_diagonal(self.bandwidth, np.inf)
        np.fill_diagonal(self.latency, 0.0)
        _check_bandwidth(self.bandwidth)
        _check_latency(self.latency)
        num_machines = int(self.machine.max()) + 1
        if self.nic_bandwidth is None:
            self.nic_bandwidth = np.full(num_machines, np.inf)
        self.nic_bandwidth = np.array(self.nic_bandwidth, dtype=np.float64).reshape(-1)
        if len(self.nic_bandwidth) != num_machines:
            raise ClusterError(f"nic_bandwidth has {len(self.nic_bandwidth)} entries for {num_machines} machines")
        bad = np.flatnonzero(np.isnan(self.nic_bandwidth) | (self.nic_bandwidth <= 0))
        if len(bad):
            raise ClusterError(f"nic_bandwidth[{bad[0]}] = {self.nic_bandwidth[bad[0]]}: must be positive")
        if self.device_group is None:
            self.device_group = self._group_devices()
        else:
            self.device_group = _int_vector(self.device_group, "device_group")
            self._check_device_groups()

    # ----------------------------------------------------------------------------------- sizes

    @property
    def num_devices(self) -> int:
        return len(self.device_type)

    @property
    def num_machines(self) -> int:
        return len(self.nic_bandwidth)

    @property
    def num_device_groups(self) -> int:
        return int(self.device_group.max()) + 1

    # ----------------------------------------------------------------------------------- per device

    def gpu(self, device: int) -> GPUType:
        return self.types[int(self.device_type[device])]

    def memory_bytes(self) -> np.ndarray:
        """[D] float64 memory capacity of each device."""
        return np.array([t.memory_bytes for t in self.types])[self.device_type]

    def peak_flops(self, dtype: str = "fp32") -> np.ndarray:
        """[D] float64 peak FLOP/s of each device for ``dtype``."""
        return np.array([t.peak(dtype) for t in self.types])[self.device_type]

    # ----------------------------------------------------------------------------------- groups

    def device_groups(self) -> list[np.ndarray]:
        """Device ids of each device group, ascending."""
        return [np.flatnonzero(self.device_group == g) for g in range(self.num_device_groups)]

    def group_bandwidth(self) -> np.ndarray:
        """[G, G] least bandwidth between a device of one group and a device of the other.

        The diagonal holds the intra-group bandwidth (``inf`` for a single-device group).
        """
        groups = self.device_groups()
        out = np.empty((len(groups), len(groups)))
        for a, members_a in enumerate(groups):
            for b, members_b in enumerate(groups):
                block = self.bandwidth[np.ix_(members_a, members_b)]
                if a == b and len(members_a) > 1:
                    block = block[~np.eye(len(members_a), dtype=bool)]
                out[a, b] = block.min()
        return out

    def _group_devices(self) -> np.ndarray:
        """[D] device groups: greedily, in device order, a device joins the first group of its machine
        and type whose members all reach it, and each other, at one and the same bandwidth."""
        group = np.full(self.num_devices, -1, dtype=np.int64)
        members: list[list[int]] = []
        link: list[float] = []  # bandwidth shared by all pairs of the group; nan while it has one device
        candidates: dict[tuple[int, int], list[int]] = {}  # (machine, type) -> its groups
        for d in range(self.num_devices):
            key = (int(self.machine[d]), int(self.device_type[d]))
            for g in candidates.setdefault(key, []):
                devices = members[g]
                pair = np.concatenate([self.bandwidth[d, devices], self.bandwidth[devices, d]])
                target = pair[0] if np.isnan(link[g]) else link[g]
                if np.allclose(pair, target, rtol=_EQUAL_BANDWIDTH_RTOL, atol=0.0):
                    devices.append(d)
                    link[g] = target
                    group[d] = g
                    break
            else:
                group[d] = len(members)
                candidates[key].append(len(members))
                members.append([d])
                link.append(np.nan)
        return group

    def _check_device_groups(self) -> None:
        if len(self.device_group) != self.num_devices:
            raise ClusterError(f"device_group has {len(self.device_group)} entries for {self.num_devices} devices")
        _check_contiguous(self.device_group, "device_group")
        for g, devices in enumerate(self.device_groups()):
            if len(np.unique(self.machine[devices])) > 1 or len(np.unique(self.device_type[devices])) > 1:
                raise ClusterError(f"device group {g} mixes machines or GPU types (devices {devices.tolist()})")

    # ----------------------------------------------------------------------------------- derived views

    def subset(self, devices: Iterable[int], *, name: str | None = None) -> Cluster:
        """The cluster of ``devices`` (in the order given), machines and types renumbered."""
        ids = np.asarray(list(devices), dtype=np.int64)
        if len(ids) == 0:
            raise ClusterError("subset: no devices given")
        if ids.min() < 0 or ids.max() >= self.num_devices:
            raise ClusterError(f"subset: device ids must be in 0..{self.num_devices - 1}, got {ids.tolist()}")
        if len(np.unique(ids)) != len(ids):
            raise ClusterError(f"subset: repeated device ids in {ids.tolist()}")
        used_types, device_type = np.unique(self.device_type[ids], return_inverse=True)
        machines, first = np.unique(self.machine[ids], return_index=True)
        order = machines[np.argsort(first)]  # machines renumbered by first appearance
        renumber = {int(m): i for i, m in enumerate(order)}
        return type(self)(
            name=name or f"{self.name}-subset",
            types=tuple(self.types[t] for t in used_types),
            device_type=device_type,
            machine=np.array([renumber[int(m)] for m in self.machine[ids]]),
            bandwidth=self.bandwidth[np.ix_(ids, ids)].copy(),
            latency=self.latency[np.ix_(ids, ids)].copy(),
            nic_bandwidth=self.nic_bandwidth[order].copy(),
            **self._measured(),
        )

    def _measured(self) -> dict[str, Any]:
        """A subclass's own fields, kept by :meth:`subset` and written by :meth:`to_json` (a profiled local
        cluster's collective figures); none for a plain cluster."""
        return {}

    def to_networkx(self) -> nx.Graph:
        """Complete graph over devices: node attributes gpu, machine, device_group, memory_bytes; edge
        attributes bandwidth, latency and ``intra_machine``."""
        graph = nx.Graph(name=self.name)
        memory = self.memory_bytes()
        for d in range(self.num_devices):
            graph.add_node(d, gpu=self.gpu(d).name, machine=int(self.machine[d]),
                           device_group=int(self.device_group[d]), memory_bytes=float(memory[d]))
        for i in range(self.num_devices):
            for j in range(i + 1, self.num_devices):
                graph.add_edge(i, j, bandwidth=float(self.bandwidth[i, j]), latency=float(self.latency[i, j]),
                               intra_machine=bool(self.machine[i] == self.machine[j]))
        return graph

    def summary(self) -> dict[str, Any]:
        """Counts and extremes for display (bandwidths in bytes/s, ``None`` for a single device)."""
        off_diagonal = self.bandwidth[~np.eye(self.num_devices, dtype=bool)]
        counts = np.bincount(self.device_type, minlength=len(self.types))
        return {
            "name": self.name,
            "devices": self.num_devices,
            "machines": self.num_machines,
            "device_groups": self.num_device_groups,
            "gpus": {t.name: int(c) for t, c in zip(self.types, counts)},
            "total_memory_bytes": float(self.memory_bytes().sum()),
            "min_bandwidth": float(off_diagonal.min()) if len(off_diagonal) else None,
            "max_bandwidth": float(off_diagonal.max()) if len(off_diagonal) else None,
        }

    def __repr__(self) -> str:
        gpus = ", ".join(f"{c}x{n}" for n, c in self.summary()["gpus"].items())
        return (f"Cluster({self.name!r}, {self.num_devices} devices [{gpus}], {self.num_machines} machines, "
                f"{self.num_device_groups} device groups)")

    # ----------------------------------------------------------------------------------- identity and IO

    def fingerprint(self) -> str:
        """sha256 hex of the canonical JSON of GPU types, machines and the tables (rounded); the name
        and the device groups (derived) do not enter it."""
        canonical = {
            "types": [_canonical_type(t) for t in self.types],
            "device_type": self.device_type.tolist(),
            "machine": self.machine.tolist(),
            "bandwidth": _encode(_round_significant(self.bandwidth)),
            "latency": _encode(_round_significant(self.latency)),
            "nic_bandwidth": _encode(_round_significant(self.nic_bandwidth)),
        }
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (``inf`` written as ``null``) that :meth:`from_json` turns back exactly."""
        return {
            "format": CLUSTER_FORMAT,
            "version": CLUSTER_VERSION,
            "name": self.name,
            "types": [t.to_json() for t in self.types],
            "device_type": self.device_type.tolist(),
            "machine": self.machine.tolist(),
            "device_group": self.device_group.tolist(),
            "nic_bandwidth": _encode(self.nic_bandwidth),
            "bandwidth": _encode(self.bandwidth),
            "latency": _encode(self.latency),
            **{key: value for key, value in self._measured().items() if value is not None},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cluster:
        if not isinstance(data, dict):
            raise SchemaError(f"cluster JSON must be an object, got {type(data).__name__}")
        if data.get("format", CLUSTER_FORMAT) != CLUSTER_FORMAT:
            raise SchemaError(f"format: expected {CLUSTER_FORMAT!r}, got {data.get('format')!r}")
        if data.get("version", CLUSTER_VERSION) != CLUSTER_VERSION:
            raise SchemaError(f"version: expected {CLUSTER_VERSION}, got {data.get('version')!r}")
        missing = [k for k in ("name", "types", "device_type", "machine", "bandwidth", "latency") if k not in data]
        if missing:
            raise SchemaError(f"cluster JSON lacks field(s) {', '.join(missing)}")
        target, measured = cls, {}
        if any(key in data for key in _LOCAL_FIELDS):  # a profiled local cluster (tag.cluster.presets)
            from tag.cluster.presets import LocalCluster

            target, measured = LocalCluster, {key: _optional_float(data.get(key), key) for key in _LOCAL_FIELDS}
        try:
            types = tuple(_type_from_json(t, i) for i, t in enumerate(data["types"]))
            return target(
                name=data["name"],
                types=types,
                device_type=data["device_type"],
                machine=data["machine"],
                bandwidth=_decode(data["bandwidth"], "bandwidth"),
                latency=_decode(data["latency"], "latency"),
                nic_bandwidth=None if data.get("nic_bandwidth") is None else _decode(data["nic_bandwidth"], "nic_bandwidth"),
                device_group=data.get("device_group"),
                **measured,
            )
        except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: an id past 64 bits
            raise SchemaError(f"malformed cluster JSON: {exc}") from None


_LOCAL_FIELDS = ("collective_latency_s", "collective_bandwidth")  # LocalCluster's measured collective figures


def _optional_float(value: Any, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
        raise SchemaError(f"{field}: expected a positive number, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------------------- routing


def widest_paths(bandwidth: np.ndarray, latency: np.ndarray, linked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fill the pairs without a direct link with the widest (max-bottleneck) path over direct links.

    ``bandwidth``, ``latency``: [D, D], read only where ``linked`` [D, D] bool (symmetric) is true.
    Linked pairs keep their own values. Every other pair gets the bottleneck of its widest path and the
    least summed latency among the paths that reach that bottleneck. Raises :class:`ClusterError` when
    some devices cannot reach each other. Returns full (bandwidth, latency) [D, D].
    """
    num_devices = len(bandwidth)
    eye = np.eye(num_devices, dtype=bool)
    linked = np.asarray(linked, dtype=bool) & ~eye
    if (linked | eye).all():  # every pair has a direct link: nothing to route
        full_bandwidth = np.where(eye, np.inf, bandwidth)
        return full_bandwidth, np.where(eye, 0.0, latency)
    width = np.where(linked, bandwidth, 0.0)
    width[eye] = np.inf
    for k in range(num_devices):  # Floyd–Warshall in the (max, min) semiring
        np.maximum(width, np.minimum(width[:, k, None], width[None, k, :]), out=width)
    if (width == 0).any():
        raise ClusterError(_disconnected_message(width > 0))
    routed = ~linked & ~eye
    out_bandwidth = np.where(linked, bandwidth, width)
    out_latency = np.where(linked, latency, 0.0)
    # Least latency among widest paths: shortest paths over the links at least as wide as the bottleneck.
    for threshold in np.unique(width[routed]):
        dist = np.where(linked & (bandwidth >= threshold), latency, np.inf)
        dist[eye] = 0.0
        for k in range(num_devices):
            np.minimum(dist, dist[:, k, None] + dist[None, k, :], out=dist)
        chosen = routed & (width == threshold)
        out_latency[chosen] = dist[chosen]
    out_bandwidth[eye] = np.inf
    return out_bandwidth, out_latency


def _disconnected_message(reach: np.ndarray) -> str:
    """``reach`` [D, D] bool, transitively closed and reflexive."""
    components: list[np.ndarray] = []
    seen = np.zeros(len(reach), dtype=bool)
    for d in range(len(reach)):
        if not seen[d]:
            members = np.flatnonzero(reach[d])
            seen[members] = True
            components.append(members)
    shown = " | ".join(_ranges(c) for c in components[:4]) + (" | ..." if len(components) > 4 else "")
    return (f"disconnected cluster: {len(components)} sets of devices cannot reach each other "
            f"(devices {shown}); give a network or links between them")


def _ranges(ids: Sequence[int]) -> str:
    """'0-3,6,8-9' for [0, 1, 2, 3, 6, 8, 9]."""
    parts: list[str] = []
    start = prev = None
    for i in list(ids) + [None]:
        if start is not None and (i is None or i != prev + 1):
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = None
        if i is not None and start is None:
            start = i
        prev = i
    return ",".join(parts)


# --------------------------------------------------------------------------------------- validation


def _check_types(types: Sequence[GPUType | str]) -> tuple[GPUType, ...]:
    if isinstance(types, (str, GPUType)):
        types = (types,)
    resolved = tuple(t if isinstance(t, GPUType) else gpu_type(t) for t in types)
    names = [t.name for t in resolved]
    if len(set(names)) != len(names):
        raise ClusterError(f"types lists a GPU type twice: {names}")
    return resolved


def _int_vector(values: Any, field: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ClusterError(f"{field} must be a vector, got shape {array.shape}")
    if len(array) and not np.issubdtype(array.dtype, np.integer):
        as_float = array.astype(np.float64)
        if not np.all(np.equal(np.mod(as_float, 1), 0)) or np.abs(as_float).max() >= 2.0**63:
            raise ClusterError(f"{field} must hold 64-bit integers")
    return array.astype(np.int64)


def _check_indices(values: np.ndarray, size: int, field: str, target: str) -> None:
    bad = np.flatnonzero((values < 0) | (values >= size))
    if len(bad):
        raise ClusterError(f"{field}[{bad[0]}] = {values[bad[0]]}: no such entry in {target} (size {size})")
    unused = sorted(set(range(size)) - set(values.tolist()))
    if unused:
        raise ClusterError(f"{target}[{unused[0]}] is used by no device; list only the types present")


def _check_contiguous(values: np.ndarray, field: str) -> None:
    if values.min() < 0:
        raise ClusterError(f"{field} ids must be non-negative")
    missing = sorted(set(range(int(values.max()) + 1)) - set(values.tolist()))
    if missing:
        raise ClusterError(f"{field} ids must be 0..{values.max()} with none skipped; {missing[0]} is unused")


def _square(values: Any, size: int, field: str) -> np.ndarray:
    try:
        array = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ClusterError(f"{field} must be a numeric [D, D] matrix") from None
    if array.shape != (size, size):
        raise ClusterError(f"{field} must have shape ({size}, {size}) for {size} devices, got {array.shape}")
    return array


def _check_bandwidth(bandwidth: np.ndarray) -> None:
    off = ~np.eye(len(bandwidth), dtype=bool)
    nan = np.argwhere(np.isnan(bandwidth) & off)
    if len(nan):
        i, j = nan[0]
        raise ClusterError(f"bandwidth[{i}, {j}] is NaN")
    negative = np.argwhere((bandwidth < 0) & off)
    if len(negative):
        i, j = negative[0]
        raise ClusterError(f"bandwidth[{i}, {j}] = {bandwidth[i, j]}: bandwidth must be positive")
    infinite = np.argwhere(np.isinf(bandwidth) & off)
    if len(infinite):
        i, j = infinite[0]
        raise ClusterError(f"bandwidth[{i}, {j}] is infinite: only a device to itself has no transfer cost")
    asymmetric = np.argwhere(bandwidth != bandwidth.T)
    if len(asymmetric):
        i, j = asymmetric[0]
        raise ClusterError(f"bandwidth is not symmetric: [{i}, {j}] = {bandwidth[i, j]}, [{j}, {i}] = {bandwidth[j, i]}")
    zero = np.argwhere((bandwidth == 0) & off)
    if len(zero):
        reach = bandwidth > 0
        for k in range(len(reach)):  # transitive closure, only on this error path
            reach |= reach[:, k, None] & reach[None, k, :]
        if not reach.all():
            raise ClusterError(_disconnected_message(reach))
        i, j = zero[0]
        raise ClusterError(f"bandwidth[{i}, {j}] is 0: the table must be full; route pairs without a direct "
                           "link with widest_paths (build_cluster does this)")


def _check_latency(latency: np.ndarray) -> None:
    bad = np.argwhere(np.isnan(latency) | (latency < 0) | np.isinf(latency))
    if len(bad):
        i, j = bad[0]
        raise ClusterError(f"latency[{i}, {j}] = {latency[i, j]}: latency must be finite and non-negative")
    asymmetric = np.argwhere(latency != latency.T)
    if len(asymmetric):
        i, j = asymmetric[0]
        raise ClusterError(f"latency is not symmetric: [{i}, {j}] = {latency[i, j]}, [{j}, {i}] = {latency[j, i]}")


# --------------------------------------------------------------------------------------- JSON helpers


def _encode(array: np.ndarray) -> Any:
    """Nested lists (or a float) with ``inf`` as ``None``: JSON has no infinity."""
    values = np.asarray(array, dtype=np.float64).astype(object)
    values[np.isinf(np.asarray(array, dtype=np.float64))] = None
    return values.tolist()


def _decode(values: Any, field: str) -> np.ndarray:
    array = np.array(values, dtype=object)
    array[np.equal(array, None)] = np.inf
    try:
        return array.astype(np.float64)
    except (TypeError, ValueError):
        raise SchemaError(f"{field}: expected numbers or null") from None


def _round_significant(array: np.ndarray) -> np.ndarray:
    finite = np.isfinite(array) & (array != 0)
    exponent = np.floor(np.log10(np.abs(np.where(finite, array, 1.0))))
    scale = 10.0 ** (_FINGERPRINT_DIGITS - 1 - exponent)
    return np.where(finite, np.round(array * scale) / scale, array)


def _canonical_type(gpu: GPUType) -> dict[str, Any]:
    """A GPU type's JSON with every number a float (the catalogue writes some sizes as ints)."""
    data = gpu.to_json()
    for key in ("memory_bytes", "memory_bandwidth", "launch_overhead_s"):
        data[key] = float(data[key])
    data["peak_flops"] = {k: float(v) for k, v in data["peak_flops"].items()}
    return data


def _type_from_json(data: Any, index: int) -> GPUType:
    if not isinstance(data, dict):
        raise SchemaError(f"types[{index}]: expected an object")
    try:
        known = GPU_TYPES.get(data["name"])
        return GPUType(
            name=str(data["name"]),
            memory_bytes=float(data["memory_bytes"]),
            memory_bandwidth=float(data["memory_bandwidth"]),
            peak_flops=tuple((str(k), float(v)) for k, v in dict(data["peak_flops"]).items()),
            launch_overhead_s=float(data.get("launch_overhead_s", 5e-6)),
            description=known.description if known is not None else "",
        )
    except KeyError as exc:
        raise SchemaError(f"types[{index}]: missing field {exc.args[0]!r}") from None
