"""Measured costs of one host: the profile file, its data model and the linear fits it holds.

A profile is what ``tag profile`` measured on the devices at hand, keyed by device: the catalogue name
of the GPU type (``h100``, ``h200``, ``cpu`` for the host's CPU processes), so that the cost model can
look a cluster's GPU types up in it. Per device it holds

- ``models``: per traced train step, every op's time at a few batch sizes and TAG's linear model fitted
  to them (§4.1.2): t(b) = fixed + b · per_sample, both non-negative; an op whose cost does not scale
  with the batch (an optimizer update) has per_sample 0 and fixed = the median of its times. The train
  step is identified by :func:`structure_fingerprint` (op kinds, roles and edges, which do not change
  with the batch size), so a graph traced at any batch size finds its measured times;
- ``comm``: point-to-point and all-reduce time against message size between processes of this host,
  with α + S/β fitted to each curve (the cluster preset ``local:N`` reads the point-to-point fit);
- ``roofline_fit``: the roofline calibrated to the measured op times (launch overhead, compute and memory
  efficiencies), which the cost model uses for the steps of that device the profile did not measure.

This module is a leaf: it imports nothing of tag above the file helpers, so that ``tag.cluster`` (the
``local`` preset) and ``tag.cost`` (the profile-backed cost model) can read profiles while the code that
measures them (:mod:`tag.profile.ops`, :mod:`tag.profile.comm`) sits at the top, beside ``tag.execute``.

The file (JSON, gzipped when the name ends in ``.gz``)::

    {"format": "tag.profile", "schema_version": 1,
     "devices": {"h100": {"description": "NVIDIA H100 80GB HBM3", "backend": "cuda", "dtype": "fp32",
                          "threads": 1, "torch": "2.11.0", "timing": {...},
                          "models": {"gpt2-tiny": {"structure": "<sha256 hex>", "batch_size": 4,
                                                   "batch_sizes": [1, 2, 4], "kinds": [...],
                                                   "batch_scaled": [...], "fixed_s": [...],
                                                   "per_sample_s": [...], "measured_s": [[...], ...]}},
                          "comm": {"p2p": {"backend": "gloo", "processes": 2, "bytes": [...],
                                           "seconds": [...], "latency_s": 3e-05, "bandwidth": 2e9}},
                          "roofline_fit": {"compute_efficiency": ..., ...}}}}

Units: seconds, bytes, bytes/s. Times not measured (inputs, free ops) are 0 in the fits and ``null`` in
``measured_s``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from tag._atomic import atomic_write_bytes
from tag._read import parse_json, read_input
from tag._schema import check_header
from tag.errors import ProfileError

__all__ = ["PROFILE_FORMAT", "PROFILE_SCHEMA_VERSION", "Profile", "DeviceProfile", "ModelTimes", "CommCurve",
           "structure_fingerprint", "fit_linear", "load_profile", "save_profile", "profile_from_json",
           "profile_to_json"]

PROFILE_FORMAT = "tag.profile"
PROFILE_SCHEMA_VERSION = 1
_STRUCTURE_DOMAIN = b"tag.profile.structure.v2"
COMM_KINDS = ("p2p", "allreduce")


# ----------------------------------------------------------------------------------------------- fits
def fit_linear(x: Sequence[float] | np.ndarray, y: np.ndarray, *, relative: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of y = a + c·x with a, c ≥ 0, for each row of ``y``.

    ``x`` [K] (batch sizes or message bytes), ``y`` [N, K] or [K] (seconds; NaN entries are left out).
    ``relative``: minimise the relative errors ((a + c·x − y) / y)² instead of the absolute ones, so that a
    curve over sizes that span orders of magnitude keeps its small end (the latency). Returns (a [N], c [N])
    (0-d arrays for a 1-D ``y``). With one usable sample the line is flat (c = 0). Where the unconstrained
    fit has c < 0 the best line is flat at the (weighted) mean; where it has a < 0 it passes through the
    origin (c = Σwxy / Σwx²).
    """
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64)
    flat = y.ndim == 1
    y = np.atleast_2d(y)
    if y.shape[1] != x.size:
        raise ValueError(f"fit_linear: {x.size} x values but {y.shape[1]} columns of y")
    usable = np.isfinite(y) & (~relative | (y > 0))
    y0 = np.where(usable, y, 0.0)
    w = usable / np.where(usable & relative, y0 * y0, 1.0)  # [N, K] weight of each sample, 0 where left out
    n, sx, sxx = w.sum(axis=1), w @ x, w @ (x * x)
    sy, sxy = (w * y0).sum(axis=1), (w * y0) @ x
    det = n * sxx - sx * sx
    scale = np.maximum(n * sxx, np.finfo(float).tiny)
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = det > 1e-12 * scale  # two distinct x among the samples
        c = np.where(ok, (n * sxy - sx * sy) / np.where(ok, det, 1.0), 0.0)
        a = np.where(n > 0, (sy - c * sx) / np.where(n > 0, n, 1.0), 0.0)
        mean = np.where(n > 0, sy / np.where(n > 0, n, 1.0), 0.0)
        through_origin = np.where(sxx > 0, sxy / np.where(sxx > 0, sxx, 1.0), 0.0)
    negative_slope = c < 0
    a, c = np.where(negative_slope, mean, a), np.where(negative_slope, 0.0, c)
    negative_intercept = a < 0
    a, c = np.where(negative_intercept, 0.0, a), np.where(negative_intercept, through_origin, c)
    a, c = np.maximum(a, 0.0), np.maximum(c, 0.0)
    return (a[0], c[0]) if flat else (a, c)


def structure_fingerprint(graph: Any) -> str:
    """sha256 hex of what a train step is, whatever its batch size: op kinds, roles, edges (sorted), the
    parameter bytes of each op and the bytes each edge carries per sample (batch-scaled edges divided by
    the batch; sizes to 6 significant digits). Two models of one layout but other widths or sequence
    lengths (a tiny BERT-48 and BERT-Small) differ. ``graph`` is an OpGraph."""
    digest = hashlib.sha256(_STRUCTURE_DOMAIN)
    src = np.asarray(graph.edge_src, dtype=np.int64)
    dst = np.asarray(graph.edge_dst, dtype=np.int64)
    order = np.lexsort((dst, src))
    edge_bytes = np.asarray(graph.edge_bytes, dtype=np.float64)
    per_sample = np.where(np.asarray(graph.edge_batch_scaled, dtype=bool), edge_bytes / graph.batch_size, edge_bytes)
    for data in (json.dumps(list(graph.kinds), separators=(",", ":")).encode(),
                 np.asarray(graph.role, dtype="<i1").tobytes(), src[order].astype("<i8").tobytes(),
                 dst[order].astype("<i8").tobytes(), _rounded(graph.param_bytes), _rounded(per_sample[order])):
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _rounded(values: Any) -> bytes:
    """``values`` rounded to 6 significant digits, as compact JSON bytes (the same on every machine)."""
    values = np.asarray(values, dtype=np.float64)
    text = json.dumps([float(f"{v:.6g}") for v in values.tolist()], separators=(",", ":"))
    return text.encode()


# ------------------------------------------------------------------------------------------ data model
@dataclass(frozen=True, eq=False)
class ModelTimes:
    """Measured op times of one train step on one device. N ops, K batch sizes."""

    name: str
    structure: str  # structure_fingerprint of the traced step
    batch_size: int  # the batch the step was traced at (the largest it can be run at)
    batch_sizes: tuple[int, ...]  # [K] the batch sizes measured
    kinds: tuple[str, ...]  # [N] op kinds, to check a match and to group ops in reports
    batch_scaled: np.ndarray  # [N] bool, the op's cost scales with the batch
    fixed_s: np.ndarray  # [N] seconds of the fit that do not scale with the batch
    per_sample_s: np.ndarray  # [N] seconds per sample (row) of the batch
    measured_s: np.ndarray  # [N, K] median seconds at each batch size, NaN where not timed
    executor_overhead_s: float = 0.0  # seconds `tag run`'s interpreter adds to every op (tag.profile.executor)

    @property
    def num_ops(self) -> int:
        return len(self.kinds)

    def linear(self, batch_size: int, batch_scaled: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """([N] fixed, [N] scaled) seconds for a graph at ``batch_size``: an op on fraction f of that batch
        takes fixed + f · scaled (the cost model's linear form); ops that do not scale (``batch_scaled``
        [N], default the profile's own flags) take fixed + batch_size · per_sample whatever f. The
        executor's overhead is in fixed, for every op (inputs too: the caller zeroes what runs no call)."""
        flags = self.batch_scaled if batch_scaled is None else np.asarray(batch_scaled, dtype=bool)
        scaled = self.per_sample_s * float(batch_size)
        fixed = np.where(flags, self.fixed_s, self.fixed_s + scaled) + self.executor_overhead_s
        return fixed, np.where(flags, scaled, 0.0)

    def predicted(self, batch_size: int) -> np.ndarray:
        """[N] seconds of each op at ``batch_size`` rows by the fit."""
        fixed, scaled = self.linear(batch_size)
        return fixed + scaled


@dataclass(frozen=True)
class CommCurve:
    """Time of one communication pattern against message size, and α + S/β fitted to it. K sizes."""

    backend: str  # gloo | nccl
    processes: int
    bytes: tuple[float, ...]  # [K]
    seconds: tuple[float, ...]  # [K] median seconds
    latency_s: float  # α of the fit
    bandwidth: float  # β of the fit, bytes/s

    def predicted(self, nbytes: float) -> float:
        """Seconds of one transfer of ``nbytes`` by the fit (a p2p curve)."""
        return self.latency_s + nbytes / self.bandwidth

    def allreduce_seconds(self, nbytes: float) -> float:
        """Seconds of one all-reduce of ``nbytes`` over the curve's processes by the fit (an all-reduce curve,
        whose α and β are per ring hop): 2(n−1)/n · S/β + 2(n−1)·α."""
        n = self.processes
        return 2.0 * (n - 1) / n * nbytes / self.bandwidth + 2.0 * (n - 1) * self.latency_s


@dataclass(frozen=True, eq=False)
class DeviceProfile:
    """Everything measured on one device type."""

    name: str  # the GPU type's catalogue name (tag.cluster.gpus), e.g. "h100" or "cpu"
    description: str = ""  # what torch calls the device
    backend: str = "cpu"  # cpu | cuda
    dtype: str = "fp32"
    threads: int = 1  # torch threads of the timing process
    torch: str = ""
    timing: Mapping[str, Any] = field(default_factory=dict)  # warmup, repeats, statistic
    models: Mapping[str, ModelTimes] = field(default_factory=dict)
    comm: Mapping[str, CommCurve] = field(default_factory=dict)  # "p2p", "allreduce"
    roofline_fit: Mapping[str, float] | None = None

    def match(self, graph: Any) -> ModelTimes | None:
        """The measured step with ``graph``'s structure (any batch size), or None."""
        if not self.models:
            return None
        key = structure_fingerprint(graph)
        return next((m for m in self.models.values() if m.structure == key), None)


class Profile:
    """Device name → :class:`DeviceProfile`. Immutable; equal (and hashed) by content, so that a cost
    model holding a profile can key caches."""

    def __init__(self, devices: Mapping[str, DeviceProfile]) -> None:
        self._devices = dict(devices)
        self.digest = hashlib.sha256(json.dumps(profile_to_json(self), sort_keys=True,
                                                separators=(",", ":")).encode()).hexdigest()

    @property
    def devices(self) -> Mapping[str, DeviceProfile]:
        return dict(self._devices)

    def device(self, name: str) -> DeviceProfile | None:
        return self._devices.get(name)

    def merged(self, other: Profile) -> Profile:
        """This profile with ``other``'s measurements added: its models and comm curves replace those of
        the same name on the same device; the device's description comes from ``other``."""
        devices = dict(self._devices)
        for name, new in other._devices.items():
            old = devices.get(name)
            if old is None:
                devices[name] = new
                continue
            devices[name] = DeviceProfile(
                name, new.description, new.backend, new.dtype, new.threads, new.torch, new.timing,
                {**old.models, **new.models}, {**old.comm, **new.comm},
                new.roofline_fit if new.roofline_fit is not None else old.roofline_fit)
        return Profile(devices)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Profile) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        parts = [f"{name}: {len(d.models)} models{', comm' if d.comm else ''}" for name, d in self._devices.items()]
        return f"Profile({'; '.join(parts)})"


# ------------------------------------------------------------------------------------------- encoding
_DIGITS = 4  # significant digits of a measured time in the file: far finer than the timing's noise


def _floats(values: np.ndarray) -> list:
    """Seconds as JSON numbers of _DIGITS significant digits (NaN as null): a profile of a 5k-op step at
    three batch sizes stays a few hundred kB."""
    return [None if not math.isfinite(v) else float(f"{v:.{_DIGITS}g}")
            for v in np.asarray(values, dtype=np.float64).reshape(-1)]


def _model_to_json(m: ModelTimes) -> dict:
    return {"structure": m.structure, "batch_size": m.batch_size, "batch_sizes": list(m.batch_sizes),
            "kinds": list(m.kinds), "batch_scaled": [bool(b) for b in m.batch_scaled],
            "fixed_s": _floats(m.fixed_s), "per_sample_s": _floats(m.per_sample_s),
            "measured_s": [_floats(row) for row in m.measured_s],
            "executor_overhead_s": _floats([m.executor_overhead_s])[0]}


def _comm_to_json(c: CommCurve) -> dict:
    return {"backend": c.backend, "processes": c.processes, "bytes": list(c.bytes), "seconds": list(c.seconds),
            "latency_s": c.latency_s, "bandwidth": c.bandwidth}


def profile_to_json(profile: Profile) -> dict:
    devices = {}
    for name, d in profile._devices.items():
        devices[name] = {"description": d.description, "backend": d.backend, "dtype": d.dtype, "threads": d.threads,
                         "torch": d.torch, "timing": dict(d.timing),
                         "models": {k: _model_to_json(m) for k, m in d.models.items()},
                         "comm": {k: _comm_to_json(c) for k, c in d.comm.items()}}
        if d.roofline_fit is not None:
            devices[name]["roofline_fit"] = dict(d.roofline_fit)
    return {"format": PROFILE_FORMAT, "schema_version": PROFILE_SCHEMA_VERSION, "devices": devices}


# ------------------------------------------------------------------------------------------- decoding
_KIND_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number"}


def _field(doc: Mapping, key: str, kind: type | tuple, where: str, *, default: Any = ...) -> Any:
    if key not in doc:
        if default is not ...:
            return default
        raise ProfileError(f"{where}: missing field {key!r}")
    value = doc[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        name = _KIND_NAMES.get(kinds[0], kinds[0].__name__)
        raise ProfileError(f"{where}: field {key!r} must be {name}, got {type(value).__name__}")
    return value


def _number_list(values: Any, where: str, *, length: int | None = None, nullable: bool = False,
                 positive: bool = False) -> np.ndarray:
    if not isinstance(values, list):
        raise ProfileError(f"{where} must be a list, got {type(values).__name__}")
    if length is not None and len(values) != length:
        raise ProfileError(f"{where} has {len(values)} entries, expected {length}")
    out = np.empty(len(values))
    for i, v in enumerate(values):
        if v is None and nullable:
            out[i] = np.nan
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                or (positive and v == 0):
            sign = "positive" if positive else "non-negative"
            raise ProfileError(f"{where}[{i}] must be a {sign} finite number{' or null' if nullable else ''}, "
                               f"got {v!r}")
        out[i] = float(v)
    return out


def _positive(doc: Mapping, key: str, where: str) -> float:
    value = _field(doc, key, (int, float), where)
    if not (math.isfinite(value) and value > 0):
        raise ProfileError(f"{where}: field {key!r} must be a positive finite number, got {value!r}")
    return float(value)


def _model_from_json(name: str, doc: Any, where: str) -> ModelTimes:
    if not isinstance(doc, dict):
        raise ProfileError(f"{where} must be an object")
    structure = _field(doc, "structure", str, where)
    batch_size = _field(doc, "batch_size", int, where)
    sizes = [int(b) for b in _number_list(_field(doc, "batch_sizes", list, where), f"{where}.batch_sizes",
                                          positive=True)]
    if not sizes or any(b != int(b) or b > batch_size for b in sizes) or len(set(sizes)) != len(sizes):
        raise ProfileError(f"{where}.batch_sizes must be distinct whole numbers in 1..batch_size ({batch_size}), "
                           f"got {_field(doc, 'batch_sizes', list, where)}")
    kinds = _field(doc, "kinds", list, where)
    if not all(isinstance(k, str) for k in kinds):
        raise ProfileError(f"{where}.kinds must be a list of strings")
    n = len(kinds)
    scaled = _field(doc, "batch_scaled", list, where)
    if len(scaled) != n or not all(isinstance(b, bool) for b in scaled):
        raise ProfileError(f"{where}.batch_scaled must be {n} booleans, one per op")
    measured = _field(doc, "measured_s", list, where)
    if len(measured) != n:
        raise ProfileError(f"{where}.measured_s has {len(measured)} rows, expected {n} (one per op)")
    table = np.stack([_number_list(row, f"{where}.measured_s[{i}]", length=len(sizes), nullable=True)
                      for i, row in enumerate(measured)]) if n else np.zeros((0, len(sizes)))
    overhead = _number_list([_field(doc, "executor_overhead_s", (int, float), where, default=0.0)],
                            f"{where}.executor_overhead_s")[0]
    return ModelTimes(name, structure, batch_size, tuple(sizes), tuple(kinds),
                      np.array(scaled, dtype=bool),
                      _number_list(_field(doc, "fixed_s", list, where), f"{where}.fixed_s", length=n),
                      _number_list(_field(doc, "per_sample_s", list, where), f"{where}.per_sample_s", length=n),
                      table, float(overhead))


def _comm_from_json(doc: Any, where: str) -> CommCurve:
    if not isinstance(doc, dict):
        raise ProfileError(f"{where} must be an object")
    sizes = _number_list(_field(doc, "bytes", list, where), f"{where}.bytes", positive=True)
    seconds = _number_list(_field(doc, "seconds", list, where), f"{where}.seconds", length=len(sizes),
                           positive=True)
    latency = _field(doc, "latency_s", (int, float), where)
    if not (math.isfinite(latency) and latency >= 0):
        raise ProfileError(f"{where}: field 'latency_s' must be a non-negative finite number, got {latency!r}")
    processes = _field(doc, "processes", int, where)
    if processes < 2:
        raise ProfileError(f"{where}: field 'processes' must be at least 2, got {processes}")
    return CommCurve(_field(doc, "backend", str, where), processes, tuple(sizes.tolist()),
                     tuple(seconds.tolist()), float(latency), _positive(doc, "bandwidth", where))


_FIT_RANGES = {"launch_overhead_s": (0.0, 1.0), "compute_efficiency": (1e-6, 4.0), "memory_efficiency": (1e-6, 4.0)}


def _roofline_fit(doc: dict | None, where: str) -> dict | None:
    """A calibrated roofline's figures, each number in its range (the cost model's own bounds)."""
    if doc is None:
        return None
    for key, (low, high) in _FIT_RANGES.items():
        if key in doc:
            value = doc[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ProfileError(f"{where}: field {key!r} must be a number in [{low:g}, {high:g}], got {value!r}")
    return dict(doc)


def _device_from_json(name: str, doc: Any, where: str) -> DeviceProfile:
    if not isinstance(doc, dict):
        raise ProfileError(f"{where} must be an object")
    models = {key: _model_from_json(key, m, f"{where}.models.{key}")
              for key, m in _field(doc, "models", dict, where, default={}).items()}
    comm = _field(doc, "comm", dict, where, default={})
    unknown = sorted(set(comm) - set(COMM_KINDS))
    if unknown:
        raise ProfileError(f"{where}.comm: unknown pattern {unknown[0]!r}; expected {', '.join(COMM_KINDS)}")
    fit = _roofline_fit(_field(doc, "roofline_fit", dict, where, default=None), f"{where}.roofline_fit")
    threads = _field(doc, "threads", int, where, default=1)
    return DeviceProfile(name, _field(doc, "description", str, where, default=""),
                         _field(doc, "backend", str, where, default="cpu"), _field(doc, "dtype", str, where,
                                                                                  default="fp32"),
                         threads, _field(doc, "torch", str, where, default=""),
                         _field(doc, "timing", dict, where, default={}), models,
                         {k: _comm_from_json(c, f"{where}.comm.{k}") for k, c in comm.items()}, fit)


def profile_from_json(doc: Any, *, where: str = "profile") -> Profile:
    """A :class:`Profile` from its decoded JSON; ProfileError names the first bad field."""
    check_header(doc, fmt=PROFILE_FORMAT, version=PROFILE_SCHEMA_VERSION, where=where, error=ProfileError)
    devices = _field(doc, "devices", dict, where)
    if not devices:
        raise ProfileError(f"{where}: field 'devices' is empty: the profile measured nothing")
    return Profile({name: _device_from_json(name, d, f"{where}: devices.{name}") for name, d in devices.items()})


def load_profile(path: str | os.PathLike) -> Profile:
    """Read a profile file (.json or .json.gz); one ProfileError naming the file and field otherwise."""
    where = os.fspath(path)
    raw = read_input(path, what="profile", error=ProfileError, gunzip=True)
    doc = parse_json(raw, where=where, error=ProfileError, malformed="not a valid JSON(.gz) profile")
    return profile_from_json(doc, where=where)


def save_profile(profile: Profile, path: str | os.PathLike) -> None:
    """Write ``profile`` atomically; gzipped when the name ends in ``.gz``."""
    text = json.dumps(profile_to_json(profile), separators=(",", ":"), allow_nan=False).encode()
    atomic_write_bytes(path, gzip.compress(text, mtime=0) if os.fspath(path).endswith(".gz") else text)
