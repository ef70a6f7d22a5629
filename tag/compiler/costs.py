"""What an inserted communication costs, written once for ``compile_strategy`` and the evaluator's kernels: a
p2p transfer, a ring all-reduce and a parameter-server push + pull. Compiled into the kernels that call them
(:func:`~tag.compiler._inline.inline_jit`) and called as they are by the readable compiler, so the two agree
to the bit. The cluster's figures they take (hop α and β, a ring's slowest hop and latency, a server's
latency and summed inverse bandwidths) come from :class:`~tag.compiler.layout.ClusterContext`."""

from __future__ import annotations

from tag.compiler._inline import inline_jit

__all__ = ["transfer_seconds", "ring_allreduce_seconds", "ps_seconds"]


@inline_jit
def transfer_seconds(count, alpha, beta, nbytes):
    """k·α + S/β: ``nbytes`` in ``count`` messages over a hop of latency ``alpha`` and bandwidth ``beta``
    (nothing moved, no time)."""
    return count * alpha + nbytes / beta if nbytes > 0 else 0.0


@inline_jit
def ring_allreduce_seconds(n, bandwidth, latency, nbytes, count):
    """2(n−1)/n · S/β + k · 2(n−1)·α: a ring all-reduce of ``nbytes`` in ``count`` tensors over ``n`` devices
    whose ring has the slowest hop ``bandwidth`` and the largest hop ``latency``
    (:meth:`~tag.compiler.layout.ClusterContext.ring`); a fusion bucket is one tensor."""
    return 2.0 * (n - 1) / n * nbytes / bandwidth + count * 2.0 * (n - 1) * latency if nbytes > 0 else 0.0


@inline_jit
def ps_seconds(server_latency, server_inverse, first_server, holders, consumer_group, uses, first_use, end_use,
               use_sync_index, use_bytes):
    """A PS push + pull of the uses ``uses[first_use:end_use]`` over ``holders`` devices whose j-th as the
    server has latency ``server_latency[first_server + j]`` and summed inverse bandwidths
    ``server_inverse[first_server + j]`` (:meth:`~tag.compiler.layout.ClusterContext.server`): each use's
    server chosen round robin from ``consumer_group`` (``use_sync_index`` [Q]), its push and pull each at its
    server's latency plus its bytes (``use_bytes`` [Q]) times the inverse bandwidths."""
    seconds = 0.0
    for u in range(first_use, end_use):
        use = uses[u]
        server = first_server + (consumer_group + use_sync_index[use]) % holders
        size = use_bytes[use]
        if size > 0:
            seconds += 2.0 * (server_latency[server] + size * server_inverse[server])
    return seconds
