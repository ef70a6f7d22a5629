"""The compiler (TAG §4.3.1): strategies over op groups → TaskGraphs with the auxiliary ops, and a checker
that proves every consumer gets exactly the data it needs."""

from tag.compiler.compile import (
    ADAM_COPIES,
    DEFAULT_FUSION_BYTES,
    CompiledPlan,
    Delivery,
    InsertedOp,
    compile_strategy,
)
from tag.compiler.check import check_compiled
from tag.compiler.errors import CompileCheckError, CompileError
from tag.compiler.generate import random_strategy
from tag.compiler.tables import GRANULARITIES, CompilerTables, compiler_tables

__all__ = [
    "compile_strategy", "check_compiled", "random_strategy", "CompiledPlan", "InsertedOp", "Delivery", "GRANULARITIES", "ADAM_COPIES",
    "DEFAULT_FUSION_BYTES", "CompilerTables", "compiler_tables", "CompileError", "CompileCheckError",
]
