"""Language models: the encoder-decoder Transformer (Vaswani et al. 2017), BERT (Devlin et al. 2019) with
its pre-training heads, and a GPT-2 style decoder (Radford et al. 2019)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tag.models.layers import DecoderLayer, EncoderLayer, sinusoidal_positions

__all__ = ["Seq2SeqConfig", "Seq2SeqTransformer", "BertConfig", "BertForPreTraining", "GPTConfig", "GPT"]


@dataclass(frozen=True)
class Seq2SeqConfig:
    src_vocab_size: int = 40_700  # with tgt: chosen so the parameters total TAG's 407 MiB (see docs)
    tgt_vocab_size: int = 40_700
    d_model: int = 512
    num_heads: int = 8
    ffn_hidden: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    src_len: int = 64  # tokens per source sentence
    tgt_len: int = 64  # tokens per target sentence


class Seq2SeqTransformer(nn.Module):
    """Post-LN encoder-decoder with sinusoidal positions and separate source, target and output matrices.

    Shapes: ``src_ids [b, s]``, ``tgt_ids [b, t]`` -> logits ``[b, t, tgt_vocab]``.
    """

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        d = config.d_model
        self.src_embedding = nn.Embedding(config.src_vocab_size, d)
        self.tgt_embedding = nn.Embedding(config.tgt_vocab_size, d)
        self.encoder = nn.ModuleList(
            EncoderLayer(d, config.num_heads, config.ffn_hidden, activation="relu")
            for _ in range(config.num_encoder_layers))
        self.decoder = nn.ModuleList(
            DecoderLayer(d, config.num_heads, config.ffn_hidden) for _ in range(config.num_decoder_layers))
        self.output = nn.Linear(d, config.tgt_vocab_size)

    def _embed(self, embedding: nn.Embedding, ids: Tensor) -> Tensor:
        """``ids [b, t] -> [b, t, d]``: scaled token embedding plus fixed positions."""
        d = embedding.embedding_dim
        return embedding(ids) * math.sqrt(d) + sinusoidal_positions(ids.shape[1], d, device=ids.device)

    def forward(self, src_ids: Tensor, tgt_ids: Tensor) -> Tensor:
        memory = self._embed(self.src_embedding, src_ids)  # [b, s, d]
        for layer in self.encoder:
            memory = layer(memory)
        x = self._embed(self.tgt_embedding, tgt_ids)  # [b, t, d]
        for layer in self.decoder:
            x = layer(x, memory)
        return self.output(x)


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30_522
    hidden: int = 1024
    num_layers: int = 24
    num_heads: int = 16
    ffn_hidden: int = 4096
    max_positions: int = 512
    type_vocab_size: int = 2
    seq_len: int = 512  # tokens per example; at most max_positions


class BertEmbeddings(nn.Module):
    """Word + learned position + token-type embeddings, then LayerNorm.

    Shapes: ``input_ids [b, t]``, ``token_type_ids [b, t]`` -> ``[b, t, hidden]``.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden)
        self.position = nn.Embedding(config.max_positions, config.hidden)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden)
        self.norm = nn.LayerNorm(config.hidden, eps=1e-12)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # [t]
        return self.norm(self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids))


class BertForPreTraining(nn.Module):
    """BERT body (embeddings, post-LN encoder, pooler) with the masked-LM and next-sentence heads.

    The MLM decoder is tied to the word embeddings and has its own bias over the vocabulary.
    Shapes: ``input_ids [b, t]``, ``token_type_ids [b, t]`` -> (``mlm_logits [b, t, vocab]``,
    ``nsp_logits [b, 2]``).
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h = config.hidden
        self.embeddings = BertEmbeddings(config)
        self.encoder = nn.ModuleList(
            EncoderLayer(h, config.num_heads, config.ffn_hidden, norm_eps=1e-12)
            for _ in range(config.num_layers))
        self.pooler = nn.Linear(h, h)
        self.mlm_transform = nn.Linear(h, h)
        self.mlm_norm = nn.LayerNorm(h, eps=1e-12)
        self.mlm_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.nsp_classifier = nn.Linear(h, 2)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> tuple[Tensor, Tensor]:
        x = self.embeddings(input_ids, token_type_ids)  # [b, t, h]
        for layer in self.encoder:
            x = layer(x)
        pooled = torch.tanh(self.pooler(x[:, 0]))  # [b, h], from the [CLS] position
        mlm_hidden = self.mlm_norm(F.gelu(self.mlm_transform(x)))  # [b, t, h]
        mlm_logits = F.linear(mlm_hidden, self.embeddings.word.weight, self.mlm_bias)  # [b, t, vocab]
        return mlm_logits, self.nsp_classifier(pooled)


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50_257
    max_positions: int = 1024
    hidden: int = 768
    num_layers: int = 12
    num_heads: int = 12
    seq_len: int = 1024  # tokens per example; at most max_positions


class GPT(nn.Module):
    """Pre-LN causal decoder with learned positions and an LM head tied to the token embeddings.

    Shapes: ``input_ids [b, t]`` -> logits ``[b, t, vocab]``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        h = config.hidden
        self.token_embedding = nn.Embedding(config.vocab_size, h)
        self.position_embedding = nn.Embedding(config.max_positions, h)
        self.blocks = nn.ModuleList(
            EncoderLayer(h, config.num_heads, 4 * h, pre_norm=True, causal=True, activation="gelu_tanh")
            for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(h)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # [t]
        x = self.token_embedding(input_ids) + self.position_embedding(positions)  # [b, t, h]
        for block in self.blocks:
            x = block(x)
        return F.linear(self.final_norm(x), self.token_embedding.weight)
