"""The stage partitioner's DP as one compiled pass over a flat program of table operations.

A table ``F [D+1, O+1]`` holds, for d devices and an in-flight count o of the stage that follows a
subgraph, the least in-flight count of the subgraph's entry stage(s) (``INF`` when no strategy meets the
target); every table is non-increasing in d (devices may stay idle) and non-decreasing in o. The
program (built once per block graph, :class:`tag.graphpipe.partition._Program`) lists operations whose
arguments are earlier slots, so one call evaluates the whole DP for a target without Python in the loop.
"""

from __future__ import annotations

import numpy as np

from tag._compiled import jit

INF = 1 << 30

# operation codes: (arg_a, arg_b) are a candidate id for STAGE and earlier slots otherwise
STAGE, SERIES, PARALLEL, MIN, SHIFT, SERIES_ID, PARALLEL_ID = range(7)


@jit
def run_program(kind: np.ndarray, arg_a: np.ndarray, arg_b: np.ndarray, omax: np.ndarray,
                depth_limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(val [P, D+1, O+1], choice [P, D+1, O+1]) of every slot of the program ``kind``/``arg_a``/
    ``arg_b`` [P]; ``omax`` [C, D+1] is the most micro-batches candidate c may hold in flight on d
    replicas (-1 where it misses the target), ``depth_limit`` = O. ``choice`` is the devices of the
    first argument for SERIES / PARALLEL and 1 where MIN took its second argument."""
    num_ops = kind.shape[0]
    num = omax.shape[1]
    width = depth_limit + 1
    val = np.full((num_ops, num, width), INF, dtype=np.int32)
    choice = np.zeros((num_ops, num, width), dtype=np.int16)
    for p in range(num_ops):
        k = kind[p]
        a = arg_a[p]
        b = arg_b[p]
        if k == STAGE:
            for d in range(1, num):
                for o in range(width):
                    v = o + 1
                    if v <= depth_limit and v <= omax[a, d]:
                        val[p, d, o] = v
                    if val[p, d - 1, o] < val[p, d, o]:
                        val[p, d, o] = val[p, d - 1, o]
        elif k == SERIES:  # a runs before b: the later part is solved first
            for d in range(2, num):
                for d1 in range(1, d):  # both parts are subgraphs: each needs a device
                    d2 = d - d1
                    for o in range(width):
                        v = val[b, d2, o]
                        if v < width:
                            w = val[a, d1, v]
                            if w < val[p, d, o]:
                                val[p, d, o] = w
                                choice[p, d, o] = d1
        elif k == PARALLEL:
            for d in range(2, num):
                for d1 in range(1, d):
                    d2 = d - d1
                    for o in range(width):
                        x = val[a, d1, o]
                        y = val[b, d2, o]
                        w = x if x > y else y
                        if w < val[p, d, o]:
                            val[p, d, o] = w
                            choice[p, d, o] = d1
        elif k == MIN:
            for d in range(num):
                for o in range(width):
                    if val[b, d, o] < val[a, d, o]:
                        val[p, d, o] = val[b, d, o]
                        choice[p, d, o] = 1
                    else:
                        val[p, d, o] = val[a, d, o]
        elif k == SHIFT:  # the subgraph feeds a stage that holds one more micro-batch
            for d in range(num):
                for o in range(width - 1):
                    val[p, d, o] = val[a, d, o + 1]
        elif k == SERIES_ID:
            for d in range(num):
                for o in range(width):
                    val[p, d, o] = o
        else:  # PARALLEL_ID
            for d in range(num):
                for o in range(width):
                    val[p, d, o] = 0
    return val, choice
