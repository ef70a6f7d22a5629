"""The search tree in flat arrays indexed by node id.

Nodes are numbered in creation order, the root first. A node's candidate actions are a contiguous run of
*edges* (compressed sparse rows): node ``n`` owns edges ``edge_start[n] .. edge_start[n] + num_edges[n]``,
edge ``edge_start[n] + a`` is action ``a`` of ``n``. An edge holds the prior of its action, whether the
action is valid, and the id of the child node it leads to (:data:`UNVISITED` until first selected).
Visit counts and value sums live on the nodes: N(s, a) and Q(s, a) of TAG §4.2.2 are those of the
child that edge (s, a) leads to.

Every array grows by doubling, so a search allocates O(log N) times. Node arrays are ``[N]`` and edge
arrays ``[E]``, N nodes and E edges in use (the arrays may be longer: their capacity).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tag._arrays import grown

__all__ = ["Tree", "ROOT", "UNVISITED", "NO_PARENT", "UNEXPANDED"]

ROOT = 0  # node id of the root (the empty assignment)
UNVISITED = -1  # child of an edge whose action was never selected
NO_PARENT = -1  # parent of the root, and its action
UNEXPANDED = -1  # edge_start of a node whose candidate actions are not enumerated yet

_INITIAL_NODES = 64
_INITIAL_EDGES = 1024


@dataclass
class Tree:
    """A search tree. Node arrays ``[N]``, edge arrays ``[E]`` (capacity may exceed the counts in use)."""

    visits: np.ndarray  # [N] int64, N(s): leaf values backed up through the node (virtual losses included)
    value_sum: np.ndarray  # [N] float64, sum of those values; Q = value_sum / visits
    parent: np.ndarray  # [N] int64, NO_PARENT at the root
    action: np.ndarray  # [N] int64, the action of the parent that leads here; NO_PARENT at the root
    depth: np.ndarray  # [N] int64, edges from the root
    edge_start: np.ndarray  # [N] int64, first edge of the node's actions; UNEXPANDED before expansion
    num_edges: np.ndarray  # [N] int64, candidate actions (0: terminal, or not expanded)
    exhausted: np.ndarray  # [N] bool, nothing below is left to evaluate (terminal, or every child exhausted)
    prior: np.ndarray  # [E] float64, G(s, a): prior probability of the action, 0 where invalid
    valid: np.ndarray  # [E] bool, the action may be selected
    child: np.ndarray  # [E] int64, node the action leads to, UNVISITED until first selected
    states: list[Any] = field(default_factory=list)  # [N] the environment's state of each node
    num_nodes: int = 0
    num_edge_slots: int = 0  # edges in use
    min_value: float = np.inf  # smallest and largest leaf value backed up so far (Q normalisation)
    max_value: float = -np.inf

    @classmethod
    def empty(cls, root_state: Any) -> Tree:
        """A tree holding only the root, not expanded."""
        tree = cls(
            visits=np.zeros(_INITIAL_NODES, np.int64),
            value_sum=np.zeros(_INITIAL_NODES, np.float64),
            parent=np.full(_INITIAL_NODES, NO_PARENT, np.int64),
            action=np.full(_INITIAL_NODES, NO_PARENT, np.int64),
            depth=np.zeros(_INITIAL_NODES, np.int64),
            edge_start=np.full(_INITIAL_NODES, UNEXPANDED, np.int64),
            num_edges=np.zeros(_INITIAL_NODES, np.int64),
            exhausted=np.zeros(_INITIAL_NODES, bool),
            prior=np.zeros(_INITIAL_EDGES, np.float64),
            valid=np.zeros(_INITIAL_EDGES, bool),
            child=np.full(_INITIAL_EDGES, UNVISITED, np.int64),
        )
        tree.add_node(NO_PARENT, NO_PARENT, root_state)
        return tree

    # ------------------------------------------------------------------ growth

    def add_node(self, parent: int, action: int, state: Any) -> int:
        """A new unexpanded node reached from ``parent`` by ``action``; links the parent's edge to it."""
        node = self.num_nodes
        size = node + 1
        self.visits = grown(self.visits, size, 0)
        self.value_sum = grown(self.value_sum, size, 0.0)
        self.parent = grown(self.parent, size, NO_PARENT)
        self.action = grown(self.action, size, NO_PARENT)
        self.depth = grown(self.depth, size, 0)
        self.edge_start = grown(self.edge_start, size, UNEXPANDED)
        self.num_edges = grown(self.num_edges, size, 0)
        self.exhausted = grown(self.exhausted, size, False)
        self.parent[node] = parent
        self.action[node] = action
        if parent != NO_PARENT:
            self.depth[node] = self.depth[parent] + 1
            self.child[self.edge(parent, action)] = node
        self.states.append(state)
        self.num_nodes = size
        return node

    def add_edges(self, node: int, prior: np.ndarray, valid: np.ndarray) -> None:
        """Expand ``node`` with A candidate actions: ``prior`` [A] (0 where invalid), ``valid`` [A] bool."""
        if self.edge_start[node] != UNEXPANDED:
            raise ValueError(f"node {node} is already expanded")
        count = len(prior)
        start = self.num_edge_slots
        size = start + count
        self.prior = grown(self.prior, size, 0.0)
        self.valid = grown(self.valid, size, False)
        self.child = grown(self.child, size, UNVISITED)
        self.prior[start:size] = prior
        self.valid[start:size] = valid
        self.edge_start[node] = start
        self.num_edges[node] = count
        self.num_edge_slots = size

    # ------------------------------------------------------------------ queries

    def expanded(self, node: int) -> bool:
        return bool(self.edge_start[node] != UNEXPANDED)

    def edge(self, node: int, action: int) -> int:
        """Edge id of ``action`` of an expanded ``node``."""
        if not 0 <= action < self.num_edges[node]:
            raise IndexError(f"node {node} has {self.num_edges[node]} actions, not {action}")
        return int(self.edge_start[node] + action)

    def edges(self, node: int) -> slice:
        """The edge ids of ``node``'s actions, as a slice into the edge arrays."""
        start = int(self.edge_start[node])
        return slice(start, start + int(self.num_edges[node])) if start != UNEXPANDED else slice(0, 0)

    def child_visits(self, node: int) -> np.ndarray:
        """[A] N(s, a) of each action of ``node`` (0 where the child does not exist)."""
        child = self.child[self.edges(node)]
        return np.where(child != UNVISITED, self.visits[np.maximum(child, 0)], 0)

    def mean_value(self, node: int) -> float:
        """Q of the node: mean of the values backed up through it (0.0 before any)."""
        visits = self.visits[node]
        return float(self.value_sum[node] / visits) if visits > 0 else 0.0

    def normalise(self, values: np.ndarray | float) -> np.ndarray | float:
        """Min-max normalisation of values by the smallest and largest leaf value seen, into [0, 1]
        (0 everywhere while they are equal), so that the PUCT constant does not depend on the reward scale."""
        span = self.max_value - self.min_value
        if not span > 0:
            return np.zeros_like(values) if isinstance(values, np.ndarray) else 0.0
        return (values - self.min_value) / span

    def path(self, node: int) -> list[int]:
        """Node ids from the root down to ``node``."""
        out = []
        while node != NO_PARENT:
            out.append(int(node))
            node = int(self.parent[node])
        return out[::-1]

    def actions_to(self, node: int) -> list[int]:
        """The actions taken from the root to reach ``node``."""
        return [int(self.action[n]) for n in self.path(node)[1:]]
