"""Time every op of a traced train step on the local device and fit TAG's linear model per op.

The step is a :class:`~tag.execute.program.Program`: the argument records of every aten call, traced
again at each batch size measured. One pass per batch size walks the ops in topological order on real
tensors on the device (parameters as the model has them, the example inputs cut to the batch), decoding
each record once (:func:`tag.execute.runtime.decode`) and calling it ``warmup + repeats`` times
(:func:`tag.execute.runtime.call_record`); the op's time is the median of the timed calls and its last
result feeds its consumers. On a GPU each call is timed by a pair of CUDA events, which counts the
launch gaps an eager step has between small kernels; on the CPU by ``perf_counter`` with one torch thread
(a ``tag run`` rank runs with one). Inputs, constants and ``getitem`` (no kernel) are not timed.

The fit per op is TAG's linear model in the batch (§4.1.2), t(b) = fixed + b · per_sample with both
non-negative (:func:`tag.profile.data.fit_linear`); ops whose cost does not scale with the batch get the
median of their times as a constant.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from tag.errors import ModelError
from tag.execute.program import Program
from tag.execute.runtime import call_record, decode
from tag.profile.data import ModelTimes, fit_linear, structure_fingerprint

__all__ = ["DEFAULT_WARMUP", "DEFAULT_REPEATS", "default_batch_sizes", "profile_program", "time_step",
           "single_thread"]

DEFAULT_WARMUP = 2  # calls before timing: allocator, cuBLAS/cuDNN algorithm choice, caches
DEFAULT_REPEATS = 5  # timed calls per op; the median is kept

Progress = Callable[[int], None]  # called with the number of ops just done


def default_batch_sizes(batch_size: int) -> tuple[int, ...]:
    """A quarter, a half and all of the traced batch, at least 2 rows (a trace at one row often drops a
    dimension and is another step), three sizes where the batch allows: the range a replica or a
    micro-batch of a plan runs at."""
    if batch_size < 2:
        return (batch_size,)
    sizes = {max(2, batch_size // 4), max(2, batch_size // 2), batch_size}
    if len(sizes) < 3:
        sizes.add(max(2, batch_size * 3 // 4))
    return tuple(sorted(sizes))


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """One torch thread inside the block (as a ``tag run`` rank has), the previous count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _timer(device: torch.device, warmup: int, repeats: int) -> Callable[[Callable[[], Any]], tuple[float, Any]]:
    """A function that calls ``fn`` warmup + repeats times and returns (median seconds, last result)."""
    def on_cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
        result = None
        for _ in range(warmup):
            result = fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times), result

    def on_cuda(fn: Callable[[], Any]) -> tuple[float, Any]:
        result = None
        for _ in range(warmup):
            result = fn()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeats)]
        for start, end in events:
            start.record()
            result = fn()
            end.record()
        torch.cuda.synchronize(device)
        return statistics.median(s.elapsed_time(e) for s, e in events) / 1e3, result

    return on_cuda if device.type == "cuda" else on_cpu


def _on_device(value: Any, device: torch.device) -> Any:
    """Decoded arguments with every ``torch.device`` (the records say ``cpu``) replaced by ``device``."""
    if isinstance(value, torch.device):
        return device
    if isinstance(value, list):
        return [_on_device(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_on_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _on_device(v, device) for k, v in value.items()}
    return value


def _input_value(program: Program, record: dict, device: torch.device) -> torch.Tensor:
    """A placeholder's or constant's value at the record's shape (the batch cut to its rows) on ``device``."""
    shape, dtype = list(record["shape"]), getattr(torch, record["dtype"].split(".")[-1])
    if record["target"] == "get_attr":
        value = record.get("value")
        tensor = torch.tensor(value, dtype=dtype) if value is not None else torch.zeros(shape, dtype=dtype)
        return tensor.reshape(shape).to(device)
    tensor = program.tensors[record["name"]]
    if list(tensor.shape) != shape and tensor.dim() > 0 and shape and shape[0] <= tensor.shape[0]:
        tensor = tensor[: shape[0]]
    if list(tensor.shape) != shape:
        raise ModelError(f"{program.name}: input {record['name']!r} has shape {list(tensor.shape)}, "
                         f"the step at this batch expects {shape}")
    return tensor.to(device)


def _refs(value: Any, out: set[int]) -> set[int]:
    """The ops a JSON argument refers to (``{"ref": op}``, also inside folded views)."""
    if isinstance(value, list):
        for item in value:
            _refs(item, out)
    elif isinstance(value, dict):
        if "ref" in value:
            out.add(int(value["ref"]))
        for item in value.values():
            _refs(item, out)
    return out


def _release_after(records: list[dict], order: list[int]) -> dict[int, list[int]]:
    """op -> the ops whose values nothing after it reads (walking ``order``); a value nobody reads is
    dropped right after it is made."""
    last: dict[int, int] = {}
    for op in order:
        last[op] = op
        for producer in _refs([records[op].get("args", []), records[op].get("kwargs", {})], set()):
            last[producer] = op
    release: dict[int, list[int]] = {}
    for producer, reader in last.items():
        release.setdefault(reader, []).append(producer)
    return release


def time_step(program: Program, batch: int, *, device: torch.device, warmup: int = DEFAULT_WARMUP,
              repeats: int = DEFAULT_REPEATS, progress: Progress | None = None) -> np.ndarray:
    """[N] median seconds of every op of ``program``'s step at ``batch`` rows (NaN where not timed)."""
    records = program.at(batch)
    graph = program.graph
    timer = _timer(device, warmup, repeats)
    values: dict[int, Any] = {}

    def resolve(op: int, out: int) -> Any:
        value = values[op]
        return value[out] if isinstance(value, (tuple, list)) else value

    order = graph.topological_order().tolist()
    release = _release_after(records, order)
    times = np.full(graph.num_ops, np.nan)
    for done, op in enumerate(order, 1):
        record = records[op]
        target = record.get("target")
        if target in ("placeholder", "get_attr"):
            values[op] = _input_value(program, record, device)
        elif target == "getitem":
            values[op] = call_record(record, resolve)
        else:
            call = {"target": target, "args": _on_device(decode(record["args"], resolve), device),
                    "kwargs": _on_device({k: decode(v, resolve) for k, v in record["kwargs"].items()}, device)}
            with torch.no_grad():
                times[op], values[op] = timer(lambda: call_record(call, resolve))
        for spent in release.get(op, ()):  # a step's whole state does not fit where its peak does
            del values[spent]
        if progress is not None and (done % 64 == 0 or done == graph.num_ops):
            progress(64 if done % 64 == 0 else done % 64)
    return times


def profile_program(program: Program, batch_sizes: Sequence[int] | None = None, *, device: torch.device,
                    warmup: int = DEFAULT_WARMUP, repeats: int = DEFAULT_REPEATS, name: str | None = None,
                    progress: Progress | None = None) -> ModelTimes:
    """Every op's time at each of ``batch_sizes`` (default :func:`default_batch_sizes`) and the fits."""
    graph = program.graph
    sizes = tuple(sorted(set(batch_sizes))) if batch_sizes else default_batch_sizes(program.batch_size)
    too_big = [b for b in sizes if not 1 <= b <= program.batch_size]
    if too_big:
        raise ModelError(f"{program.name}: cannot measure a batch of {too_big[0]}: the step was traced at batch "
                         f"{program.batch_size} (give --batch-size at least {max(sizes)})")
    for b in sizes:  # traced first, so that a size the step cannot take fails before any timing
        try:
            program.at(b)
        except ModelError as error:
            raise ModelError(f"{error}; measure batch sizes the step keeps its ops at (often at least 2 rows: "
                             "a trace at one row may drop a dimension)") from None
    measured = np.stack([time_step(program, b, device=device, warmup=warmup, repeats=repeats, progress=progress)
                         for b in sizes], axis=1)  # [N, K]
    fixed, per_sample = fit_linear(np.array(sizes, dtype=np.float64), measured)
    timed = np.isfinite(measured).any(axis=1)
    constant = np.where(timed, np.nanmedian(np.where(timed[:, None], measured, 0.0), axis=1), 0.0)
    scaled = graph.batch_scaled.astype(bool)
    fixed = np.where(scaled, fixed, constant)
    per_sample = np.where(scaled, per_sample, 0.0)
    return ModelTimes(name or program.name, structure_fingerprint(graph), program.batch_size, sizes,
                      tuple(graph.kinds), scaled, np.where(timed, fixed, 0.0), np.where(timed, per_sample, 0.0),
                      measured)
