"""SoDeep sorters: networks that map a sequence to the (normalized) ranks of its elements.

SoDeep (Engilberge et al., CVPR'19) trains a small network :math:`f_\\Theta` on synthetic sequences
so that :math:`f_\\Theta(y) \\approx \\mathrm{rk}(y)` (L1 loss against the true normalized ranks), and
uses it as a differentiable surrogate of the rank function. This module holds the sorter
architectures (torch only):

* :class:`RNNSorter` — bidirectional GRU or LSTM over the sequence (the paper's family);
* :class:`MLPSorter` — a fully connected network over the whole (fixed-length) sequence;
* :class:`ExactSorter` — the analytic, parameter-free pairwise-sigmoid sorter.

All sorters standardize every sequence first (subtract its mean, divide by its standard deviation
plus ``eps``), so they are invariant to the scale and offset of their input, and share the output
convention of SoDeep's ``get_rank``: with ``descending=True`` (the default) the largest element
gets ``1/n`` and the smallest ``1``; with ``descending=False`` the smallest gets ``1/n``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from rankwise._validation import check_choice, check_floating, check_positive, check_positive_int, to_compute

__all__ = [
    "SORTER_MODELS",
    "ExactSorter",
    "MLPSorter",
    "RNNSorter",
    "Sorter",
    "build_sorter",
    "standardize",
]

SorterModel = Literal["gru", "lstm", "mlp", "exact"]
SORTER_MODELS = ("gru", "lstm", "mlp", "exact")


def standardize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``(x - mean) / (std + eps')`` along the last dim (population std).

    ``eps' = eps + 4 * finfo.eps * |mean|`` — a floor at the rounding level of the mean, so constant
    rows (whose centered values are pure rounding noise) give zeros, not noise blown up to ``O(1)``.
    """
    if x.shape[-1] == 0:
        return x
    mean = x.mean(-1, keepdim=True)
    centered = x - mean
    std = centered.pow(2).mean(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny).sqrt()  # finite grad at 0
    floor = eps + 4 * torch.finfo(x.dtype).eps * mean.abs()
    centered = torch.where(std > floor, centered, torch.zeros_like(centered))
    return centered / (std + floor)


class Sorter(nn.Module):
    """Base class: input ``(*, n)`` -> normalized ranks ``(*, n)`` in ``(0, 1]``.

    Subclasses implement :meth:`position`, which maps standardized sequences ``(B, n)`` to the
    predicted *ascending fractional position* ``p`` of every element: ``0`` for the smallest and
    ``1`` for the largest (the exact 0-based ascending rank divided by ``n - 1``). The base class
    converts it to normalized ranks: ``(n - p (n - 1)) / n`` (descending, SoDeep's ``get_rank``)
    or ``(1 + p (n - 1)) / n`` (ascending).

    ``seq_len`` is the length the sorter was built / trained for; ``fixed_length`` sorters (MLP)
    reject other lengths, the others accept any length (quality is only measured at ``seq_len``).
    """

    fixed_length: bool = False
    model_name: str = "base"

    def __init__(self, seq_len: int) -> None:
        super().__init__()
        check_positive_int(seq_len, "seq_len")
        self.seq_len = seq_len

    def hparams(self) -> dict[str, Any]:
        """Constructor arguments (stored with the weights)."""
        return {"seq_len": self.seq_len}

    def position(self, z: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor, *, descending: bool = True) -> torch.Tensor:
        check_floating(x, "x")
        if x.dim() == 0:
            raise ValueError("`x` must have at least 1 dimension, got a 0-d tensor")
        n = x.shape[-1]
        if self.fixed_length and n != self.seq_len:
            raise ValueError(
                f"this {self.model_name} sorter was built for sequences of length seq_len={self.seq_len}, "
                f"got an input of length {n} (shape {tuple(x.shape)})"
            )
        if n <= 1 or x.numel() == 0:
            # one element (or none): its rank is 1/1, kept attached to the graph
            return x * 0 + 1
        xc = to_compute(x)
        lead = xc.shape[:-1]
        z = standardize(xc.reshape(-1, n))
        p = self.position(z).reshape(*lead, n)
        if descending:
            out = (n - p * (n - 1)) / n
        else:
            out = (1 + p * (n - 1)) / n
        return out.to(x.dtype)


class RNNSorter(Sorter):
    """Bidirectional GRU / LSTM sorter (SoDeep's recurrent family).

    Each standardized element ``z_i`` is expanded into ``[z_i, s_1(z_i), ..., s_K(z_i)]`` with
    ``K = num_features`` fixed soft thresholds ``s_k(z) = sigmoid((z - c_k) / w)`` (centers ``c_k``
    evenly spaced on ``[-2.5, 2.5]``, ``w`` their spacing; ``K = 0`` feeds ``z`` alone, as in the
    paper). A ``num_layers``-layer bidirectional recurrent net reads the sequence; a small head maps
    ``[h_i^fwd, h_i^bwd, features_i]`` to the element's ascending fractional position. The threshold
    features let the recurrent state accumulate a soft histogram of the sequence, which is what
    ranking needs, and make training much faster.
    """

    def __init__(
        self,
        seq_len: int,
        *,
        hidden_size: int = 64,
        num_layers: int = 1,
        num_features: int = 16,
        cell: Literal["gru", "lstm"] = "gru",
    ) -> None:
        super().__init__(seq_len)
        check_choice(cell, "cell", ("gru", "lstm"))
        if hidden_size < 1 or num_layers < 1 or num_features < 0:
            raise ValueError(
                "`hidden_size` and `num_layers` must be >= 1 and `num_features` >= 0, got "
                f"{hidden_size}, {num_layers} and {num_features}"
            )
        self.model_name = cell
        self.hidden_size, self.num_layers, self.num_features, self.cell = hidden_size, num_layers, num_features, cell
        centers = torch.linspace(-2.5, 2.5, num_features) if num_features > 1 else torch.zeros(num_features)
        self.register_buffer("centers", centers, persistent=False)
        self.width = 5.0 / max(num_features - 1, 1)
        d_in = 1 + num_features
        rnn_cls = nn.GRU if cell == "gru" else nn.LSTM
        self.rnn = rnn_cls(d_in, hidden_size, num_layers=num_layers, batch_first=True, bidirectional=True)
        self.head = nn.Sequential(nn.Linear(2 * hidden_size + d_in, hidden_size), nn.Tanh(), nn.Linear(hidden_size, 1))

    def hparams(self) -> dict[str, Any]:
        return {
            "seq_len": self.seq_len,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "num_features": self.num_features,
        }

    def features(self, z: torch.Tensor) -> torch.Tensor:
        """``(B, n)`` standardized values -> ``(B, n, 1 + num_features)`` inputs."""
        zin = z.unsqueeze(-1)
        if self.num_features == 0:
            return zin
        c: torch.Tensor = self.centers.to(z.dtype)  # type: ignore[operator,assignment]
        return torch.cat([zin, torch.sigmoid((zin - c) / self.width)], dim=-1)

    def position(self, z: torch.Tensor) -> torch.Tensor:
        w: torch.Tensor = self.head[0].weight  # type: ignore[assignment]
        f = self.features(z.to(w.dtype))
        h, _ = self.rnn(f)
        return self.head(torch.cat([h, f], dim=-1)).squeeze(-1).to(z.dtype) + 0.5


class MLPSorter(Sorter):
    """Fully connected sorter over the whole standardized sequence (fixed length ``seq_len``)."""

    fixed_length = True

    def __init__(self, seq_len: int, *, hidden_size: int = 512, num_layers: int = 3) -> None:
        super().__init__(seq_len)
        if hidden_size < 1 or num_layers < 1:
            raise ValueError(f"`hidden_size` and `num_layers` must be >= 1, got {hidden_size} and {num_layers}")
        self.model_name = "mlp"
        self.hidden_size, self.num_layers = hidden_size, num_layers
        layers: list[nn.Module] = []
        width = seq_len
        for _ in range(num_layers):
            layers += [nn.Linear(width, hidden_size), nn.Tanh()]
            width = hidden_size
        layers.append(nn.Linear(width, seq_len))
        self.net = nn.Sequential(*layers)

    def hparams(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "hidden_size": self.hidden_size, "num_layers": self.num_layers}

    def position(self, z: torch.Tensor) -> torch.Tensor:
        w: torch.Tensor = self.net[0].weight  # type: ignore[assignment]
        return self.net(z.to(w.dtype)).to(z.dtype) + 0.5


class ExactSorter(Sorter):
    r"""Analytic pairwise-sigmoid sorter (parameter-free).

    .. math::
        r_i = \tfrac12 + \sum_j \sigma\!\Bigl(\frac{z_i - z_j}{\tau}\Bigr), \qquad
        z = \frac{x - \bar x}{\operatorname{std}(x) + \epsilon}

    is the ascending rank (average ranks as :math:`\tau \to 0`); its fractional position is
    :math:`(r_i - 1)/(n - 1)`. Dividing by the spread makes :math:`\tau` relative to the input's
    standard deviation; a constant input gives :math:`z = 0` and every element the mean rank.
    """

    def __init__(self, seq_len: int = 1, *, temperature: float = 0.01) -> None:
        super().__init__(seq_len)
        self.model_name = "exact"
        self.temperature = check_positive(temperature, "temperature")

    def hparams(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "temperature": self.temperature}

    def position(self, z: torch.Tensor) -> torch.Tensor:
        n = z.shape[-1]
        r = 0.5 + torch.sigmoid((z.unsqueeze(-1) - z.unsqueeze(-2)) / self.temperature).sum(-1)
        return (r - 1) / (n - 1)


def build_sorter(model: str, seq_len: int, **hparams: Any) -> Sorter:
    """Create an (untrained) sorter: ``model`` in ``"gru"``, ``"lstm"``, ``"mlp"``, ``"exact"``."""
    check_choice(model, "model", SORTER_MODELS)
    hp = {k: v for k, v in hparams.items() if k != "seq_len"}
    if model in ("gru", "lstm"):
        return RNNSorter(seq_len, cell=model, **hp)  # type: ignore[arg-type]
    if model == "mlp":
        return MLPSorter(seq_len, **hp)
    return ExactSorter(seq_len, **hp)
