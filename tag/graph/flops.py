"""FLOPs of one aten op call, from PyTorch's flop registry with a documented fallback.

``op_flops(op, args, kwargs, out)`` mirrors how ``torch.utils.flop_counter.FlopCounterMode`` counts:
it looks the op's ``OpOverloadPacket`` up in ``torch.utils.flop_counter.flop_registry`` and calls the
entry as ``formula(*args, **kwargs, out_val=out)`` (tensors, fake or real, are reduced to shapes by the
registry's own wrapper). Ops the registry does not cover get the fallback below; the registry counts
only matmul, convolution and attention kernels, so most element-wise work is fallback work.

Fallback table (``FALLBACK_RULES``), applied in this order; "elements" means tensor elements:

=================  ============================================================  =====================
rule               ops                                                           FLOP
=================  ============================================================  =====================
attention          ``_scaled_dot_product_flash_attention_for_cpu`` (+ backward)  registry's SDPA count
free               views, aliases, getitem, copies and dtype casts, factories,   0
                   concatenation, indexing, gather/scatter, embedding lookups
normalisation      softmax / log-softmax, layer / batch / group norm (fwd, bwd)  4 per input element
reduction          sum, mean, amax/amin, var/std, norm, any/all, losses, argmax  1 per input element
element-wise       every other op with a tensor output                           1 per output element
=================  ============================================================  =====================

The normalisation constant counts a statistics pass, the normalisation and the affine transform.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["op_flops", "FALLBACK_RULES", "FLOP_SOURCE_REGISTRY", "FLOP_SOURCE_FALLBACK", "is_free_op"]

FLOP_SOURCE_REGISTRY = "registry"
FLOP_SOURCE_FALLBACK = "fallback"

NORMALISATION_FLOPS_PER_ELEMENT = 4

# Ops that move or alias memory but do no arithmetic (their cost is in bytes_accessed).
_FREE_OPS = frozenset(
    {
        "getitem", "detach", "alias", "lift_fresh", "lift_fresh_copy", "view", "_unsafe_view", "reshape",
        "t", "transpose", "permute", "expand", "expand_as", "squeeze", "unsqueeze", "slice", "select",
        "as_strided", "unfold", "split", "split_with_sizes", "unbind", "chunk", "narrow", "flatten",
        "unflatten", "view_as", "view_copy", "t_copy", "transpose_copy", "permute_copy", "expand_copy",
        "squeeze_copy", "unsqueeze_copy", "slice_copy", "select_copy", "as_strided_copy", "alias_copy",
        "clone", "copy", "copy_", "_to_copy", "to", "contiguous", "_reshape_alias", "cat", "stack",
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
        "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "scalar_tensor",
        "arange", "tensor", "fill", "fill_", "zero", "zero_", "index", "index_select", "gather", "scatter",
        "embedding", "constant_pad_nd", "slice_backward", "select_backward", "index_put",
        "repeat", "roll", "flip", "pad", "_unsafe_index", "diagonal", "tril", "triu", "split_copy", "unbind_copy",
        "sym_size", "sym_stride", "sym_numel", "_local_scalar_dense", "item",
    }
)

_NORMALISATION_OPS = frozenset(
    {
        "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
        "native_layer_norm", "native_layer_norm_backward", "native_batch_norm", "native_batch_norm_backward",
        "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
        "_batch_norm_with_update", "_batch_norm_with_update_functional", "_batch_norm_no_update",
        "batch_norm_backward", "native_group_norm", "native_group_norm_backward", "_fused_rms_norm",
        "_fused_rms_norm_backward",
    }
)

_REDUCTION_OPS = frozenset(
    {
        "sum", "mean", "amax", "amin", "max", "min", "aminmax", "argmax", "argmin", "prod", "var", "std",
        "var_mean", "std_mean", "norm", "linalg_vector_norm", "logsumexp", "any", "all", "cumsum", "cumprod",
        "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "mse_loss",
        "binary_cross_entropy", "binary_cross_entropy_with_logits", "embedding_dense_backward",
        "_embedding_bag", "_embedding_bag_backward", "_embedding_bag_dense_backward", "index_add",
        "scatter_add", "scatter_reduce", "index_put_", "_index_put_impl",
    }
)


def _attention_for_cpu(args: tuple, kwargs: dict, out: Any) -> int:
    query, key, value = args[:3]
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _attention_for_cpu_backward(args: tuple, kwargs: dict, out: Any) -> int:
    grad_out, query, key, value = args[:4]
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


_ATTENTION_OPS: dict[str, Callable[[tuple, dict, Any], int]] = {
    "_scaled_dot_product_flash_attention_for_cpu": _attention_for_cpu,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _attention_for_cpu_backward,
}

FALLBACK_RULES: dict[str, str] = {
    "attention": "flash-attention kernels for CPU: the registry's scaled-dot-product-attention count",
    "free": "views, aliases, copies, factories, concatenation, indexing: 0 FLOP",
    "normalisation": f"softmax and layer/batch/group norm: {NORMALISATION_FLOPS_PER_ELEMENT} FLOP per input element",
    "reduction": "sums, means, maxima, variances, norms, losses: 1 FLOP per input element",
    "elementwise": "any other op with a tensor output: 1 FLOP per output element",
}


def _base_name(op: Any) -> str:
    """The aten name of an op without namespace or overload: ``aten.mm.default`` -> ``mm``."""
    packet = getattr(op, "_overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(op, "__name__", str(op)).split(".")[-1]


def is_free_op(op: Any) -> bool:
    """True for ops the fallback counts as zero FLOP (views, copies, factories, indexing)."""
    return _base_name(op).rstrip("_") in _FREE_OPS or _base_name(op) in _FREE_OPS


def _numel(tree: Any) -> int:
    return sum(t.numel() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


def _fallback_flops(name: str, args: tuple, kwargs: dict, out: Any) -> tuple[int, str]:
    if name in _ATTENTION_OPS:
        return _ATTENTION_OPS[name](args, kwargs, out), "attention"
    if name in _FREE_OPS or name.rstrip("_") in _FREE_OPS:
        return 0, "free"
    if name in _NORMALISATION_OPS:
        first = next((t for t in tree_leaves(args) if isinstance(t, torch.Tensor)), None)
        return NORMALISATION_FLOPS_PER_ELEMENT * (first.numel() if first is not None else 0), "normalisation"
    if name in _REDUCTION_OPS or name.rstrip("_") in _REDUCTION_OPS:
        return _numel((args, kwargs)), "reduction"
    return _numel(out), "elementwise"


def op_flops(op: Any, args: tuple, kwargs: dict, out: Any) -> tuple[float, str]:
    """FLOPs of ``op(*args, **kwargs) -> out`` and where the count came from.

    ``args``/``kwargs``/``out`` hold tensors (real, fake or meta) where the call had tensors. Returns
    ``(flops, source)`` with source :data:`FLOP_SOURCE_REGISTRY` or ``"fallback:<rule>"``.
    """
    packet = getattr(op, "_overloadpacket", None)
    if packet is not None and packet in flop_registry:
        count = flop_registry[packet](*args, **kwargs, out_val=out)
        return float(count), FLOP_SOURCE_REGISTRY
    count, rule = _fallback_flops(_base_name(op), args, kwargs, out)
    if not math.isfinite(count) or count < 0:
        count = 0
    return float(count), f"{FLOP_SOURCE_FALLBACK}:{rule}"
