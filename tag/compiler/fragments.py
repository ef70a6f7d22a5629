"""The search's pair fragments as a compiled kernel: their own tasks (transfers and collectives with their
dependencies, tensors and reads), numbered as ``compile_strategy`` numbers them (:mod:`tag.compiler.evaluate`;
a replicated group's rows: :mod:`tag.compiler.rows`)."""

from __future__ import annotations

import numpy as np

from tag._compiled import jit
from tag.sim.taskgraph import TASK_COLLECTIVE, TASK_TRANSFER
from tag.compiler.costs import ps_seconds, ring_allreduce_seconds, transfer_seconds

# Longer than ~80 lines for a reason: the hot loop of a cold evaluation (every new pair's transfers and collectives
# with their waits). Split into steps (sizes, transfers, collectives; even inlined) it ran 10-20% slower, its
# output columns no longer known apart from its inputs; tests/test_compiler.py holds it to compile_strategy.
@jit
def _pair_fragments(pairs, bundles, list_rows, skeletons, blocks, costs):
    """The own tasks of M pair fragments, with their dependencies, tensors and reads, one fragment after
    another: each fragment's transfers (``_Compiler._instantiate`` for its bundles), then its collectives
    (``_Compiler._emit_collectives``, in its order: bundle by bundle, category by category), numbered as the
    compiler numbers one pair (P's block from 0, C's from ``c_shift[m]``, own tasks from ``first_task[m]``, own
    tensors from ``first_tensor[m]``).

    ``pairs``: (fragment_p, fragment_c, c_shift, first_task, first_tensor, consumer_group, first_bundle,
    bundle_end, list_first), [M] each. Bundles (``bundles``: :meth:`_BundleStore.arrays`): pair m's are
    ``first_bundle[m]:bundle_end[m]``; their producer unit's index in P (-1: input ops), kind (its skeleton's
    row in the skeleton store: ``list_rows[list_first[m] + kind]``), first category (its bytes, tensors and use
    ids) and consumer units' indices in C. Skeletons (``skeletons``: :meth:`_Skeletons.arrays`): transfers with
    their parts, local devices, collectives with their plans (holders, servers, resources, ring). Blocks
    (``blocks``: :meth:`_BlockStore.arrays`), by group fragment id (P's is ``fragment_p[m]``, C's
    ``fragment_c[m]``): R tasks per unit (unit u's replica r is task u * R + r), a replicated block's on its R
    devices; a model-parallel group's units are its pieces, R = 1, piece u on the u-th of its devices.
    ``costs``: (alpha [D, D], beta [D, D], nic_out [D, D], nic_in [D, D] (-1: none), use_sync_index [Q],
    use_bytes [Q], link_base, D). Returns (duration, kind, nres, res, dep_task, dep_on, tensor_device,
    tensor_bytes, tensor_producer, read_tensor, read_task, counts [M, 6]: tasks, resources, dependencies,
    tensors, reads and transfers of each fragment).
    """
    (fragment_p, fragment_c, c_shift, first_task, first_tensor, consumer_group, first_bundle, bundle_end,
     list_first) = pairs
    (bundle_unit, bundle_kind, bundle_category, consumer_first, consumer_end, category_bytes, category_count,
     bundle_consumer, category_use_first, category_use_end, category_use) = bundles
    (sk_first_transfer, sk_transfers, tr_src, tr_dst, tr_stage, tr_first_part, tr_parts, part_category, part_fraction,
     sk_local, sk_coll_first, sk_colls, coll_category, coll_ps, sk_holder_first, sk_holders, holder_device,
     server_latency, server_inverse, sk_held_first, sk_helds, held_res, sk_ring_bandwidth, sk_ring_latency) = skeletons
    block_replicas, block_mp, block_row, block_index, block_device0, block_unit0, block_device, block_tensor_first \
        = blocks
    alpha, beta, nic_out, nic_in, use_sync_index, use_bytes, link_base, num_devices = costs
    m_pairs = fragment_p.size
    # sizes first (bounds for dependencies, reads and resources), so that every column is allocated once
    transfers = 0
    collectives = 0
    deps = 0
    resources = 0
    for m in range(m_pairs):
        r_c = block_replicas[fragment_c[m]]
        for b in range(first_bundle[m], bundle_end[m]):
            sk = list_rows[list_first[m] + bundle_kind[b]]
            n = sk_transfers[sk]
            transfers += n
            consumers = consumer_end[b] - consumer_first[b]
            # each transfer waits for its source, and an AddN forward for stage-1 transfers; each consumer
            # replica waits for its local copy and for the transfers into its device; each collective waits
            # for every holder, and every consumer replica for it
            deps += n * (1 + n) + consumers * (r_c + n)
            resources += 3 * n
            c = sk_colls[sk]
            collectives += c
            deps += c * (sk_holders[sk] + consumers * r_c)
            resources += c * sk_helds[sk]
    tasks = transfers + collectives
    duration = np.empty(tasks)
    kind = np.empty(tasks, dtype=np.int8)
    nres = np.empty(tasks, dtype=np.int64)
    res = np.empty(resources, dtype=np.int64)
    dep_task = np.empty(deps, dtype=np.int64)
    dep_on = np.empty(deps, dtype=np.int64)
    read_tensor = np.empty(deps, dtype=np.int64)
    read_task = np.empty(deps, dtype=np.int64)
    tensor_device = np.empty(transfers, dtype=np.int64)
    tensor_bytes = np.empty(transfers)
    tensor_producer = np.empty(transfers, dtype=np.int64)
    counts = np.zeros((m_pairs, 6), dtype=np.int64)
    t = 0  # tasks so far (all fragments)
    n_tensors = 0
    h = 0  # resources
    e = 0  # dependencies
    q = 0  # reads
    for m in range(m_pairs):
        t_pair, h_pair, e_pair, q_pair = t, h, e, q
        fp, fc = fragment_p[m], fragment_c[m]
        r_c = block_replicas[fc]
        p_r = block_replicas[fp]
        index = block_index[block_row[fp]]
        p_mp, c_mp = block_mp[fp], block_mp[fc]
        p_devices = block_device[block_device0[fp]:]
        c_devices = block_device[block_device0[fc]:]
        p_first_tensor = block_tensor_first[block_unit0[fp]:]
        own_task, own_tensor = first_task[m] - t_pair, first_tensor[m] - t_pair  # + t: task t's id, tensor's
        for b in range(first_bundle[m], bundle_end[m]):
            sk = list_rows[list_first[m] + bundle_kind[b]]
            first = sk_first_transfer[sk]
            n = sk_transfers[sk]
            unit = bundle_unit[b]
            p_base = unit * p_r if unit >= 0 else -1
            p_first = p_first_tensor[unit] if unit >= 0 else -1
            c0 = bundle_category[b]
            t0 = t
            for i in range(first, first + n):
                src, dst = tr_src[i], tr_dst[i]
                k = tr_first_part[i]
                nbytes = category_bytes[c0 + part_category[k]] * part_fraction[k]
                for k in range(tr_first_part[i] + 1, tr_first_part[i] + tr_parts[i]):
                    nbytes += category_bytes[c0 + part_category[k]] * part_fraction[k]
                count = 0  # a message per tensor of each category counted (the parts')
                for k in range(tr_first_part[i], tr_first_part[i] + tr_parts[i]):
                    count += category_count[c0 + part_category[k]]
                duration[t] = transfer_seconds(count, alpha[src, dst], beta[src, dst], nbytes)
                kind[t] = TASK_TRANSFER
                nres[t] = 1
                if nic_out[src, dst] >= 0:
                    res[h] = nic_out[src, dst]
                    h += 1
                    nres[t] += 1
                if nic_in[src, dst] >= 0:
                    res[h] = nic_in[src, dst]
                    h += 1
                    nres[t] += 1
                res[h] = link_base + src * num_devices + dst
                h += 1
                task = own_task + t
                replica = _replica(unit, src, p_r, index, p_devices, p_mp)
                if replica >= 0:  # it sends the producer's copy on its source
                    dep_task[e] = task
                    dep_on[e] = p_base + replica
                    e += 1
                    if p_first >= 0:
                        read_tensor[q] = p_first + replica
                        read_task[q] = task
                        q += 1
                if tr_stage[i] == 2:  # an AddN root forwards what reached it in stage 1
                    for j in range(first, first + n):
                        if tr_stage[j] == 1 and tr_dst[j] == src:
                            dep_task[e] = task
                            dep_on[e] = own_task + t0 + j - first
                            e += 1
                            read_tensor[q] = own_tensor + t0 + j - first
                            read_task[q] = task
                            q += 1
                tensor_device[n_tensors] = dst
                tensor_bytes[n_tensors] = nbytes
                tensor_producer[n_tensors] = task
                n_tensors += 1
                t += 1
            for c in range(consumer_first[b], consumer_end[b]):
                c_first = bundle_consumer[c] * r_c
                for r in range(r_c):
                    device = c_devices[bundle_consumer[c]] if c_mp else c_devices[r]
                    task = c_shift[m] + c_first + r
                    replica = _replica(unit, device, p_r, index, p_devices, p_mp)
                    if sk_local[sk * num_devices + device] and replica >= 0 and p_base + replica != task:
                        dep_task[e] = task
                        dep_on[e] = p_base + replica
                        e += 1
                        if p_first >= 0:
                            read_tensor[q] = p_first + replica
                            read_task[q] = task
                            q += 1
                    for j in range(first, first + n):
                        if tr_dst[j] == device:
                            dep_task[e] = task
                            dep_on[e] = own_task + t0 + j - first
                            e += 1
                            read_tensor[q] = own_tensor + t0 + j - first
                            read_task[q] = task
                            q += 1
        counts[m, 5] = t - t_pair
        # the collectives: each waits for the producer unit's replica on each of its devices and reads its
        # output there; every replica of every consumer unit waits for it
        for b in range(first_bundle[m], bundle_end[m]):
            sk = list_rows[list_first[m] + bundle_kind[b]]
            holders = sk_holders[sk]
            h0 = sk_holder_first[sk]
            for j in range(sk_coll_first[sk], sk_coll_first[sk] + sk_colls[sk]):
                category = bundle_category[b] + coll_category[j]
                task = own_task + t
                if coll_ps[j]:
                    duration[t] = ps_seconds(server_latency, server_inverse, h0, holders, consumer_group[m],
                                             category_use, category_use_first[category],
                                             category_use_end[category], use_sync_index, use_bytes)
                else:
                    duration[t] = ring_allreduce_seconds(holders, sk_ring_bandwidth[sk], sk_ring_latency[sk],
                                                         category_bytes[category], category_count[category])
                kind[t] = TASK_COLLECTIVE
                nres[t] = sk_helds[sk]
                for k in range(sk_held_first[sk], sk_held_first[sk] + sk_helds[sk]):
                    res[h] = held_res[k]
                    h += 1
                unit = bundle_unit[b]
                if unit >= 0:
                    p_first = p_first_tensor[unit]
                    for k in range(h0, h0 + holders):
                        replica = _replica(unit, holder_device[k], p_r, index, p_devices, p_mp)
                        dep_task[e] = task
                        dep_on[e] = unit * p_r + replica
                        e += 1
                        if p_first >= 0:
                            read_tensor[q] = p_first + replica
                            read_task[q] = task
                            q += 1
                for c in range(consumer_first[b], consumer_end[b]):
                    c_first = c_shift[m] + bundle_consumer[c] * r_c
                    for r in range(r_c):
                        dep_task[e] = c_first + r
                        dep_on[e] = task
                        e += 1
                t += 1
        counts[m, 0] = t - t_pair
        counts[m, 1] = h - h_pair
        counts[m, 2] = e - e_pair
        counts[m, 3] = counts[m, 5]
        counts[m, 4] = q - q_pair
    return (duration, kind, nres, res[:h].copy(), dep_task[:e].copy(), dep_on[:e].copy(), tensor_device,
            tensor_bytes, tensor_producer, read_tensor[:q].copy(), read_task[:q].copy(), counts)


@jit
def _replica(unit, device, replicas, index, devices, model_parallel):
    """The replica of producer unit ``unit`` (-1: input ops, none) on ``device``, -1 if it has none there; the
    producer's block has R = ``replicas`` replicas, ``index`` [D] (replica of each device), ``devices`` (its
    replicas', or a model-parallel block's pieces')."""
    if unit < 0:
        return -1
    if replicas > 1:
        return index[device]
    return 0 if (devices[unit] if model_parallel else devices[0]) == device else -1
