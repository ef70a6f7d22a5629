"""GPU catalogue: peak FLOP/s per dtype, memory bandwidth and capacity of the GPUs tag plans for.

Figures are the vendors' datasheet peaks (dense, no sparsity) for the board named; the cost model
applies efficiency factors on top of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tag.errors import ClusterError

__all__ = ["GPUType", "GPU_TYPES", "gpu_type", "DTYPES"]

DTYPES = ("fp32", "tf32", "fp16", "bf16")
_GB = 1e9
_GiB = 2**30
_TF = 1e12


@dataclass(frozen=True)
class GPUType:
    """One GPU model. Units: bytes, bytes/s, FLOP/s, seconds."""

    name: str
    memory_bytes: float
    memory_bandwidth: float
    peak_flops: tuple[tuple[str, float], ...]  # ((dtype, FLOP/s), ...); missing dtypes fall back to fp32
    launch_overhead_s: float = 5e-6
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        table = dict(self.peak_flops)
        if "fp32" not in table:
            raise ClusterError(f"GPU type {self.name!r}: peak_flops must give fp32")
        for what, value in (("memory_bytes", self.memory_bytes), ("memory_bandwidth", self.memory_bandwidth),
                            *((f"peak_flops[{dtype}]", flops) for dtype, flops in table.items())):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ClusterError(f"GPU type {self.name!r}: {what} must be a positive finite number, got {value!r}")
        unknown = set(table) - set(DTYPES)
        if unknown:
            raise ClusterError(f"GPU type {self.name!r}: unknown dtype {sorted(unknown)[0]!r}; expected {', '.join(DTYPES)}")
        if not 0 <= self.launch_overhead_s < 1:
            raise ClusterError(f"GPU type {self.name!r}: launch_overhead_s must be in [0, 1) s, got {self.launch_overhead_s!r}")

    def peak(self, dtype: str = "fp32") -> float:
        """Peak FLOP/s for ``dtype`` (tensor cores where the GPU has them)."""
        table = dict(self.peak_flops)
        if dtype not in DTYPES:
            raise ClusterError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        return table.get(dtype, table["fp32"])

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "memory_bandwidth": self.memory_bandwidth,
            "peak_flops": dict(self.peak_flops),
            "launch_overhead_s": self.launch_overhead_s,
        }


def _gpu(name, memory, bandwidth_gbs, description, **peaks_tflops) -> GPUType:
    peaks = tuple((dtype, value * _TF) for dtype, value in peaks_tflops.items())
    return GPUType(name, memory, bandwidth_gbs * _GB, peaks, description=description)


GPU_TYPES: dict[str, GPUType] = {
    gpu.name: gpu
    for gpu in (
        _gpu("v100-16gb", 16 * _GiB, 900, "Tesla V100 SXM2 16 GB", fp32=15.7, fp16=125.0),
        _gpu("v100-32gb", 32 * _GiB, 900, "Tesla V100 SXM2 32 GB", fp32=15.7, fp16=125.0),
        _gpu("p100", 16 * _GiB, 732, "Tesla P100 PCIe 16 GB", fp32=9.3, fp16=18.7),
        _gpu("1080ti", 11 * _GiB, 484, "GeForce GTX 1080 Ti", fp32=11.3, fp16=0.177),
        _gpu("t4", 16 * _GiB, 320, "Tesla T4", fp32=8.1, fp16=65.0),
        _gpu("titan-v", 12 * _GiB, 652.8, "TITAN V", fp32=14.9, fp16=110.0),
        _gpu("a100-40gb", 40 * _GiB, 1555, "A100 SXM4 40 GB", fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0),
        _gpu("a100-80gb", 80 * _GiB, 2039, "A100 SXM4 80 GB", fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0),
        _gpu("h100", 80 * _GiB, 3350, "H100 SXM5 80 GB", fp32=67.0, tf32=494.7, fp16=989.4, bf16=989.4),
        _gpu("h200", 141 * _GiB, 4800, "H200 SXM 141 GB", fp32=67.0, tf32=494.7, fp16=989.4, bf16=989.4),
        # Not a GPU: one process of this host with one torch thread, what `tag run` starts per device of
        # the `local` cluster. Nominal figures (one AVX2 core with FMA, a core's share of DDR4 bandwidth, the
        # dispatch cost of one eager aten call); `tag profile --device cpu` measures the real ones.
        GPUType("cpu", 16 * _GiB, 10 * _GB, (("fp32", 0.1 * _TF),), launch_overhead_s=5e-6,
                description="one CPU process of this host, one thread (nominal)"),
    )
}

_ALIASES = {
    "v100": "v100-16gb", "v100-16": "v100-16gb", "v100-32": "v100-32gb", "v100-sxm2-32gb": "v100-32gb",
    "p100-16gb": "p100", "gtx1080ti": "1080ti", "1080-ti": "1080ti", "gtx-1080ti": "1080ti",
    "titanv": "titan-v", "titan_v": "titan-v", "a100": "a100-40gb", "a100-40": "a100-40gb",
    "a100-80": "a100-80gb", "h100-80gb": "h100", "h100-sxm": "h100", "h200-141gb": "h200", "h200-sxm": "h200",
    "tesla-v100": "v100-16gb", "v100-sxm2-16gb": "v100-16gb", "tesla-p100": "p100", "p100-pcie": "p100",
    "tesla-t4": "t4", "titan-v-12gb": "titan-v",
}


def gpu_type(name: str) -> GPUType:
    """The catalogue entry for ``name`` (case-insensitive, a few common aliases)."""
    if not isinstance(name, str):
        raise ClusterError(f"GPU type must be a string, got {name!r}")
    key = name.strip().lower().replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key not in GPU_TYPES:
        raise ClusterError(f"unknown GPU type {name!r}; known types: {', '.join(GPU_TYPES)}")
    return GPU_TYPES[key]
