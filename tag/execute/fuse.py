"""Fuse the point-to-point transfers of rank programs into fewer messages, and prove the result deadlock-free.

A pipeline's folded programs send every tensor that crosses a stage cut as its own transfer task (an
activation's rows, a mask, a tied weight, the weight's gradient partial), each one gloo hand-over. The
transfers one rank sends one peer for the same message key (a pipeline's (stage boundary, micro-batch,
phase)) become one message (:func:`fuse_transfers`): its :class:`~tag.execute.lower.Send` takes the place of
the members' last send (every payload is ready there), its :class:`~tag.execute.lower.Recv` stands before
the first instruction that reads any member (so a receiver waits only where it needs the message). The
runtime packs a message's tensors into one byte buffer and unpacks them on arrival.

Moving a send later can make a receiver wait on a rank that itself waits on the receiver, so the fused
programs are checked by :func:`deadlock_free`, which runs every rank's instruction list against the others
(a send never blocks, a receive waits for its message, a collective for every member); where the check fails
the programs stay unfused. Messages carry distinct tags, so a receive matches its own message whatever order
the peer sent them in.
"""

from __future__ import annotations

from typing import Hashable

from tag.execute.lower import Alias, Compute, Local, RankProgram, Recv, Reduce, Send

__all__ = ["fuse_transfers", "deadlock_free"]


def fuse_transfers(programs: list[RankProgram], keys: dict[int, Hashable]) -> list[RankProgram]:
    """``programs`` with the transfers of equal key fused (module docstring). ``keys[task]``: the message
    key of transfer task ``task`` (a send and a receive of one task); a task without a key travels alone.
    Returns new programs, or ``programs`` itself when the fused ones could deadlock."""
    members: dict[tuple, list[int]] = {}  # (src, dst, key) -> tasks in the sender's order
    sends: dict[int, Send] = {}
    for program in programs:
        for step in program.steps:
            if isinstance(step, Send):
                sends[step.task] = step
                group = (program.rank, step.dst, keys.get(step.task, ("alone", step.task)))
                members.setdefault(group, []).append(step.task)
    if all(len(tasks) == 1 for tasks in members.values()) and all(s.tag == 0 for s in sends.values()):
        return programs
    head: dict[int, int] = {}  # member task -> the fused message's task (its first member's)
    last: dict[int, int] = {}  # fused message's task -> the member whose send it replaces
    tags: dict[int, int] = {}
    for tag, tasks in enumerate(members.values(), start=1):
        for t in tasks:
            head[t] = tasks[0]
        last[tasks[0]] = tasks[-1]
        tags[tasks[0]] = tag
    received = {step.task: step.items for program in programs for step in program.steps if isinstance(step, Recv)}
    items = {tasks[0]: tuple(item for m in tasks for item in sends[m].items) for tasks in members.values()}
    kept = {tasks[0]: tuple(item for m in tasks for item in received[m]) for tasks in members.values()}
    sources: dict[int, int] = {}
    fused = []
    for program in programs:
        steps: list = []
        waiting: dict[int, set[int]] = {}  # fused messages this rank receives, not yet placed -> their uses
        for step in program.steps:
            for t in [t for t, uses in waiting.items() if _reads(step, uses)]:
                steps.append(Recv(t, sources[t], kept[t], tags[t]))  # where a member is first read
                del waiting[t]
            if isinstance(step, Send):
                t = head[step.task]
                if last[t] == step.task:
                    steps.append(Send(t, step.dst, items[t], tags[t]))
            elif isinstance(step, Recv):
                t = head[step.task]
                if t == step.task:
                    waiting[t] = {item.use for item in kept[t]}
                    sources[t] = step.src
            else:
                steps.append(step)
        steps += [Recv(t, sources[t], kept[t], tags[t]) for t in waiting]
        fused.append(RankProgram(program.rank, program.world, program.records, program.inputs, steps, program.carry,
                                 program.outputs, program.groups))
    return fused if deadlock_free(fused) else programs


def _reads(step, uses: set[int]) -> bool:
    """Whether instruction ``step`` reads what arrived for one of ``uses``."""
    if isinstance(step, Compute):
        return any(read.use in uses for read in step.reads.values())
    if isinstance(step, Alias):
        return any(use in uses for use, _ in step.items)
    if isinstance(step, Local):
        return any(item.use in uses for item in step.send)
    if isinstance(step, Send):
        return any(item.kind == "sum" and item.use in uses for item in step.items)
    return False


def deadlock_free(programs: list[RankProgram]) -> bool:
    """Whether every rank gets through its step: ranks advance in turns, a Send posts its message (by
    source, destination, tag and task) and never waits, a Recv waits until its message is posted, and a
    collective over several ranks waits until every member stands at it."""
    at = [0] * len(programs)
    posted: set[tuple] = set()
    moved = True
    while moved:
        moved = False
        for program in programs:
            r = program.rank
            while at[r] < len(program.steps):
                step = program.steps[at[r]]
                if isinstance(step, Send):
                    posted.add((r, step.dst, step.tag, step.task))
                elif isinstance(step, Recv):
                    if (step.src, r, step.tag, step.task) not in posted:
                        break
                elif isinstance(step, Reduce) and len(step.members) > 1:
                    if not all(at[m] < len(programs[m].steps) and isinstance(programs[m].steps[at[m]], Reduce)
                               and programs[m].steps[at[m]].task == step.task for m in step.members):
                        break
                    for m in step.members:
                        if m != r:
                            at[m] += 1
                at[r] += 1
                moved = True
    return all(at[p.rank] == len(p.steps) for p in programs)
