"""TaskGraph: what the simulator runs. Tasks on resources, with dependencies and tensors, in column arrays.

A compiler lowers a strategy or a pipeline plan into a TaskGraph through :class:`TaskGraphBuilder`. T tasks,
each one of:

- ``compute``: runs on one device's compute stream for a precomputed ``duration``;
- ``transfer``: moves ``nbytes`` from device a to device b. Its duration comes from the cluster:
  latency[a, b] + nbytes / β, where β is bandwidth[a, b], lowered to the NIC bandwidth of either machine
  when a and b are on different machines and that NIC is slower (0 bytes cost 0 s, as in
  ``tag.cost.p2p_time``). It holds the directed **link** resource (a, b) and, between machines with
  finite NICs, the sender machine's **NIC-out** and the receiver machine's **NIC-in** (full duplex);
- ``collective`` (ring all-reduce, PS push+pull, broadcast, all-gather) over a set of devices, with a
  precomputed duration; it holds the **comm channel** of every member (one per device, apart from the
  compute stream, so communication overlaps computation as NCCL streams do).

**Sharing is FIFO serialisation** on each resource: a task needs all its resources free and holds them
for its whole duration. For k equal transfers of S bytes through one bottleneck of bandwidth β, fair
sharing finishes all k at k·S/β and FIFO finishes the i-th at i·S/β: the last finishes at the same time,
so the makespan agrees while intermediate finish times are earlier under FIFO. (With a latency α, FIFO
pays it k times, k·(α + S/β), where fair sharing pays it once; α is microseconds against the
milliseconds of S/β for the tensors a planner moves.)

**Memory** by reference counting over registered tensors ``(device, nbytes, producer, consumers)``: a
tensor is live from its producer's start until the later of its producer's finish and its last
consumer's finish (a tensor with no producer is live from time 0); a ``persistent`` tensor (parameters,
gradient buffers, optimizer states) is live from time 0 for ever.

Resource ids (R of them) are laid out as: compute streams ``0..D-1``, comm channels ``D..2D-1``, NIC-out
``2D..2D+M-1``, NIC-in ``2D+M..2D+2M-1``, then one id per directed link used by some transfer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, NamedTuple

import numpy as np

from tag._arrays import csr_by_key, csr_from_lists
from tag.cluster import Cluster
from tag.sim.errors import TaskGraphError

__all__ = [
    "TaskGraph",
    "TaskGraphBuilder",
    "TASK_KINDS",
    "TASK_COMPUTE",
    "TASK_TRANSFER",
    "TASK_COLLECTIVE",
    "COLLECTIVES",
    "RESOURCE_KINDS",
    "RES_COMPUTE",
    "RES_COMM",
    "RES_NIC_OUT",
    "RES_NIC_IN",
    "RES_LINK",
    "NO_GROUP",
    "NO_TASK",
]

TASK_KINDS = ("compute", "transfer", "collective")
TASK_COMPUTE, TASK_TRANSFER, TASK_COLLECTIVE = range(3)
COLLECTIVES = ("allreduce", "ps", "broadcast", "allgather")
RESOURCE_KINDS = ("compute", "comm", "nic_out", "nic_in", "link")
RES_COMPUTE, RES_COMM, RES_NIC_OUT, RES_NIC_IN, RES_LINK = range(5)
NO_GROUP = -1  # a task that belongs to no op group / stage
NO_TASK = -1  # a tensor without a producer; a transfer's peer for tasks that are not transfers


class Lags(NamedTuple):
    """Where things happen inside tasks, in seconds after a task's start (merged chunks,
    :func:`tag.sim.kernels.merge_chunks`; for an unmerged task: at its finish, allocations at its start)."""

    dep: np.ndarray  # [E] the dependency on dep[k] is met this long after dep[k] starts
    alloc: np.ndarray  # [N] a tensor is allocated this long after its producer starts
    free: np.ndarray  # [N] its producer is done with it this long after it starts
    consumer: np.ndarray  # [sum] each consumer is done with it this long after it starts


class _Plan(NamedTuple):
    """Python lists the simulators loop over (indexing a list is far cheaper than a numpy scalar)."""

    duration: list[float]  # [T]
    resources: list[tuple[int, ...]]  # [T] resource ids held
    successors: list[tuple[int, ...]]  # [T]
    indegree: list[int]  # [T]
    sources: list[int]  # tasks with no predecessor, ascending
    early: list[tuple[tuple[float, int], ...]]  # [T] (lag, successor) of the dependencies met before the finish
    lagged: bool  # some dependency or tensor lag differs from the plain start / finish times


@dataclass(eq=False)
class TaskGraph:
    """T tasks, R resources, N tensors over the D devices and M machines of ``cluster``.

    Build it with :class:`TaskGraphBuilder`; constructing one directly validates the arrays all the same.
    Treat it as immutable: the simulators cache list views of its columns (:attr:`plan`).
    """

    cluster: Cluster
    names: list[str]  # [T] unique task names
    labels: list[str]  # [T] short labels for traces ("2F0" = stage 2, forward, micro-batch 0)
    kind: np.ndarray  # [T] int8, index into TASK_KINDS
    duration: np.ndarray  # [T] float64 seconds
    device: np.ndarray  # [T] int64: compute device, transfer source, a collective's first member
    peer: np.ndarray  # [T] int64: transfer destination; NO_TASK (-1) for other kinds
    nbytes: np.ndarray  # [T] float64 bytes moved by a transfer or collective; 0 for compute
    collective: np.ndarray  # [T] int8, index into COLLECTIVES; -1 unless a collective
    group: np.ndarray  # [T] int64 op group / stage, NO_GROUP if none
    dep_ptr: np.ndarray  # [T+1] int64, CSR of predecessors
    dep: np.ndarray  # [E] int64 predecessor task ids
    res_ptr: np.ndarray  # [T+1] int64, CSR of resources held
    res: np.ndarray  # [sum] int64 resource ids
    resource_kind: np.ndarray  # [R] int8, index into RESOURCE_KINDS
    resource_a: np.ndarray  # [R] int64: device (compute, comm, link source) or machine (NICs)
    resource_b: np.ndarray  # [R] int64: link destination device, -1 otherwise
    tensor_device: np.ndarray  # [N] int64
    tensor_bytes: np.ndarray  # [N] float64
    tensor_producer: np.ndarray  # [N] int64 task id, NO_TASK if none
    tensor_persistent: np.ndarray  # [N] bool
    consumer_ptr: np.ndarray  # [N+1] int64, CSR of consumer tasks
    consumer: np.ndarray  # [sum] int64 task ids
    tensor_names: list[str] | None = None  # [N]
    num_groups: int | None = None  # G; default max(group) + 1
    # Lags (merged chunks, tag.sim.kernels.merge_chunks): seconds after a task's start at which something
    # happens inside it. None: at its finish (at its start for allocations), as for every unmerged task.
    dep_lag: np.ndarray | None = None  # [E] float64: the dependency dep[k] is met this long after it starts
    tensor_alloc_lag: np.ndarray | None = None  # [N] float64: allocated this long after the producer starts
    tensor_free_lag: np.ndarray | None = None  # [N] float64: the producer is done with it this long after it starts
    consumer_lag: np.ndarray | None = None  # [sum] float64: each consumer is done with it this long after it starts

    def __post_init__(self) -> None:
        self.kind = np.asarray(self.kind, dtype=np.int8)
        self.collective = np.asarray(self.collective, dtype=np.int8)
        self.tensor_persistent = np.asarray(self.tensor_persistent, dtype=bool)
        for column in ("duration", "nbytes", "tensor_bytes"):
            setattr(self, column, np.asarray(getattr(self, column), dtype=np.float64))
        for column in ("device", "peer", "group", "dep_ptr", "dep", "res_ptr", "res", "resource_a", "resource_b",
                       "tensor_device", "tensor_producer", "consumer_ptr", "consumer"):
            setattr(self, column, np.asarray(getattr(self, column), dtype=np.int64).reshape(-1))
        self.resource_kind = np.asarray(self.resource_kind, dtype=np.int8)
        if self.num_groups is None:
            self.num_groups = int(self.group.max()) + 1 if len(self.group) else 0
        self._validate_columns()
        self.lags = self._lags()
        edge_task = np.repeat(np.arange(self.num_tasks), np.diff(self.dep_ptr))
        self.succ_ptr, order = csr_by_key(self.num_tasks, self.dep)  # [T+1] CSR of successors
        self.succ = edge_task[order]  # [E] successor task ids, each task's in ascending order
        self.succ_lag = self.lags.dep[order]  # [E] the lag of each successor's dependency
        self.topological_order = self._topological_order()  # [T]

    # ----------------------------------------------------------------------------------- sizes

    @property
    def num_tasks(self) -> int:
        return len(self.names)

    @property
    def num_resources(self) -> int:
        return len(self.resource_kind)

    @property
    def num_tensors(self) -> int:
        return len(self.tensor_device)

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    def predecessors(self, task: int) -> np.ndarray:
        return self.dep[self.dep_ptr[task]:self.dep_ptr[task + 1]]

    def successors(self, task: int) -> np.ndarray:
        return self.succ[self.succ_ptr[task]:self.succ_ptr[task + 1]]

    def resources(self, task: int) -> np.ndarray:
        return self.res[self.res_ptr[task]:self.res_ptr[task + 1]]

    def members(self, task: int) -> np.ndarray:
        """Devices of a collective (its comm channels); the one device of a compute task; [src, dst] of a
        transfer."""
        if self.kind[task] == TASK_COLLECTIVE:
            held = self.resources(task)
            return held[self.resource_kind[held] == RES_COMM] - self.num_devices
        if self.kind[task] == TASK_TRANSFER:
            return np.array([self.device[task], self.peer[task]])
        return self.device[task:task + 1]

    def link_resources(self) -> np.ndarray:
        """[L] ids of the link resources (each a directed device pair used by some transfer)."""
        return np.flatnonzero(self.resource_kind == RES_LINK)

    def resource_name(self, resource: int) -> str:
        kind = int(self.resource_kind[resource])
        a, b = int(self.resource_a[resource]), int(self.resource_b[resource])
        if kind == RES_LINK:
            return f"link {a}->{b}"
        if kind in (RES_NIC_OUT, RES_NIC_IN):
            return f"machine {a} {RESOURCE_KINDS[kind].replace('_', '-')}"
        return f"device {a} {RESOURCE_KINDS[kind]}"

    def _lags(self) -> Lags:
        """The lag columns, those not given filled in for unmerged tasks (at the finish; allocations at the
        start), checked against their tables."""
        produced = self.tensor_producer >= 0
        free = np.zeros(self.num_tensors)
        free[produced] = self.duration[self.tensor_producer[produced]]
        lags = Lags(
            dep=self.duration[self.dep] if self.dep_lag is None else np.asarray(self.dep_lag, dtype=np.float64),
            alloc=np.zeros(self.num_tensors) if self.tensor_alloc_lag is None
            else np.asarray(self.tensor_alloc_lag, dtype=np.float64),
            free=free if self.tensor_free_lag is None else np.asarray(self.tensor_free_lag, dtype=np.float64),
            consumer=self.duration[self.consumer] if self.consumer_lag is None
            else np.asarray(self.consumer_lag, dtype=np.float64))
        for column, size, what in ((lags.dep, self.dep.size, "dep_lag"),
                                   (lags.alloc, self.num_tensors, "tensor_alloc_lag"),
                                   (lags.free, self.num_tensors, "tensor_free_lag"),
                                   (lags.consumer, self.consumer.size, "consumer_lag")):
            if column.shape != (size,):
                raise ValueError(f"TaskGraph: {what} has shape {column.shape}, expected ({size},)")
        if (lags.dep < 0).any() or (lags.dep > self.duration[self.dep]).any():
            raise ValueError("TaskGraph: a dependency lag lies outside its predecessor's run")
        return lags

    @functools.cached_property
    def plan(self) -> _Plan:
        """The lists both simulators loop over, built once per graph."""
        resources = self.res.tolist()
        res_ptr = self.res_ptr.tolist()
        indegree = np.diff(self.dep_ptr).tolist()
        pred = np.repeat(np.arange(self.num_tasks), np.diff(self.succ_ptr))  # [E] predecessor of each succ entry
        early_edge = self.succ_lag < self.duration[pred]
        early: list[list] = [[] for _ in range(self.num_tasks)]
        for p, lag, t in zip(pred[early_edge].tolist(), self.succ_lag[early_edge].tolist(),
                             self.succ[early_edge].tolist()):
            early[p].append((lag, t))
        late = ~early_edge
        successors: list[list] = [[] for _ in range(self.num_tasks)]
        for p, t in zip(pred[late].tolist(), self.succ[late].tolist()):
            successors[p].append(t)
        produced = self.tensor_producer >= 0
        lagged = bool(early_edge.any() or self.lags.alloc.any()
                      or (self.lags.free[produced] != self.duration[self.tensor_producer[produced]]).any()
                      or (self.lags.consumer != self.duration[self.consumer]).any())
        return _Plan(
            duration=self.duration.tolist(),
            resources=[tuple(resources[res_ptr[i]:res_ptr[i + 1]]) for i in range(self.num_tasks)],
            successors=[tuple(x) for x in successors],
            indegree=indegree,
            sources=[i for i, n in enumerate(indegree) if n == 0],
            early=[tuple(x) for x in early],
            lagged=lagged,
        )

    def __repr__(self) -> str:
        counts = np.bincount(self.kind, minlength=len(TASK_KINDS))
        kinds = ", ".join(f"{c} {k}" for k, c in zip(TASK_KINDS, counts))
        return (f"TaskGraph({self.num_tasks} tasks [{kinds}], {len(self.dep)} dependencies, "
                f"{self.num_tensors} tensors, on {self.cluster.name!r})")

    # ----------------------------------------------------------------------------------- validation

    def _validate_columns(self) -> None:
        t = self.num_tasks
        for column in ("labels",):
            if len(getattr(self, column)) != t:
                raise TaskGraphError(f"{column} has {len(getattr(self, column))} entries for {t} tasks")
        for column in ("kind", "duration", "device", "peer", "nbytes", "collective", "group"):
            if getattr(self, column).shape != (t,):
                raise TaskGraphError(f"column {column!r} has shape {getattr(self, column).shape}, expected ({t},)")
        if len(set(self.names)) != t:
            seen: set[str] = set()
            duplicate = next(x for x in self.names if x in seen or seen.add(x))
            raise TaskGraphError(f"task name {duplicate!r} appears more than once")
        for ptr, values, what in ((self.dep_ptr, self.dep, "dependency"), (self.res_ptr, self.res, "resource")):
            if len(ptr) != t + 1 or ptr[0] != 0 or ptr[-1] != len(values) or (np.diff(ptr) < 0).any():
                raise TaskGraphError(f"{what} CSR is malformed")
        if t and ((self.kind < 0) | (self.kind >= len(TASK_KINDS))).any():
            raise TaskGraphError(f"task {self.names[int(np.argmax((self.kind < 0) | (self.kind >= 3)))]!r}: unknown kind")
        bad = ~np.isfinite(self.duration) | (self.duration < 0)
        if bad.any():
            i = int(np.argmax(bad))
            raise TaskGraphError(f"task {self.names[i]!r}: duration must be finite and non-negative, got {self.duration[i]!r}")
        bad_group = (self.group < NO_GROUP) | (self.group >= self.num_groups)
        if bad_group.any():
            i = int(np.argmax(bad_group))
            raise TaskGraphError(f"task {self.names[i]!r}: group {self.group[i]} outside 0..{self.num_groups - 1} "
                                 "(or NO_GROUP)")
        bad_dev = (self.device < 0) | (self.device >= self.num_devices)
        if bad_dev.any():
            i = int(np.argmax(bad_dev))
            raise TaskGraphError(f"task {self.names[i]!r}: unknown device {self.device[i]} "
                                 f"(cluster {self.cluster.name!r} has {self.num_devices})")
        if len(self.dep) and (self.dep.min() < 0 or self.dep.max() >= t):
            i = int(np.searchsorted(self.dep_ptr, int(np.argmax((self.dep < 0) | (self.dep >= t))), side="right")) - 1
            raise TaskGraphError(f"task {self.names[i]!r} depends on a task id outside 0..{t - 1}")
        r = len(self.resource_kind)
        if len(self.res) and (self.res.min() < 0 or self.res.max() >= r):
            raise TaskGraphError(f"resource ids must be in 0..{r - 1}")
        if t and (np.diff(self.res_ptr) == 0).any():
            raise TaskGraphError(f"task {self.names[int(np.argmax(np.diff(self.res_ptr) == 0))]!r} holds no resource")
        self._validate_tensors()

    def _validate_tensors(self) -> None:
        n = self.num_tensors
        for column in ("tensor_bytes", "tensor_producer", "tensor_persistent"):
            if getattr(self, column).shape != (n,):
                raise TaskGraphError(f"column {column!r} has shape {getattr(self, column).shape}, expected ({n},)")
        if len(self.consumer_ptr) != n + 1 or self.consumer_ptr[-1] != len(self.consumer):
            raise TaskGraphError("tensor consumer CSR is malformed")
        bad = ~np.isfinite(self.tensor_bytes) | (self.tensor_bytes < 0)
        if bad.any():
            raise TaskGraphError(f"{self._tensor_name(int(np.argmax(bad)))}: bytes must be finite and non-negative")
        bad = (self.tensor_device < 0) | (self.tensor_device >= self.num_devices)
        if bad.any():
            i = int(np.argmax(bad))
            raise TaskGraphError(f"{self._tensor_name(i)}: unknown device {self.tensor_device[i]}")
        t = self.num_tasks
        bad = (self.tensor_producer < NO_TASK) | (self.tensor_producer >= t)
        if len(self.consumer):
            bad_consumer = (self.consumer < 0) | (self.consumer >= t)
            if bad_consumer.any():
                i = int(np.searchsorted(self.consumer_ptr, int(np.argmax(bad_consumer)), side="right")) - 1
                raise TaskGraphError(f"{self._tensor_name(i)}: consumer is not a task id")
        if bad.any():
            raise TaskGraphError(f"{self._tensor_name(int(np.argmax(bad)))}: producer is not a task id")

    def _tensor_name(self, tensor: int) -> str:
        return f"tensor {self.tensor_names[tensor]!r}" if self.tensor_names else f"tensor {tensor}"

    def _topological_order(self) -> np.ndarray:
        """Kahn's algorithm; a cycle raises TaskGraphError naming the tasks on it."""
        plan_succ = self.succ.tolist()
        succ_ptr = self.succ_ptr.tolist()
        remaining = np.diff(self.dep_ptr).tolist()
        stack = [i for i, n in enumerate(remaining) if n == 0]
        order: list[int] = []
        while stack:
            i = stack.pop()
            order.append(i)
            for j in plan_succ[succ_ptr[i]:succ_ptr[i + 1]]:
                remaining[j] -= 1
                if remaining[j] == 0:
                    stack.append(j)
        if len(order) < self.num_tasks:
            raise TaskGraphError(f"dependency cycle: {' -> '.join(self._find_cycle(remaining))}")
        return np.array(order, dtype=np.int64)

    def _find_cycle(self, remaining: list[int]) -> list[str]:
        """Names along one cycle among the tasks Kahn's algorithm could not order."""
        stuck = [i for i, n in enumerate(remaining) if n > 0]
        blocked = set(stuck)
        position: dict[int, int] = {}
        path: list[int] = []
        task = stuck[0]
        while task not in position:  # walk predecessors that are themselves stuck: it must close a loop
            position[task] = len(path)
            path.append(task)
            task = next(int(p) for p in self.predecessors(task) if int(p) in blocked)
        cycle = path[position[task]:][::-1]
        return [self.names[i] for i in cycle + cycle[:1]]


class TaskGraphBuilder:
    """Collects tasks, dependencies and tensors, then :meth:`build` validates and freezes them.

    Every ``add_*``/``compute``/``transfer``/``collective`` call checks its own arguments and returns the
    new id; dependencies may name tasks created later (through :meth:`add_deps`), so cycles are found
    by :meth:`build`.
    """

    def __init__(self, cluster: Cluster, *, num_groups: int | None = None) -> None:
        self.cluster = cluster
        self.num_groups = num_groups
        self._num_devices = cluster.num_devices
        self._num_machines = cluster.num_machines
        self._names: list[str] = []
        self._labels: list[str] = []
        self._kind: list[int] = []
        self._duration: list[float] = []
        self._device: list[int] = []
        self._peer: list[int] = []
        self._nbytes: list[float] = []
        self._collective: list[int] = []
        self._group: list[int] = []
        self._deps: list[list[int]] = []
        self._res: list[tuple[int, ...]] = []
        self._links: dict[tuple[int, int], int] = {}  # (src, dst) -> index among links
        self._tensor_device: list[int] = []
        self._tensor_bytes: list[float] = []
        self._tensor_producer: list[int] = []
        self._tensor_persistent: list[bool] = []
        self._consumers: list[list[int]] = []
        self._tensor_names: list[str] = []
        self._name_set: set[str] = set()

    @property
    def num_tasks(self) -> int:
        return len(self._names)

    # ----------------------------------------------------------------------------------- tasks

    def compute(self, device: int, duration: float, *, deps: Iterable[int] = (), name: str | None = None,
                label: str | None = None, group: int = NO_GROUP) -> int:
        """A task on ``device``'s compute stream lasting ``duration`` seconds."""
        task_name = self._name(name, "compute")
        device = self._check_device(device, task_name)
        return self._add(task_name, label, TASK_COMPUTE, self._check_duration(duration, task_name), device,
                         NO_TASK, 0.0, -1, group, deps, (device,))

    def transfer(self, src: int, dst: int, nbytes: float, *, deps: Iterable[int] = (), name: str | None = None,
                 label: str | None = None, group: int = NO_GROUP) -> int:
        """``nbytes`` from ``src`` to ``dst``, timed and routed on the cluster (see the module docstring)."""
        task_name = self._name(name, "transfer")
        src = self._check_device(src, task_name)
        dst = self._check_device(dst, task_name)
        if src == dst:
            raise TaskGraphError(f"task {task_name!r}: transfer from device {src} to itself")
        nbytes = self._check_bytes(nbytes, task_name)
        cluster = self.cluster
        bandwidth = float(cluster.bandwidth[src, dst])
        resources = [self._link(src, dst)]
        src_machine, dst_machine = int(cluster.machine[src]), int(cluster.machine[dst])
        if src_machine != dst_machine:
            nic_out, nic_in = float(cluster.nic_bandwidth[src_machine]), float(cluster.nic_bandwidth[dst_machine])
            if np.isfinite(nic_out):
                resources.append(2 * self._num_devices + src_machine)
            if np.isfinite(nic_in):
                resources.append(2 * self._num_devices + self._num_machines + dst_machine)
            bandwidth = min(bandwidth, nic_out, nic_in)
        duration = float(cluster.latency[src, dst]) + nbytes / bandwidth if nbytes > 0 else 0.0
        return self._add(task_name, label, TASK_TRANSFER, duration, src, dst, nbytes, -1, group, deps,
                         tuple(sorted(resources)))

    def collective(self, devices: Iterable[int], duration: float, *, op: str = "allreduce", nbytes: float = 0.0,
                   deps: Iterable[int] = (), name: str | None = None, label: str | None = None,
                   group: int = NO_GROUP) -> int:
        """A collective ``op`` (one of COLLECTIVES) over ``devices`` lasting ``duration`` seconds (the
        compiler computes it with the cost model); it holds every member's comm channel."""
        task_name = self._name(name, op if isinstance(op, str) else "collective")
        if op not in COLLECTIVES:
            raise TaskGraphError(f"task {task_name!r}: unknown collective {op!r}; expected one of {', '.join(COLLECTIVES)}")
        members = [self._check_device(d, task_name) for d in devices]
        if not members:
            raise TaskGraphError(f"task {task_name!r}: a collective needs at least one device")
        if len(set(members)) != len(members):
            raise TaskGraphError(f"task {task_name!r}: device listed twice in {members}")
        nbytes = self._check_bytes(nbytes, task_name)
        resources = tuple(sorted(self._num_devices + d for d in members))
        return self._add(task_name, label, TASK_COLLECTIVE, self._check_duration(duration, task_name), members[0],
                         NO_TASK, nbytes, COLLECTIVES.index(op), group, deps, resources)

    def devices_of(self, task: int) -> tuple[int, ...]:
        """The devices ``task`` runs on: its device, a transfer's (src, dst), a collective's members."""
        self._check_task(task, "devices_of")
        kind = self._kind[task]
        if kind == TASK_COMPUTE:
            return (self._device[task],)
        if kind == TASK_TRANSFER:
            return (self._device[task], self._peer[task])
        return tuple(r - self._num_devices for r in self._res[task])

    def add_deps(self, task: int, deps: Iterable[int]) -> None:
        """``task`` starts only after every task in ``deps`` has finished."""
        self._check_task(task, "add_deps")
        self._deps[task].extend(self._check_deps(deps, self._names[task]))

    # ----------------------------------------------------------------------------------- tensors

    def tensor(self, device: int, nbytes: float, *, producer: int | None = None, consumers: Iterable[int] = (),
               persistent: bool = False, name: str | None = None) -> int:
        """Register a tensor on ``device``. It is allocated when ``producer`` starts (time 0 without one)
        and freed when its last consumer finishes (the producer's finish without consumers);
        ``persistent`` tensors are allocated at time 0 and never freed (and take no producer)."""
        tensor_name = name if name is not None else f"tensor{len(self._tensor_names)}"
        what = f"tensor {tensor_name!r}"
        device = self._check_device(device, what, noun="tensor")
        nbytes = self._check_bytes(nbytes, what, noun="tensor")
        if persistent and producer is not None:
            raise TaskGraphError(f"{what}: a persistent tensor lives from time 0 and takes no producer")
        if producer is not None:
            self._check_task(producer, what)
            self._check_touches(producer, device, what, "producer")
        self._tensor_device.append(device)
        self._tensor_bytes.append(nbytes)
        self._tensor_producer.append(NO_TASK if producer is None else int(producer))
        self._tensor_persistent.append(bool(persistent))
        self._consumers.append([])
        self._tensor_names.append(tensor_name)
        self.add_consumers(len(self._tensor_names) - 1, consumers)
        return len(self._tensor_names) - 1

    def add_consumers(self, tensor: int, consumers: Iterable[int]) -> None:
        if not 0 <= tensor < len(self._tensor_names):
            raise TaskGraphError(f"add_consumers: no tensor {tensor}")
        what = f"tensor {self._tensor_names[tensor]!r}"
        current = self._consumers[tensor]
        for task in consumers:
            self._check_task(task, what)
            self._check_touches(task, self._tensor_device[tensor], what, "consumer")
            if int(task) != self._tensor_producer[tensor] and int(task) not in current:
                current.append(int(task))

    # ----------------------------------------------------------------------------------- build

    def build(self) -> TaskGraph:
        """Validate (unknown tasks, cycles, tensors without producer or consumers) and freeze."""
        for i, (persistent, producer, consumers) in enumerate(
                zip(self._tensor_persistent, self._tensor_producer, self._consumers)):
            if not persistent and producer == NO_TASK and not consumers:
                raise TaskGraphError(f"tensor {self._tensor_names[i]!r} has neither producer nor consumers; "
                                     "mark it persistent")
        d, m = self._num_devices, self._num_machines
        links = sorted(self._links.items(), key=lambda item: item[1])
        resource_kind = [RES_COMPUTE] * d + [RES_COMM] * d + [RES_NIC_OUT] * m + [RES_NIC_IN] * m + [RES_LINK] * len(links)
        resource_a = list(range(d)) * 2 + list(range(m)) * 2 + [a for (a, _), _ in links]
        resource_b = [-1] * (2 * d + 2 * m) + [b for (_, b), _ in links]
        dep_ptr, dep = csr_from_lists([sorted(set(x)) for x in self._deps])
        res_ptr, res = csr_from_lists(self._res)
        consumer_ptr, consumer = csr_from_lists(self._consumers)
        return TaskGraph(
            cluster=self.cluster, names=list(self._names), labels=list(self._labels), kind=self._kind,
            duration=self._duration, device=self._device, peer=self._peer, nbytes=self._nbytes,
            collective=self._collective, group=self._group, dep_ptr=dep_ptr, dep=dep, res_ptr=res_ptr, res=res,
            resource_kind=resource_kind, resource_a=resource_a, resource_b=resource_b,
            tensor_device=self._tensor_device, tensor_bytes=self._tensor_bytes,
            tensor_producer=self._tensor_producer, tensor_persistent=self._tensor_persistent,
            consumer_ptr=consumer_ptr, consumer=consumer, tensor_names=list(self._tensor_names),
            num_groups=self.num_groups,
        )

    # ----------------------------------------------------------------------------------- helpers

    def _add(self, name, label, kind, duration, device, peer, nbytes, collective, group, deps, resources) -> int:
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < NO_GROUP:
            raise TaskGraphError(f"task {name!r}: group must be an int >= 0 or NO_GROUP (-1), got {group!r}")
        checked_deps = self._check_deps(deps, name)
        self._name_set.add(name)
        self._names.append(name)
        self._labels.append(name if label is None else str(label))
        self._kind.append(kind)
        self._duration.append(duration)
        self._device.append(device)
        self._peer.append(peer)
        self._nbytes.append(nbytes)
        self._collective.append(collective)
        self._group.append(int(group))
        self._deps.append(checked_deps)
        self._res.append(resources)
        return len(self._names) - 1

    def _name(self, name: str | None, stem: str) -> str:
        name = f"{stem}{len(self._names)}" if name is None else str(name)
        if name in self._name_set:
            raise TaskGraphError(f"task name {name!r} is used twice")
        return name

    def _link(self, src: int, dst: int) -> int:
        index = self._links.setdefault((src, dst), len(self._links))
        return 2 * self._num_devices + 2 * self._num_machines + index

    def _check_device(self, device, what: str, *, noun: str = "task") -> int:
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or not 0 <= device < self._num_devices:
            prefix = what if noun == "tensor" else f"task {what!r}"
            raise TaskGraphError(f"{prefix}: unknown device {device!r} (cluster {self.cluster.name!r} has "
                                 f"devices 0..{self._num_devices - 1})")
        return int(device)

    @staticmethod
    def _check_duration(duration, name: str) -> float:
        value = float(duration)
        if not (np.isfinite(value) and value >= 0):
            raise TaskGraphError(f"task {name!r}: duration must be finite and non-negative, got {duration!r}")
        return value

    @staticmethod
    def _check_bytes(nbytes, what: str, *, noun: str = "task") -> float:
        value = float(nbytes)
        if not (np.isfinite(value) and value >= 0):
            prefix = what if noun == "tensor" else f"task {what!r}"
            raise TaskGraphError(f"{prefix}: bytes must be finite and non-negative, got {nbytes!r}")
        return value

    def _check_task(self, task, what: str) -> None:
        if isinstance(task, bool) or not isinstance(task, (int, np.integer)) or not 0 <= task < len(self._names):
            raise TaskGraphError(f"{what}: no task {task!r} (have {len(self._names)})")

    def _check_deps(self, deps: Iterable[int], name: str) -> list[int]:
        checked = []
        for dep in deps:
            self._check_task(dep, f"task {name!r} depends on")
            checked.append(int(dep))
        return checked

    def _check_touches(self, task: int, device: int, what: str, role: str) -> None:
        """A tensor on ``device`` can only be produced or read by a task that runs on that device."""
        touched = self.devices_of(task)
        if device not in touched:
            raise TaskGraphError(f"{what} lives on device {device} but its {role} {self._names[task]!r} "
                                 f"runs on device(s) {list(touched)}")
