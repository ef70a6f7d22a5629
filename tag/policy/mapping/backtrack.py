"""Depth-first search with backtracking over the decoder's ranked choices under a bound of the stage time.

A greedy decode under a bound (:meth:`MappingDecoder.complete`) takes, slot after slot, the decoder's best
free device whose reach stays within the bound, and gives up at the first slot where none does: on a
256-device mesh, a ring whose first replicas walked into a corner it cannot close from. :func:`backtrack`
goes on from there the way the exact mapper's DFS does (Parmesan Algorithm 2), with the decoder's ranking
as its value ordering and the reach (a lower bound of each slot's final stage time) as its pruning: the
greedy dive's choices become the frames of a stack; at a dead end the deepest frame with an untried
choice takes its next device (its ranking within the bound, computed when the search first backs into it)
and dives again. Within ``dives`` dives and a deadline it returns the first map whose time is within the
bound, or says that the whole tree under the bound was searched (no such map exists: every pruned device
was past the bound by a lower bound of its final time).
"""

from __future__ import annotations

import math
import time
from typing import Callable, NamedTuple, Sequence

import numpy as np

from tag._compiled import jit as _jit
from tag.policy.errors import PolicyError
from tag.policy.mapping.decoder import MappingDecoder

__all__ = ["BacktrackResult", "backtrack", "limited_discrepancy", "RingRegions"]

_TIME_RTOL = 1e-9  # a map's time within this relative distance of the bound meets it (rounding)


class BacktrackResult(NamedTuple):
    """What :func:`backtrack` found."""

    devices: list[int] | None  # [K] the fastest complete map it met (slot order), None when it met none
    time: float  # its max stage time, seconds (inf when none)
    exhausted: bool  # every choice under the bound was tried (with no width limit): no map within it exists
    dives: int  # greedy dives run


def backtrack(decoder: MappingDecoder, bound: float, evaluate: Callable[[Sequence[int]], float], *,
              dives: int, width: int | None = None, deadline: float = math.inf) -> BacktrackResult:
    """The first map found by depth-first search under ``bound`` (seconds) whose time (``evaluate``:
    the max stage time of a complete map in slot order) is within it, else the fastest complete map met.

    Each node of the search is one greedy dive (:meth:`MappingDecoder.dive`) from a prefix; its choices
    are frames (slot, the dive's devices before it), and a dead end (a slot with no device within the
    bound, or a complete map over the bound: the reach only bounds the time from below) backs up to the
    deepest frame with an untried device, in :meth:`MappingDecoder.ranked` order, at most ``width``
    devices per slot (None: all). Stops after ``dives`` dives or at ``deadline`` (perf_counter seconds)."""
    _check_width(width)
    frames: list[tuple[list[int], int, list[int] | None]] = []  # (dive's devices, slot, untried devices or
    #     None until the search first backs into the frame); the frame's prefix is devices[:slot]
    prefix: list[int] = []
    best: list[int] | None = None
    best_time = math.inf
    pruned = False  # a width limit left out some device: an exhausted search proves nothing
    regions = RingRegions(decoder, bound)
    count = 0
    while count < dives and time.perf_counter() < deadline:
        out, stopped = decoder.dive(prefix, bound=bound)
        count += 1
        dead = regions.first_dead_end(out, len(prefix))
        if dead is not None:  # no completion past this ring's end: back up from it
            out, stopped = out[:dead + 1], dead + 1
        elif stopped < 0:
            value = evaluate(out)
            if value < best_time:
                best, best_time = out, value
            if value <= bound * (1.0 + _TIME_RTOL):
                return BacktrackResult(best, best_time, False, count)
            stopped = len(out)
        frames.extend((out, slot, None) for slot in range(len(prefix), stopped))
        prefix = None
        while frames:
            devices, slot, untried = frames[-1]
            if untried is None:  # the dive took the first device of the ranking: the rest are untried
                ranking = decoder.ranked(devices[:slot], bound=bound)
                untried = [d for d in ranking if d != devices[slot]]
                if width is not None and len(untried) > width - 1:
                    untried, pruned = untried[:width - 1], True
            if not untried:
                frames.pop()
                continue
            choice = untried.pop(0)
            frames[-1] = (devices, slot, untried)
            prefix = devices[:slot] + [choice]
            break
        if prefix is None:
            return BacktrackResult(best, best_time, not pruned, count)
    return BacktrackResult(best, best_time, False, count)


def _check_width(width: int | None) -> None:
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
        raise PolicyError(f"width must be a positive integer (devices tried per slot), got {width!r}")


class RingRegions:
    """Whether a prefix of a map can still be completed under a bound with all-reduce rings.

    A ring of stage s under the bound uses only links (x, y) with c_s(x) + hop_s(x, y) and c_s(y) +
    hop_s(x, y) within it (each replica's time is its compute plus the ring's slowest hop). So

    - the open ring (some of its replicas placed) closes along a path of the replicas it still needs
      through free devices from its last device back to its first: they lie in one connected component
      of the free devices with its links, with enough of them, and of the right colours when that graph
      is bipartite (a path alternates colours);
    - every later ring lies inside one component of the free devices over the union of the later
      stages' links; a component of n devices holds at most ⌊n / R⌋ rings, and at most ⌊min(b, w) /
      (R / 2)⌋ when it is bipartite with b and w devices of each colour (none when R is odd).

    A prefix that fails either has no completion within the bound: on a mesh, a ring that walked into a
    pocket it cannot close from, or every device taken but a region the last ring cannot cover. The slots
    come stage after stage, each stage's replicas in a row (:func:`~tag.policy.mapping.search_order`)."""

    def __init__(self, decoder: MappingDecoder, bound: float) -> None:
        inst = decoder.instance
        self.replicas = int(inst.problem.num_replicas)
        self.num_slots = inst.num_slots
        self.num_rings = inst.num_slots // max(self.replicas, 1)
        self.active = inst.instantiation == "allreduce" and self.replicas >= 2 and bool((inst.ring_coef > 0).all())
        if not self.active:
            return
        limit = bound / inst.scale * (1.0 + _TIME_RTOL)
        allowed = []  # per ring in slot order: [D, D] links a hop of its stage may take
        for k in np.flatnonzero(inst.slot_replica == 0).tolist():
            hop = inst.hop_cost(k)
            compute = inst.compute[k]
            allowed.append((compute[:, None] + hop <= limit) & (compute[None, :] + hop <= limit))
        self._allowed = np.asarray(allowed)  # [S, D, D]
        self._after = np.logical_or.accumulate(self._allowed[::-1], axis=0)[::-1]  # [S, D, D] union from ring i on

    def feasible(self, devices: Sequence[int]) -> bool:
        """False when the prefix ``devices`` provably has no completion within the bound (class docstring)."""
        placed = len(devices)
        if not self.active or placed >= self.num_slots or placed == 0:
            return True
        r = self.replicas
        ring, inside = divmod(placed, r)
        free = np.ones(self._allowed.shape[1], dtype=bool)
        free[list(devices)] = False
        later = ring + (inside > 0)
        if inside and not _ring_closes(self._allowed[ring], free, devices[ring * r], devices[-1], r - inside):
            return False
        return later >= self.num_rings or _rings_fit(self._after[later], free, r, self.num_rings - later)

    def first_dead_end(self, devices: Sequence[int], start: int) -> int | None:
        """A slot j ≥ ``start`` whose prefix ``devices[:j + 1]`` fails :meth:`feasible` (a bisection over
        j, the first one when failing is monotone along the prefix), else None."""
        if not self.active or self.feasible(devices):
            return None
        low, high = start, len(devices) - 1  # devices[:high + 1] fails
        while low < high:
            middle = (low + high) // 2
            if self.feasible(devices[:middle + 1]):
                low = middle + 1
            else:
                high = middle
        return high


def _ring_closes(allowed: np.ndarray, free: np.ndarray, first: int, last: int, need: int) -> bool:
    """Whether a path of ``need`` free devices can lead from ``last`` back to ``first`` over ``allowed``
    [D, D] (RingRegions): in one component with them, enough devices, and of alternating colours when it
    is bipartite (with ``first == last`` the path closes a cycle of need + 1 hops)."""
    ids = np.flatnonzero(free)
    nodes = np.concatenate([ids, [first]] if first == last else [ids, [first, last]])
    label, colour, bipartite = _components(allowed[np.ix_(nodes, nodes)])
    at_first, at_last = len(ids), len(nodes) - 1
    if label[at_first] != label[at_last]:
        return False
    members = label[:len(ids)] == label[at_last]
    if int(members.sum()) < need:
        return False
    if not bipartite[label[at_last]]:
        return True
    # the path's devices alternate colours from last's; the one before first differs from first's
    if (colour[at_last] ^ (need % 2)) == colour[at_first]:
        return False
    unlike = int((colour[:len(ids)][members] != colour[at_last]).sum())
    return unlike >= (need + 1) // 2 and int(members.sum()) - unlike >= need // 2


def _rings_fit(allowed: np.ndarray, free: np.ndarray, replicas: int, rings: int) -> bool:
    """Whether ``rings`` cycles of ``replicas`` devices fit in the components of ``allowed`` [D, D] over the
    ``free`` [D] devices (RingRegions)."""
    ids = np.flatnonzero(free)
    label, colour, bipartite = _components(allowed[np.ix_(ids, ids)])
    fit = 0
    for c in range(len(bipartite)):
        members = label == c
        if bipartite[c]:
            black = int((colour[members] == 0).sum())
            fit += 0 if replicas % 2 else min(black, int(members.sum()) - black) // (replicas // 2)
        else:
            fit += int(members.sum()) // replicas
    return fit >= rings


@_jit
def _components(adjacent):  # pragma: no cover - compiled
    """(label [n], colour [n] 0/1, bipartite [C]) of the graph ``adjacent`` [n, n] (bool): connected
    components by breadth-first search, each 2-coloured while it can be."""
    n = adjacent.shape[0]
    label = np.full(n, -1, dtype=np.int64)
    colour = np.zeros(n, dtype=np.int64)
    bipartite = np.ones(n, dtype=np.bool_)
    queue = np.empty(n, dtype=np.int64)
    count = 0
    for root in range(n):
        if label[root] >= 0:
            continue
        label[root] = count
        queue[0] = root
        head, tail = 0, 1
        while head < tail:
            x = queue[head]
            head += 1
            for y in range(n):
                if y == x or not adjacent[x, y]:
                    continue
                if label[y] < 0:
                    label[y] = count
                    colour[y] = 1 - colour[x]
                    queue[tail] = y
                    tail += 1
                elif colour[y] == colour[x]:
                    bipartite[count] = False
        count += 1
    return label, colour, bipartite[:count]


def limited_discrepancy(decoder: MappingDecoder, bound: float, evaluate: Callable[[Sequence[int]], float], *,
                        dives: int, width: int = 3, deadline: float = math.inf) -> BacktrackResult:
    """:func:`backtrack`'s search in limited-discrepancy order (Harvey and Ginsberg): the greedy dive
    under ``bound``, then every path that leaves the decoder's ranking at one slot (its next ``width`` − 1
    devices within the bound, earlier slots first), then at two, and so on; each path completed by a
    greedy dive and cut where it meets a dead end (:class:`RingRegions`). Where a chronological search
    spends its dives on the last slots, this one revisits early choices (the region a ring took) as soon
    as late ones. Once every path within the width is tried (the devices left out of it were the only
    choices: a ring's first replica may need a device ranked lower), the width doubles and the search
    starts over. Returns the first map within the bound, else the fastest complete map met;
    ``exhausted`` when every path was tried with no device left out (never when the dives or the deadline
    stopped the search first)."""
    _check_width(width)
    regions = RingRegions(decoder, bound)
    state = {"dives": 0, "best": None, "time": math.inf, "pruned": False, "deeper": False, "cut": False}

    def spent() -> bool:
        """The dive budget or the deadline is used up; remembered, since a search cut short proves nothing."""
        if state["dives"] >= dives or time.perf_counter() >= deadline:
            state["cut"] = True
        return state["cut"]

    def dive(prefix: list[int]) -> tuple[list[int], int] | None:
        """The dive's devices and where it stopped (len when complete and over the bound); None once a map
        within the bound is found."""
        out, stopped = decoder.dive(prefix, bound=bound)
        state["dives"] += 1
        dead = regions.first_dead_end(out, len(prefix))
        if dead is not None:
            return out[:dead + 1], dead + 1
        if stopped >= 0:
            return out, stopped
        value = evaluate(out)
        if value < state["time"]:
            state["best"], state["time"] = out, value
        return None if value <= bound * (1.0 + _TIME_RTOL) else (out, len(out))

    def search(prefix: list[int], left: int) -> bool:
        """Paths from ``prefix`` with exactly ``left`` more discrepancies; True once one meets the bound."""
        if spent():
            return False
        result = dive(prefix)
        if result is None:
            return True
        out, stopped = result
        if left == 0:  # a path with choices left to vary: the next count of discrepancies has more to try
            state["deeper"] = state["deeper"] or stopped > len(prefix)
            return False
        for slot in range(len(prefix), stopped):
            ranking = [d for d in decoder.ranked(out[:slot], bound=bound) if d != out[slot]]
            if len(ranking) > width - 1:
                ranking, state["pruned"] = ranking[:width - 1], True
            for device in ranking:
                if search(out[:slot] + [device], left - 1):
                    return True
                if spent():
                    return False
        return False

    discrepancies = 0
    while not spent():
        state["deeper"] = False
        if search([], discrepancies):
            return BacktrackResult(state["best"], state["time"], False, state["dives"])
        if state["cut"]:  # stopped partway through this pass: the untried paths may hold a map
            break
        if state["deeper"]:
            discrepancies += 1
        elif not state["pruned"]:  # no path had a choice left to vary: every path was tried
            return BacktrackResult(state["best"], state["time"], True, state["dives"])
        else:  # every path within the width was tried: widen it and start over
            width, discrepancies, state["pruned"] = 2 * width, 0, False
    return BacktrackResult(state["best"], state["time"], False, state["dives"])
