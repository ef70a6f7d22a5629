"""The two consecutive placements of a uniform pipeline that the partitioners' candidates are simulated on.

- **stage-major**: stage s on the s-th run of R devices (the placement Parmesan's search uses);
- **copy-major**: pipeline copy i on the i-th run of S devices, so neighbouring stages share a machine
  where S fits one, as PipeDream maps its copies (stage s on GPU s of every machine).

Each comes with the bandwidth of its stage links (the hops replica i of stage s → replica i of stage
s + 1, NICs shared), the price of a boundary byte a cut for that placement should be made at.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tag.cluster.cluster import Cluster
from tag.cost.comm import hop_bandwidths

__all__ = ["consecutive_placements", "link_bandwidth"]


def consecutive_placements(cluster: Cluster, devices: Sequence[int], stages: int,
                           replicas: int) -> list[tuple[str, list[list[int]], float]]:
    """(name, rows [S][R], bandwidth of the stage links) of each placement (module docstring); one when
    S or R is 1 (the two coincide)."""
    devices = list(devices)[:stages * replicas]
    out = [("stage-major", [devices[s * replicas:(s + 1) * replicas] for s in range(stages)])]
    if stages > 1 and replicas > 1:
        out.append(("copy-major", [[devices[i * stages + s] for i in range(replicas)] for s in range(stages)]))
    return [(name, rows, link_bandwidth(cluster, rows)) for name, rows in out]


def link_bandwidth(cluster: Cluster, rows: list[list[int]]) -> float:
    """Median bandwidth of the hops replica i of stage s → replica i of stage s + 1, NICs shared; inf
    for one stage."""
    hops = [(a[i], b[i]) for a, b in zip(rows, rows[1:]) for i in range(min(len(a), len(b)))]
    return float(np.median(hop_bandwidths(cluster, hops))) if hops else float("inf")
