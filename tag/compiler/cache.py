"""What compiling strategies keeps from one call to the next: an object its owner creates and passes in.

A planner, a search, or any caller that compiles many strategies of one grouping on one cluster creates one
:class:`CompilerCache` and hands it to :func:`~tag.compiler.compile_strategy`,
:func:`~tag.compiler.evaluate_strategy` and :class:`~tag.compiler.StrategyEvaluator`; a call given none makes
its own and keeps nothing. Nothing is stashed on the grouping or the cluster. The cache holds:

- the :class:`~tag.compiler.tables.CompilerTables` of each (grouping, GPU types, cost model, granularity);
- the :class:`~tag.compiler.layout.ClusterContext` of each (cluster, tables): layouts, bundle plans and
  skeletons, rings and parameter servers, model-parallel cuts;
- the :class:`~tag.compiler.StrategyEvaluator` of each (grouping, cluster, granularity, cost model), with
  its fragments (:func:`tag.compiler.evaluate.strategy_evaluator`).

Entries are keyed by the identity of the grouping and cluster objects and hold them, so a key stays valid as
long as the cache lives: give a planning run one cache and let it go with the run.
"""

from __future__ import annotations

from typing import Any

from tag.cluster import Cluster
from tag.cost import CostModel
from tag.grouping import GroupGraph
from tag.compiler.layout import ClusterContext, make_context
from tag.compiler.tables import CompilerTables, build_tables

__all__ = ["CompilerCache", "compiler_tables", "cluster_context"]


class CompilerCache:
    """Tables, cluster contexts and evaluators of one planning run (module docstring)."""

    def __init__(self) -> None:
        self.tables: dict[tuple, CompilerTables] = {}  # (grouping id, granularity, GPU type names, cost) -> tables
        self.contexts: dict[tuple[int, int], ClusterContext] = {}  # (cluster id, tables id) -> its context
        self.evaluators: dict[tuple, Any] = {}  # (grouping id, cluster id, granularity, cost) -> StrategyEvaluator

    def clear(self) -> None:
        """Forget everything (what a long-lived owner does between groupings or clusters)."""
        self.tables.clear()
        self.contexts.clear()
        self.evaluators.clear()


def compiler_tables(group_graph: GroupGraph, cluster: Cluster, cost: CostModel, granularity: str, *,
                    cache: CompilerCache | None = None) -> CompilerTables:
    """The tables of ``group_graph`` for the GPU types of ``cluster``: ``cache``'s, made and kept there on a
    miss (None: made for this call)."""
    key = (id(group_graph), granularity, tuple(t.name for t in cluster.types), cost)
    tables = None if cache is None else cache.tables.get(key)
    if tables is None:
        tables = build_tables(group_graph, tuple(cluster.types), cost, granularity)
        if cache is not None:
            cache.tables[key] = tables  # the tables hold the grouping: its id stays its own
    return tables


def cluster_context(cluster: Cluster, tables: CompilerTables, *, cache: CompilerCache | None = None
                    ) -> ClusterContext:
    """The context of ``cluster`` for ``tables``: ``cache``'s, made and kept there on a miss (None: made for
    this call)."""
    key = (id(cluster), id(tables))
    context = None if cache is None else cache.contexts.get(key)
    if context is None:
        context = make_context(cluster, tables)
        if cache is not None:
            cache.contexts[key] = context  # the context holds the cluster and the tables
    return context
