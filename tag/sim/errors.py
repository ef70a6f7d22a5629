"""Errors of the simulator: a malformed TaskGraph, and a plan that does not fit in device memory."""

from __future__ import annotations

from tag.errors import GraphError, TagError
from tag.units import format_bytes

__all__ = ["TaskGraphError", "OOMError"]


class TaskGraphError(GraphError):
    """A TaskGraph is malformed: unknown device, negative duration or size, a dependency cycle."""


class OOMError(TagError):
    """A simulated plan needs more memory on a device than the device has."""

    def __init__(self, device: int, peak_bytes: float, capacity_bytes: float, *, detail: str = "") -> None:
        self.device = int(device)
        self.peak_bytes = float(peak_bytes)
        self.capacity_bytes = float(capacity_bytes)
        where = f"device {self.device}" + (f" ({detail})" if detail else "")
        super().__init__(f"out of memory on {where}: peak {format_bytes(self.peak_bytes)} "
                         f"exceeds capacity {format_bytes(self.capacity_bytes)}")
