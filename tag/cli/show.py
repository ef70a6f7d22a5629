"""``tag show MODEL [--cluster C]``: ops by role, parameters, FLOPs, training memory, where the model fits."""

from __future__ import annotations

import argparse

from tag.cli.args import add_json, add_model, add_profile, named, profile_cost

__all__ = ["add_parser", "run", "model_summary"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("show", help="summarise a model: ops by role, parameters, FLOPs, memory, where it fits")
    add_model(p)
    p.add_argument("--cluster", type=named, help="preset NAME[:ARGS] or a YAML/JSON spec file")
    add_json(p)
    add_profile(p)
    p.set_defaults(func=run)


def model_summary(graph) -> dict:
    """What ``tag show`` and ``tag trace`` report of a model's graph."""
    from tag.cost import training_memory_bytes

    return {
        "model": graph.meta.get("model", ""),
        "source": graph.meta.get("source", ""),
        "batch_size": graph.batch_size,
        "parameters": graph.parameters,
        "parameter_bytes": graph.total_param_bytes(),
        "ops": {role: n for role, n in graph.count_by_role().items()},
        "edges": graph.num_edges,
        "flops_per_iteration": graph.total_flops(),
        "training_memory_bytes": float(training_memory_bytes(graph)),
    }


def _fit_rows(graph, cluster, memory_bytes: float, cost=None) -> list[dict]:
    import numpy as np

    from tag.cost import CostModel

    cost = CostModel() if cost is None else cost
    return [{"gpu": gpu.name, "count": int(np.sum(cluster.device_type == t)), "memory_bytes": gpu.memory_bytes,
             "fits": bool(memory_bytes <= gpu.memory_bytes),
             "single_device_iteration_s": float(cost.op_times(graph, gpu).sum())}
            for t, gpu in enumerate(cluster.types)]


def run(args: argparse.Namespace) -> dict:
    from tag.graph.resolve import resolve_model

    cluster = None
    if args.cluster:  # resolved first: it is cheap and a bad one should fail before a long trace
        from tag.cluster import resolve_cluster

        cluster = resolve_cluster(args.cluster)
    cost = profile_cost(args)
    graph = resolve_model(args.model, batch_size=args.batch_size, tiny=args.tiny)
    payload = model_summary(graph)
    if cluster is not None:
        payload["cluster"] = {"name": cluster.name, "devices": cluster.num_devices}
        payload["fits_on"] = _fit_rows(graph, cluster, payload["training_memory_bytes"], cost)
    if not args.json:
        from tag.cli.report import render_show

        render_show(payload)
    return payload
