"""Point-to-point and all-reduce time against message size between processes of this host, measured the
way `tag run`'s ranks communicate.

``processes`` ranks are started by `tag run`'s own launcher (:func:`tag.execute.launch.launch`: one torch
thread each, gloo over TCP on the CPU; NCCL with one GPU per rank where this host has that many GPUs), or
by a caller's :class:`~tag.execute.launch.WorkerPool`, and time, for each message size, after ``warmup``
untimed rounds:

- point to point, as the runtime sends: a ping-pong between ranks 0 and 1 of an ``isend`` answered by a
  blocking ``recv`` (0 sends, 1 receives and sends back); one transfer is half the round trip. Each half
  includes waking the receiver that waited in ``recv``, which is what a transfer costs a step;
- all-reduce, as the runtime reduces: one ``all_reduce`` over all ranks, entered by rank 0 while the others
  arrive ``stagger_s`` later (they spin, after a barrier), as ranks reach a collective at different points
  of a step; timed from the last rank's arrival to rank 0's return (one monotonic clock serves every
  process of a host), so that waking rank 0, which waited, counts and the stagger does not.

The median of ``repeats`` rounds is kept. Each curve gets α + S/β fitted to it: β from the larger half of
the sizes, α from the smaller half (:func:`_robust_line`). The all-reduce's fit, a + c·S for the whole
collective, is kept as the per-hop latency and bandwidth that make the cost model's ring formula
(:func:`tag.cost.comm.ring_allreduce_time`, 2(n−1)/n · S/β + 2(n−1)·α) pass through it
(:meth:`~tag.profile.data.CommCurve.allreduce_seconds`), so either curve can be compared with the simulator's.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import numpy as np
import torch

from tag.errors import TagError
from tag.profile.data import CommCurve, fit_linear

__all__ = ["DEFAULT_MESSAGE_BYTES", "DEFAULT_STAGGER_S", "measure_comm", "comm_backend", "CommError", "fit_curve"]

DEFAULT_MESSAGE_BYTES = tuple(4 ** k * 1024 for k in range(8))  # 1 KiB .. 16 MiB
DEFAULT_STAGGER_S = 1e-3  # how much later than rank 0 the other ranks enter a timed all-reduce
_WARMUP, _REPEATS = 2, 7
_RESOLUTION_S = 1e-7  # the smallest time a round reports (a file's times are positive)


class CommError(TagError):
    """The communication benchmark could not run (a rank failed, the backend is missing)."""


def comm_backend(device: str) -> str:
    """``nccl`` where ``device`` is cuda and this host has two GPUs and NCCL; ``gloo`` otherwise."""
    import torch.distributed as dist

    if device == "cuda" and torch.cuda.device_count() >= 2 and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def _spin(seconds: float) -> None:
    """Busy for ``seconds`` (a rank computing, not sleeping)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _CommProbe:
    """One rank's part of the benchmark, run by `tag run`'s launcher like a rank program: ``make_runtime``
    gives the object whose ``step`` times every size and returns ``{"p2p": [K], "allreduce": [K]}`` median
    seconds (rank 0's are the figures)."""

    def __init__(self, rank: int, sizes: Sequence[int], warmup: int, repeats: int, stagger_s: float) -> None:
        self.rank, self.sizes, self.warmup, self.repeats = rank, tuple(sizes), warmup, repeats
        self.stagger_s = stagger_s

    def make_runtime(self, tensors: dict, device: torch.device | None = None) -> _CommProbe:
        self.device = device or torch.device("cpu")
        return self

    def describe(self) -> str:
        return "the communication benchmark"

    def carry(self) -> None:
        pass

    def step(self) -> dict[str, torch.Tensor]:
        import torch.distributed as dist

        sync = (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        rank, stagger = self.rank, self.stagger_s
        p2p, allreduce = [], []
        for nbytes in self.sizes:
            x = torch.ones(max(1, int(nbytes) // 4), dtype=torch.float32, device=self.device)

            def ping_pong() -> float:
                start = time.perf_counter()
                if rank == 0:
                    work = dist.isend(x, 1)
                    dist.recv(x, 1)
                    work.wait()
                elif rank == 1:
                    dist.recv(x, 0)
                    dist.isend(x, 0).wait()
                sync()
                return max((time.perf_counter() - start) / 2, _RESOLUTION_S)

            def reduce() -> float:
                dist.barrier()
                if rank != 0:
                    _spin(stagger)
                arrival = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process of the host
                dist.all_reduce(x)
                sync()
                done = time.perf_counter()
                last = torch.tensor([arrival], dtype=torch.float64)
                dist.all_reduce(last, op=dist.ReduceOp.MAX)  # untimed: when the last rank arrived
                return max(done - float(last), _RESOLUTION_S)

            p2p.append(_median(ping_pong, self.warmup, self.repeats))
            allreduce.append(_median(reduce, self.warmup, self.repeats))
        return {"p2p": torch.tensor(p2p, dtype=torch.float64),
                "allreduce": torch.tensor(allreduce, dtype=torch.float64)}


def _median(round_s, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        round_s()
    return statistics.median(round_s() for _ in range(max(1, repeats)))


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


def fit_curve(kind: str, backend: str, world: int, sizes: Sequence[float], seconds: Sequence[float]) -> CommCurve:
    """The :class:`CommCurve` of measured ``seconds`` [K] at ``sizes`` [K] bytes: α + S/β of one transfer
    (``kind`` p2p), or of one whole all-reduce over ``world`` ranks, kept as it is and as the ring formula's
    per-hop α and β (``kind`` allreduce: a = 2(n−1)·α, c = 2(n−1)/(n·β))."""
    a, c = _robust_line(np.asarray(sizes, dtype=np.float64), np.asarray(seconds, dtype=np.float64))
    if c <= 0:  # flat: no size grew the time; bound the bandwidth by the largest message
        c = float(seconds[-1]) / float(sizes[-1]) / 1e3
    if kind == "allreduce":
        latency, bandwidth = a / (2 * (world - 1)), 2 * (world - 1) / (world * c)
    else:
        latency, bandwidth = a, 1.0 / c
    return CommCurve(backend, world, tuple(float(s) for s in sizes), tuple(float(t) for t in seconds),
                     latency, bandwidth)


def measure_comm(*, processes: int = 2, device: str = "cpu", sizes: Sequence[int] = DEFAULT_MESSAGE_BYTES,
                 warmup: int = _WARMUP, repeats: int = _REPEATS, stagger_s: float = DEFAULT_STAGGER_S,
                 timeout_s: float = 120.0, pool=None) -> dict[str, CommCurve]:
    """``{"p2p": curve, "allreduce": curve}`` between ``processes`` ranks on this host (module docstring);
    ``pool``: a :class:`~tag.execute.launch.WorkerPool` of at least ``processes`` to run them in."""
    from tag.execute.launch import launch
    from tag.execute.lower import ExecutionError

    if processes < 2:
        raise CommError(f"measuring communication needs at least 2 processes, got {processes}")
    backend = comm_backend(device)
    probes = [_CommProbe(r, sizes, warmup, repeats, stagger_s) for r in range(processes)]
    try:
        reports = launch(probes, {}, steps=1, backend=backend, timeout_s=timeout_s, pool=pool)
    except ExecutionError as error:
        raise CommError(f"measuring communication ({backend}): {error}") from None
    measured = reports[0]["results"][0]
    return {kind: fit_curve(kind, backend, processes, sizes, measured[kind].tolist()) for kind in ("p2p", "allreduce")}
