"""Sufficient factor broadcasting (TAG §4.2.3): per gradient of a replicated op group, an integer program
decides which ops every replica recomputes on the whole batch and which small tensors are broadcast
instead of all-reducing the gradient.

:mod:`tag.sfb.program` is the kernel (one program over arrays, pulp + CBC or enumeration, cached);
:mod:`tag.sfb.plan` runs it over a strategy and merges the decisions per group for the compiler.
"""

from tag.sfb.errors import SFBError
from tag.sfb.plan import DEFAULT_DEPTH, DEFAULT_MAX_OPS, GradientSFB, GroupSFB, SFBPlan, SFBReport, apply_sfb
from tag.sfb.select import SFBSelection, select_sfb
from tag.sfb.program import (
    AUTO_EXHAUSTIVE_OPS,
    DEFAULT_TIME_LIMIT_S,
    EXTERNAL,
    MAX_EXHAUSTIVE_OPS,
    METHODS,
    STATUSES,
    SFBCache,
    SFBDecision,
    problem_signature,
    sfb_objective,
    solve_sfb,
)

__all__ = [
    "solve_sfb", "sfb_objective", "problem_signature", "SFBDecision", "SFBCache", "EXTERNAL", "METHODS", "STATUSES",
    "DEFAULT_TIME_LIMIT_S", "AUTO_EXHAUSTIVE_OPS", "MAX_EXHAUSTIVE_OPS",
    "apply_sfb", "SFBPlan", "GroupSFB", "GradientSFB", "SFBReport", "DEFAULT_DEPTH", "DEFAULT_MAX_OPS",
    "SFBSelection", "select_sfb",
    "SFBError",
]
