"""Strategies (TAG §4.2): for each op group, a placement mask over device groups and a replication option.

G op groups, M device groups, D devices. A :class:`Strategy` holds the paper's placement matrix
``P [G, M]`` (row i: the device groups op group i goes to) and its replication plan ``O`` as one option
index per group instead of a one-hot ``[G, 4]`` row. A strategy places an op group on *every* device of
each device group its mask selects; the option says what those devices do (TAG §4.2):

- ``ALLREDUCE`` — replicate; the batch is split among the replicas; gradients are summed by all-reduce;
- ``PS`` — the same, gradients synchronised through a parameter server;
- ``DUPLICATE`` — copy; every copy computes the whole batch, so gradients agree and need no
  synchronisation (what SFB produces);
- ``MODEL_PARALLEL`` — the group's ops are divided among the devices; each runs its share on the whole
  batch.

**Single-device rule.** When the mask of a group covers exactly one device the four options mean the same
thing: one device runs every op on the whole batch, with nothing to split or synchronise. A strategy
normalises such a row to :data:`SINGLE_DEVICE_OPTION` (``DUPLICATE``: "the whole batch, no
synchronisation" is what duplicate means) on construction, so equal plans compare equal and hash alike,
and the candidate actions of :mod:`tag.strategy.actions` list each single-device mask once. This is why a
strategy carries ``device_group_sizes`` [M]: whether a mask covers one device depends on the cluster.

**Batch split.** ``"even"`` (the paper): the replicas of a replicated group get equal batch fractions.
``"speed"``: fractions proportional to each device's peak FLOP/s (DP-NCCL-P's rule); the same split
decides the op shares of a model-parallel group. See :func:`replicas` for the exact contract.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tag.cluster import Cluster
from tag.strategy.errors import StrategyError

__all__ = [
    "OPTIONS",
    "ALLREDUCE",
    "PS",
    "DUPLICATE",
    "MODEL_PARALLEL",
    "SYNC_OPTIONS",
    "SINGLE_DEVICE_OPTION",
    "BATCH_SPLITS",
    "Strategy",
    "Replicas",
    "replicas",
    "replica_fractions",
    "device_group_sizes",
    "option_code",
]

OPTIONS = ("allreduce", "ps", "duplicate", "model_parallel")
ALLREDUCE, PS, DUPLICATE, MODEL_PARALLEL = range(4)
_OPTION_ABBREVIATIONS = ("AR", "PS", "DUP", "MP")  # for repr only
SYNC_OPTIONS = (ALLREDUCE, PS)  # options that split the batch and synchronise gradients
# The option every group placed on a single device is normalised to (see the module docstring).
SINGLE_DEVICE_OPTION = DUPLICATE
BATCH_SPLITS = ("even", "speed")
_REPR_ROWS = 8  # op groups shown by repr before eliding the rest


def option_code(option: int | str) -> int:
    """The option index of an option given by index or by name ("allreduce", "ps", ...)."""
    if isinstance(option, str):
        try:
            return OPTIONS.index(option)
        except ValueError:
            raise StrategyError(f"unknown option {option!r}; expected one of {', '.join(OPTIONS)}") from None
    if isinstance(option, (bool, np.bool_)) or not isinstance(option, (int, np.integer)) or not 0 <= option < len(OPTIONS):
        raise StrategyError(f"unknown option {option!r}; expected 0..{len(OPTIONS) - 1} or one of {', '.join(OPTIONS)}")
    return int(option)


def device_group_sizes(cluster: Cluster) -> np.ndarray:
    """[M] int64 number of devices in each device group of ``cluster``."""
    return np.bincount(cluster.device_group, minlength=cluster.num_device_groups).astype(np.int64)


@dataclass(frozen=True, eq=False, repr=False)
class Strategy:
    """Placement and replication option of G op groups over M device groups; immutable and hashable.

    ``placement`` and ``option`` accept array-likes (0/1 or bool; option indices or names) and are stored
    as read-only arrays. Construction validates and applies the single-device rule; a bad argument
    raises :class:`StrategyError` naming it.
    """

    placement: np.ndarray  # [G, M] bool, non-empty rows
    option: np.ndarray  # [G] int8, index into OPTIONS
    device_group_sizes: np.ndarray  # [M] int64, devices in each device group
    batch_split: str = "even"  # one of BATCH_SPLITS

    def __post_init__(self) -> None:
        sizes = _check_sizes(self.device_group_sizes)
        placement = _check_placement(self.placement, len(sizes))
        option = _check_options(self.option, placement.shape[0])
        if not isinstance(self.batch_split, str) or self.batch_split not in BATCH_SPLITS:
            raise StrategyError(f"batch_split must be one of {', '.join(map(repr, BATCH_SPLITS))}, got {self.batch_split!r}")
        option = _canonical_options(placement, option, sizes)
        for array in (placement, option, sizes):
            array.setflags(write=False)
        object.__setattr__(self, "placement", placement)
        object.__setattr__(self, "option", option)
        object.__setattr__(self, "device_group_sizes", sizes)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_cluster(cls, cluster: Cluster, placement: Any, option: Any, *, batch_split: str = "even") -> Strategy:
        """A strategy over the device groups of ``cluster``."""
        return cls(placement, option, device_group_sizes(cluster), batch_split)

    @classmethod
    def data_parallel(cls, num_groups: int, cluster: Cluster, *, option: int | str = ALLREDUCE,
                      batch_split: str = "even") -> Strategy:
        """Every op group on every device group with ``option`` (default all-reduce): TAG's DP baseline."""
        num_groups = _check_num_groups(num_groups)
        placement = np.ones((num_groups, cluster.num_device_groups), dtype=bool)
        return cls.from_cluster(cluster, placement, np.full(num_groups, option_code(option)), batch_split=batch_split)

    @classmethod
    def single_device(cls, num_groups: int, cluster: Cluster, device_group: int, *, option: int | str | None = None,
                      batch_split: str = "even") -> Strategy:
        """Every op group on device group ``device_group``.

        A strategy places groups on whole device groups, so this is a single-device strategy only when
        that device group has one device (then ``option`` is irrelevant). For a device group of several
        devices give ``option`` explicitly; without it this raises, since the result would not run on
        a single device. (To run on one device of a larger group, build the cluster with that device in a
        group of its own, e.g. ``cluster.subset([d])``.)
        """
        num_groups = _check_num_groups(num_groups)
        if isinstance(device_group, bool) or not isinstance(device_group, (int, np.integer)) \
                or not 0 <= device_group < cluster.num_device_groups:
            raise StrategyError(f"device_group must be in 0..{cluster.num_device_groups - 1} for cluster "
                                f"{cluster.name!r}, got {device_group!r}")
        size = int(device_group_sizes(cluster)[device_group])
        if option is None:
            if size != 1:
                raise StrategyError(f"device group {device_group} of cluster {cluster.name!r} has {size} devices; "
                                    "give an option for it, or use a device group of one device")
            option = SINGLE_DEVICE_OPTION
        placement = np.zeros((num_groups, cluster.num_device_groups), dtype=bool)
        placement[:, device_group] = True
        return cls.from_cluster(cluster, placement, np.full(num_groups, option_code(option)), batch_split=batch_split)

    def with_group(self, group: int, mask: Any, option: int | str) -> Strategy:
        """A copy with op group ``group`` placed on ``mask`` [M] (0/1 or bool) with ``option``."""
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or not 0 <= group < self.num_groups:
            raise StrategyError(f"op group must be in 0..{self.num_groups - 1}, got {group!r}")
        row = np.asarray(mask)
        if row.shape != (self.num_device_groups,):
            raise StrategyError(f"mask has shape {row.shape}, expected ({self.num_device_groups},) (one entry per device group)")
        placement = self.placement.copy()
        placement[group] = _as_bool(row, "mask")
        option_row = self.option.copy()
        option_row[group] = option_code(option)
        return Strategy(placement, option_row, self.device_group_sizes, self.batch_split)

    def with_batch_split(self, batch_split: str) -> Strategy:
        return dataclasses.replace(self, batch_split=batch_split)

    # ------------------------------------------------------------------ queries

    @property
    def num_groups(self) -> int:
        return int(self.placement.shape[0])

    @property
    def num_device_groups(self) -> int:
        return int(self.placement.shape[1])

    def option_names(self) -> list[str]:
        return [OPTIONS[o] for o in self.option]

    def devices_covered(self) -> np.ndarray:
        """[G] int64 number of devices each op group runs on."""
        return self.placement.astype(np.int64) @ self.device_group_sizes

    # ------------------------------------------------------------------ identity

    def _key(self) -> tuple:
        return (self.placement.shape, self.placement.tobytes(), self.option.tobytes(),
                self.device_group_sizes.tobytes(), self.batch_split)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Strategy):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        rows = [f"{''.join('1' if b else '0' for b in self.placement[g])}/{_OPTION_ABBREVIATIONS[self.option[g]]}"
                for g in range(min(self.num_groups, _REPR_ROWS))]
        if self.num_groups > _REPR_ROWS:
            rows.append(f"... +{self.num_groups - _REPR_ROWS}")
        return f"Strategy(G={self.num_groups}, M={self.num_device_groups}, {self.batch_split}: {' '.join(rows)})"


# --------------------------------------------------------------------------------------- replicas


class Replicas(NamedTuple):
    """Where one op group runs and what share of the work each of its R devices does.

    ``batch_fraction[r]``: the fraction of the global batch device r's copy of the ops processes.
    ``op_fraction[r]``: the fraction of the group's ops (by compute) device r runs.

    ======================  ===========================  ==============================
    option                  batch_fraction               op_fraction
    ======================  ===========================  ==============================
    ALLREDUCE, PS           split, sums to 1             1 each (every replica: all ops)
    DUPLICATE               1 each (whole batch)         1 each
    MODEL_PARALLEL          1 each (whole batch)         split, sums to 1
    ======================  ===========================  ==============================

    "split" is even (1/R) for ``batch_split == "even"`` and proportional to the devices' peak FLOP/s for
    ``"speed"``. A group on one device is DUPLICATE with (1, 1). Only ALLREDUCE and PS produce gradients
    that need synchronising (R ≥ 2 for them, by the single-device rule).
    """

    devices: np.ndarray  # [R] int64, ascending device ids
    batch_fraction: np.ndarray  # [R] float64
    op_fraction: np.ndarray  # [R] float64
    option: int  # index into OPTIONS

    @property
    def model_parallel(self) -> bool:
        """The devices share the group's ops, not the batch."""
        return self.option == MODEL_PARALLEL

    @property
    def synchronised(self) -> bool:
        """Gradients of the group are summed across replicas (all-reduce or PS)."""
        return self.option in SYNC_OPTIONS

    def pairs(self) -> list[tuple[int, float]]:
        """[(device, batch_fraction)] in device order."""
        return [(int(d), float(f)) for d, f in zip(self.devices, self.batch_fraction)]


def replicas(strategy: Strategy, cluster: Cluster, group: int, *, dtype: str = "fp32") -> Replicas:
    """Devices of op group ``group`` and their batch and op fractions (see :class:`Replicas`).

    The devices are every device of the device groups the group's mask selects, in ascending id order.
    ``dtype`` picks the peak FLOP/s used by the ``"speed"`` split. StrategyError if the strategy's
    device groups are not those of ``cluster``.
    """
    _check_cluster(strategy, cluster)
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or not 0 <= group < strategy.num_groups:
        raise StrategyError(f"op group must be in 0..{strategy.num_groups - 1}, got {group!r}")
    devices = np.flatnonzero(strategy.placement[group][cluster.device_group])
    weight = cluster.peak_flops(dtype)[devices] if strategy.batch_split == "speed" else np.ones(len(devices))
    share = weight / weight.sum()
    whole = np.ones(len(devices))
    option = int(strategy.option[group])
    batch_fraction = share if option in SYNC_OPTIONS else whole
    op_fraction = share if option == MODEL_PARALLEL else whole
    return Replicas(devices.astype(np.int64), batch_fraction, op_fraction, option)


def replica_fractions(strategy: Strategy, cluster: Cluster, *, dtype: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
    """:func:`replicas` for every op group at once, as dense matrices.

    Returns ``(batch_fraction [G, D], op_fraction [G, D])``, 0 on the devices a group does not use.
    """
    _check_cluster(strategy, cluster)
    on = strategy.placement[:, cluster.device_group]  # [G, D]
    weight = cluster.peak_flops(dtype) if strategy.batch_split == "speed" else np.ones(cluster.num_devices)
    weighted = on * weight[None, :]  # [G, D]
    share = weighted / weighted.sum(axis=1, keepdims=True)
    whole = on.astype(np.float64)
    splits_batch = np.isin(strategy.option, SYNC_OPTIONS)[:, None]
    splits_ops = (strategy.option == MODEL_PARALLEL)[:, None]
    return np.where(splits_batch, share, whole), np.where(splits_ops, share, whole)


# --------------------------------------------------------------------------------------- validation


def _check_cluster(strategy: Strategy, cluster: Cluster) -> None:
    sizes = device_group_sizes(cluster)
    if not np.array_equal(sizes, strategy.device_group_sizes):
        raise StrategyError(
            f"the strategy is for {strategy.num_device_groups} device groups of "
            f"{strategy.device_group_sizes.tolist()} devices, but cluster {cluster.name!r} has "
            f"{len(sizes)} of {sizes.tolist()}")


def _check_num_groups(num_groups: Any) -> int:
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or num_groups < 1:
        raise StrategyError(f"the number of op groups must be a positive integer, got {num_groups!r}")
    return int(num_groups)


def _check_sizes(values: Any) -> np.ndarray:
    sizes = np.asarray(values)
    if sizes.ndim != 1 or sizes.size == 0:
        raise StrategyError(f"device_group_sizes must be a non-empty vector [M], got shape {sizes.shape}")
    if not np.issubdtype(sizes.dtype, np.integer) or (sizes < 1).any():
        raise StrategyError(f"device_group_sizes must hold positive integers, got {sizes.tolist()}")
    return sizes.astype(np.int64)


def _as_bool(values: np.ndarray, field: str) -> np.ndarray:
    if values.dtype == bool:
        return values.copy()
    if values.dtype.kind not in "iuf" or not np.isin(values, (0, 1)).all():
        raise StrategyError(f"{field} must hold 0/1 or booleans")
    return values.astype(bool)


def _check_placement(values: Any, num_device_groups: int) -> np.ndarray:
    try:
        placement = np.asarray(values)
    except ValueError:
        raise StrategyError("placement must be a [G, M] matrix (rows of equal length)") from None
    if placement.ndim != 2:
        raise StrategyError(f"placement must be a [G, M] matrix, got shape {placement.shape}")
    if placement.shape[0] == 0:
        raise StrategyError("placement has no rows: a strategy needs at least one op group")
    if placement.shape[1] != num_device_groups:
        raise StrategyError(f"placement has {placement.shape[1]} columns, but there are {num_device_groups} "
                            "device groups (one column each)")
    placement = _as_bool(placement, "placement")
    empty = np.flatnonzero(~placement.any(axis=1))
    if len(empty):
        raise StrategyError(f"op group {empty[0]} is placed on no device group (placement row {empty[0]} is empty)")
    return placement


def _check_options(values: Any, num_groups: int) -> np.ndarray:
    option = np.asarray(values, dtype=object if not isinstance(values, np.ndarray) else None)
    if option.ndim != 1:
        raise StrategyError(f"option must be a vector [G], got shape {option.shape}")
    if len(option) != num_groups:
        raise StrategyError(f"option has {len(option)} entries for {num_groups} op groups")
    if option.dtype.kind in "iu":
        bad = np.flatnonzero((option < 0) | (option >= len(OPTIONS)))
        if len(bad):
            raise StrategyError(f"option[{bad[0]}] = {option[bad[0]]} is not an option; expected 0..{len(OPTIONS) - 1} "
                                f"({', '.join(OPTIONS)})")
        return option.astype(np.int8)
    codes = np.empty(num_groups, dtype=np.int8)
    for g, value in enumerate(option):
        try:
            codes[g] = option_code(value)
        except StrategyError as error:
            raise StrategyError(f"option[{g}]: {error}") from None
    return codes


def _canonical_options(placement: np.ndarray, option: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``option`` [G] with the single-device rule applied to ``placement`` [G, M] (sizes [M])."""
    single = placement.astype(np.int64) @ sizes == 1
    return np.where(single, np.int8(SINGLE_DEVICE_OPTION), option).astype(np.int8)
