"""Run plans on torch.distributed: per-rank programs from a compiled plan, checked against one device.

``build_program`` / ``resolve_program`` make the executable train step of a model; ``run_strategy`` runs a
placement plan, ``run_pipeline`` a pipeline or graph pipeline plan; ``WorkerPool`` keeps rank processes
alive between runs.
"""

from tag.execute.launch import WorkerPool
from tag.execute.lower import ExecutionError, RankProgram, lower_plan
from tag.execute.pipeline import lower_pipeline, run_pipeline
from tag.execute.program import Program, batch_coupled_ops, build_program, resolve_program, zoo_program
from tag.execute.run import CHECK_TOLERANCE, RunResult, run_strategy

__all__ = ["Program", "build_program", "resolve_program", "zoo_program", "batch_coupled_ops", "lower_plan",
           "RankProgram", "ExecutionError", "RunResult", "run_strategy", "lower_pipeline", "run_pipeline",
           "WorkerPool", "CHECK_TOLERANCE"]
