"""A placement state as a PyG ``HeteroData``: the GNN input of TAG §4.2.1 (Table 1), made scale-free.

Node types: :data:`OP` (G op groups) and :data:`DEVICE` (M device groups). The GNN convolves five
relations, :data:`GNN_RELATIONS`: tensors between op groups in both directions (:data:`FEEDS`,
:data:`FED_BY`), links between device groups (:data:`LINK`, every ordered pair a ≠ b) and placement
edges between every op group and every device group in both directions (:data:`PLACED_ON`,
:data:`HOSTS`; a complete bipartite graph whose ``placed`` feature is the paper's placement bit, so
that an op group also sees the device groups it is *not* on). The feature columns are named in
:data:`OP_FEATURES`, :data:`DEVICE_FEATURES`, :data:`TENSOR_FEATURES`, :data:`LINK_FEATURES` and
:data:`PLACEMENT_FEATURES`.

**Normalisation** (DESIGN.md, Policy and search). Let t [G] be the groups' compute times averaged over
the cluster's GPU types, τ = ‖t‖₂, and B the largest device-to-device bandwidth. Times are divided by τ;
sizes in bytes by τ·B ("seconds to move it over the fastest link, in units of τ"); bandwidths by B;
memory by the device's capacity; GPU speed is relative to the mean over the cluster's types. So a
setting in which everything takes c times longer (compute times × c, bandwidths ÷ c, feedback times × c)
gives the same features, and so does one with tensors and links both c times larger: one trained policy
reads models and clusters of any scale on one scale. A single-device cluster has no links (B = ∞) and
its size features are 0.

**Feedback** (Table 1, part 3) is that of the state's current strategy. Before the first simulation
(``feedback is None``) its columns are 0 and every node and link carries ``no_feedback = 1``.

**Decoder inputs** ride in the same object, so that ``torch_geometric.data.Batch`` offsets them: a node
type :data:`ACTION` (A candidate actions, ``option`` [A] int64) and two relations the GNN does not
convolve, :data:`IN_MASK` (device group j → action a wherever mask P_aj = 1) and :data:`DECIDES` (the
next op group → every action).

Everything that depends only on (grouping, cluster) is computed once per pair in a :class:`FeatureCache`
that the caller owns and passes in (a :class:`~tag.policy.GNNEvaluator` keeps one for its searches).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch_geometric.data import HeteroData

from tag.cluster import Cluster
from tag.cost.memory import OPTIMIZER_STATE_COPIES
from tag.grouping import GroupGraph
from tag.policy.errors import PolicyError
from tag.search.base import PlacementState
from tag.sim.result import Feedback
from tag.strategy import OPTIONS

__all__ = [
    "OP", "DEVICE", "ACTION",
    "FEEDS", "FED_BY", "LINK", "PLACED_ON", "HOSTS", "IN_MASK", "DECIDES", "GNN_RELATIONS",
    "OP_FEATURES", "DEVICE_FEATURES", "TENSOR_FEATURES", "LINK_FEATURES", "PLACEMENT_FEATURES",
    "RELATION_FEATURES", "NODE_FEATURES", "FEATURE_VERSION",
    "state_to_data", "FeatureCache",
]

OP = "op_group"
DEVICE = "device_group"
ACTION = "action"

FEEDS = (OP, "feeds", OP)  # producer → consumer, one edge per pair of groups with boundary tensors
FED_BY = (OP, "fed_by", OP)  # the same edges reversed, so that producers hear their consumers
LINK = (DEVICE, "link", DEVICE)  # every ordered pair of distinct device groups
PLACED_ON = (OP, "placed_on", DEVICE)  # every (op group, device group) pair
HOSTS = (DEVICE, "hosts", OP)  # the same pairs reversed
IN_MASK = (DEVICE, "in_mask", ACTION)  # decoder only: device group j is in action a's mask
DECIDES = (OP, "decides", ACTION)  # decoder only: the next op group, to each candidate action
GNN_RELATIONS = (FEEDS, FED_BY, LINK, PLACED_ON, HOSTS)

OP_FEATURES = (
    "compute_time",  # t_i / τ
    "param_bytes",  # / (τ·B)
    "output_bytes",  # boundary tensors leaving the group / (τ·B)
    "input_bytes",  # boundary tensors entering the group / (τ·B)
    "decided",  # the group's strategy was chosen on the path from the root (Table 1, part 4)
    "next",  # the group the next action decides
    *(f"option_{name}" for name in OPTIONS),  # one-hot of the current option (Table 1, part 2)
    "devices_covered",  # devices the group runs on / all devices
    "makespan",  # feedback: first start to last finish of the group's tasks / τ
    "output_idle",  # feedback: mean wait before its outputs start moving / τ
    "no_feedback",
)
DEVICE_FEATURES = (
    "devices",  # devices in the group / all devices
    "inverse_devices",  # 1 / devices in the group
    "speed",  # mean group compute time over the cluster's types / that on this group's type
    "memory",  # per-device capacity / the largest in the cluster
    "model_memory",  # parameters with gradient and Adam state / capacity (clipped)
    "intra_bandwidth",  # bandwidth inside the group / B; 0 for one device
    "placed_compute",  # share of the model's compute placed here by the current strategy
    "peak_memory",  # feedback: peak memory of the fullest member / capacity (clipped)
    "idle",  # feedback: mean compute idle fraction of the members
    "comm_idle",  # feedback: mean idle fraction of the members' collective channels
    "no_feedback",
)
TENSOR_FEATURES = (
    "bytes_fast",  # bytes / (τ·B): transfer time over the fastest link
    "bytes_slow",  # bytes / (τ·B_min): over the slowest
)
LINK_FEATURES = (
    "bandwidth",  # least bandwidth between the two groups / B
    "log_slowdown",  # ln(B / bandwidth)
    "link_idle",  # feedback: mean idle fraction of the used links from a to b (1 where none is used)
    "no_feedback",
)
PLACEMENT_FEATURES = (
    "placed",  # the placement bit P_ij of the current strategy
    "compute_time",  # the op group's compute time on this device group's GPU type / τ
    "param_memory",  # the op group's parameters with gradient and Adam state / capacity (clipped)
)
NODE_FEATURES = {OP: OP_FEATURES, DEVICE: DEVICE_FEATURES}
RELATION_FEATURES = {FEEDS: TENSOR_FEATURES, FED_BY: TENSOR_FEATURES, LINK: LINK_FEATURES,
                     PLACED_ON: PLACEMENT_FEATURES, HOSTS: PLACEMENT_FEATURES}
# Bumped whenever a column changes meaning, so that a checkpoint trained on other features is refused.
FEATURE_VERSION = 1

# Parameter, gradient buffer and Adam's two moments (tag.cost.memory): what a replica keeps per parameter byte.
_PARAM_COPIES = 2 + OPTIMIZER_STATE_COPIES["adam"]
_MAX_MEMORY_RATIO = 8.0  # memory ratios are clipped here: far beyond capacity is all the same to the policy
_MAX_CACHED_PAIRS = 16  # (grouping, cluster) pairs a FeatureCache keeps before it starts afresh


class _Static(NamedTuple):
    """What depends only on (grouping, cluster). G groups, M device groups, D devices, E group edges."""

    cluster: Cluster  # held so that the id() key cannot be reused while the entry lives
    time_scale: float  # τ, seconds
    mean_time: np.ndarray  # [G] t / τ
    op_x: np.ndarray  # [G, 4] the first four OP_FEATURES
    device_x: np.ndarray  # [M, 6] the first six DEVICE_FEATURES
    tensor_index: torch.Tensor  # [2, E] int64 producer, consumer
    tensor_attr: torch.Tensor  # [E, 2]
    link_index: torch.Tensor  # [2, M(M-1)] int64
    link_attr: np.ndarray  # [M(M-1), 2] the static LINK_FEATURES
    placement_index: torch.Tensor  # [2, G·M] int64 (op group, device group), row-major
    placement_attr: np.ndarray  # [G·M, 2] the static PLACEMENT_FEATURES
    group_size: np.ndarray  # [M] devices in each device group
    capacity: np.ndarray  # [M] bytes per device


class FeatureCache:
    """The static features of (grouping, cluster) pairs, each built once: what :func:`state_to_data`
    reuses across the states of one search. Its owner keeps it for as long as it sees the same
    groupings and clusters; it holds at most ``max_pairs`` pairs (and a reference to each grouping and
    cluster, so that their ids cannot be reused while an entry lives) and starts afresh when full."""

    def __init__(self, *, max_pairs: int = _MAX_CACHED_PAIRS) -> None:
        self.max_pairs = max_pairs
        self._entries: dict[tuple[int, int], tuple[GroupGraph, _Static]] = {}  # (id(grouping), id(cluster)) ->

    def static(self, group_graph: GroupGraph, cluster: Cluster) -> _Static:
        """The static features of (``group_graph``, ``cluster``), built on the first request."""
        key = (id(group_graph), id(cluster))
        entry = self._entries.get(key)
        if entry is None or entry[0] is not group_graph or entry[1].cluster is not cluster:
            if len(self._entries) >= self.max_pairs:
                self._entries.clear()
            entry = self._entries[key] = (group_graph, _build_static(group_graph, cluster))
        return entry[1]

    def __len__(self) -> int:
        return len(self._entries)


def state_to_data(state: PlacementState, cache: FeatureCache | None = None) -> HeteroData:
    """The features of ``state`` (module docstring) as a HeteroData; float32 features, int64 indices.

    ``cache``: where the static features of the state's (grouping, cluster) are kept between calls (None:
    built for this call alone). The static edge tensors are shared with the cache: treat them as read-only.
    PolicyError when the state's arrays disagree with its grouping or cluster.
    """
    _check_state(state)
    static = (FeatureCache() if cache is None else cache).static(state.group_graph, state.cluster)
    data = HeteroData()
    data[OP].x = torch.from_numpy(_op_features(state, static))
    data[DEVICE].x = torch.from_numpy(_device_features(state, static))
    data[FEEDS].edge_index = static.tensor_index
    data[FEEDS].edge_attr = static.tensor_attr
    data[FED_BY].edge_index = static.tensor_index.flip(0)
    data[FED_BY].edge_attr = static.tensor_attr
    data[LINK].edge_index = static.link_index
    data[LINK].edge_attr = torch.from_numpy(_link_features(state, static))
    placement_attr = torch.from_numpy(np.column_stack(
        [state.strategy.placement.reshape(-1), static.placement_attr]).astype(np.float32))
    data[PLACED_ON].edge_index = static.placement_index
    data[PLACED_ON].edge_attr = placement_attr
    data[HOSTS].edge_index = static.placement_index.flip(0)
    data[HOSTS].edge_attr = placement_attr

    num_actions = len(state.options)
    data[ACTION].num_nodes = num_actions
    data[ACTION].option = torch.from_numpy(np.asarray(state.options, dtype=np.int64))
    action, device = np.nonzero(np.asarray(state.masks, dtype=bool))
    data[IN_MASK].edge_index = torch.from_numpy(np.stack([device, action]).astype(np.int64))
    data[DECIDES].edge_index = torch.from_numpy(
        np.stack([np.full(num_actions, state.next_group), np.arange(num_actions)]).astype(np.int64))
    return data


# --------------------------------------------------------------------------------------------- dynamic


def _op_features(state: PlacementState, static: _Static) -> np.ndarray:
    """[G, len(OP_FEATURES)] float32."""
    strategy, feedback = state.strategy, state.feedback
    num_groups = len(static.mean_time)
    next_flag = np.zeros(num_groups)
    if 0 <= state.next_group < num_groups:
        next_flag[state.next_group] = 1.0
    option = np.eye(len(OPTIONS))[strategy.option]  # [G, 4]
    covered = strategy.devices_covered() / static.group_size.sum()
    if feedback is None:
        runtime = np.zeros((num_groups, 2))
    else:
        runtime = np.column_stack([feedback.group_makespan, feedback.group_output_idle]) / static.time_scale
    no_feedback = np.full(num_groups, float(feedback is None))
    return np.column_stack([static.op_x, np.asarray(state.decided, dtype=np.float64), next_flag, option, covered,
                            runtime, no_feedback]).astype(np.float32)


def _device_features(state: PlacementState, static: _Static) -> np.ndarray:
    """[M, len(DEVICE_FEATURES)] float32."""
    feedback = state.feedback
    num_device_groups = len(static.group_size)
    total = static.mean_time.sum()
    placed = static.mean_time @ state.strategy.placement / total if total > 0 else np.zeros(num_device_groups)
    if feedback is None:
        runtime = np.zeros((num_device_groups, 3))
    else:
        device_group = state.cluster.device_group
        comm_idle_sum = np.bincount(device_group, weights=feedback.comm_idle, minlength=num_device_groups)
        comm_idle = comm_idle_sum / static.group_size
        peak = np.minimum(feedback.device_group_peak_memory / static.capacity, _MAX_MEMORY_RATIO)
        runtime = np.column_stack([peak, feedback.device_group_idle, comm_idle])
    no_feedback = np.full(num_device_groups, float(feedback is None))
    return np.column_stack([static.device_x, placed, runtime, no_feedback]).astype(np.float32)


def _link_features(state: PlacementState, static: _Static) -> np.ndarray:
    """[M(M-1), len(LINK_FEATURES)] float32."""
    count = len(static.link_attr)
    if state.feedback is None:
        idle, no_feedback = np.zeros(count), np.ones(count)
    else:
        src, dst = static.link_index.numpy()
        idle, no_feedback = state.feedback.device_group_link_idle[src, dst], np.zeros(count)
    return np.column_stack([static.link_attr, idle, no_feedback]).astype(np.float32)


# --------------------------------------------------------------------------------------------- static


def _build_static(gg: GroupGraph, cluster: Cluster) -> _Static:
    groups = cluster.device_groups()
    first = np.array([members[0] for members in groups])  # [M] a representative device of each group
    group_size = np.array([len(members) for members in groups], dtype=np.float64)  # [M]
    capacity = cluster.memory_bytes()[first]  # [M]
    table = gg.compute_table(cluster)  # [G, T] seconds on each of the cluster's GPU types
    mean_time = table.mean(axis=1)  # [G]
    device_time = table[:, cluster.device_type[first]]  # [G, M] on each device group's type
    time_scale = float(np.linalg.norm(mean_time)) or 1.0
    fastest, slowest = _bandwidth_extremes(cluster)
    byte_scale = time_scale * fastest  # inf on a single device: sizes do not matter there

    graph = gg.graph
    out_bytes = np.bincount(graph.edge_src, weights=graph.edge_bytes, minlength=gg.num_groups)
    in_bytes = np.bincount(graph.edge_dst, weights=graph.edge_bytes, minlength=gg.num_groups)
    op_x = np.column_stack([mean_time / time_scale, gg.param_bytes / byte_scale, out_bytes / byte_scale,
                            in_bytes / byte_scale])
    tensor_attr = np.column_stack([graph.edge_bytes / byte_scale, graph.edge_bytes / (time_scale * slowest)])

    group_bandwidth = cluster.group_bandwidth()  # [M, M], diagonal inside the group (inf for one device)
    intra = np.diag(group_bandwidth)
    intra = np.divide(intra, fastest, out=np.zeros(len(groups)), where=np.isfinite(intra))
    total_time = device_time.sum(axis=0)
    speed = np.divide(mean_time.sum(), total_time, out=np.ones(len(groups)), where=total_time > 0)
    model_memory = np.minimum(_PARAM_COPIES * gg.param_bytes.sum() / capacity, _MAX_MEMORY_RATIO)
    device_x = np.column_stack([group_size / group_size.sum(), 1.0 / group_size, speed, capacity / capacity.max(),
                                model_memory, intra])

    src, dst = np.nonzero(~np.eye(len(groups), dtype=bool))
    link_bandwidth = group_bandwidth[src, dst]
    link_attr = np.column_stack([link_bandwidth / fastest, np.log(fastest / link_bandwidth)])

    num_groups, num_device_groups = gg.num_groups, len(groups)
    placement_index = np.stack([np.repeat(np.arange(num_groups), num_device_groups),
                                np.tile(np.arange(num_device_groups), num_groups)])
    param_memory = np.minimum(_PARAM_COPIES * gg.param_bytes[:, None] / capacity[None, :], _MAX_MEMORY_RATIO)
    placement_attr = np.column_stack([(device_time / time_scale).reshape(-1), param_memory.reshape(-1)])

    return _Static(
        cluster=cluster, time_scale=time_scale, mean_time=mean_time / time_scale, op_x=op_x, device_x=device_x,
        tensor_index=_index(np.stack([graph.edge_src, graph.edge_dst])),
        tensor_attr=torch.from_numpy(tensor_attr.astype(np.float32)),
        link_index=_index(np.stack([src, dst])), link_attr=link_attr,
        placement_index=_index(placement_index), placement_attr=placement_attr,
        group_size=group_size, capacity=capacity,
    )


def _bandwidth_extremes(cluster: Cluster) -> tuple[float, float]:
    """(largest, smallest) bandwidth between two distinct devices; (inf, inf) for a single device."""
    off_diagonal = cluster.bandwidth[~np.eye(cluster.num_devices, dtype=bool)]
    if off_diagonal.size == 0:
        return np.inf, np.inf
    return float(off_diagonal.max()), float(off_diagonal.min())


def _index(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))


# --------------------------------------------------------------------------------------------- validation


def _check_state(state: PlacementState) -> None:
    """PolicyError naming the first field of ``state`` whose shape disagrees with its grouping or cluster."""
    num_groups = state.group_graph.num_groups
    num_device_groups = state.cluster.num_device_groups
    if state.strategy.placement.shape != (num_groups, num_device_groups):
        raise PolicyError(f"state.strategy is for {state.strategy.num_groups} op groups on "
                          f"{state.strategy.num_device_groups} device groups; the grouping has {num_groups} and "
                          f"cluster {state.cluster.name!r} has {num_device_groups}")
    if np.shape(state.decided) != (num_groups,):
        raise PolicyError(f"state.decided has shape {np.shape(state.decided)}, expected ({num_groups},)")
    masks, options = np.asarray(state.masks), np.asarray(state.options)
    if masks.ndim != 2 or masks.shape[1] != num_device_groups or options.shape != (masks.shape[0],):
        raise PolicyError(f"state.masks {masks.shape} and state.options {options.shape} must be [A, "
                          f"{num_device_groups}] and [A]")
    if options.size and (not np.issubdtype(options.dtype, np.integer) or options.min() < 0
                         or options.max() >= len(OPTIONS)):
        raise PolicyError(f"state.options must hold option indices 0..{len(OPTIONS) - 1}")
    if options.size and not 0 <= state.next_group < num_groups:
        raise PolicyError(f"state.next_group = {state.next_group} is not an op group (0..{num_groups - 1}) "
                          f"although the state has {options.size} candidate actions")
    if state.feedback is not None:
        _check_feedback(state.feedback, num_groups, num_device_groups, state.cluster.num_devices)


def _check_feedback(feedback: Feedback, num_groups: int, num_device_groups: int, num_devices: int) -> None:
    expected = {
        "group_makespan": (num_groups,), "group_output_idle": (num_groups,), "comm_idle": (num_devices,),
        "device_group_peak_memory": (num_device_groups,), "device_group_idle": (num_device_groups,),
        "device_group_link_idle": (num_device_groups, num_device_groups),
    }
    for name, shape in expected.items():
        if np.shape(getattr(feedback, name)) != shape:
            raise PolicyError(f"state.feedback.{name} has shape {np.shape(getattr(feedback, name))}, expected "
                              f"{shape}: the feedback is of another grouping or cluster")
