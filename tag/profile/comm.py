"""Point-to-point and all-reduce time against message size between processes of this host.

``processes`` ranks are spawned (one torch thread each, as ``tag run`` starts its ranks), join one process
group (gloo over TCP on the CPU; NCCL with one GPU per rank where this host has that many GPUs), and
time, for each message size, after ``warmup`` untimed rounds:

- point to point: a ping-pong between ranks 0 and 1 (0 sends, 1 receives and sends back); one transfer
  is half the round trip;
- all-reduce: a sum over all ranks, each round started after a barrier; rank 0's time.

The median of ``repeats`` rounds is kept. Each curve gets α + S/β fitted to it: β from the larger half of
the sizes, α from the smaller half (:func:`_robust_line`). For the all-reduce, α and β are the per-hop latency and bandwidth
that make the cost model's ring formula (:func:`tag.cost.comm.ring_allreduce_time`, 2(n−1)/n · S/β +
2(n−1)·α) pass through the fit, so either curve can be compared with the simulator's.
Results come back through a file, not a queue (a queue races with the worker's exit).
"""

from __future__ import annotations

import datetime
import json
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.multiprocessing as mp

from tag.errors import TagError
from tag.execute.launch import free_port
from tag.profile.data import CommCurve, fit_linear

__all__ = ["DEFAULT_MESSAGE_BYTES", "measure_comm", "comm_backend", "CommError"]

DEFAULT_MESSAGE_BYTES = tuple(4 ** k * 1024 for k in range(8))  # 1 KiB .. 16 MiB
_WARMUP, _REPEATS = 2, 7


class CommError(TagError):
    """The communication benchmark could not run (a rank failed, the backend is missing)."""


def comm_backend(device: str) -> str:
    """``nccl`` where ``device`` is cuda and this host has two GPUs and NCCL; ``gloo`` otherwise."""
    import torch.distributed as dist

    if device == "cuda" and torch.cuda.device_count() >= 2 and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def _rounds(fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rank(rank: int, world: int, port: int, backend: str, sizes: Sequence[int], warmup: int, repeats: int,
          timeout_s: float, out_dir: str) -> None:
    """Body of one rank: time every size, rank 0 writes ``comm.json``; a failure writes ``rank{r}.error``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        sync = (lambda: torch.cuda.synchronize(device)) if backend == "nccl" else (lambda: None)
        p2p, allreduce = [], []
        for nbytes in sizes:
            x = torch.ones(max(1, int(nbytes) // 4), dtype=torch.float32, device=device)

            def ping_pong() -> None:
                if rank == 0:
                    dist.send(x, 1)
                    dist.recv(x, 1)
                elif rank == 1:
                    dist.recv(x, 0)
                    dist.send(x, 0)
                sync()

            def reduce() -> None:
                dist.all_reduce(x)
                sync()

            dist.barrier()
            p2p.append(_rounds(ping_pong, warmup, repeats) / 2)
            dist.barrier()
            allreduce.append(_rounds(lambda: (dist.barrier(), reduce()), warmup, repeats))
        if rank == 0:
            (Path(out_dir) / "comm.json").write_text(json.dumps({"p2p": p2p, "allreduce": allreduce}))
        dist.destroy_process_group()
    except BaseException as error:  # noqa: BLE001 - reported to the launcher through the file
        (Path(out_dir) / f"rank{rank}.error").write_text(f"rank {rank}: {type(error).__name__}: {error}\n"
                                                         + traceback.format_exc()[-2000:])


def _robust_line(sizes: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(a, c) of a + c·S: the slope c from the larger half of the sizes (least squares), the intercept a
    from the smaller half (the median of t − c·S). One line fitted to all sizes lets either end swamp the
    other: a loaded host puts a floor of a millisecond or more under small gloo messages."""
    order = np.argsort(sizes)
    sizes, seconds = sizes[order], seconds[order]
    half = max(1, len(sizes) // 2)
    large, small = slice(len(sizes) - max(2, half), len(sizes)), slice(0, half)
    _, c = fit_linear(sizes[large], seconds[large])
    c = float(c) if c > 0 else float(seconds[-1] / sizes[-1])
    a = max(0.0, float(np.median(seconds[small] - c * sizes[small])))
    return a, c


def _fit(kind: str, backend: str, world: int, sizes: Sequence[int], seconds: Sequence[float]) -> CommCurve:
    a, c = _robust_line(np.asarray(sizes, dtype=np.float64), np.asarray(seconds, dtype=np.float64))
    if c <= 0:  # flat: no size grew the time; bound the bandwidth by the largest message
        c = float(seconds[-1]) / float(sizes[-1]) / 1e3
    if kind == "allreduce":  # a = 2(n-1)·α, c = 2(n-1)/(n·β)
        latency, bandwidth = a / (2 * (world - 1)), 2 * (world - 1) / (world * c)
    else:
        latency, bandwidth = a, 1.0 / c
    return CommCurve(backend, world, tuple(float(s) for s in sizes), tuple(float(t) for t in seconds),
                     latency, bandwidth)


def measure_comm(*, processes: int = 2, device: str = "cpu", sizes: Sequence[int] = DEFAULT_MESSAGE_BYTES,
                 warmup: int = _WARMUP, repeats: int = _REPEATS, timeout_s: float = 120.0) -> dict[str, CommCurve]:
    """``{"p2p": curve, "allreduce": curve}`` between ``processes`` ranks on this host (module docstring)."""
    if processes < 2:
        raise CommError(f"measuring communication needs at least 2 processes, got {processes}")
    backend = comm_backend(device)
    port = free_port()
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tag-comm-") as out:
        ranks = [context.Process(target=_rank, daemon=True,
                                 args=(r, processes, port, backend, tuple(sizes), warmup, repeats, timeout_s, out))
                 for r in range(processes)]
        for p in ranks:
            p.start()
        deadline = time.monotonic() + timeout_s + 60
        for p in ranks:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in ranks:
            if p.is_alive():
                p.kill()
                p.join(5)
        errors = sorted(Path(out).glob("rank*.error"))
        if errors:
            raise CommError(f"measuring communication ({backend}): {errors[0].read_text().splitlines()[0]}")
        died = [r for r, p in enumerate(ranks) if p.exitcode not in (0, None)]
        if died:
            raise CommError(f"measuring communication ({backend}): rank {died[0]} died (exit status "
                            f"{ranks[died[0]].exitcode})")
        result = Path(out) / "comm.json"
        if not result.exists():
            raise CommError(f"measuring communication ({backend}): the ranks did not finish in {timeout_s:.0f} s")
        data = json.loads(result.read_text())
    return {kind: _fit(kind, backend, processes, sizes, data[kind]) for kind in ("p2p", "allreduce")}
