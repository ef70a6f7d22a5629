"""The user's model code behind a ``MODULE:FUNCTION`` or ``FILE.py:FUNCTION`` spec.

User code runs with tag's errors around it: an exception, or a ``sys.exit`` at import or in the
function, becomes one :class:`ModelError` naming the spec (never a silent exit with the user's status).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from tag._read import check_input_file, input_is_file
from tag.errors import ModelError, SpecError

__all__ = ["load_user_function", "load_user_step", "describe_failure"]


def describe_failure(error: BaseException) -> str:
    """What user code did, for a message: "raised ValueError: ..." or "called sys.exit(3)"."""
    if isinstance(error, SystemExit):
        return f"called sys.exit({error.code!r})"
    return f"raised {type(error).__name__}: {error}"


def _import_spec(target: str) -> Any:
    """The module named by the left side of a MODULE:FUNCTION or FILE.py:FUNCTION spec."""
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target).expanduser()
        if not input_is_file(path):
            check_input_file(path, what="Python file", error=SpecError)  # says why not
        module_name = f"_tag_user_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise SpecError(f"{target}: cannot be imported as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as error:
            sys.modules.pop(module_name, None)
            raise ModelError(f"{target}: importing it {describe_failure(error)}") from error
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as error:
        if error.name and (target == error.name or target.startswith(error.name + ".")):
            raise SpecError(f"no module named {target!r}") from None
        raise ModelError(f"{target}: importing it raised ModuleNotFoundError: {error}") from error
    except (Exception, SystemExit) as error:
        raise ModelError(f"{target}: importing it {describe_failure(error)}") from error


def load_user_step(spec: str) -> tuple[nn.Module, tuple, Callable, tuple]:
    """Call ``"package.module:function"`` or ``"path/to/file.py:function"``; it must return
    ``(model, example_inputs, loss_fn)`` or ``(model, example_inputs, loss_fn, targets)``, where
    ``loss_fn(model(*example_inputs), *targets)`` is the loss and ``targets`` (labels, with the batch in dim
    0) are inputs of the train step, not constants. Returns the four (``targets`` empty if none). SpecError
    if the spec does not resolve, ModelError if the function fails or returns something else."""
    if not isinstance(spec, str) or ":" not in spec:
        raise SpecError(f"model spec {spec!r} must look like MODULE:FUNCTION or FILE.py:FUNCTION")
    target, _, function_name = spec.rpartition(":")
    if not target or not function_name.isidentifier():
        raise SpecError(f"model spec {spec!r} must look like MODULE:FUNCTION or FILE.py:FUNCTION")
    with contextlib.redirect_stdout(sys.stderr):  # the user's prints must not break `--json` on stdout
        module = _import_spec(target)
    function = getattr(module, function_name, None)
    if function is None:
        raise SpecError(f"{target} has no function {function_name!r}")
    if not callable(function):
        raise SpecError(f"{target}:{function_name} is a {type(function).__name__}, not a function")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = function()
    except (Exception, SystemExit) as error:
        raise ModelError(f"{spec} {describe_failure(error)}") from error
    if not isinstance(result, (tuple, list)) or len(result) not in (3, 4):
        got = f"a {len(result)}-tuple" if isinstance(result, (tuple, list)) else type(result).__name__
        raise ModelError(f"{spec} must return (model, example_inputs, loss_fn[, targets]), got {got}")
    model, inputs, loss_fn = result[:3]
    targets = result[3] if len(result) == 4 else ()
    if isinstance(targets, torch.Tensor):
        targets = (targets,)
    if not isinstance(targets, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in targets):
        raise ModelError(f"{spec}: its loss targets must be a tensor or a tuple of tensors")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(model, nn.Module):
        raise ModelError(f"{spec} must return (model, example_inputs, loss_fn[, targets]); its model is a {type(model).__name__}")
    if not isinstance(inputs, (tuple, list)) or not all(isinstance(x, torch.Tensor) for x in inputs) or not inputs:
        raise ModelError(f"{spec} must return (model, example_inputs, loss_fn[, targets]); example_inputs must be a tuple of tensors")
    if not callable(loss_fn):
        raise ModelError(f"{spec} must return (model, example_inputs, loss_fn[, targets]); its loss_fn is not callable")
    return model, tuple(inputs), loss_fn, tuple(targets)


def load_user_function(spec: str) -> tuple[nn.Module, tuple, Callable]:
    """:func:`load_user_step` for a function that returns no loss targets: ``(model, example_inputs,
    loss_fn)``; ModelError if it returns targets."""
    model, inputs, loss_fn, targets = load_user_step(spec)
    if targets:
        raise ModelError(f"{spec} returns loss targets; load it with load_user_step")
    return model, inputs, loss_fn
