"""Human units, parsed only at the edges. Internally: seconds, bytes, bytes/s, FLOP, FLOP/s."""

from __future__ import annotations

import re

from tag.errors import UnitError

__all__ = ["parse_bytes", "parse_bandwidth", "parse_time", "parse_flops", "format_bytes", "format_time"]

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-z/]*)\s*$")

_BYTES = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# Bandwidth units are case sensitive in their b/B: "Gbps" and "Gb/s" are bits, "GB/s" and "GBps" bytes.
_BANDWIDTH_PREFIX = {"": 1, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                     "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_BANDWIDTH = re.compile(r"^(|K|k|M|G|T|Ki|Mi|Gi|Ti)(bps|b/s|Bps|B/s)$")
_TIME = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_FLOPS_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


def _split(text: object, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"{what}: expected a number with a unit, got {text!r}")
    if isinstance(text, (int, float)):
        return float(text), ""
    if not isinstance(text, str):
        raise UnitError(f"{what}: expected a number with a unit, got {text!r}")
    match = _QUANTITY.match(text.replace("µ", "u"))
    if match is None:
        raise UnitError(f"{what}: cannot parse {text!r} as a number with a unit")
    return float(match.group(1)), match.group(2)


def parse_bytes(text: object, *, what: str = "size") -> float:
    """Bytes from ``"16GiB"``, ``"11 GB"``, ``"512"`` or a plain number."""
    value, unit = _split(text, what)
    scale = _BYTES.get(unit.lower())
    if scale is None:
        raise UnitError(f"{what}: unknown size unit {unit!r} in {text!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    return value * scale


def parse_bandwidth(text: object, *, what: str = "bandwidth") -> float:
    """Bytes per second from ``"100Gbps"`` (bits), ``"11 GB/s"`` (bytes) or a plain number (bytes/s)."""
    value, unit = _split(text, what)
    if unit == "":
        return value
    match = _BANDWIDTH.match(unit)
    if match is None:
        raise UnitError(f"{what}: unknown bandwidth unit {unit!r} in {text!r} (use Gbps, Gb/s, GB/s, MB/s)")
    prefix, base = match.groups()
    bits = base in ("bps", "b/s")
    return value * _BANDWIDTH_PREFIX[prefix] / (8.0 if bits else 1.0)


def parse_time(text: object, *, what: str = "time") -> float:
    """Seconds from ``"5us"``, ``"1.5 ms"``, ``"2s"`` or a plain number (seconds)."""
    value, unit = _split(text, what)
    scale = _TIME.get(unit.lower())
    if scale is None:
        raise UnitError(f"{what}: unknown time unit {unit!r} in {text!r} (use s, ms, us, ns)")
    return value * scale


def parse_flops(text: object, *, what: str = "FLOP/s") -> float:
    """FLOP/s from ``"15.7 TFLOPS"``, ``"125T"`` or a plain number."""
    value, unit = _split(text, what)
    low = unit.lower().replace("/s", "ps")
    for suffix in ("flops", "flop", ""):
        if low.endswith(suffix):
            prefix = low[: len(low) - len(suffix)] if suffix else low
            if prefix in _FLOPS_PREFIX:
                return value * _FLOPS_PREFIX[prefix]
    raise UnitError(f"{what}: unknown unit {unit!r} in {text!r} (use TFLOPS, GFLOPS)")


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def format_time(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.1f} us"
