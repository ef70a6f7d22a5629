"""The registry: every zoo model with the batch size and parameter count its paper reports.

Full-size configs follow the papers (TAG Table 3, Parmesan Tables VII-VIII, GraphPipe App. A.2); tiny
configs keep the architecture and shrink depth, width and inputs so a CPU train step is milliseconds.
``docs/models.md`` explains every choice a paper leaves open.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch
from torch import Tensor

from tag.errors import ModelError
from tag.models import inputs
from tag.models.cnn import VGG, ResNet, ResNetConfig, VGGConfig
from tag.models.inception import InceptionConfig, InceptionV3
from tag.models.language import (GPT, BertConfig, BertForPreTraining, GPTConfig, Seq2SeqConfig,
                                 Seq2SeqTransformer)
from tag.models.losses import (bert_pretraining_loss, binary_loss, classification_loss, regression_loss,
                               token_loss)
from tag.models.multibranch import (DLRM, CandleUno, DLRMConfig, MMTConfig, MultiModalTransformer,
                                    UnoConfig)
from tag.models.spec import ModelSpec, ModelVariant

__all__ = ["MODELS", "get_model", "list_models"]

Generator = torch.Generator | None


# -- example inputs: (batch_size, device, generator) -> tuple of tensors, dim 0 the batch -------------------

def _image_inputs(image_size: int, batch: int, device: torch.device, gen: Generator) -> tuple[Tensor]:
    return (inputs.images(batch, image_size, device, gen),)


def _seq2seq_inputs(config: Seq2SeqConfig, batch: int, device: torch.device,
                    gen: Generator) -> tuple[Tensor, Tensor]:
    return (inputs.token_ids((batch, config.src_len), config.src_vocab_size, device, gen),
            inputs.token_ids((batch, config.tgt_len), config.tgt_vocab_size, device, gen))


def _bert_inputs(config: BertConfig, batch: int, device: torch.device, gen: Generator) -> tuple[Tensor, Tensor]:
    shape = (batch, config.seq_len)
    return (inputs.token_ids(shape, config.vocab_size, device, gen),
            inputs.token_ids(shape, config.type_vocab_size, device, gen))


def _gpt_inputs(config: GPTConfig, batch: int, device: torch.device, gen: Generator) -> tuple[Tensor]:
    return (inputs.token_ids((batch, config.seq_len), config.vocab_size, device, gen),)


def _mmt_inputs(config: MMTConfig, batch: int, device: torch.device, gen: Generator) -> tuple[Tensor, ...]:
    shape = (batch, config.seq_len, config.hidden)
    return tuple(inputs.features(shape, device, gen) for _ in range(config.num_branches))


def _dlrm_inputs(config: DLRMConfig, batch: int, device: torch.device, gen: Generator) -> tuple[Tensor, ...]:
    dense = [inputs.features((batch, config.dense_features), device, gen)
             for _ in range(config.num_dense_branches)]
    bags = [inputs.token_ids((batch, config.bag_size), config.table_rows, device, gen)
            for _ in range(config.num_sparse_branches)]
    return tuple(dense + bags)


def _uno_inputs(config: UnoConfig, batch: int, device: torch.device, gen: Generator) -> tuple[Tensor, ...]:
    return tuple(inputs.features((batch, config.branch_features), device, gen)
                 for _ in range(config.num_branches))


# -- variants -----------------------------------------------------------------------------------------------

def _image_variant(model_class: type, config: ResNetConfig | VGGConfig | InceptionConfig,
                   batch_size: int) -> ModelVariant:
    side = config.image_size
    return ModelVariant(partial(model_class, config), partial(_image_inputs, side), classification_loss,
                        batch_size, config, f"3x{side}x{side}")


def _seq2seq_variant(config: Seq2SeqConfig, batch_size: int) -> ModelVariant:
    return ModelVariant(partial(Seq2SeqTransformer, config), partial(_seq2seq_inputs, config), token_loss,
                        batch_size, config, f"src {config.src_len}, tgt {config.tgt_len} tokens")


def _bert_variant(config: BertConfig, batch_size: int) -> ModelVariant:
    return ModelVariant(partial(BertForPreTraining, config), partial(_bert_inputs, config),
                        bert_pretraining_loss, batch_size, config, f"seq {config.seq_len}")


def _gpt_variant(config: GPTConfig, batch_size: int) -> ModelVariant:
    return ModelVariant(partial(GPT, config), partial(_gpt_inputs, config), token_loss, batch_size, config,
                        f"seq {config.seq_len}")


def _mmt_variant(config: MMTConfig, batch_size: int) -> ModelVariant:
    return ModelVariant(partial(MultiModalTransformer, config), partial(_mmt_inputs, config),
                        classification_loss, batch_size, config,
                        f"{config.num_branches} x seq {config.seq_len} x {config.hidden} features")


def _dlrm_variant(config: DLRMConfig, batch_size: int) -> ModelVariant:
    return ModelVariant(partial(DLRM, config), partial(_dlrm_inputs, config), binary_loss, batch_size, config,
                        f"{config.num_dense_branches} x {config.dense_features} dense, "
                        f"{config.num_sparse_branches} x bag of {config.bag_size} ids")


def _uno_variant(config: UnoConfig, batch_size: int) -> ModelVariant:
    return ModelVariant(partial(CandleUno, config), partial(_uno_inputs, config), regression_loss, batch_size,
                        config, f"{config.num_branches} x {config.branch_features} features")


# -- configs ------------------------------------------------------------------------------------------------

TINY_BATCH = 4

_TINY_RESNET = ResNetConfig(blocks=(1, 1, 1, 1), width=8, image_size=32, num_classes=10)
_TINY_VGG = VGGConfig(stages=((8,), (16,), (16, 16), (32,), (32,)), hidden=32, image_size=32, num_classes=10)
_TINY_INCEPTION = InceptionConfig(image_size=75, num_classes=10, width_divisor=16, a_pool_channels=(32,),
                                  c_channels_7x7=(128,), num_e_modules=1)
_TINY_SEQ2SEQ = Seq2SeqConfig(src_vocab_size=100, tgt_vocab_size=90, d_model=32, num_heads=4, ffn_hidden=64,
                              num_encoder_layers=2, num_decoder_layers=2, src_len=12, tgt_len=10)
_BERT_SMALL = BertConfig(hidden=512, num_layers=4, num_heads=8, ffn_hidden=2048, seq_len=128)
_BERT_LARGE = BertConfig()
_TINY_BERT = BertConfig(vocab_size=100, hidden=32, num_layers=2, num_heads=4, ffn_hidden=64, max_positions=16,
                        seq_len=16)
_TINY_GPT = GPTConfig(vocab_size=100, max_positions=16, hidden=32, num_layers=2, num_heads=4, seq_len=16)
_TINY_MMT = MMTConfig(num_branches=2, layers_per_branch=1, hidden=32, num_heads=4, ffn_hidden=64, seq_len=8,
                      num_classes=10)
_TINY_DLRM = DLRMConfig(num_dense_branches=2, dense_features=16, dense_widths=(32, 32), num_sparse_branches=2,
                        table_rows=100, embedding_dim=8, bag_size=4, top_widths=(32, 32))
_TINY_UNO = UnoConfig(num_branches=2, branch_features=16, branch_widths=(32, 32), top_widths=(32, 32))


def _bert_spec(name: str, num_layers: int, batch_size: int, paper_parameters: float,
               paper_source: str) -> ModelSpec:
    return ModelSpec(
        name, f"BERT-{num_layers} (hidden 1024, 16 heads) with pooler and MLM + NSP pre-training heads",
        batch_size, paper_parameters, paper_source,
        full=_bert_variant(replace(_BERT_LARGE, num_layers=num_layers), batch_size),
        tiny=_bert_variant(replace(_TINY_BERT, num_layers=num_layers // 12), TINY_BATCH))


def _specs() -> list[ModelSpec]:
    return [
        ModelSpec("inception-v3", "Inception V3, 1000 classes, 299x299, no aux head", 96, 23.8e6,
                  "TAG Table 3 (batch 96, 90 MB); Szegedy et al. 2016",
                  full=_image_variant(InceptionV3, InceptionConfig(), 96),
                  tiny=_image_variant(InceptionV3, _TINY_INCEPTION, TINY_BATCH)),
        ModelSpec("resnet101", "ResNet-101, bottleneck blocks [3, 4, 23, 3], 224x224", 96, 44.5e6,
                  "TAG Table 3 (batch 96, 169 MB); He et al. 2016",
                  full=_image_variant(ResNet, ResNetConfig(blocks=(3, 4, 23, 3)), 96),
                  tiny=_image_variant(ResNet, _TINY_RESNET, TINY_BATCH)),
        ModelSpec("resnet152", "ResNet-152, bottleneck blocks [3, 8, 36, 3], 224x224", 64, 60.2e6,
                  "Parmesan Table VII (micro-batch 64, 60M); He et al. 2016",
                  full=_image_variant(ResNet, ResNetConfig(blocks=(3, 8, 36, 3)), 64),
                  tiny=_image_variant(ResNet, replace(_TINY_RESNET, blocks=(1, 2, 2, 1)), TINY_BATCH)),
        ModelSpec("vgg19", "VGG-19 without batch norm, 4096-wide FC layers, 224x224", 96, 143.7e6,
                  "TAG Table 3 (batch 96, 548 MB); Simonyan & Zisserman 2015",
                  full=_image_variant(VGG, VGGConfig(), 96),
                  tiny=_image_variant(VGG, _TINY_VGG, TINY_BATCH)),
        ModelSpec("transformer", "Transformer-base encoder-decoder, 6+6 layers, d 512, separate embeddings",
                  480, 106.7e6, "TAG Table 3 (batch 480, 407 MB = 106.7M float32 if MB is MiB)",
                  full=_seq2seq_variant(Seq2SeqConfig(), 480),
                  tiny=_seq2seq_variant(_TINY_SEQ2SEQ, TINY_BATCH)),
        ModelSpec("bert-small", "BERT-Small (Turc et al.): 4 layers, hidden 512, 8 heads, MLM + NSP heads",
                  96, 25.7e6, "TAG Table 3 (batch 96, 98 MB = 25.7M float32); Turc et al. 2019 list 29.1M",
                  full=_bert_variant(_BERT_SMALL, 96),
                  tiny=_bert_variant(replace(_TINY_BERT, hidden=16, num_heads=2, ffn_hidden=32), TINY_BATCH)),
        _bert_spec("bert-large", 24, 16, 335e6,
                   "TAG Table 3 (batch 16; its 2313 MB is not 335M x 4 B); Devlin et al. 2019 (340M)"),
        _bert_spec("bert-36", 36, 8, 516e6, "Parmesan Table VIII (micro-batch 8, 516M with vocab 30533)"),
        _bert_spec("bert-48", 48, 8, 667e6, "Parmesan Table VIII (micro-batch 8, 667M with vocab 30533)"),
        ModelSpec("mmt", "multi-modal transformer: 4 branches x 8 encoder layers (1024, 16 heads), seq 256",
                  128, None, "GraphPipe App. A.2 (mini-batch 128 on 8 GPUs)",
                  full=_mmt_variant(MMTConfig(), 128),
                  tiny=_mmt_variant(_TINY_MMT, TINY_BATCH)),
        ModelSpec("dlrm", "DLRM: 7 dense branches x 4 FF layers of 4096, 7 tables of 1M x 64, bag 100",
                  128, None, "GraphPipe App. A.2 (architecture; batch 128 chosen here)",
                  full=_dlrm_variant(DLRMConfig(), 128),
                  tiny=_dlrm_variant(_TINY_DLRM, TINY_BATCH)),
        ModelSpec("candle-uno", "CANDLE-Uno: 7 branches x 4 FF layers of 4096, top MLP, regression",
                  128, None, "GraphPipe App. A.2 (architecture; batch 128 chosen here)",
                  full=_uno_variant(UnoConfig(), 128),
                  tiny=_uno_variant(_TINY_UNO, TINY_BATCH)),
        ModelSpec("gpt2", "GPT-2 small: 12 layers, 768, 12 heads, vocab 50257, tied LM head", 8, 124e6,
                  "Radford et al. 2019 (reported as 117M; the released weights hold 124M)",
                  full=_gpt_variant(GPTConfig(), 8),
                  tiny=_gpt_variant(_TINY_GPT, TINY_BATCH)),
    ]


MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _specs()}


def get_model(name: str) -> ModelSpec:
    """The zoo entry called ``name`` (case and ``_``/``-`` do not matter)."""
    key = name.strip().lower().replace("_", "-") if isinstance(name, str) else None
    if key not in MODELS:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return MODELS[key]


def list_models() -> list[ModelSpec]:
    """Every zoo entry, in registry order."""
    return list(MODELS.values())
