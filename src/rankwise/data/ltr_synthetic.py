r"""A synthetic learning-to-rank dataset from a documented relevance model (offline demo of ``recipe: ltr``).

Every number obtained on it is synthetic: it checks that a learning-to-rank pipeline runs and
learns a ranking signal, nothing about web search. The model (all draws from ``seed``):

* ``num_features`` features (default 46, the size of LETOR 4.0's MQ2007 / MQ2008), of which the
  first ``informative`` (default 10) carry the signal; a unit-norm weight vector
  :math:`w \in \mathbb{R}^{k}` with i.i.d. normal entries is drawn once;
* queries of :math:`n_q` documents, :math:`n_q` uniform in ``[min_docs, max_docs]``; each query has a
  difficulty :math:`b_q \sim N(0, 0.6^2)` and a feature shift :math:`m_q \sim N(0, 0.5^2 I)`;
* document :math:`d` of query :math:`q`: latent :math:`z \sim N(0, I)`, score
  :math:`s = w^\top z_{1..k} + 0.3\,(z_1^2 - 1) + b_q + \varepsilon`, :math:`\varepsilon \sim N(0, 0.5^2)`;
  the relevance grade (0-4) is the number of thresholds :math:`t_1 < \dots < t_4` below :math:`s`,
  where the thresholds are the quantiles of the training documents' scores at 51.7 %, 84.2 %,
  97.6 % and 99.3 % (so the training grades follow the label distribution of MSLR-WEB10K:
  51.7 / 32.5 / 13.4 / 1.7 / 0.7 %; validation and test use the same thresholds);
* observed features :math:`x_j = c_j\,(z_j + m_{q,j}) + j` with scales :math:`c_j = 10^{(j \bmod 4) - 1}`
  (0.1 to 100, so that standardisation matters), rounded to float32.

The per-query shift moves all documents of a query alike: only differences within a query
predict the ranking, as with query-dependent features (BM25, ...) of real collections. At the
default sizes 2 of the 500 training queries have no relevant document (grade > 0).

:func:`make_ltr_synthetic` writes the three splits as LETOR files (``train.txt``, ``vali.txt``,
``test.txt``); the ``ltr_synthetic`` dataset builds the same arrays in memory (reading the files
with the ``letor`` dataset gives identical tensors).
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rankwise._fileio import atomic_open
from rankwise._validation import check_int
from rankwise.data._base import register_dataset
from rankwise.data.letor import RankingData, build_ranking_data

__all__ = ["LTR_SYNTHETIC_FILES", "load_ltr_synthetic", "ltr_synthetic_arrays", "make_ltr_synthetic"]

#: file of each split written by :func:`make_ltr_synthetic` (the MSLR-WEB fold layout)
LTR_SYNTHETIC_FILES = {"train": "train.txt", "val": "vali.txt", "test": "test.txt"}
#: cumulative share of the grades 0, 1, 2, 3 among MSLR-WEB10K's documents
_GRADE_QUANTILES = (0.517, 0.842, 0.976, 0.993)


#: most feature values (documents x features, documents bounded by queries x ``max_docs``) one draw makes
MAX_VALUES = 200_000_000


def _draws(
    *,
    seed: int = 0,
    train_queries: int = 500,
    val_queries: int = 100,
    test_queries: int = 200,
    min_docs: int = 10,
    max_docs: int = 50,
    num_features: int = 46,
    informative: int = 10,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], np.ndarray]:
    """``({split: (features, latent score s, noise-free part of s, qid)}, grade thresholds)`` of the model."""
    sizes = {
        "train": check_int(train_queries, "train_queries", low=1),
        "val": check_int(val_queries, "val_queries", low=1),
        "test": check_int(test_queries, "test_queries", low=1),
    }
    lo, hi, d, k = (
        check_int(v, n, low=1)
        for v, n in (
            (min_docs, "min_docs"),
            (max_docs, "max_docs"),
            (num_features, "num_features"),
            (informative, "informative"),
        )
    )
    if lo > hi:
        raise ValueError(f"`min_docs` ({lo}) must be <= `max_docs` ({hi})")
    if k > d:
        raise ValueError(f"`informative` ({k}) must be <= `num_features` ({d})")
    check_int(seed, "seed", low=0)
    if sum(sizes.values()) * hi * d > MAX_VALUES:
        raise ValueError(
            f"`train_queries` + `val_queries` + `test_queries` ({sum(sizes.values())}) x `max_docs` ({hi}) x "
            f"`num_features` ({d}) must be at most {MAX_VALUES:,} feature values"
        )
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(k)
    w /= np.linalg.norm(w)
    scale = 10.0 ** ((np.arange(d) % 4) - 1)
    offset = np.arange(d, dtype=np.float64)
    raw: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    next_qid = 1
    for split, q in sizes.items():
        n_docs = rng.integers(lo, hi + 1, size=q)
        qid = np.repeat(np.arange(next_qid, next_qid + q), n_docs)
        next_qid += q
        n = int(n_docs.sum())
        b = np.repeat(rng.normal(0.0, 0.6, size=q), n_docs)
        m = np.repeat(rng.normal(0.0, 0.5, size=(q, d)), n_docs, axis=0)
        z = rng.standard_normal((n, d))
        signal = z[:, :k] @ w + 0.3 * (z[:, 0] ** 2 - 1.0) + b
        s = signal + rng.normal(0.0, 0.5, size=n)
        x = (scale * (z + m) + offset).astype(np.float32)
        raw[split] = (x, s, signal, qid.astype(np.int64))
    return raw, np.quantile(raw["train"][1], _GRADE_QUANTILES)


def ltr_synthetic_arrays(
    *,
    seed: int = 0,
    train_queries: int = 500,
    val_queries: int = 100,
    test_queries: int = 200,
    min_docs: int = 10,
    max_docs: int = 50,
    num_features: int = 46,
    informative: int = 10,
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{split: (features float32 (N, D), relevance float32 (N,), qid int64 (N,))}`` of the model above.

    Query ids run from 1 over the train, then val, then test queries.

    Example:
        >>> parts = ltr_synthetic_arrays(train_queries=20, val_queries=5, test_queries=5)
        >>> x, y, qid = parts["train"]
        >>> x.shape, y[:8].tolist(), qid[:3].tolist()
        ((557, 46), [3.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0], [1, 1, 1])
    """
    raw, thresholds = _draws(
        seed=seed,
        train_queries=train_queries,
        val_queries=val_queries,
        test_queries=test_queries,
        min_docs=min_docs,
        max_docs=max_docs,
        num_features=num_features,
        informative=informative,
    )
    return {
        split: (x, (s[:, None] > thresholds[None, :]).sum(axis=1).astype(np.float32), qid)
        for split, (x, s, _, qid) in raw.items()
    }


@register_dataset(
    "ltr_synthetic",
    modality="query_lists",
    description="synthetic learning-to-rank queries from a documented relevance model",
)
def load_ltr_synthetic(
    *,
    seed: int = 0,
    train_queries: int = 500,
    val_queries: int = 100,
    test_queries: int = 200,
    min_docs: int = 10,
    max_docs: int = 50,
    num_features: int = 46,
    informative: int = 10,
    standardize: bool = True,
    drop_no_relevant: Literal["none", "train", "all"] = "none",
) -> RankingData:
    """Synthetic learning-to-rank queries (grades 0-4 from a documented model; see ``rankwise.data.ltr_synthetic``).

    Each document has ``num_features`` features, the first ``informative`` carrying a linear plus
    quadratic relevance signal with query-level difficulty and feature shifts and Gaussian noise;
    grades follow MSLR-WEB10K's label distribution on the training split. Every number obtained on
    it is synthetic. ``rankwise data make ltr-synthetic --out DIR`` writes the same data as LETOR
    files. Options: ``seed``, ``train_queries`` (500), ``val_queries`` (100), ``test_queries`` (200),
    ``min_docs`` (10), ``max_docs`` (50), ``num_features`` (46), ``informative`` (10),
    ``standardize``, ``drop_no_relevant`` (as for ``letor``).
    """
    parts = ltr_synthetic_arrays(
        seed=seed,
        train_queries=train_queries,
        val_queries=val_queries,
        test_queries=test_queries,
        min_docs=min_docs,
        max_docs=max_docs,
        num_features=num_features,
        informative=informative,
    )
    return build_ranking_data(
        "ltr_synthetic",
        parts,
        standardize=standardize,
        drop_no_relevant=drop_no_relevant,
        meta={"source": f"synthetic (seed {seed})"},
    )


def _write_split(path: Path, x: np.ndarray, y: np.ndarray, qid: np.ndarray) -> None:
    cols = [f"{j + 1}:{{:.9g}}" for j in range(x.shape[1])]
    row = " ".join(cols)
    with atomic_open(path, "w") as fh:  # make_ltr_synthetic refuses an existing file first
        for xi, yi, qi in zip(x.tolist(), y.tolist(), qid.tolist()):
            fh.write(f"{int(yi)} qid:{qi} " + row.format(*xi) + "\n")


def make_ltr_synthetic(out: str | Path, **options: Any) -> Path:
    """Write the synthetic dataset as LETOR files ``out/{train,vali,test}.txt``; returns ``out``.

    ``options`` are those of :func:`ltr_synthetic_arrays`. ``out`` is created; an existing file of
    the same name is never overwritten (``FileExistsError``).

    Example:
        >>> import tempfile
        >>> from rankwise.data import load_letor
        >>> folder = make_ltr_synthetic(tempfile.mkdtemp() + "/ltr", train_queries=8, val_queries=2, test_queries=2)
        >>> load_letor(str(folder), num_features=46).sizes()
        (8, 2, 2)
    """
    parts = ltr_synthetic_arrays(**options)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    for name in LTR_SYNTHETIC_FILES.values():
        if (root / name).exists():
            raise FileExistsError(errno.EEXIST, f"{root / name} exists; choose another --out", str(root / name))
    for split, name in LTR_SYNTHETIC_FILES.items():
        _write_split(root / name, *parts[split])
    return root
