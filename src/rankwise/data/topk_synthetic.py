r"""A synthetic many-class classification task with confusable classes (offline demo of ``recipe: topk``).

Every number obtained on it is synthetic: it checks that a top-k classification pipeline runs and
what a top-k loss changes when classes are confusable, nothing about images. The model (all draws
from ``seed``):

* ``num_classes`` classes (default 100) in ``clusters`` groups (default 20) of ``num_classes /
  clusters`` consecutive classes (class ``c`` is in group ``c // (num_classes / clusters)``);
* group centres :math:`g_j \sim N(0, \texttt{cluster\_scale}^2 I_D)` and class means
  :math:`\mu_c = g_{j(c)} + \delta_c`, :math:`\delta_c \sim N(0, \texttt{class\_scale}^2 I_D)` in
  ``dim`` dimensions (default 32): the classes of a group are close to each other, so their top-1
  is hard and the group (a top-5 set when groups hold 5 classes) is easier;
* an example of class :math:`c`: :math:`x = \mu_c + \varepsilon`, :math:`\varepsilon \sim
  N(0, \texttt{noise}^2 I_D)`, float32; ``train_per_class`` / ``val_per_class`` / ``test_per_class``
  examples of every class (balanced splits, in class order);
* ``label_noise``: that fraction of the TRAINING examples get a class drawn uniformly from all
  classes instead of their own (validation and test labels stay clean).

The structure (centres and means) and the examples come from one generator seeded by ``seed``, so
``seed`` fixes the whole dataset. At the defaults (1.0, 0.35, 1.2, 30 / 10 / 20 per class, seed 0)
the Bayes classifier (the nearest true class mean) has 67.1 % top-1 and 99.1 % top-5 accuracy on
the test split: top-1 is hard, top-5 nearly always holds the class.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rankwise._validation import check_int, check_positive
from rankwise.data._base import ClassificationData, TensorPairDataset, register_dataset

__all__ = ["load_topk_synthetic", "topk_synthetic_arrays"]

#: most feature values (examples x dim) one draw makes
MAX_VALUES = 100_000_000


def topk_synthetic_arrays(
    *,
    seed: int = 0,
    num_classes: int = 100,
    clusters: int = 20,
    dim: int = 32,
    train_per_class: int = 30,
    val_per_class: int = 10,
    test_per_class: int = 20,
    cluster_scale: float = 1.0,
    class_scale: float = 0.35,
    noise: float = 1.2,
    label_noise: float = 0.0,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{split: (features float32 (N, dim), labels int64 (N,))}`` of the model in the module doc.

    Example:
        >>> arrays = topk_synthetic_arrays(num_classes=10, clusters=2, dim=4, train_per_class=3)
        >>> arrays["train"][0].shape, arrays["test"][1][:3].tolist()
        ((30, 4), [0, 0, 0])
    """
    c = check_int(num_classes, "num_classes", low=2)
    g = check_int(clusters, "clusters", low=1)
    if c % g:
        raise ValueError(f"`clusters` must divide `num_classes` = {c} (groups of equal size), got {g}")
    d = check_int(dim, "dim", low=1)
    sizes = {
        "train": check_int(train_per_class, "train_per_class", low=1),
        "val": check_int(val_per_class, "val_per_class", low=1),
        "test": check_int(test_per_class, "test_per_class", low=1),
    }
    if sum(sizes.values()) * c * d > MAX_VALUES:
        raise ValueError(
            f"the dataset would hold {sum(sizes.values()) * c * d} feature values (examples x dim), more than "
            f"{MAX_VALUES}; use fewer examples per class, classes or dimensions"
        )
    cs = check_positive(cluster_scale, "cluster_scale", allow_zero=True)
    ks = check_positive(class_scale, "class_scale", allow_zero=True)
    sd = check_positive(noise, "noise", allow_zero=True)
    if isinstance(label_noise, bool) or not isinstance(label_noise, (int, float)) or not 0.0 <= label_noise <= 1.0:
        raise ValueError(f"`label_noise` must be a fraction in [0, 1], got {label_noise!r}")
    rng = np.random.default_rng(check_int(seed, "seed", low=0))
    centres = rng.normal(size=(g, d)) * cs
    means = centres[np.arange(c) // (c // g)] + rng.normal(size=(c, d)) * ks
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split, n in sizes.items():
        y = np.repeat(np.arange(c, dtype=np.int64), n)
        x = (means[y] + rng.normal(size=(len(y), d)) * sd).astype(np.float32)
        out[split] = (x, y)
    if label_noise > 0:
        x, y = out["train"]
        flip = rng.random(len(y)) < label_noise
        y = y.copy()
        y[flip] = rng.integers(0, c, size=int(flip.sum()))
        out["train"] = (x, y)
    return out


@register_dataset(
    "topk_synthetic",
    modality="classes",
    description="SYNTHETIC 100-class Gaussian task with confusable classes in clusters (top-k classification)",
)
def load_topk_synthetic(
    *,
    seed: int = 0,
    num_classes: int = 100,
    clusters: int = 20,
    dim: int = 32,
    train_per_class: int = 30,
    val_per_class: int = 10,
    test_per_class: int = 20,
    cluster_scale: float = 1.0,
    class_scale: float = 0.35,
    noise: float = 1.2,
    label_noise: float = 0.0,
) -> ClassificationData:
    """SYNTHETIC many-class task with confusable classes (:mod:`rankwise.data.topk_synthetic`), train / val / test.

    ``num_classes`` Gaussian classes in ``clusters`` groups of consecutive classes: group centres
    ~ N(0, ``cluster_scale``² I), class means = centre + N(0, ``class_scale``² I), examples = class
    mean + N(0, ``noise``² I) in ``dim`` dimensions; ``train_per_class`` / ``val_per_class`` /
    ``test_per_class`` examples of every class; ``label_noise``: that fraction of the training labels
    drawn uniformly anew. Everything is drawn from ``seed``.

    Items: float32 feature vectors ``(dim,)`` and the int64 class; ``image_shape`` is ``(1, 1, dim)``
    (one row of ``dim`` values). ``meta``: ``feature_names`` (``x0`` .. ``x{dim-1}``, the columns of a
    file ``rankwise predict`` reads), ``clusters`` (the group of each class) and
    ``backbone_options`` ``{in_dim: dim}`` (an ``mlp`` backbone's input width). The features are not
    standardised (they are already on a unit scale).
    """
    options: dict[str, Any] = {
        "seed": seed,
        "num_classes": num_classes,
        "clusters": clusters,
        "dim": dim,
        "train_per_class": train_per_class,
        "val_per_class": val_per_class,
        "test_per_class": test_per_class,
        "cluster_scale": cluster_scale,
        "class_scale": class_scale,
        "noise": noise,
        "label_noise": label_noise,
    }
    arrays = topk_synthetic_arrays(**options)
    per_group = int(num_classes) // int(clusters)
    split = {s: TensorPairDataset(torch.from_numpy(x), torch.from_numpy(y)) for s, (x, y) in arrays.items()}
    return ClassificationData(
        name="topk_synthetic",
        train=split["train"],
        test=split["test"],
        val=split["val"],
        num_classes=int(num_classes),
        image_shape=(1, 1, int(dim)),
        train_targets=arrays["train"][1].copy(),
        test_targets=arrays["test"][1].copy(),
        meta={
            "source": "synthetic",
            "feature_names": [f"x{j}" for j in range(int(dim))],
            "clusters": [c // per_group for c in range(int(num_classes))],
            "backbone_options": {"in_dim": int(dim)},
            "split": "generated train / val / test",
        },
    )
