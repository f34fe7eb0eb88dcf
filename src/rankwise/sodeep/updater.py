"""Refining a sorter on the inputs it actually sees (SoDeep's "updating wrapper").

A sorter trained on synthetic data may be less accurate on the score distribution of a real
model. :class:`SorterUpdater` records (detached) inputs passed through it during training and,
on :meth:`SorterUpdater.refine`, trains the sorter on them against their exact ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from rankwise._validation import check_floating, check_positive_int
from rankwise.sodeep.models import Sorter

__all__ = ["SorterUpdater"]


class SorterUpdater(nn.Module):
    """Wrap ``sorter``: forward = ``sorter(x, descending=...)`` + record ``x`` for later refinement.

    Args:
        sorter: a learned sorter (e.g. ``rankwise.sodeep_sorter(64, trainable=True)``).
        buffer_size: number of sequences kept (a ring buffer of the most recent ones).
        lr: Adam learning rate used by :meth:`refine`.
        record: record inputs in ``forward`` (only while ``self.training`` if ``"train"``).

    Every recorded row is a sequence of length ``sorter.seq_len``; inputs of shape ``(*, n)`` are
    flattened to rows. The buffer lives on the input's device and is not part of the state dict.

    Example:
        >>> import torch, rankwise
        >>> from rankwise.sodeep import SorterUpdater
        >>> upd = SorterUpdater(rankwise.sodeep_sorter(32, trainable=True), buffer_size=64)
        >>> r = upd(torch.randn(8, 32))          # ranks; the 8 rows are recorded
        >>> len(upd)
        8
        >>> losses = upd.refine(steps=2, batch_size=8)
    """

    def __init__(
        self, sorter: Sorter, buffer_size: int = 1024, *, lr: float = 1e-4, record: bool | str = "train"
    ) -> None:
        super().__init__()
        if not isinstance(sorter, Sorter):
            raise TypeError(f"`sorter` must be a rankwise.sodeep Sorter, got {type(sorter).__name__}")
        check_positive_int(buffer_size, "buffer_size")
        self.sorter = sorter
        self.buffer_size, self.lr, self.record = buffer_size, lr, record
        self._buffer: torch.Tensor | None = None
        self._next = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def forward(self, x: torch.Tensor, *, descending: bool = True) -> torch.Tensor:
        if self.record is True or (self.record == "train" and self.training):
            self.collect(x)
        return self.sorter(x, descending=descending)

    @torch.no_grad()
    def collect(self, x: torch.Tensor) -> None:
        """Add the rows of ``x`` ``(*, seq_len)`` (detached) to the ring buffer."""
        check_floating(x, "x")
        n = self.sorter.seq_len
        if x.dim() == 0 or x.shape[-1] != n:
            raise ValueError(f"`x` must have last dimension seq_len={n} to be recorded, got shape {tuple(x.shape)}")
        rows = x.detach().reshape(-1, n).float()[-self.buffer_size :]
        if self._buffer is None or self._buffer.device != rows.device:
            self._buffer = torch.zeros(self.buffer_size, n, device=rows.device)
            self._next, self._count = 0, 0
        k = rows.shape[0]
        idx = (self._next + torch.arange(k, device=rows.device)) % self.buffer_size
        self._buffer[idx] = rows
        self._next = (self._next + k) % self.buffer_size
        self._count = min(self._count + k, self.buffer_size)

    def refine(
        self, steps: int = 100, *, batch_size: int = 64, generator: torch.Generator | None = None
    ) -> list[float]:
        """Train the sorter on recorded sequences against their exact (average-tie) ranks.

        Each step samples ``batch_size`` recorded rows (with ``generator`` if given), minimizes the
        L1 error of the ascending normalized ranks with Adam (``lr``) and returns the loss of every
        step (in rank units). The sorter's parameters are made trainable during the call and its
        previous ``requires_grad`` / train-eval state are restored afterwards.
        """
        from rankwise.ops.ranking import rank

        if self._count == 0 or self._buffer is None:
            raise ValueError("`refine` needs recorded sequences: call the updater (or `collect`) on inputs first")
        if steps < 0 or batch_size < 1:
            raise ValueError(f"`steps` must be >= 0 and `batch_size` >= 1, got steps={steps}, batch_size={batch_size}")
        params = list(self.sorter.parameters())
        if not params:
            return []
        flags = [p.requires_grad for p in params]
        was_training = self.sorter.training
        self.sorter.requires_grad_(True).train()
        opt = torch.optim.Adam(params, lr=self.lr)
        data = self._buffer[: self._count]
        n = data.shape[-1]
        losses: list[float] = []
        try:
            for _ in range(steps):
                idx = torch.randint(0, self._count, (batch_size,), generator=generator).to(data.device)
                x = data[idx]
                target = rank(x, ties="average") / n
                with torch.enable_grad():
                    loss = (self.sorter(x, descending=False) - target).abs().mean() * n
                    opt.zero_grad()
                    loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
        finally:
            for p, f in zip(params, flags):
                p.requires_grad_(f)
            self.sorter.train(was_training)
        return losses
