"""Parmesan's inner-level search (Algorithm 2): is there a mapping whose maximum stage time is ≤ t?

Pure functions over arrays; :mod:`tag.exact.mapping` builds the arrays and drives the binary search.

The graph G' holds S stages × R replicas; vertex (s, r) goes to one device of D, each device at most once.
Each search assigns vertices in one fixed order (Algorithm 2's mapping_order) and answers FOUND (with a
mapping), INFEASIBLE (a proof: the whole tree was pruned) or TIMEOUT. One search per instantiation of
the stage time (Parmesan §V-B):

- :func:`search_p2p`, eq. (6) with (8): replica r of stage s talks only to replica r of its adjacent
  stages, so the R replica chains are independent but for the devices they share. Two orders share the
  time: stage-major (:func:`search_p2p_stages`: every replica of the tightest stage, then its
  neighbours) and chain-major (:func:`search_p2p_chains`: one replica chain after another).
- :func:`search_allreduce`, eq. (7) with (9): a stage's time is its compute plus its slowest ring hop,
  so the search builds one ring after another, the most constrained stage first (fewest allowed hops).

Each keeps the paper's checking scheme (a vertex's time is checked exactly once every vertex it depends
on is placed) and adds pruning that never cuts a feasible mapping:

- partial times: a vertex's time with its unplaced partners at their cheapest link (a lower bound,
  computed in the same order of additions as the exact time, so that rounding keeps it a lower bound);
- vertex bounds (p2p): a device may hold a stage only if the stage's adjacent stages fit on distinct
  other devices within the target (``SearchTables.p2p_bound``; a mesh's edge device has too few
  one-hop links for a hub stage);
- pair masks: bitsets of the device pairs two adjacent vertices may take at this target, made arc
  consistent before the search (p2p); ring graphs peeled to devices with two neighbours inside a
  biconnected block of at least R devices, since a ring is a cycle (allreduce);
- forward checks: every unplaced vertex next to a placed one keeps a device, and those vertices can
  all get distinct devices (a matching, p2p stage-major); the open ring can still reach a device that
  closes it (allreduce);
- coverage: when every free device but ``spare`` of them must be used, a free device no remaining
  vertex can use is a dead end once more than ``spare`` of them exist;
- components: a later ring or replica chain lies inside one connected component of the free devices,
  so a component of n devices holds at most n // R rings (n // S chains);
- nogoods (p2p chain-major): a set of free devices from which the later chains failed is not tried again;
- symmetry breaking, all as lexicographic-leader constraints over the one assignment order (so they may
  be combined): interchangeable replica chains (p2p) take ascending first devices; a ring starts at its
  smallest device and runs towards its smaller neighbour (allreduce); identical stages take ascending
  first devices (allreduce); among *twin* devices (same type and same links to every other device) a
  device is used only once every lower-numbered twin is.

Bitsets are Python ints over device ids (bit d = device d).
"""

from __future__ import annotations

import time
from typing import NamedTuple, Sequence

import networkx as nx
import numpy as np

__all__ = [
    "FOUND",
    "INFEASIBLE",
    "TIMEOUT",
    "SearchTables",
    "Decision",
    "search_p2p",
    "search_p2p_stages",
    "search_p2p_chains",
    "search_allreduce",
    "connectivity_order",
    "stage_adjacency",
]

FOUND, INFEASIBLE, TIMEOUT = "found", "infeasible", "timeout"
NO_DEVICE = -1
# How many assignments pass between two looks at the clock.
_CLOCK_EVERY = 1024


class SearchTables(NamedTuple):
    """What a search reads. S stages, R replicas, D devices, K adjacent stage pairs. Seconds."""

    compute: np.ndarray  # [S, D] compute time of stage s on device d
    pair_stages: np.ndarray  # [K, 2] int64, adjacent stage pairs (a < b) with bytes to move
    transfer: np.ndarray  # [K, D, D] eq. (8) term of pair k between two devices; diagonal inf
    hop: np.ndarray  # [S, D, D] eq. (9) term of one ring hop of stage s; diagonal inf
    num_replicas: int
    twin_class: np.ndarray  # [D] int64; devices of one class are interchangeable
    stage_class: np.ndarray  # [S] int64; stages of one class are interchangeable under eq. (7)
    p2p_bound: np.ndarray  # [S, D] least eq. (6) time of stage s on d, its adjacent stages on distinct devices


class Decision(NamedTuple):
    status: str  # FOUND, INFEASIBLE or TIMEOUT
    mapping: np.ndarray | None  # [S, R] device of each stage replica when FOUND
    nodes: int  # assignments tried


# --------------------------------------------------------------------------------------- shared helpers


def stage_adjacency(num_stages: int, pair_stages: np.ndarray) -> list[list[tuple[int, int]]]:
    """adj[s] = [(k, other stage)] over the pairs k that touch s, by k: the order eq. (8) sums in."""
    adj: list[list[tuple[int, int]]] = [[] for _ in range(num_stages)]
    for k, (a, b) in enumerate(np.asarray(pair_stages).tolist()):
        adj[a].append((k, b))
        adj[b].append((k, a))
    return adj


def connectivity_order(num_stages: int, pair_stages: np.ndarray, priority: Sequence[float] | None = None) -> list[int]:
    """Stages so that each comes as soon after its neighbours as possible.

    Without ``priority``: start at the lowest stage of least degree (a chain: 0, 1, …, S-1). With it:
    start at the stage of least priority. Then repeatedly take the stage with the most already ordered
    neighbours, ties to the least priority, then the lowest index. A vertex's time is known once its
    neighbours are placed, so this order lets the checking scheme check early.
    """
    adj = stage_adjacency(num_stages, pair_stages)
    rank = [0.0] * num_stages if priority is None else [float(p) for p in priority]
    placed = [False] * num_stages
    order: list[int] = []
    while len(order) < num_stages:
        rest = [s for s in range(num_stages) if not placed[s]]
        links = {s: sum(placed[o] for _, o in adj[s]) for s in rest}
        if max(links.values()) == 0:  # a new component: start at an end, or at the least priority
            key = (lambda s: (len(adj[s]), s)) if priority is None else (lambda s: (rank[s], s))
        else:
            key = lambda s: (-links[s], rank[s], s)  # noqa: E731
        nxt = min(rest, key=key)
        placed[nxt] = True
        order.append(nxt)
    return order


def _row_masks(ok: np.ndarray) -> list[int]:
    """Bitset of each row of a bool matrix [N, D]."""
    packed = np.packbits(np.ascontiguousarray(ok, dtype=bool), axis=-1, bitorder="little")
    return [int.from_bytes(row.tobytes(), "little") for row in packed]


def _lower_twins(twin_class: np.ndarray) -> list[int]:
    """lower[d] = bitset of the twins of d with a smaller id."""
    lower = [0] * len(twin_class)
    seen: dict[int, int] = {}
    for d, c in enumerate(np.asarray(twin_class).tolist()):
        lower[d] = seen.get(c, 0)
        seen[c] = lower[d] | (1 << d)
    return lower


def _above(num_devices: int) -> list[int]:
    """above[d] = bitset of the ids greater than d."""
    full = (1 << num_devices) - 1
    return [full ^ ((1 << (d + 1)) - 1) for d in range(num_devices)]


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _distinct_representatives(domains: Sequence[int]) -> bool:
    """Can every domain (a bitset of devices) get its own device? Augmenting paths over bitsets."""
    match = [NO_DEVICE] * len(domains)
    owner: dict[int, int] = {}
    for root in sorted(range(len(domains)), key=lambda v: domains[v].bit_count()):
        reached: dict[int, int] = {}  # device -> the vertex that reached it
        seen = 0
        frontier = [root]
        found = NO_DEVICE
        while frontier and found < 0:
            grown = []
            for u in frontier:
                new = domains[u] & ~seen
                seen |= new
                for d in _bits(new):
                    reached[d] = u
                    if d not in owner:
                        found = d
                        break
                    grown.append(owner[d])
                if found >= 0:
                    break
            frontier = grown
        if found < 0:
            return False
        d, u = found, reached[found]
        while True:  # flip the path back to the root
            old = match[u]
            match[u] = d
            owner[d] = u
            if u == root:
                break
            d, u = old, reached[old]
    return True


class _Clock:
    """Counts assignments and says when the deadline has passed (looking every _CLOCK_EVERY)."""

    __slots__ = ("deadline", "nodes", "_next")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.nodes = 0
        self._next = _CLOCK_EVERY

    def tick(self) -> bool:
        """Count one assignment; True when time is up."""
        self.nodes += 1
        if self.nodes >= self._next:
            self._next += _CLOCK_EVERY
            return time.monotonic() > self.deadline
        return False


def _depth_first(dev: list[int], num_devices: int, clock: _Clock, candidates, viable, *,
                 admissible=None, exhausted=None) -> str:
    """Algorithm 2's backtracking over positions 0..len(dev)−1, shared by every search.

    ``candidates(i, free)`` lists the devices position i may try (in order), ``admissible(i, x)`` may
    still refuse one when it comes up, ``viable(i, free)`` is the forward check after placing position i,
    and ``exhausted(i, free)`` hears of a position whose candidates all failed. ``dev`` holds the
    assignment (NO_DEVICE where open); FOUND leaves it complete. Returns FOUND, INFEASIBLE or TIMEOUT.
    """
    total = len(dev)
    free = (1 << num_devices) - 1
    stack: list[list[int]] = [candidates(0, free)]
    pointer = [0]
    i = 0
    while i >= 0:
        if pointer[i] == len(stack[i]):
            if exhausted is not None:
                exhausted(i, free)
            stack.pop()
            pointer.pop()
            i -= 1
            if i >= 0:
                free |= 1 << dev[i]
                dev[i] = NO_DEVICE
            continue
        x = stack[i][pointer[i]]
        pointer[i] += 1
        if clock.tick():
            return TIMEOUT
        if admissible is not None and not admissible(i, x):
            continue
        dev[i] = x
        free ^= 1 << x
        if i + 1 == total:
            return FOUND
        if viable(i, free):
            nxt = candidates(i + 1, free)
            if nxt:
                stack.append(nxt)
                pointer.append(0)
                i += 1
                continue
        free |= 1 << x
        dev[i] = NO_DEVICE
    return INFEASIBLE


def _components(devices: int, graph: list[int]):
    """The connected components (bitsets) of ``devices`` [bitset] under the links ``graph`` [D bitsets]."""
    unseen = devices
    while unseen:
        component = frontier = unseen & -unseen
        while frontier:
            grown = 0
            for y in _bits(frontier):
                grown |= graph[y]
            frontier = grown & unseen & ~component
            component |= frontier
        unseen &= ~component
        yield component


def _back_index(adj: list[list[tuple[int, int]]]) -> list[list[int]]:
    """back[s][a]: the index, in adj[o], of the pair s shares with its a-th neighbour o."""
    return [[next(b for b, (kk, _) in enumerate(adj[o]) if kk == k) for k, o in adj[s]] for s in range(len(adj))]


# --------------------------------------------------------------------------------------- eq. (6): p2p


class _P2PModel(NamedTuple):
    """Per-target tables of the p2p search."""

    adj: list[list[tuple[int, int]]]  # [S] (k, other stage) in summation order
    compute: list[list[float]]  # [S][D]
    transfer: list[list[list[float]]]  # [K][D][D]
    cheapest: list[list[float]]  # [K][D] cheapest transfer of pair k from a device
    usable: list[int]  # [S] bitset of devices that may hold stage s at all
    partner: list[list[list[int]]]  # [S][a][D] devices the a-th neighbour of s may take when s is on d


def _p2p_model(tables: SearchTables, target: float) -> _P2PModel:
    compute = np.asarray(tables.compute, dtype=np.float64)
    num_stages, num_devices = compute.shape
    transfer = np.asarray(tables.transfer, dtype=np.float64)
    adj = stage_adjacency(num_stages, tables.pair_stages)
    cheapest = transfer.min(axis=2) if len(transfer) else np.zeros((0, num_devices))  # [K, D]
    # half[s][a][x, y]: stage s on x, its a-th neighbour on y, every other link at its cheapest.
    half: list[list[np.ndarray]] = []
    usable_rows = np.zeros((num_stages, num_devices), dtype=bool)
    for s in range(num_stages):
        bound = compute[s].copy()
        for k, _ in adj[s]:
            bound = bound + cheapest[k]
        usable_rows[s] = (bound <= target) & (tables.p2p_bound[s] <= target)
        rows = []
        for a in range(len(adj[s])):
            value = compute[s][:, None]
            for b, (k, _) in enumerate(adj[s]):
                value = value + (transfer[k] if b == a else cheapest[k][:, None])
            rows.append(value <= target)
        half.append(rows)
    back = _back_index(adj)
    pairs = [[half[s][a] & half[o][back[s][a]].T for a, (k, o) in enumerate(adj[s])] for s in range(num_stages)]
    while True:  # arc consistency: a device stays usable only if each of its links has a usable partner
        supported = usable_rows.copy()
        for s in range(num_stages):
            for a, (k, o) in enumerate(adj[s]):
                supported[s] &= (pairs[s][a] & usable_rows[o][None, :]).any(axis=1)
        if (supported == usable_rows).all():
            break
        usable_rows = supported
    partner = [[_row_masks(pairs[s][a] & usable_rows[s][:, None] & usable_rows[o][None, :])
                for a, (k, o) in enumerate(adj[s])] for s in range(num_stages)]
    return _P2PModel(adj, compute.tolist(), transfer.tolist(), cheapest.tolist(),
                     _row_masks(usable_rows), partner)


def search_p2p(tables: SearchTables, target: float, deadline: float) -> Decision:
    """A mapping with every eq. (6) stage time ≤ ``target``, or proof that none exists, or TIMEOUT.

    Two assignment orders, each exact, share the time: stage-major (:func:`search_p2p_stages`, strong
    when a few stages are tight everywhere) for half of it, then chain-major
    (:func:`search_p2p_chains`, strong when chains must tile the devices: meshes, machines).
    """
    now = time.monotonic()
    first = search_p2p_stages(tables, target, now + 0.5 * (deadline - now))
    if first.status != TIMEOUT:
        return first
    second = search_p2p_chains(tables, target, deadline)
    return second._replace(nodes=first.nodes + second.nodes)


def search_p2p_stages(tables: SearchTables, target: float, deadline: float) -> Decision:
    """Stage-major search for :func:`search_p2p`.

    Stage-major: all replicas of the most constrained stage (fewest usable devices) first, then its
    neighbours, so that a stage that cannot find room for its R replicas fails before the search has
    committed the other chains. Position i holds stage order[i // R], replica i % R.
    """
    model = _p2p_model(tables, target)
    num_stages, num_devices = tables.compute.shape
    replicas = tables.num_replicas
    adj, compute, transfer, cheapest = model.adj, model.compute, model.transfer, model.cheapest
    usable, partner = model.usable, model.partner
    clock = _Clock(deadline)
    if any(mask.bit_count() < replicas for mask in usable):
        return Decision(INFEASIBLE, None, clock.nodes)
    order = connectivity_order(num_stages, tables.pair_stages, [mask.bit_count() for mask in usable])
    position = [0] * num_stages
    for q, s in enumerate(order):
        position[s] = q
    lower_twin = _lower_twins(tables.twin_class)
    above = _above(num_devices)
    total = num_stages * replicas
    back = _back_index(adj)
    # Checking scheme, per stage index q: neighbours placed before (o, its index of the pair, its q),
    # and neighbours placed after (their q).
    placed_before = [[(o, back[s][a], position[o]) for a, (k, o) in enumerate(adj[s]) if position[o] < q]
                     for q, s in enumerate(order)]
    dev = [NO_DEVICE] * total

    def time_bound(s: int, x: int, r: int) -> float:
        """Replica r of stage s on x: eq. (6), unplaced partners at their cheapest (exact once all are placed)."""
        value = compute[s][x]
        for k, o in adj[s]:
            y = dev[position[o] * replicas + r]
            value += transfer[k][x][y] if y >= 0 else cheapest[k][x]
        return value

    def domain(q: int, r: int, free: int) -> int:
        """Free devices replica r of stage order[q] may take, given its placed neighbours."""
        mask = free & usable[order[q]]
        for o, b, qo in placed_before[q]:
            y = dev[qo * replicas + r]
            if y >= 0:
                mask &= partner[o][b][y]
        return mask

    def candidates(i: int, free: int) -> list[int]:
        q, r = divmod(i, replicas)
        s = order[q]
        mask = domain(q, r, free)
        if q == 0 and r > 0:  # replica chains are interchangeable: their first devices ascend
            mask &= above[dev[r - 1]]
        scored = []
        for x in _bits(mask):
            if free & lower_twin[x]:
                continue
            dev[i] = x
            own = time_bound(s, x, r)
            ok = own <= target and all(time_bound(order[qo], dev[qo * replicas + r], r) <= target
                                       for _, _, qo in placed_before[q])
            dev[i] = NO_DEVICE
            if ok:
                # The first stage goes lowest device first, leaving the most room above it for the later
                # chains; every other vertex takes its cheapest device first.
                scored.append((x if q == 0 else own, x))
        scored.sort()
        return [x for _, x in scored]

    def viable(i: int, free: int) -> bool:
        """Forward check after placing position i: every unplaced vertex keeps a device, the stages
        keep enough devices between them, and no more free devices go unused than may."""
        q, r = divmod(i, replicas)
        remaining = total - i - 1
        if remaining == 0:
            return True
        spare = free.bit_count() - remaining
        union = 0
        bound = []  # domains of the unplaced vertices with a placed neighbour
        for qo in range(q, num_stages):
            first = r + 1 if qo == q else 0
            if first == replicas:
                continue
            if placed_before[qo]:
                stage_union = 0
                for ro in range(first, replicas):
                    mask = domain(qo, ro, free)
                    if not mask:
                        return False
                    stage_union |= mask
                    bound.append(mask)
            else:
                stage_union = free & usable[order[qo]]
            if stage_union.bit_count() < replicas - first:
                return False
            union |= stage_union
        if (free & ~union).bit_count() > spare:
            return False
        return _distinct_representatives(bound)

    status = _depth_first(dev, num_devices, clock, candidates, viable)
    return Decision(status, _stage_major_mapping(dev, order, replicas) if status == FOUND else None, clock.nodes)


def search_p2p_chains(tables: SearchTables, target: float, deadline: float) -> Decision:
    """Chain-major search for :func:`search_p2p`: replica chain after replica chain, each in the
    connectivity order of the stages (position i: chain i // S, stage order[i % S]).

    Besides the checks of the stage-major search, every later chain must fit inside one connected
    component of the free devices (links any stage pair may use), and a set of free devices from which
    the later chains failed once is not tried again (with twins, many placements leave the same set).
    """
    model = _p2p_model(tables, target)
    num_stages, num_devices = tables.compute.shape
    replicas = tables.num_replicas
    adj, compute, transfer, cheapest = model.adj, model.compute, model.transfer, model.cheapest
    usable, partner = model.usable, model.partner
    clock = _Clock(deadline)
    if any(mask.bit_count() < replicas for mask in usable):
        return Decision(INFEASIBLE, None, clock.nodes)
    order = connectivity_order(num_stages, tables.pair_stages)
    position = [0] * num_stages
    for j, s in enumerate(order):
        position[s] = j
    back = _back_index(adj)
    placed_before = [[(o, back[s][a], position[o]) for a, (k, o) in enumerate(adj[s]) if position[o] < j]
                     for j, s in enumerate(order)]
    later = [[a for a, (k, o) in enumerate(adj[s]) if position[o] > j] for j, s in enumerate(order)]
    # Chains lie in one component of the device links only when the stage graph is connected; a chain's
    # rest after position j does when it is connected too (it then touches the placed part).
    connected = _connected(range(num_stages), adj)
    rest_connected = [_connected(order[j + 1:], adj) for j in range(num_stages)]
    linked = [0] * num_devices  # [D] devices any stage pair may join to d
    for s in range(num_stages):
        for masks in partner[s]:
            linked = [a | b for a, b in zip(linked, masks)]
    by_looseness = sorted(range(num_stages), key=lambda s: (len(adj[s]), s))
    rest_of_chain = [[s for s in by_looseness if position[s] > j] for j in range(num_stages)]
    lower_twin = _lower_twins(tables.twin_class)
    above = _above(num_devices)
    total = num_stages * replicas
    dev = [NO_DEVICE] * total
    failed: set[tuple[int, int, int]] = set()  # (free devices, next chain, its lowest first device)

    def time_bound(s: int, x: int, base: int) -> float:
        value = compute[s][x]
        for k, o in adj[s]:
            y = dev[base + position[o]]
            value += transfer[k][x][y] if y >= 0 else cheapest[k][x]
        return value

    def boundary(i: int, free: int) -> tuple[int, int, int] | None:
        """The state entering a chain's first position: all that the rest of the search depends on."""
        chain, j = divmod(i, num_stages)
        if j or chain == 0:
            return None
        return free, chain, dev[i - num_stages]

    def candidates(i: int, free: int) -> list[int]:
        chain, j = divmod(i, num_stages)
        s = order[j]
        base = chain * num_stages
        key = boundary(i, free)
        if key is not None and key in failed:
            return []
        mask = free & usable[s]
        for o, b, jo in placed_before[j]:
            mask &= partner[o][b][dev[base + jo]]
        if j == 0 and chain > 0:
            mask &= above[dev[base - num_stages]]
        scored = []
        for x in _bits(mask):
            if free & lower_twin[x]:
                continue
            rest = free ^ (1 << x)
            if any(not (partner[s][a][x] & rest) for a in later[j]):
                continue
            dev[i] = x
            own = time_bound(s, x, base)
            ok = own <= target and all(time_bound(order[jo], dev[base + jo], base) <= target
                                       for _, _, jo in placed_before[j])
            dev[i] = NO_DEVICE
            if ok:
                # A chain's first vertex goes lowest device first (the later chains start above it); the
                # others cheapest first, then Warnsdorff: fewest free devices left for the next vertices,
                # so that the last chains, which must use up whatever devices are left (a Hamiltonian
                # path when S·R = D), do not find devices stranded behind them.
                room = sum((partner[s][a][x] & rest).bit_count() for a in later[j])
                scored.append((x if j == 0 else own, room, x))
        scored.sort()
        return [x for *_, x in scored]

    def viable(i: int, free: int) -> bool:
        remaining = total - i - 1
        spare = free.bit_count() - remaining
        if remaining == 0:
            return True
        chain, j = divmod(i, num_stages)
        base = chain * num_stages
        later_chains = replicas - 1 - chain
        first = order[0]
        if later_chains:  # the later chains' first vertices need distinct devices above this chain's
            room = 0
            for y in _bits(free & usable[first] & above[dev[base]]):
                if all(masks[y] & free for masks in partner[first]):
                    room += 1
                    if room >= later_chains:
                        break
            if room < later_chains:
                return False
        own_chain = 0
        for jo in range(j + 1):
            own_chain |= 1 << dev[base + jo]
        reach = free | own_chain
        stages = by_looseness if later_chains else rest_of_chain[j]
        idle = 0
        for y in _bits(free):
            for s in stages:
                if usable[s] >> y & 1 and all(masks[y] & reach for masks in partner[s]):
                    break
            else:
                idle += 1
                if idle > spare:
                    return False
        return not connected or chains_fit(j, later_chains, own_chain, free)

    def chains_fit(j: int, later_chains: int, own_chain: int, free: int) -> bool:
        """Each later chain lies in one connected component of the free devices, so a component of n
        devices holds at most n // S of them; this chain's rest (if connected) comes from one component
        next to its placed devices."""
        left = num_stages - 1 - j
        if left and not rest_connected[j]:
            return True
        touching = 0
        for y in _bits(own_chain):
            touching |= linked[y]
        total_fit = 0
        best_gain = None if left else 0
        for component in _components(free, linked):
            size = component.bit_count()
            fit = size // num_stages
            total_fit += fit
            if left and size >= left and component & touching:
                gain = (size - left) // num_stages - fit
                best_gain = gain if best_gain is None else max(best_gain, gain)
        return best_gain is not None and total_fit + best_gain >= later_chains

    def exhausted(i: int, free: int) -> None:
        key = boundary(i, free)
        if key is not None:
            failed.add(key)

    status = _depth_first(dev, num_devices, clock, candidates, viable, exhausted=exhausted)
    mapping = None
    if status == FOUND:
        mapping = np.empty((num_stages, replicas), dtype=np.int64)
        for chain in range(replicas):
            for j, s in enumerate(order):
                mapping[s, chain] = dev[chain * num_stages + j]
    return Decision(status, mapping, clock.nodes)


def _stage_major_mapping(dev: list[int], order: list[int], replicas: int) -> np.ndarray:
    """[S, R] from an assignment by position, stage order[q]'s replicas at q·R … q·R + R − 1."""
    mapping = np.empty((len(order), replicas), dtype=np.int64)
    for q, s in enumerate(order):
        mapping[s] = dev[q * replicas:(q + 1) * replicas]
    return mapping


def _connected(stages: Sequence[int], adj: list[list[tuple[int, int]]]) -> bool:
    """Whether ``stages`` induce a connected subgraph (an empty set counts as connected)."""
    members = set(stages)
    if not members:
        return True
    seen = {next(iter(members))}
    frontier = list(seen)
    while frontier:
        s = frontier.pop()
        for _, o in adj[s]:
            if o in members and o not in seen:
                seen.add(o)
                frontier.append(o)
    return seen == members


# --------------------------------------------------------------------------------------- eq. (7): allreduce


def _ring_graphs(tables: SearchTables, target: float) -> tuple[list[list[int]], list[int]]:
    """(ring[s][d], usable[s]): the devices a ring neighbour of d may take in stage s's ring, and the
    devices that may hold stage s at all.

    A ring of R ≥ 3 devices is a cycle, and a cycle lies inside one biconnected block of the graph of
    allowed hops: devices and hops outside every block of at least R devices are dropped, as are
    devices with fewer ring neighbours than a ring needs, until neither rule drops more.
    """
    compute = np.asarray(tables.compute, dtype=np.float64)
    num_stages, num_devices = compute.shape
    replicas = tables.num_replicas
    need = 2 if replicas >= 3 else replicas - 1
    rings: list[list[int]] = []
    usable: list[int] = []
    for s in range(num_stages):
        alive = compute[s] <= target
        if replicas >= 2:
            pair = np.maximum(compute[s][:, None], compute[s][None, :]) + tables.hop[s] <= target
            np.fill_diagonal(pair, False)
            while True:
                while True:  # peel devices with fewer than `need` ring neighbours left
                    pair &= alive[:, None] & alive[None, :]
                    drop = alive & (pair.sum(axis=1) < need)
                    if not drop.any():
                        break
                    alive &= ~drop
                if replicas < 3 or not alive.any():
                    break
                kept = _block_links(pair, replicas)
                if (kept == pair).all():
                    break
                pair = kept
                alive &= pair.any(axis=1)
            rings.append(_row_masks(pair))
        else:
            rings.append([0] * num_devices)
        usable.append(_row_masks(alive[None, :])[0])
    return rings, usable


def _block_links(pair: np.ndarray, size: int) -> np.ndarray:
    """``pair`` [D, D] bool (symmetric) without the links outside biconnected blocks of ≥ ``size`` devices."""
    graph = nx.Graph()
    graph.add_edges_from(zip(*np.nonzero(np.triu(pair, 1))))
    kept = np.zeros_like(pair)
    for block in nx.biconnected_component_edges(graph):
        nodes = {d for link in block for d in link}
        if len(nodes) >= size:
            a, b = np.array(block).T
            kept[a, b] = kept[b, a] = True
    return kept


def search_allreduce(tables: SearchTables, target: float, deadline: float) -> Decision:
    """A mapping with every eq. (7) stage time ≤ ``target``, or proof that none exists, or TIMEOUT."""
    num_stages, num_devices = tables.compute.shape
    replicas = tables.num_replicas
    compute = np.asarray(tables.compute, dtype=np.float64).tolist()
    hop = np.asarray(tables.hop, dtype=np.float64).tolist() if replicas >= 2 else None
    ring, usable = _ring_graphs(tables, target)
    clock = _Clock(deadline)
    if any(mask.bit_count() < replicas for mask in usable):
        return Decision(INFEASIBLE, None, clock.nodes)
    # Most constrained ring first: fewest allowed hops (on a mesh at a tight target every stage may use
    # every device, but some only the one-hop links), then fewest usable devices.
    hops = [sum(mask.bit_count() for mask in ring[s]) for s in range(num_stages)]
    order = sorted(range(num_stages), key=lambda s: (hops[s], usable[s].bit_count(), s))
    stage_class = np.asarray(tables.stage_class).tolist()
    previous_twin = [-1] * num_stages  # index in `order` of the last identical stage before
    for q, s in enumerate(order):
        earlier = [p for p in range(q) if stage_class[order[p]] == stage_class[s]]
        previous_twin[q] = earlier[-1] if earlier else -1
    need = 2 if replicas >= 3 else replicas - 1
    # later_ring[q][d]: union over the stages after order[q] of their ring neighbours of d.
    later_ring: list[list[int]] = [[0] * num_devices for _ in range(num_stages)]
    later_usable = [0] * num_stages
    for q in range(num_stages - 2, -1, -1):
        s = order[q + 1]
        later_usable[q] = later_usable[q + 1] | usable[s]
        later_ring[q] = [a | b for a, b in zip(later_ring[q + 1], ring[s])]
    # joined[q][d]: ring neighbours of d in stage order[q]'s graph or any later one.
    joined = [[a | b for a, b in zip(ring[order[q]], later_ring[q])] for q in range(num_stages)]
    lower_twin = _lower_twins(tables.twin_class)
    above = _above(num_devices)
    total = num_stages * replicas
    dev = [NO_DEVICE] * total  # by position: stage order[q], ring slot r at q * R + r
    worst_compute = [0.0] * (total + 1)  # of the ring being built, entering each position
    worst_hop = [0.0] * (total + 1)

    def candidates(i: int, free: int) -> list[int]:
        q, r = divmod(i, replicas)
        s = order[q]
        start = q * replicas
        if r == 0:
            mask = free & usable[s]
            if previous_twin[q] >= 0:
                mask &= above[dev[previous_twin[q] * replicas]]
        else:
            mask = free & ring[s][dev[i - 1]] & above[dev[start]]
            if r == replicas - 1:
                mask &= ring[s][dev[start]]
                if replicas >= 3:
                    mask &= above[dev[start + 1]]
        scored = []
        for x in _bits(mask):
            if free & lower_twin[x]:
                continue
            # A ring's first two devices go lowest first (every later one must exceed the first, the
            # closing one the second); the rest follow Warnsdorff: fewest free ring neighbours first.
            scored.append((x if r <= 1 else (ring[s][x] & free).bit_count(), x))
        scored.sort()
        return [x for _, x in scored]

    def admissible(i: int, x: int) -> bool:
        """Ring so far with x in slot r: worst compute + worst hop ≤ target (exact once it closes)."""
        q, r = divmod(i, replicas)
        s = order[q]
        start = q * replicas
        worst_c = max(worst_compute[i], compute[s][x]) if r else compute[s][x]
        worst_h = worst_hop[i] if r else 0.0
        if r:
            worst_h = max(worst_h, hop[s][dev[i - 1]][x])
            if r == replicas - 1:
                worst_h = max(worst_h, hop[s][x][dev[start]])
        if worst_c + worst_h > target:
            return False
        last = r == replicas - 1
        worst_compute[i + 1] = 0.0 if last else worst_c
        worst_hop[i + 1] = 0.0 if last else worst_h
        return True

    def covered(i: int, free: int) -> bool:
        """The open ring can still close, and enough free devices remain usable."""
        q, r = divmod(i, replicas)
        s = order[q]
        start = q * replicas
        left = replicas - 1 - r  # slots of this ring still open
        first, last = dev[start], dev[i]
        if left:
            bound = above[first]
            if left == 1:
                closing = ring[s][last] & ring[s][first] & free & bound
                if replicas >= 3 and r >= 1:
                    closing &= above[dev[start + 1]]
                if not closing:
                    return False
            elif r == 0:
                if (ring[s][first] & free & bound).bit_count() < 2:
                    return False
            elif not reachable(s, last, ring[s][first] & above[dev[start + 1]], free & bound, left):
                return False
        remaining = total - i - 1
        spare = free.bit_count() - remaining
        if remaining == 0 or spare >= free.bit_count():
            return True
        ends = (1 << first) | (1 << last)
        closing = ring[s][last] & ring[s][first] if left == 1 else 0
        future = later_ring[q] if q < num_stages - 1 else None
        future_any = later_usable[q] if q < num_stages - 1 else 0
        idle = 0
        for y in _bits(free):
            if left >= 2 and above[first] >> y & 1 and (ring[s][y] & (free | ends)).bit_count() >= 2:
                continue
            if left == 1 and closing >> y & 1:
                continue
            if future is not None and future_any >> y & 1:
                if need == 0 or (future[y] & free).bit_count() >= need:
                    continue
            idle += 1
            if idle > spare:
                return False
        if future is None or need == 0:
            return True
        return rings_fit(q, left, first, last, free)

    def reachable(s: int, last: int, closers: int, allowed: int, left: int) -> bool:
        """Can the open ring still run from ``last`` through ``left`` allowed devices to a closer? (At
        least: some closer is reachable through allowed devices, and ``left`` of them are reachable.)"""
        graph = ring[s]
        reached = frontier = graph[last] & allowed
        while frontier and not (reached & closers and reached.bit_count() >= left):
            grown = 0
            for y in _bits(frontier):
                grown |= graph[y]
            frontier = grown & allowed & ~reached
            reached |= frontier
        return bool(reached & closers) and reached.bit_count() >= left

    def rings_fit(q: int, left: int, first: int, last: int, free: int) -> bool:
        """Each later ring lies inside one connected component of the free devices (in the union of
        the ring graphs still to come), so a component of n devices holds at most n // R of them; the
        open ring takes its ``left`` devices from one component next to both its ends."""
        s = order[q]
        graph = joined[q] if left else later_ring[q]
        rings_left = num_stages - 1 - q
        total_fit = 0
        best_gain = None if left else 0  # best change in fit from hosting the open ring's devices
        for component in _components(free, graph):
            size = component.bit_count()
            fit = size // replicas
            total_fit += fit
            if left and size >= left and component & ring[s][last] and component & ring[s][first]:
                gain = (size - left) // replicas - fit
                best_gain = gain if best_gain is None else max(best_gain, gain)
        return best_gain is not None and total_fit + best_gain >= rings_left

    status = _depth_first(dev, num_devices, clock, candidates, covered, admissible=admissible)
    return Decision(status, _stage_major_mapping(dev, order, replicas) if status == FOUND else None, clock.nodes)
