"""Start the ranks of a plan on this host (gloo or NCCL over TCP) and collect what they report.

Three ways to start them: :func:`run_ranks` spawns one fresh process per rank and ends them afterwards;
a :class:`WorkerPool` keeps processes alive between runs (each run joins a new process group on a new
port), which is what the tests share to keep start-up cheap; under ``torchrun`` (one or many hosts) each
process runs its own rank and rank 0 gathers the reports (:func:`run_torchrun`). Either way a rank that raises, dies or
times out stops the run: the others are ended and :class:`~tag.execute.lower.ExecutionError` names the
rank and what it was doing. Results come back through files (``torch.save``, loaded with
``weights_only=True``), not through queues, which race with a worker's exit.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from tag.execute.lower import ExecutionError, RankProgram

__all__ = ["run_ranks", "WorkerPool", "free_port", "check_port", "DEFAULT_TIMEOUT_S", "launch", "torchrun_rank",
           "run_torchrun", "rank_device"]

DEFAULT_TIMEOUT_S = 120.0  # a collective or receive that waits longer fails the run
_POLL_S = 0.05


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_port(port: int) -> None:
    """ExecutionError when ``port`` cannot be bound on this host (in use, or not a port)."""
    if not 1 <= port <= 65535:
        raise ExecutionError(f"--port {port} is not a TCP port (1-65535)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ExecutionError(f"port {port} is in use on this host; give another --port or leave it out") from None


def _run_rank(rank: int, world: int, port: int, backend: str, program, tensors: dict, steps: int,
              timeout_s: float, out_dir: str, faults: dict | None = None) -> None:
    """Body of one rank: join the group, run ``steps`` steps, write results or the error to ``out_dir``.
    ``program``: a :class:`RankProgram`, or anything with ``make_runtime(tensors, device)`` giving an object with
    ``step()``, ``carry()`` and ``describe()`` (a torch pipeline stage, :mod:`tag.execute.torch_pipeline`)."""
    import torch.distributed as dist

    from tag.execute.runtime import timed_steps

    torch.set_num_threads(1)
    runtime = None
    try:
        device = rank_device(backend, getattr(program, "device", rank))  # a torch stage: its plan device
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s), **_device_id(device))
        try:
            runtime = program.make_runtime(tensors, device)
            _inject(faults, rank, runtime)
            results, times = timed_steps(runtime, steps, _progress_file(Path(out_dir)) if rank == 0 else None)
            torch.save({"rank": rank, "results": results, "times": times}, Path(out_dir) / f"rank{rank}.pt")
        finally:
            dist.destroy_process_group()
    except BaseException as error:  # noqa: BLE001 - every failure is reported to the launcher
        where = runtime.describe() if runtime is not None else "start-up"
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        message = f"rank {rank} failed at {where}: {type(error).__name__}: {first}"[:2000]
        (Path(out_dir) / f"rank{rank}.error").write_text(message + "\n" + traceback.format_exc()[-4000:])
        if isinstance(error, KeyboardInterrupt):
            raise


def rank_device(backend: str, local_rank: int) -> torch.device:
    """Where a rank computes: the CPU under gloo; under NCCL its own GPU of this host (local rank k takes GPU
    k), made the current CUDA device."""
    if backend != "nccl":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ExecutionError(f"local rank {local_rank} needs GPU {local_rank}; this host has {count} (start fewer "
                             "processes per host, several hosts with torchrun)")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _device_id(device: torch.device) -> dict:
    """init_process_group's ``device_id`` for a GPU rank (NCCL binds the group to it); none on the CPU."""
    return {"device_id": device} if device.type == "cuda" else {}


def _progress_file(out_dir: Path):
    """Rank 0 notes each finished step in ``out_dir/progress`` (written whole, then renamed)."""
    def note(done: int, total: int) -> None:
        tmp = out_dir / "progress.tmp"
        tmp.write_text(f"{done} {total}")
        os.replace(tmp, out_dir / "progress")
    return note


class _Progress:
    """Calls ``callback(done, total)`` when rank 0 has finished another step."""

    def __init__(self, out_dir: Path, callback) -> None:
        self.path, self.callback, self.seen = out_dir / "progress", callback, None

    def poll(self) -> None:
        if self.callback is None or not self.path.exists():
            return
        text = self.path.read_text()
        if text != self.seen:
            self.seen = text
            done, total = map(int, text.split())
            self.callback(done, total)


def _inject(faults: dict | None, rank: int, runtime) -> None:
    """Test hook: make ``rank`` raise or die at its first compute of op ``faults['op']``."""
    if not faults or faults.get("rank") != rank:
        return
    from tag.execute.lower import Compute

    original = runtime._compute

    def faulty(c: Compute) -> None:
        if c.op == faults["op"]:
            if faults.get("how") == "die":
                os._exit(17)
            raise RuntimeError(f"injected fault at op {c.op}")
        original(c)

    runtime._compute = faulty


def _collect(out_dir: Path, world: int) -> list[dict]:
    results = []
    for rank in range(world):
        path = out_dir / f"rank{rank}.pt"
        results.append(torch.load(path, weights_only=True))
    return results


_PEER_FAILURES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _first_error(out_dir: Path) -> str | None:
    """The first line of the error that caused the failure: a rank that lost its peer reports only that."""
    errors = [path.read_text().splitlines()[0] for path in sorted(out_dir.glob("rank*.error"))]
    if not errors:
        return None
    own = [e for e in errors if not any(mark in e for mark in _PEER_FAILURES)]
    return (own or errors)[0]


def run_ranks(programs: list[RankProgram], tensors: dict, *, steps: int = 1, backend: str = "gloo",
              port: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, faults: dict | None = None,
              progress=None) -> list[dict]:
    """Spawn one process per rank program, run ``steps`` steps, return each rank's report."""
    world = len(programs)
    port = free_port() if port is None else port
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tag-run-") as out:
        processes = [context.Process(target=_run_rank, daemon=True,
                                     args=(r, world, port, backend, programs[r], tensors, steps, timeout_s, out,
                                           faults))
                     for r in range(world)]
        for p in processes:
            p.start()
        _wait(processes, Path(out), world, timeout_s, _Progress(Path(out), progress))
        return _collect(Path(out), world)


def _wait(processes: list, out: Path, world: int, timeout_s: float, progress: _Progress) -> None:
    deadline = time.monotonic() + timeout_s * 2 + 60
    try:
        while True:
            progress.poll()
            if all(not p.is_alive() for p in processes):
                break
            error = _first_error(out)
            dead = [r for r, p in enumerate(processes) if not p.is_alive() and p.exitcode not in (0, None)]
            if error is not None or dead or time.monotonic() > deadline:
                time.sleep(0.5)  # let the other ranks write what they saw
                break
            time.sleep(_POLL_S)
    finally:
        for p in processes:
            if p.is_alive():
                p.terminate()
        for p in processes:
            p.join(5)
            if p.is_alive():
                p.kill()
    _raise_failure(out, world, {r: p.exitcode for r, p in enumerate(processes)})


def _raise_failure(out: Path, world: int, exitcodes: dict[int, Any]) -> None:
    missing = [r for r in range(world) if not (out / f"rank{r}.pt").exists()]
    if not missing:
        return
    error = _first_error(out)
    if error is not None and not any(mark in error for mark in _PEER_FAILURES):
        raise ExecutionError(error)  # a rank raised: the others were stopped after it
    died = [r for r in missing if exitcodes.get(r) not in (0, None) and not (out / f"rank{r}.error").exists()]
    if died:  # a rank that died is the cause; the others only saw their peer vanish
        raise ExecutionError(f"rank {died[0]} died (exit status {exitcodes[died[0]]}) before it finished")
    if error is not None:
        raise ExecutionError(error)
    rank = missing[0]
    code = exitcodes.get(rank)
    if code not in (0, None):
        raise ExecutionError(f"rank {rank} died (exit status {code}) before it finished")
    raise ExecutionError(f"rank {rank} did not finish in time")


# ---------------------------------------------------------------------------------------------- torchrun
_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun_rank() -> tuple[int, int] | None:
    """(rank, world size) when ``torchrun`` (or any launcher of the env:// convention) started this process."""
    if not all(name in os.environ for name in _TORCHRUN_VARIABLES):
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise ExecutionError("RANK and WORLD_SIZE must be integers (torchrun sets them)") from None


def run_torchrun(programs: list, tensors: dict, *, steps: int = 1, backend: str = "gloo",
                 timeout_s: float = DEFAULT_TIMEOUT_S, progress=None) -> list[dict] | None:
    """Run this process's rank of a launch that torchrun started on one or many hosts: every process lowers
    the same plan, rank 0's initial tensors are broadcast (a user's model need not seed itself), and rank 0
    gathers every rank's report; the others return None."""
    import torch.distributed as dist

    from tag.execute.runtime import timed_steps

    rank, world = torchrun_rank()
    if world != len(programs):
        raise ExecutionError(f"torchrun started {world} processes; the plan has {len(programs)} ranks "
                             f"(give --nproc-per-node × --nnodes = {len(programs)})")
    torch.set_num_threads(1)
    device = rank_device(backend, int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), **_device_id(device))
    runtime = None
    try:
        shared = _broadcast_tensors(tensors, device)
        runtime = programs[rank].make_runtime(shared, device)
        results, times = timed_steps(runtime, steps, progress if rank == 0 else None)
        reports = [None] * world if rank == 0 else None
        dist.gather_object({"rank": rank, "results": results, "times": times}, reports, dst=0)
        return reports
    except Exception as error:  # noqa: BLE001 - one line naming the rank and what it was doing
        where = runtime.describe() if runtime is not None else "start-up"
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ExecutionError(f"rank {rank} failed at {where}: {type(error).__name__}: {first}"[:2000]) from None
    finally:
        dist.destroy_process_group()


def _broadcast_tensors(tensors: dict, device: torch.device) -> dict:
    """Rank 0's initial tensors on every rank (a user's model need not seed itself): every rank built the
    same program, so each receives in place, tensor by tensor in one name order."""
    import torch.distributed as dist

    out = {}
    for name in sorted(tensors):
        value = tensors[name].detach().to(device, copy=True).contiguous()
        dist.broadcast(value, src=0)
        out[name] = value.cpu() if device.type != "cpu" else value
    return out


def launch(programs: list, tensors: dict, *, steps: int = 1, backend: str = "gloo", port: int | None = None,
           timeout_s: float = DEFAULT_TIMEOUT_S, pool: WorkerPool | None = None,
           faults: dict | None = None, progress=None) -> list[dict] | None:
    """Every rank's report: from ``pool``, from this process's torchrun launch (None off rank 0), or from
    processes spawned here. ``progress(done, total)`` is called as rank 0 finishes each step."""
    if pool is not None:
        return pool.run(programs, tensors, steps=steps, backend=backend, timeout_s=timeout_s, faults=faults)
    if torchrun_rank() is not None:
        return run_torchrun(programs, tensors, steps=steps, backend=backend, timeout_s=timeout_s, progress=progress)
    return run_ranks(programs, tensors, steps=steps, backend=backend, port=port, timeout_s=timeout_s, faults=faults,
                     progress=progress)


# ---------------------------------------------------------------------------------------------- pool
def _pool_worker(index: int, jobs, replies) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        _run_rank(index, *job)
        replies.put(index)


class WorkerPool:
    """``size`` processes kept alive for many runs (imports and start-up paid once)."""

    def __init__(self, size: int) -> None:
        context = mp.get_context("spawn")
        self.size = size
        self.jobs = [context.Queue() for _ in range(size)]
        self.replies = context.Queue()
        self.processes = [context.Process(target=_pool_worker, args=(i, self.jobs[i], self.replies), daemon=True)
                          for i in range(size)]
        for p in self.processes:
            p.start()

    def run(self, programs: list[RankProgram], tensors: dict, *, steps: int = 1, backend: str = "gloo",
            timeout_s: float = DEFAULT_TIMEOUT_S, faults: dict | None = None) -> list[dict]:
        world = len(programs)
        if world > self.size:
            raise ExecutionError(f"the plan has {world} ranks; this pool has {self.size} processes")
        self._revive()
        port = free_port()
        with tempfile.TemporaryDirectory(prefix="tag-run-") as out:
            for r in range(world):
                self.jobs[r].put((world, port, backend, programs[r], tensors, steps, timeout_s, out, faults))
            done: set[int] = set()
            codes: dict[int, Any] = {}
            deadline = time.monotonic() + timeout_s * 2 + 60
            while len(done) < world:
                try:
                    done.add(self.replies.get(timeout=_POLL_S))
                except queue.Empty:
                    pass
                failed = _first_error(Path(out)) is not None
                dead = [r for r in range(world) if not self.processes[r].is_alive()]
                if (failed or dead or time.monotonic() > deadline) and len(done) < world:
                    time.sleep(0.5)
                    codes = {r: self.processes[r].exitcode for r in range(world)}
                    self._restart([r for r in range(world) if r not in done])
                    break
            _raise_failure(Path(out), world, codes)
            return _collect(Path(out), world)

    def _restart(self, indices: list[int]) -> None:
        """End workers stuck in a failed run and start fresh ones in their place."""
        for i in indices:
            if self.processes[i].is_alive():
                self.processes[i].kill()
            self.processes[i].join(5)
        self._drain()
        self._revive()

    def _drain(self) -> None:
        while True:
            try:
                self.replies.get_nowait()
            except queue.Empty:
                return

    def _revive(self) -> None:
        context = mp.get_context("spawn")
        for i, p in enumerate(self.processes):
            if not p.is_alive():
                self.jobs[i] = context.Queue()
                self.processes[i] = context.Process(target=_pool_worker, args=(i, self.jobs[i], self.replies),
                                                    daemon=True)
                self.processes[i].start()

    def close(self) -> None:
        for q, p in zip(self.jobs, self.processes):
            if p.is_alive():
                q.put(None)
        for p in self.processes:
            p.join(5)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
