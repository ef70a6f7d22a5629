"""One rank's interpreter: runs a :class:`~tag.execute.lower.RankProgram` on torch.distributed.

Values live per op (``values[op]``: a tensor, or a tuple for a multi-output op) and per tensor use
(``inbox[use]``: row pieces, partials, a reduced result, a whole copy), exactly the state the compiler's
checker reasons about. Sends are ``isend`` (never blocking), receives and collectives block; every
rank walks the same global order, so a receive always finds its send.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tag.execute.lower import Alias, Carry, Compute, Local, Read, Recv, Reduce, RankProgram, Send

__all__ = ["RankRuntime", "call_record", "decode"]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.split(".")[-1])


def _target(name: str):
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def decode(value: Any, resolve, device: torch.device | None = None) -> Any:
    """A JSON argument of an op record → Python/torch values; ``resolve(op, out)`` gives references, and a
    recorded device becomes ``device`` (the rank's own; default the CPU)."""
    if isinstance(value, list):
        return [decode(v, resolve, device) for v in value]
    if isinstance(value, dict):
        if "ref" in value:
            return resolve(int(value["ref"]), int(value["out"]))
        if "expr" in value:
            return call_record(value["expr"], resolve, device)
        if "dtype" in value:
            return _dtype(value["dtype"])
        if "layout" in value:
            return getattr(torch, value["layout"].split(".")[-1])
        if "memory_format" in value:
            return getattr(torch, value["memory_format"].split(".")[-1])
        if "device" in value:
            return device or torch.device("cpu")  # a rank runs on its own device
        if "float" in value:
            return float(value["float"])
        return {k: decode(v, resolve, device) for k, v in value.items()}
    return value


def call_record(record: dict, resolve, device: torch.device | None = None) -> Any:
    args = decode(record["args"], resolve, device)
    kwargs = {k: decode(v, resolve, device) for k, v in record["kwargs"].items()}
    if record["target"] == "getitem":
        return args[0]
    return _target(record["target"])(*args, **kwargs)


def _out(value: Any, out: int) -> torch.Tensor:
    return value[out] if isinstance(value, (tuple, list)) else value


@dataclass
class _Inbox:
    rows: list = field(default_factory=list)  # [(lo, hi, {out: tensor})]
    partials: list = field(default_factory=list)  # [{out: tensor}]
    result: dict | None = None  # {out: tensor}: an all-reduce, PS or AddN result
    full: dict | None = None  # {out: tensor}


class RankRuntime:
    """Runs one rank's program step after step; ``tensors``: placeholder name → value at the global batch."""

    def __init__(self, program: RankProgram, tensors: dict[str, torch.Tensor], device: torch.device | None = None
                 ) -> None:
        self.program = program
        self.rank = program.rank
        self.device = device or torch.device("cpu")
        self.values: dict[int, Any] = {}
        for op, (name, rows) in program.inputs.items():
            value = tensors[name]
            self.values[op] = (value if rows is None else value[rows[0]:rows[1]]).to(self.device)
        self.groups = {members: dist.new_group(list(members)) for members in program.groups}
        self.current = None  # the instruction running (for error reports)

    # ------------------------------------------------------------------ one step
    def step(self) -> dict[str, torch.Tensor]:
        self.inbox: dict[int, _Inbox] = {}
        pending = []
        for instruction in self.program.steps:
            self.current = instruction
            if isinstance(instruction, Compute):
                self._compute(instruction)
            elif isinstance(instruction, Send):
                pending.extend(self._send(instruction))
            elif isinstance(instruction, Recv):
                self._recv(instruction)
            elif isinstance(instruction, Reduce):
                self._reduce(instruction)
            elif isinstance(instruction, Local):
                for sent, kept in zip(instruction.send, instruction.recv):
                    self._store(kept, dict(zip((k for k, *_ in kept.outs), self._payload(sent))))
            elif isinstance(instruction, Alias):
                for use, item in instruction.items:
                    box = self.inbox[use]
                    tensors = box.full if item.kind == "full" else \
                        next(t for lo, hi, t in box.rows if (lo, hi) == (item.lo, item.hi))
                    self._store(item, tensors)
        for work in pending:
            work.wait()
        self.current = None
        return {name: self._local(ref).detach().to("cpu", copy=True) for name, (ref, _) in self.program.outputs.items()}

    def _local(self, ref: dict) -> torch.Tensor:
        """A reference (or folded view of one) evaluated on this rank's own values."""
        return decode(ref, lambda p, out: _out(self.values[p], out), self.device)

    def carry(self) -> None:
        """Inputs of the next step: updated parameters, optimizer states and buffers."""
        new = {}
        pending = []
        for c in self.program.carry:
            self.current = c
            if c.src == self.rank and c.dst == self.rank:
                new[c.op] = self._local(c.ref)
            elif c.src == self.rank:
                pending.append(dist.isend(self._local(c.ref).contiguous(), c.dst))
            else:
                like = self.values[c.op]
                buffer = torch.empty_like(like)
                dist.recv(buffer, c.src)
                new[c.op] = buffer
        for work in pending:
            work.wait()
        self.values = {op: v for op, v in self.values.items() if op in self.program.inputs}
        self.values.update(new)
        self.current = None

    def describe(self) -> str:
        """What the rank was doing (for errors)."""
        i = self.current
        if isinstance(i, Compute):
            return f"op {i.op} ({self.program.records[i.op].get('target')})"
        if isinstance(i, (Local, Alias)):
            return f"local transfer task {i.task}"
        if isinstance(i, (Send, Recv)):
            return f"transfer task {i.task} ({'to' if isinstance(i, Send) else 'from'} rank " \
                   f"{i.dst if isinstance(i, Send) else i.src})"
        if isinstance(i, Reduce):
            return f"{i.kind} task {i.task} over ranks {list(i.members)}"
        if isinstance(i, Carry):
            return f"carrying op {i.op} to the next step"
        return "start-up"

    # ------------------------------------------------------------------ compute
    def _compute(self, c: Compute) -> None:
        record = self.program.records[c.op]
        cache: dict[tuple[int, int], torch.Tensor] = {}

        def resolve(p: int, out: int) -> torch.Tensor:
            key = (p, out)
            if key not in cache:
                cache[key] = self._read(p, out, c.reads[p])
            return cache[key]

        value = call_record(record, resolve, self.device)
        for out, factor in c.scale_out:
            if isinstance(value, (tuple, list)):
                value = tuple(v * factor if k == out else v for k, v in enumerate(value))
            else:
                value = value * factor
        self.values[c.op] = value

    def _read(self, p: int, out: int, read: Read) -> torch.Tensor:
        if read.mode == "local":
            value = _out(self.values[p], out)
        elif read.mode == "whole":
            box = self.inbox[read.use]
            value = box.full[out]
        elif read.mode == "rows":
            value = self._rows(p, out, read)
        elif read.mode == "sum":
            box = self.inbox.get(read.use, _Inbox())
            if box.result is not None:
                value = box.result[out]
            else:
                parts = ([_out(self.values[p], out)] if read.own else []) + [x[out] for x in box.partials]
                value = _add(parts)
        else:  # share
            box = self.inbox.get(read.use, _Inbox())
            parts = ([_out(self.values[p], out)] if read.own else []) + [x[out] for x in box.partials]
            if parts:
                value = _add(parts)
            else:
                shape, dtype = next((s, d) for k, s, d in read.zeros if k == out)
                value = torch.zeros(shape, dtype=_dtype(dtype), device=self.device)
        return value

    def _rows(self, p: int, out: int, read: Read) -> torch.Tensor:
        dim, per = next((d, r) for k, d, r in read.dims if k == out)
        lo, hi = read.need
        pieces = []
        if read.local is not None:
            a, b = read.local
            pieces.append((a, b, _out(self.values[p], out), read.held_lo))
        for plo, phi, tensors in self.inbox.get(read.use, _Inbox()).rows:
            a, b = max(plo, lo), min(phi, hi)
            if b > a:
                pieces.append((a, b, tensors[out], plo))
        pieces.sort(key=lambda x: x[0])
        at, parts = lo, []
        for a, b, tensor, start in pieces:
            if a != at:
                raise RuntimeError(f"rows [{at}, {a}) of op {p} never arrived")
            parts.append(tensor.narrow(dim, (a - start) * per, (b - a) * per))
            at = b
        if at != hi:
            raise RuntimeError(f"rows [{at}, {hi}) of op {p} never arrived")
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim)

    # ------------------------------------------------------------------ communication
    def _payload(self, item) -> list[torch.Tensor]:
        value = self.values.get(item.op)
        out = []
        for k, shape, dtype, dim, per in item.outs:
            if item.kind == "rows":
                tensor = _out(value, k).narrow(dim, (item.lo - item.held_lo) * per, (item.hi - item.lo) * per)
            elif item.kind == "sum":  # the AddN root: its own partial and every partial that reached it
                box = self.inbox.get(item.use, _Inbox())
                parts = ([_out(value, k)] if value is not None else []) + [x[k] for x in box.partials]
                tensor = _add(parts)
            else:
                tensor = _out(value, k)
            out.append(tensor.contiguous())
        return out

    def _send(self, s: Send) -> list:
        """One isend per message: a lone tensor as it is, several packed into one byte buffer (:func:`_pack`)."""
        tensors = [tensor for item in s.items for tensor in self._payload(item)]
        message = tensors[0] if len(tensors) == 1 else _pack(tensors)
        return [dist.isend(message, s.dst, tag=s.tag)]

    def _recv(self, r: Recv) -> None:
        specs = [(tuple(shape), _dtype(dtype)) for item in r.items for _, shape, dtype, _, _ in item.outs]
        if len(specs) == 1:
            buffer = torch.empty(specs[0][0], dtype=specs[0][1], device=self.device)
            dist.recv(buffer, r.src, tag=r.tag)
            tensors = iter([buffer])
        else:
            buffer = torch.empty(_packed_size(specs), dtype=torch.uint8, device=self.device)
            dist.recv(buffer, r.src, tag=r.tag)
            tensors = iter(_unpack(buffer, specs))
        for item in r.items:
            self._store(item, {k: next(tensors) for k, *_ in item.outs})

    def _store(self, item, tensors: dict) -> None:
        """File what arrived for one transfer item in its use's inbox."""
        box = self.inbox.setdefault(item.use, _Inbox())
        if item.kind == "rows":
            box.rows.append((item.lo, item.hi, tensors))
        elif item.kind == "partial":
            box.partials.append(tensors)
        elif item.kind == "sum":
            box.result = tensors
        else:
            box.full = tensors

    def _reduce(self, r: Reduce) -> None:
        """The collective over ``r.members``; this rank's partial is the sum of its values ``ops`` (several
        micro-batches of a pipeline stage, one op of a placement), the result filed under every use."""
        group = self.groups[r.members] if len(r.members) > 1 else None
        partials = [[_add([_out(self.values[p], k) for p in ops]).detach() for k, *_ in outs]
                    for _, ops, outs in r.items]
        if group is not None:  # one collective per dtype over the task's tensors packed flat (as a fused task is)
            for dtype in dict.fromkeys(t.dtype for row in partials for t in row):
                tensors = [t for row in partials for t in row if t.dtype == dtype]
                flat = torch.cat([t.reshape(-1) for t in tensors])
                if r.kind == "allreduce":
                    dist.all_reduce(flat, group=group)
                else:
                    dist.reduce(flat, dst=r.server, group=group)
                    dist.broadcast(flat, src=r.server, group=group)
                summed = iter(flat.split([t.numel() for t in tensors]))
                partials = [[next(summed).view_as(t) if t.dtype == dtype else t for t in row] for row in partials]
        for (uses, _, outs), row in zip(r.items, partials):
            result = {k: (t if group is not None else t.clone()) for (k, *_), t in zip(outs, row)}
            for q in uses:
                self.inbox.setdefault(q, _Inbox()).result = result


_ALIGN = 8  # bytes: every packed tensor starts at a multiple, so that its bytes can be viewed as its dtype


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _packed_size(specs: list[tuple[tuple, torch.dtype]]) -> int:
    """Bytes of the buffer that packs tensors of ``specs`` [(shape, dtype)]."""
    return sum(_padded(int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size())
               for shape, dtype in specs)


def _pack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Contiguous tensors of any dtypes as one uint8 buffer, each at an aligned offset."""
    flat = torch.empty(_packed_size([(t.shape, t.dtype) for t in tensors]), dtype=torch.uint8,
                       device=tensors[0].device)
    at = 0
    for t in tensors:
        raw = t.reshape(-1).view(torch.uint8)
        flat[at:at + raw.numel()].copy_(raw)
        at += _padded(raw.numel())
    return flat


def _unpack(flat: torch.Tensor, specs: list[tuple[tuple, torch.dtype]]) -> list[torch.Tensor]:
    """The tensors :func:`_pack` packed, as views of ``flat``."""
    out, at = [], 0
    for shape, dtype in specs:
        nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        out.append(flat[at:at + nbytes].view(dtype).view(shape))
        at += _padded(nbytes)
    return out


def _add(parts: list[torch.Tensor]) -> torch.Tensor:
    total = parts[0]
    for x in parts[1:]:
        total = total + x
    return total


def timed_steps(runtime: RankRuntime, steps: int, progress=None) -> tuple[list[dict], list[float]]:
    """Run ``steps`` optimizer steps; the results of each and its wall time (after a barrier)."""
    results, times = [], []
    for k in range(steps):
        dist.barrier()
        start = time.perf_counter()
        results.append(runtime.step())
        times.append(time.perf_counter() - start)
        if k + 1 < steps:
            runtime.carry()
        if progress is not None:
            progress(k + 1, steps)
    return results, times
