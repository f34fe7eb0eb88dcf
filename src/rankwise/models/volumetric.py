"""3D networks for brain-age estimation from T1-weighted MRI.

* :class:`ScaleDense` / :class:`TSANSecondStage` -- the two stages of TSAN (Cheng et al., "Brain Age
  Estimation From MRI Using Cascade Networks With Ranking Loss", IEEE TMI 2021). Their module and
  parameter names follow the authors' release, so its ``state_dict`` files load with
  :func:`load_tsan_checkpoint`;
* :class:`SFCN` -- the Simple Fully Convolutional Network of Peng et al. ("Accurate brain age
  prediction with lightweight deep neural networks", Medical Image Analysis 2021), a soft
  classification over age bins (:func:`sfcn_soft_labels`, :func:`sfcn_kl_loss`).

Volumes are ``(B, 1, D, H, W)``; sex is the one-hot ``(B, 2)`` tensor of the authors' code
(column 1 = male).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rankwise._fileio import UnreadableWeightsError, load_weights_only
from rankwise._validation import check_positive_int
from rankwise.models._registry import register_backbone

__all__ = [
    "SFCN",
    "ScaleDense",
    "TSANSecondStage",
    "load_tsan_checkpoint",
    "sex_one_hot",
    "sfcn_kl_loss",
    "sfcn_soft_labels",
]


def sex_one_hot(sex: torch.Tensor) -> torch.Tensor:
    """``(B,)`` 0/1 labels (1 = male) -> the ``(B, 2)`` float one-hot input of the TSAN networks.

    Example:
        >>> sex_one_hot(torch.tensor([1, 0]))
        tensor([[0., 1.],
                [1., 0.]])
    """
    s = torch.as_tensor(sex).reshape(-1).long()
    if s.numel() and (bool((s < 0).any()) or bool((s > 1).any())):
        raise ValueError(f"`sex` must hold 0 (female) or 1 (male), got values {sorted(set(s.tolist()))}")
    return F.one_hot(s, 2).float()


def _conv_bn(cin: int, cout: int, kernel: tuple[int, int, int]) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv3d(cin, cout, kernel, padding=(kernel[0] // 2, kernel[1] // 2, kernel[2] // 2), bias=False),
        nn.BatchNorm3d(cout),
    )


class _AsymmetricConv(nn.Module):
    """Sum of a 3x3x3 and three 1-D (1x1x3, 3x1x1, 1x3x1) convolutions, each batch-normalised."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = _conv_bn(cin, cout, (3, 3, 3))
        self.conv2 = _conv_bn(cin, cout, (1, 1, 3))
        self.conv3 = _conv_bn(cin, cout, (3, 1, 1))
        self.conv4 = _conv_bn(cin, cout, (1, 3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv1(x) + self.conv2(x) + self.conv3(x) + self.conv4(x)


class _SqueezeExcite(nn.Module):
    """Channel gates ``sigmoid(W2 relu(W1 mean(x)))`` (reduction 16).

    With fewer than ``reduction`` channels (``nb_filter`` < 8) the hidden layer has no unit, as
    ``channels // reduction`` gives in the authors' network: the gate is then a learned constant per
    channel (``sigmoid`` of ``FC2``'s bias). Such widths are kept for parity; torch's warning about
    initialising the empty weights is not shown.
    """

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        hidden = channels // reduction
        with warnings.catch_warnings():
            if hidden == 0:
                warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
            self.FC1 = nn.Linear(channels, hidden)
            self.FC2 = nn.Linear(hidden, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=(2, 3, 4))
        g = torch.sigmoid(self.FC2(torch.relu(self.FC1(s))))
        return x * g[:, :, None, None, None]


class _ScaleBlock(nn.Module):
    """Two asymmetric convolutions + SE + max-pool, concatenated with the max-pooled input."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            _AsymmetricConv(cin, cout),
            nn.BatchNorm3d(cout),
            nn.ELU(),
            _AsymmetricConv(cout, cout),
            nn.BatchNorm3d(cout),
            nn.ELU(),
            _SqueezeExcite(cout),
            nn.MaxPool3d(2, 2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.max_pool3d(x, 2), self.block(x)], dim=1)


def _check_volume(x: torch.Tensor, sex: torch.Tensor | None, use_sex: bool) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 5 or x.shape[1] != 1:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"`x` must have shape (B, 1, D, H, W), got {shape}")
    if use_sex and (sex is None or sex.reshape(sex.shape[0], -1).shape != (x.shape[0], 2)):
        got = None if sex is None else tuple(sex.shape)
        raise ValueError(f"`sex` must be the one-hot (B, 2) = ({x.shape[0]}, 2) tensor, got {got}")


class _ScaleTrunk(nn.Module):
    """The ScaleDense trunk: 7^3 dilated convolution, ``nb_block`` scale blocks, global average pooling."""

    def __init__(self, nb_filter: int, nb_block: int, use_sex: bool) -> None:
        super().__init__()
        check_positive_int(nb_filter, "nb_filter")
        check_positive_int(nb_block, "nb_block")
        self.nb_block, self.use_sex = nb_block, bool(use_sex)
        self.pre = nn.Sequential(nn.Conv3d(1, nb_filter, kernel_size=7, stride=1, padding=1, dilation=2), nn.ELU())
        blocks, c = [], nb_filter
        for _ in range(nb_block):
            blocks.append(_ScaleBlock(c, 2 * c))
            c = 3 * c
        self.block = nn.Sequential(*blocks)
        self.feature_dim = c
        self.male_fc = nn.Sequential(nn.Linear(2, 16), nn.Linear(16, 8), nn.ELU())

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.pre(x)).mean(dim=(2, 3, 4))

    def sex_features(self, sex: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return self.male_fc(sex.reshape(sex.shape[0], -1).to(like.dtype))


class ScaleDense(_ScaleTrunk):
    r"""TSAN's first stage (Cheng et al., IEEE TMI 2021): a scale-dense 3D CNN regressing age.

    ``pre`` (7^3 convolution, dilation 2, padding 1, ELU) -> ``nb_block`` blocks, each two
    asymmetric convolutions (3x3x3 + 1x1x3 + 3x1x1 + 1x3x1, batch-normalised and summed) with BN +
    ELU, squeeze-excitation and a 2x max-pool, concatenated with the max-pooled block input
    (channels :math:`c \to 3c`) -> global average pool -> ``deep_fc`` (Linear(., 32) + ELU);
    with ``use_sex`` the sex branch (``male_fc``: Linear(2, 16), Linear(16, 8), ELU) is
    concatenated and ``end_fc_with_gender`` (Linear(40, 16), Linear(16, 1), ReLU) predicts the
    age, else ``end_fc_without_gender`` (Linear(32, 16), Linear(16, 1), ReLU). Both heads exist
    whatever ``use_sex`` (as in the authors' release, so checkpoints load either way): 102,378,307
    parameters with the defaults.

    Shape:
        - x: :math:`(B, 1, D, H, W)`, each of D, H, W at least :math:`10 + 2^{nb\_block}`
          (91x109x91 at 2 mm in the paper).
        - sex: :math:`(B, 2)` one-hot (column 1 = male, see :func:`sex_one_hot`); ignored without ``use_sex``.
        - output: :math:`(B, 1)` predicted age (non-negative).

    Example:
        >>> net = ScaleDense(nb_filter=4, nb_block=2)
        >>> net(torch.randn(2, 1, 16, 16, 16), sex_one_hot(torch.tensor([0, 1]))).shape
        torch.Size([2, 1])
    """

    def __init__(self, nb_filter: int = 8, nb_block: int = 5, use_sex: bool = True) -> None:
        super().__init__(nb_filter, nb_block, use_sex)
        self.deep_fc = nn.Sequential(nn.Linear(self.feature_dim, 32), nn.ELU())
        self.end_fc_with_gender = nn.Sequential(nn.Linear(40, 16), nn.Linear(16, 1), nn.ReLU())
        self.end_fc_without_gender = nn.Sequential(nn.Linear(32, 16), nn.Linear(16, 1), nn.ReLU())

    @property
    def head_in_features(self) -> int:
        """Width of the features the final layers receive: 40 with ``use_sex`` (``deep_fc`` + ``male_fc``), else 32."""
        return 40 if self.use_sex else 32

    def replace_head(self, head: nn.Module) -> None:
        """Replace the final layers that ``forward`` uses (``end_fc_with_gender`` with ``use_sex``, else
        ``end_fc_without_gender``: two linear layers and the ReLU) by ``head``, a module of the
        ``(B, head_in_features)`` features they received; ``forward`` then returns its output (e.g. the
        logits of an ordinal head). The other head is kept, as built."""
        if not isinstance(head, nn.Module):
            raise TypeError(f"`head` must be an nn.Module, got {type(head).__name__}")
        setattr(self, "end_fc_with_gender" if self.use_sex else "end_fc_without_gender", head)

    @property
    def final_layers(self) -> nn.Module:
        """The final layers that ``forward`` applies to :meth:`features`: ``end_fc_with_gender`` with
        ``use_sex``, else ``end_fc_without_gender`` (or the head of :meth:`replace_head`)."""
        return self.end_fc_with_gender if self.use_sex else self.end_fc_without_gender

    def features(self, x: torch.Tensor, sex: torch.Tensor | None = None) -> torch.Tensor:
        """The ``(B, head_in_features)`` penultimate features: ``deep_fc`` of the pooled trunk, with
        ``use_sex`` concatenated with the sex branch ``male_fc`` -- what the final layers receive."""
        _check_volume(x, sex, self.use_sex)
        h = self.deep_fc(self.trunk(x))
        if not self.use_sex:
            return h
        assert sex is not None
        return torch.cat([h, self.sex_features(sex, h)], dim=1)

    def forward(self, x: torch.Tensor, sex: torch.Tensor | None = None) -> torch.Tensor:
        return self.final_layers(self.features(x, sex))


class TSANSecondStage(_ScaleTrunk):
    r"""TSAN's second stage: the ScaleDense trunk plus the discretized first-stage age; predicts the residual.

    The trunk as :class:`ScaleDense` (its first linear layer is named ``fc``), a branch of the
    discretized age ``dis_fc`` (Linear(1, 32), ReLU, Linear(32, 16), ReLU), the sex branch; the
    head ``end_fc_with_gender`` (Linear(56, 16), Linear(16, 1); ``end_fc_without_gender``
    Linear(48, 16), Linear(16, 1) without sex) has no final ReLU. It returns
    ``(residual, residual + discretized_age)``: 102,379,411 parameters with the defaults.

    Shape:
        - x: :math:`(B, 1, D, H, W)`; sex: :math:`(B, 2)`; discretized_age: :math:`(B, 1)` (or :math:`(B,)`).
        - output: ``(residual, age)``, both :math:`(B, 1)`.

    Example:
        >>> net = TSANSecondStage(nb_filter=4, nb_block=2)
        >>> x, sex = torch.randn(2, 1, 16, 16, 16), sex_one_hot(torch.tensor([0, 1]))
        >>> res, age = net(x, sex, torch.tensor([[40.0], [65.0]]))
        >>> bool(torch.allclose(age - res, torch.tensor([[40.0], [65.0]])))
        True
    """

    def __init__(self, nb_filter: int = 8, nb_block: int = 5, use_sex: bool = True) -> None:
        super().__init__(nb_filter, nb_block, use_sex)
        self.fc = nn.Sequential(nn.Linear(self.feature_dim, 32), nn.ELU())
        self.dis_fc = nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
        self.end_fc_with_gender = nn.Sequential(nn.Linear(56, 16), nn.Linear(16, 1))
        self.end_fc_without_gender = nn.Sequential(nn.Linear(48, 16), nn.Linear(16, 1))

    def forward(
        self, x: torch.Tensor, sex: torch.Tensor | None, discretized_age: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_volume(x, sex, self.use_sex)
        d = torch.as_tensor(discretized_age).reshape(x.shape[0], 1)
        h = self.fc(self.trunk(x))
        dis = self.dis_fc(d.to(h.dtype))
        if self.use_sex:
            assert sex is not None
            residual = self.end_fc_with_gender(torch.cat([h, self.sex_features(sex, h), dis], dim=1))
        else:
            residual = self.end_fc_without_gender(torch.cat([h, dis], dim=1))
        return residual, residual + d.to(residual.dtype)


def load_tsan_checkpoint(path: str | Path, model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of a TSAN checkpoint file, ``module.`` prefixes (DataParallel) stripped.

    Accepts a bare state dict or the authors' ``{"state_dict": ...}`` checkpoint (and Lightning's);
    read with ``torch.load(weights_only=True)`` (no code is unpickled). With ``model``, the state is
    loaded into it (strict) too. Raises ``ValueError`` naming the file when it holds no state dict.

    Example:
        >>> import tempfile, os
        >>> net = ScaleDense(nb_filter=4, nb_block=2)
        >>> path = os.path.join(tempfile.mkdtemp(), "tsan.pth.tar")
        >>> torch.save({"state_dict": {"module." + k: v for k, v in net.state_dict().items()}}, path)
        >>> sorted(load_tsan_checkpoint(path, ScaleDense(nb_filter=4, nb_block=2)))[:2]
        ['block.0.block.0.conv1.0.weight', 'block.0.block.0.conv1.1.bias']
    """
    try:
        obj: Any = load_weights_only(path)
    except FileNotFoundError:
        raise
    except (UnreadableWeightsError, OSError) as e:
        cause = e.cause if isinstance(e, UnreadableWeightsError) else e
        raise ValueError(f"{path}: not a readable weights file ({type(cause).__name__}: {cause})") from None
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path}: expected a state dict (name -> tensor) or {{'state_dict': ...}}")
    state = {str(k).removeprefix("module.").removeprefix("model."): v for k, v in obj.items()}
    if model is not None:
        model.load_state_dict(state)
    return state


# ------------------------------------------------------------------------------------------------- SFCN


class SFCN(nn.Module):
    r"""SFCN (Peng et al., Medical Image Analysis 2021): a lightweight fully convolutional age classifier.

    Five blocks Conv3d(3^3, padding 1) -> BN -> MaxPool(2) -> ReLU and one Conv3d(1^3) -> BN ->
    ReLU (channels ``channels``), global average pooling (the authors' AvgPool3d(5, 6, 5) at
    160x192x160), dropout, a 1^3 convolution to ``bins`` logits and ``log_softmax``. The predicted
    age is the expectation over the bin centres (:meth:`predict_age`). Module names follow the
    authors' release (``feature_extractor.conv_i``, ``classifier.conv_6``).

    Shape:
        - x: :math:`(B, 1, D, H, W)` with each side at least 32.
        - output: :math:`(B, \text{bins})` log-probabilities.

    Example:
        >>> net = SFCN(channels=(4, 4, 4, 4, 4, 4), bins=10, age_range=(20.0, 90.0))
        >>> logp = net(torch.randn(2, 1, 32, 32, 32))
        >>> logp.shape, net.predict_age(logp).shape
        (torch.Size([2, 10]), torch.Size([2]))
    """

    def __init__(
        self,
        channels: Sequence[int] = (32, 64, 128, 256, 256, 64),
        bins: int = 40,
        age_range: tuple[float, float] = (42.0, 82.0),
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        chans = [check_positive_int(c, "channels") for c in channels]
        if len(chans) < 2:
            raise ValueError(f"`channels` must list at least 2 layer widths, got {list(channels)}")
        check_positive_int(bins, "bins")
        lo, hi = (float(a) for a in age_range)
        if not hi > lo:
            raise ValueError(f"`age_range` must be (low, high) with high > low, got {age_range!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), got {dropout!r}")
        self.feature_extractor = nn.Sequential()
        cin = 1
        for i, c in enumerate(chans):
            last = i == len(chans) - 1
            layers: list[nn.Module] = [nn.Conv3d(cin, c, 1 if last else 3, padding=0 if last else 1), nn.BatchNorm3d(c)]
            if not last:
                layers.append(nn.MaxPool3d(2, stride=2))
            layers.append(nn.ReLU())
            self.feature_extractor.add_module(f"conv_{i}", nn.Sequential(*layers))
            cin = c
        self.classifier = nn.Sequential()
        self.classifier.add_module("average_pool", nn.AdaptiveAvgPool3d(1))
        self.classifier.add_module("dropout", nn.Dropout(dropout))
        self.classifier.add_module(f"conv_{len(chans)}", nn.Conv3d(cin, bins, kernel_size=1))
        step = (hi - lo) / bins
        self.register_buffer(
            "bin_centers", lo + step * (torch.arange(bins, dtype=torch.float32) + 0.5), persistent=False
        )
        self.bin_step = step
        self.bins, self.age_range = int(bins), (lo, hi)

    @property
    def head_in_features(self) -> int:
        """Width of the pooled features the final 1^3 convolution receives (``channels[-1]``)."""
        return int(self.feature_extractor[-1][0].out_channels)  # type: ignore[index]

    def replace_head(self, head: nn.Module) -> None:
        """Replace the final 1^3 convolution (on the pooled, dropped-out ``(B, head_in_features, 1, 1, 1)``
        map, i.e. a linear map of the pooled features) by ``head``, a module of the flattened
        ``(B, head_in_features)`` features; :meth:`logits` then returns its output (e.g. an ordinal
        head's), and ``forward`` its ``log_softmax``."""
        if not isinstance(head, nn.Module):
            raise TypeError(f"`head` must be an nn.Module, got {type(head).__name__}")
        name = list(self.classifier._modules)[-1]
        setattr(self.classifier, name, nn.Sequential(nn.Flatten(1), head))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The ``(B, bins)`` logits of the final layer (before ``log_softmax``)."""
        _check_volume(x, None, False)
        return self.classifier(self.feature_extractor(x)).flatten(1)

    def forward(self, x: torch.Tensor, sex: torch.Tensor | None = None) -> torch.Tensor:
        return F.log_softmax(self.logits(x), dim=1)

    def predict_age(self, log_probs: torch.Tensor) -> torch.Tensor:
        """Expected age ``sum_k p_k c_k`` over the bin centres ``c_k``: ``(B, bins) -> (B,)``."""
        centers: torch.Tensor = self.bin_centers  # type: ignore[assignment]
        return (log_probs.exp() * centers.to(log_probs.dtype)).sum(-1)


def sfcn_soft_labels(
    age: torch.Tensor, centers: torch.Tensor, *, sigma: float = 1.0, bin_width: float | None = None
) -> torch.Tensor:
    r"""Soft age labels over bins (Peng et al. 2021): the mass of :math:`\mathcal{N}(a, \sigma^2)` in each bin.

    :math:`q_k = \Phi((c_k + w/2 - a)/\sigma) - \Phi((c_k - w/2 - a)/\sigma)` for bin centres
    :math:`c_k` of width :math:`w` (``bin_width``, default the spacing of ``centers``), as the
    authors' ``num2vect``: the rows are **not** renormalised, so an age near the edge of the range
    keeps only the mass that falls inside it (about 0.5 at the edge itself).

    Shape:
        - age: :math:`(B,)`; centers: :math:`(K,)` equally spaced; output: :math:`(B, K)`.

    Example:
        >>> q = sfcn_soft_labels(torch.tensor([30.0]), torch.arange(25.5, 36.0), sigma=1.0)
        >>> int(q.argmax()), round(float(q.sum()), 4)
        (4, 1.0)
    """
    if not sigma > 0:
        raise ValueError(f"`sigma` must be > 0, got {sigma!r}")
    c = torch.as_tensor(centers)
    if not c.is_floating_point():
        c = c.float()
    if bin_width is None:
        if c.numel() < 2:
            raise ValueError(f"`bin_width` is needed with fewer than 2 bin centres, got {c.numel()} centre(s)")
        bin_width = float(c[1] - c[0])
    if not bin_width > 0:
        raise ValueError(f"`bin_width` must be > 0, got {bin_width!r}")
    a = torch.as_tensor(age).reshape(-1, 1).to(c.dtype)
    dtype = torch.float64 if c.dtype == torch.float64 else torch.float32
    hi = (c.to(dtype) + bin_width / 2 - a.to(dtype)) / sigma
    lo = (c.to(dtype) - bin_width / 2 - a.to(dtype)) / sigma
    return (torch.special.ndtr(hi) - torch.special.ndtr(lo)).to(c.dtype)


def sfcn_kl_loss(log_probs: torch.Tensor, soft_labels: torch.Tensor) -> torch.Tensor:
    r"""SFCN's KL loss: :math:`\frac{1}{B}\sum_{b,k} q_{bk} (\log(q_{bk} + 10^{-16}) - \log p_{bk})`.

    As the authors' ``my_KLDivLoss`` (``KLDivLoss(reduction="sum")`` over the batch size, ``1e-16``
    added to the target). An empty batch gives 0 that keeps the graph.

    Example:
        >>> q = torch.tensor([[0.5, 0.5]])
        >>> float(sfcn_kl_loss(q.log(), q)) < 1e-6
        True
    """
    if soft_labels.shape != log_probs.shape:
        raise ValueError(
            f"`soft_labels` must have the shape of `log_probs` {tuple(log_probs.shape)}, got {tuple(soft_labels.shape)}"
        )
    b = log_probs.shape[0]
    if b == 0:
        return log_probs.sum() * 0
    q = soft_labels.to(log_probs.dtype) + 1e-16
    return (q * (q.log() - log_probs)).sum() / b


@register_backbone("scale_dense", description="TSAN first stage (Cheng et al., IEEE TMI 2021); 3D volumes + sex")
def scale_dense(nb_filter: int = 8, nb_block: int = 5, use_sex: bool = True) -> tuple[nn.Module, int]:
    """:class:`ScaleDense` (``forward(x, sex) -> (B, 1)`` age); feature dimension 1 (the age)."""
    return ScaleDense(nb_filter=nb_filter, nb_block=nb_block, use_sex=use_sex), 1


@register_backbone("tsan_second_stage", description="TSAN second stage: residual on the discretized stage-1 age")
def tsan_second_stage(nb_filter: int = 8, nb_block: int = 5, use_sex: bool = True) -> tuple[nn.Module, int]:
    """:class:`TSANSecondStage` (``forward(x, sex, discretized_age) -> (residual, age)``); feature dimension 1."""
    return TSANSecondStage(nb_filter=nb_filter, nb_block=nb_block, use_sex=use_sex), 1


@register_backbone("sfcn", description="SFCN (Peng et al., Medical Image Analysis 2021): soft age classification")
def sfcn(
    channels: Sequence[int] = (32, 64, 128, 256, 256, 64),
    bins: int = 40,
    age_range: Sequence[float] = (42.0, 82.0),
    dropout: float = 0.5,
) -> tuple[nn.Module, int]:
    """:class:`SFCN` (``forward(x) -> (B, bins)`` log-probabilities); feature dimension ``bins``."""
    lo, hi = age_range
    return SFCN(channels=tuple(channels), bins=bins, age_range=(float(lo), float(hi)), dropout=dropout), int(bins)
