"""The search's fragments as compiled kernels: a replicated group's rows, and the own tasks of pair fragments
(transfers and collectives with their dependencies, tensors and reads), numbered as ``compile_strategy``
numbers them (:mod:`tag.compiler.evaluate`)."""

from __future__ import annotations

import numpy as np

from tag._compiled import jit
from tag.sim.taskgraph import TASK_COLLECTIVE, TASK_TRANSFER

@jit
def _replica_rows(g, r, devices, fractions, first, unit_ptr, unit_ids, unit_rank, unit_out_rows, unit_out_fixed,
                  local_ptr, local_src, local_dst, local_dep, persistent, task_base, tensor_base, dep_task, dep_on,
                  read_tensor, read_task, tensor_device, tensor_bytes, tensor_producer, tensor_persistent, e, q, n):
    """Write the rows of group ``g`` replicated on the R = ``r`` devices ``devices[first:first + r]`` with batch
    fractions ``fractions[first:first + r]``, as ``_Compiler.group_fragment`` lists them: its tasks are
    unit-major then replica (unit u's replica j is task ``task_base + u * r + j``, on the j-th device); every
    pair of its units that read each other (``local_src -> local_dst``, CSR ``local_ptr``, unit indices) adds
    a dependency per replica where ``local_dep`` says so, at ``e``, and a read per replica where the source
    outputs, at ``q``; each unit that outputs (``unit_rank`` >= 0: its rank among them) has a tensor per
    replica, numbered in unit order from ``tensor_base`` and written at ``n``, of the layout's bytes
    (batch-scaled bytes times the fraction, plus the fixed ones); then, if the group has persistent bytes, one
    persistent tensor per device. Returns the next (e, q, n)."""
    first_unit = unit_ptr[g]
    for i in range(local_ptr[g], local_ptr[g + 1]):
        if not local_dep[i]:
            continue
        for j in range(r):
            dep_task[e] = task_base + local_dst[i] * r + j
            dep_on[e] = task_base + local_src[i] * r + j
            e += 1
    for i in range(local_ptr[g], local_ptr[g + 1]):
        rank = unit_rank[first_unit + local_src[i]]
        if rank >= 0:
            for j in range(r):
                read_tensor[q] = tensor_base + rank * r + j
                read_task[q] = task_base + local_dst[i] * r + j
                q += 1
    for u in range(unit_ptr[g + 1] - first_unit):
        if unit_rank[first_unit + u] >= 0:
            unit = unit_ids[first_unit + u]
            for j in range(r):
                tensor_device[n] = devices[first + j]
                tensor_bytes[n] = unit_out_rows[unit] * fractions[first + j] + unit_out_fixed[unit]
                tensor_producer[n] = task_base + u * r + j
                tensor_persistent[n] = False
                n += 1
    if persistent[g] > 0:
        for j in range(r):
            tensor_device[n] = devices[first + j]
            tensor_bytes[n] = persistent[g]
            tensor_producer[n] = -1
            tensor_persistent[n] = True
            n += 1
    return e, q, n


@jit
def _replica_fragments(groups, device_ptr, devices, fractions, unit_ptr, unit_ids, unit_rank, unit_out_rows,
                       unit_out_fixed, local_ptr, local_src, local_dst, local_dep, persistent, num_devices, rows):
    """The group fragments of F replicated layouts, one after another: layout f is group ``groups[f]`` on the
    R devices ``devices[device_ptr[f]:device_ptr[f + 1]]`` with batch fractions ``fractions`` (the same
    slice), its rows as :func:`_replica_rows` writes them, references relative to the fragment. Returns
    (res [tasks]: each task's device, dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer,
    tensor_persistent, read_tensor, read_task, tensor_first (each unit's first output tensor, -1; units of
    layout f after the earlier layouts'), index [F, D] (replica of each device, -1), counts [F, 6]: tasks,
    resources, dependencies, tensors, reads and output tensors of each fragment). Without ``rows`` (compact
    fragments: :func:`_assemble` writes them) the resource, dependency, tensor and read columns are empty and
    only the counts, the units' first output tensors and the index are taken."""
    f_count = groups.size
    counts = np.zeros((f_count, 6), dtype=np.int64)
    units_total = 0
    for f in range(f_count):
        g = groups[f]
        r = device_ptr[f + 1] - device_ptr[f]
        units = unit_ptr[g + 1] - unit_ptr[g]
        outputs = 0
        for u in range(unit_ptr[g], unit_ptr[g + 1]):
            outputs += unit_rank[u] >= 0
        reads = 0
        deps = 0
        for i in range(local_ptr[g], local_ptr[g + 1]):
            reads += unit_rank[unit_ptr[g] + local_src[i]] >= 0
            deps += local_dep[i]
        counts[f, 0] = counts[f, 1] = units * r
        counts[f, 2] = deps * r
        counts[f, 3] = (outputs + (persistent[g] > 0)) * r
        counts[f, 4] = reads * r
        counts[f, 5] = outputs * r
        units_total += units
    totals = counts.sum(axis=0) if rows else np.zeros(6, dtype=np.int64)
    res = np.empty(totals[0], dtype=np.int64)
    dep_task = np.empty(totals[2], dtype=np.int64)
    dep_on = np.empty(totals[2], dtype=np.int64)
    tensor_device = np.empty(totals[3], dtype=np.int64)
    tensor_bytes = np.empty(totals[3])
    tensor_producer = np.empty(totals[3], dtype=np.int64)
    tensor_persistent = np.zeros(totals[3], dtype=np.bool_)
    read_tensor = np.empty(totals[4], dtype=np.int64)
    read_task = np.empty(totals[4], dtype=np.int64)
    tensor_first = np.empty(units_total, dtype=np.int64)
    index = np.full((f_count, num_devices), -1, dtype=np.int64)
    t = 0
    w = 0  # into tensor_first
    e = q = n = 0
    for f in range(f_count):
        g = groups[f]
        first = device_ptr[f]
        r = device_ptr[f + 1] - first
        units = unit_ptr[g + 1] - unit_ptr[g]
        for k in range(r):
            index[f, devices[first + k]] = k
        for u in range(units):
            if rows:
                for k in range(r):
                    res[t + u * r + k] = devices[first + k]
            rank = unit_rank[unit_ptr[g] + u]
            tensor_first[w + u] = rank * r if rank >= 0 else -1
        if rows:
            e, q, n = _replica_rows(g, r, devices, fractions, first, unit_ptr, unit_ids, unit_rank, unit_out_rows,
                                    unit_out_fixed, local_ptr, local_src, local_dst, local_dep, persistent, 0, 0,
                                    dep_task, dep_on, read_tensor, read_task, tensor_device, tensor_bytes,
                                    tensor_producer, tensor_persistent, e, q, n)
        t += units * r
        w += units
    return (res, dep_task, dep_on, tensor_device, tensor_bytes, tensor_producer, tensor_persistent, read_tensor,
            read_task, tensor_first, index, counts)


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
                duration[t] = count * alpha[src, dst] + nbytes / beta[src, dst] if nbytes > 0 else 0.0
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
                if coll_ps[j]:  # ps_seconds: each use's push and pull at its server
                    seconds = 0.0
                    for u in range(category_use_first[category], category_use_end[category]):
                        use = category_use[u]
                        server = h0 + (consumer_group[m] + use_sync_index[use]) % holders
                        size = use_bytes[use]
                        if size > 0:
                            seconds += 2.0 * (server_latency[server] + size * server_inverse[server])
                    duration[t] = seconds
                else:  # ring_allreduce_seconds
                    nbytes = category_bytes[category]
                    duration[t] = (2.0 * (holders - 1) / holders * nbytes / sk_ring_bandwidth[sk]
                                   + category_count[category] * 2.0 * (holders - 1) * sk_ring_latency[sk]
                                   if nbytes > 0 else 0.0)
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
