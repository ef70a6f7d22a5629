"""The compiler (TAG §4.3.1): strategies over op groups → TaskGraphs with the auxiliary ops, and a checker
that proves every consumer gets exactly the data it needs.

Two entry points:

- :func:`compile_strategy` → :class:`CompiledPlan`: the TaskGraph with every inserted op and delivery
  recorded (for reports, traces and :func:`check_compiled`); run it with ``plan.simulate()``;
- :func:`evaluate_strategy` (and :class:`StrategyEvaluator`, which it keeps per grouping, cluster and
  granularity in the caller's :class:`CompilerCache`): what search calls thousands of times. It returns the
  :class:`~tag.sim.SimulationResult` of ``simulate_fast(compile_strategy(...).taskgraph)`` — iteration
  time, peak memory per device, feasibility, and the Table 1 feedback the GNN reads — bit for bit, from
  cached per-group and per-pair fragments and compiled kernels, without building a TaskGraph
  (:mod:`tag.compiler.evaluate`).
"""

from tag.compiler.compile import (
    ADAM_COPIES,
    DEFAULT_FUSION_BYTES,
    CompiledPlan,
    Delivery,
    InsertedOp,
    compile_strategy,
)
from tag.compiler.cache import CompilerCache, cluster_context, compiler_tables
from tag.compiler.check import check_compiled
from tag.compiler.errors import CompileCheckError, CompileError
from tag.compiler.evaluate import StrategyEvaluator, evaluate_strategy, strategy_evaluator
from tag.compiler.generate import random_strategy
from tag.compiler.tables import GRANULARITIES, CompilerTables

__all__ = [
    "compile_strategy", "evaluate_strategy", "StrategyEvaluator", "strategy_evaluator", "check_compiled",
    "random_strategy", "CompiledPlan", "InsertedOp", "Delivery", "GRANULARITIES", "ADAM_COPIES",
    "DEFAULT_FUSION_BYTES", "CompilerTables", "CompilerCache", "compiler_tables", "cluster_context", "CompileError",
    "CompileCheckError",
]
