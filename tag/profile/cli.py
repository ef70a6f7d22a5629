"""What ``tag profile`` (:mod:`tag.cli.profile`) assembles from its measurements, and the one place the
planning commands turn ``--profile PROFILE.json`` into a cost model (:func:`profile_cost_model`).

The command itself (flags, progress, report) is :mod:`tag.cli.profile`; this module keeps the name its
callers import it by.
"""

from __future__ import annotations

from tag.errors import ModelError

__all__ = ["profile_cost_model", "device_type_name", "build_profile"]

# What torch calls a device -> the GPU catalogue's name (tag.cluster.gpus); first match wins.
_DEVICE_NAMES = (("h200", "h200"), ("h100", "h100"), ("a100-sxm4-80gb", "a100-80gb"), ("a100 80gb", "a100-80gb"),
                 ("a100", "a100-40gb"), ("v100-sxm2-32gb", "v100-32gb"), ("v100", "v100-16gb"), ("t4", "t4"),
                 ("p100", "p100"), ("titan v", "titan-v"), ("1080 ti", "1080ti"))


def profile_cost_model(path: str | None):
    """A :class:`~tag.cost.ProfiledCostModel` over the profile at ``path``, or None for no ``--profile``."""
    if path is None:
        return None
    from tag.cost import ProfiledCostModel
    from tag.profile.data import load_profile

    return ProfiledCostModel(profile=load_profile(path))


def device_type_name(device: str, gpu_type_name: str | None) -> str:
    """The catalogue name the profile keys this device by: ``--gpu-type``, else ``cpu`` or read from the
    CUDA device's name."""
    from tag.cluster.gpus import gpu_type

    if gpu_type_name is not None:
        return gpu_type(gpu_type_name).name
    if device == "cpu":
        return "cpu"
    import torch

    name = torch.cuda.get_device_name(0).lower()
    for fragment, key in _DEVICE_NAMES:
        if fragment in name:
            return key
    raise ModelError(f"the CUDA device {torch.cuda.get_device_name(0)!r} is not in tag's GPU catalogue; "
                     "say which type it is with --gpu-type")


def _describe(device: str) -> str:
    import platform

    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        model = ""
    return model or platform.processor() or platform.machine()


def build_profile(program, times, comm: dict, device_name: str, *, backend: str, warmup: int, repeats: int,
                  processes: int, out: str):
    """(Profile, report) of one ``tag profile`` run: the op times ``times`` of ``program`` on this device
    (``backend`` "cpu" or "cuda", keyed as ``device_name``), the communication ``comm`` measured between
    ``processes`` processes, and the roofline's agreement and calibration; ``out`` is where it is written."""
    import dataclasses

    import numpy as np
    import torch

    from tag.cluster.gpus import gpu_type
    from tag.graph.opgraph import ROLE_INPUT
    from tag.profile.data import DeviceProfile, Profile
    from tag.profile.report import agreement_by_kind, agreement_by_role, roofline_fit

    gpu = gpu_type(device_name)
    graph = program.graph
    fit = roofline_fit([(graph, times)], gpu)
    device = DeviceProfile(device_name, _describe(backend), backend, "fp32",
                           1 if backend == "cpu" else torch.get_num_threads(), torch.__version__,
                           {"warmup": warmup, "repeats": repeats, "statistic": "median",
                            "timer": "cuda events" if backend == "cuda" else "perf_counter"},
                           {times.name: times}, comm, fit)
    bare = dataclasses.replace(times, executor_overhead_s=0.0)
    steps = [{"batch": b, "measured_s": float(np.nansum(times.measured_s[:, k])),
              "fit_s": float(bare.predicted(b)[program.graph.role != ROLE_INPUT].sum())}
             for k, b in enumerate(times.batch_sizes)]
    report = {"out": out, "device": device_name, "description": device.description,
              "backend": backend, "model": times.name, "ops": times.num_ops,
              "timed_ops": int(np.isfinite(times.measured_s).any(axis=1).sum()),
              "batch_size": times.batch_size, "batch_sizes": list(times.batch_sizes), "steps": steps,
              "executor_overhead_s": times.executor_overhead_s,
              "roofline": {"by_kind": agreement_by_kind(graph, times, gpu),
                           "by_role": agreement_by_role(graph, times, gpu), "fit": fit},
              "comm": {kind: {"backend": c.backend, "processes": c.processes, "latency_s": c.latency_s,
                              "bandwidth": c.bandwidth, "bytes": list(c.bytes), "seconds": list(c.seconds)}
                       for kind, c in comm.items()},
              "cluster": f"local:{processes},profile={out}" if comm else None}
    return Profile({device_name: device}), report
