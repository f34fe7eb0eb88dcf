"""A from-scratch sentence-pair encoder (no pretrained embeddings, no downloads)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rankwise._validation import check_positive_int
from rankwise.models._registry import register_backbone

__all__ = ["TextPairEncoder", "text_pair_encoder"]


class TextPairEncoder(nn.Module):
    r"""Siamese BiLSTM/BiGRU sentence encoder + pair features + MLP (as in the STS-B-DIR baseline).

    Each sentence (int64 ids, ``padding_idx`` = pad) is embedded (trained from scratch), run
    through a bidirectional RNN (padding packed away, so it never sees pad tokens) and max-pooled
    over its real tokens to ``u`` / ``v`` (``2 * hidden``). The pair is
    :math:`[u, v, |u - v|, u \odot v]` (``8 * hidden``) -> ``Linear`` -> ``ReLU`` ->
    ``Linear(feature_dim)`` -> ``ReLU``. Empty sentences (all pad) get a zero sentence vector.

    ``forward`` takes the pair as one tuple (what :func:`rankwise.data.collate_text_pairs`
    yields as ``x``) or as two arguments.

    Shape:
        ``((B, L1), (B, L2)) -> (B, feature_dim)``.

    Example:
        >>> import torch
        >>> enc = TextPairEncoder(vocab_size=50, embed_dim=16, hidden=8, feature_dim=12)
        >>> a = torch.tensor([[5, 6, 7], [9, 0, 0]]); b = torch.tensor([[8, 0], [4, 3]])
        >>> enc((a, b)).shape
        torch.Size([2, 12])
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 128,
        hidden: int = 128,
        feature_dim: int = 128,
        *,
        rnn: Literal["lstm", "gru"] = "lstm",
        num_layers: int = 1,
        dropout: float = 0.0,
        padding_idx: int = 0,
    ) -> None:
        super().__init__()
        for name, v in (
            ("vocab_size", vocab_size),
            ("embed_dim", embed_dim),
            ("hidden", hidden),
            ("feature_dim", feature_dim),
            ("num_layers", num_layers),
        ):
            check_positive_int(v, name)
        if rnn not in ("lstm", "gru"):
            raise ValueError(f"`rnn` must be one of 'lstm', 'gru'; got {rnn!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), got {dropout!r}")
        if not 0 <= padding_idx < vocab_size:
            raise ValueError(f"`padding_idx` must be in [0, {vocab_size}), got {padding_idx!r}")
        self.vocab_size = vocab_size
        self.padding_idx = padding_idx
        self.feature_dim = feature_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        cls = nn.LSTM if rnn == "lstm" else nn.GRU
        self.rnn = cls(
            embed_dim,
            hidden,
            num_layers=num_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(dropout)
        self.mlp = nn.Sequential(
            nn.Linear(8 * hidden, 2 * hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(2 * hidden, feature_dim),
            nn.ReLU(),
        )

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """Sentence vectors ``(B, 2 * hidden)`` of padded ids ``(B, L)``."""
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"token ids must be an int64 tensor of shape (B, L), got {ids.dtype} {tuple(ids.shape)}")
        mask = ids != self.padding_idx
        lengths = mask.sum(1)
        emb = self.dropout(self.embedding(ids))
        # pack needs lengths >= 1 on the CPU; empty sentences are run on one pad token, then zeroed
        packed = pack_padded_sequence(emb, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        valid = torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]
        out = out.masked_fill(~valid[:, :, None], float("-inf"))
        pooled = out.max(dim=1).values
        return torch.where(lengths[:, None] > 0, pooled, torch.zeros_like(pooled))

    def forward(
        self, x: tuple[torch.Tensor, torch.Tensor] | torch.Tensor, ids2: torch.Tensor | None = None
    ) -> torch.Tensor:
        if ids2 is None:
            if not isinstance(x, (tuple, list)) or len(x) != 2:
                raise TypeError("`x` must be a pair (ids1, ids2) of token-id tensors, or pass ids2 separately")
            ids1, ids2 = x
        else:
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"`x` must be a tensor when `ids2` is given, got {type(x).__name__}")
            ids1 = x
        if ids1.shape[0] != ids2.shape[0]:
            raise ValueError(f"the two sentences' batches differ: {ids1.shape[0]} and {ids2.shape[0]}")
        u, v = self.encode(ids1), self.encode(ids2)
        return self.mlp(torch.cat([u, v, (u - v).abs(), u * v], dim=-1))


@register_backbone("text_pair")
def text_pair_encoder(
    vocab_size: int,
    embed_dim: int = 128,
    hidden: int = 128,
    feature_dim: int = 128,
    *,
    rnn: Literal["lstm", "gru"] = "lstm",
    num_layers: int = 1,
    dropout: float = 0.0,
    padding_idx: int = 0,
) -> tuple[nn.Module, int]:
    """From-scratch BiLSTM/BiGRU sentence-pair encoder (:class:`TextPairEncoder`); needs ``vocab_size``."""
    net = TextPairEncoder(
        vocab_size,
        embed_dim,
        hidden,
        feature_dim,
        rnn=rnn,
        num_layers=num_layers,
        dropout=dropout,
        padding_idx=padding_idx,
    )
    return net, feature_dim
