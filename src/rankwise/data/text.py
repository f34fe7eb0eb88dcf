"""STS-B-DIR sentence-pair regression from GLUE-format TSV files on the user's disk."""

from __future__ import annotations

import collections
import csv
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from rankwise.data._base import DataFormatError, RegressionData, register_dataset
from rankwise.data._files import check_header, csv_records, parse_number, read_text

__all__ = [
    "PAD",
    "UNK",
    "TextPairDataset",
    "build_vocab",
    "collate_text_pairs",
    "encode",
    "load_stsb_dir",
    "read_sts_tsv",
    "tokenize",
]

PAD, UNK = "<pad>", "<unk>"  # ids 0 and 1
_TOKEN = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Lowercase, then split into words (runs of letters/digits/_) and single punctuation marks.

    Example:
        >>> tokenize("A man's playing the Guitar!")
        ['a', 'man', "'", 's', 'playing', 'the', 'guitar', '!']
    """
    return _TOKEN.findall(text.lower())


def build_vocab(
    sentences: Iterable[Sequence[str]], *, min_freq: int = 1, max_size: int | None = None
) -> dict[str, int]:
    """Token -> id: ``<pad>`` = 0, ``<unk>`` = 1, then tokens seen >= ``min_freq`` times, most frequent first.

    Ties in frequency are ordered alphabetically, so the vocabulary is deterministic.
    """
    if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
        raise ValueError(f"`min_freq` must be an int >= 1, got {min_freq!r}")
    counts = collections.Counter(tok for sent in sentences for tok in sent)
    items = sorted(((t, c) for t, c in counts.items() if c >= min_freq), key=lambda tc: (-tc[1], tc[0]))
    if max_size is not None:
        items = items[: max(0, max_size - 2)]
    vocab = {PAD: 0, UNK: 1}
    for tok, _ in items:
        vocab.setdefault(tok, len(vocab))
    return vocab


def encode(tokens: Sequence[str], vocab: dict[str, int], max_len: int | None = None) -> torch.Tensor:
    """int64 ids of ``tokens`` (unknown -> ``<unk>``), truncated to ``max_len`` when given."""
    unk = vocab[UNK]
    ids = [vocab.get(t, unk) for t in tokens]
    if max_len is not None:
        ids = ids[:max_len]
    return torch.tensor(ids, dtype=torch.int64)


class TextPairDataset(Dataset):
    """Items ``((token_ids_1, token_ids_2), score)``: two int64 ``(L_i,)`` tensors and a float32 scalar.

    Batch with :func:`collate_text_pairs` (variable lengths).
    """

    def __init__(self, ids1: list[torch.Tensor], ids2: list[torch.Tensor], labels: np.ndarray) -> None:
        if not len(ids1) == len(ids2) == len(labels):
            raise ValueError(f"lengths differ: {len(ids1)}, {len(ids2)}, {len(labels)}")
        self.ids1 = ids1
        self.ids2 = ids2
        self.labels = torch.as_tensor(labels, dtype=torch.float32)

    def __len__(self) -> int:
        return len(self.ids1)

    def __getitem__(self, index: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        return (self.ids1[index], self.ids2[index]), self.labels[index]


def _pad(seqs: Sequence[torch.Tensor], pad_id: int) -> torch.Tensor:
    length = max([1, *(len(s) for s in seqs)])
    out = torch.full((len(seqs), length), pad_id, dtype=torch.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def collate_text_pairs(
    batch: Sequence[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]], *, pad_id: int = 0
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Batch ``((ids1, ids2), y)`` items: ``((B, L1) int64, (B, L2) int64)`` padded with ``pad_id``, ``y (B,)``.

    ``L1``/``L2`` are the longest sentence of the batch (at least 1); sentence lengths are the
    counts of non-pad ids, which :class:`rankwise.models.TextPairEncoder` recovers itself.

    Example:
        >>> import torch
        >>> items = [((torch.tensor([5, 6, 7]), torch.tensor([8])), torch.tensor(1.5)),
        ...          ((torch.tensor([9]), torch.tensor([4, 3])), torch.tensor(0.5))]
        >>> (a, b), y = collate_text_pairs(items)
        >>> a.tolist(), b.tolist(), y.tolist()
        ([[5, 6, 7], [9, 0, 0]], [[8, 0], [4, 3]], [1.5, 0.5])
    """
    ids1 = _pad([item[0][0] for item in batch], pad_id)
    ids2 = _pad([item[0][1] for item in batch], pad_id)
    y = torch.stack([torch.as_tensor(item[1], dtype=torch.float32) for item in batch]) if batch else torch.zeros(0)
    return (ids1, ids2), y


def read_sts_tsv(path: str | Path) -> tuple[list[str], list[str], np.ndarray]:
    """``(sentence1, sentence2, score)`` of a GLUE STS-B TSV (header with those columns; no quoting).

    Quotes are literal characters (``csv.QUOTE_NONE``). The file must be UTF-8 (a byte-order mark
    is dropped). A row with the wrong number of fields or a missing / non-numeric / out-of-range
    (0..5) score, a repeated column name, an empty file or one without data rows raises
    :class:`~rankwise.data.DataFormatError` naming the file (and the row); a missing file raises
    :class:`~rankwise.data.DataFileNotFoundError`.
    """
    path = Path(path)
    text = read_text(path, "STS-B file")
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    records = csv_records(text, path, delimiter="\t", quoting=csv.QUOTE_NONE)
    first = next(records, None)
    if first is None:
        raise DataFormatError(path, None, "the file is empty")
    header = check_header(first[1], path)
    missing = [c for c in ("sentence1", "sentence2", "score") if c not in header]
    if missing:
        raise DataFormatError(path, first[0], f"missing column(s) {missing}; columns are {header}")
    i1, i2, isc = header.index("sentence1"), header.index("sentence2"), header.index("score")
    for row_no, row in records:
        if len(row) != len(header):
            raise DataFormatError(path, row_no, f"expected {len(header)} tab-separated fields, got {len(row)}")
        score = parse_number(row[isc], path, row_no, "score")
        if not 0.0 <= score <= 5.0:
            raise DataFormatError(path, row_no, f"column 'score': expected a value in [0, 5], got {row[isc].strip()!r}")
        s1.append(row[i1])
        s2.append(row[i2])
        scores.append(score)
    if not scores:
        raise DataFormatError(path, None, "no data rows")
    return s1, s2, np.asarray(scores, dtype=np.float64)


@register_dataset("stsb_dir", modality="text_pairs")
def load_stsb_dir(
    root: str | Path,
    *,
    min_freq: int = 1,
    max_vocab: int | None = None,
    max_len: int | None = None,
) -> RegressionData:
    """STS-B-DIR (Yang et al. 2021) from ``root/{train_new,dev_new,test_new}.tsv`` (GLUE format).

    Sentence-pair similarity regression, score 0..5; the official split has 5,249 / 1,000 /
    1,000 pairs (val/test: 50 pairs per 0.25-wide score bin, 5.0 counted in the last one);
    ``bin_width`` is 0.1 (the reference's 50 bins; :func:`rankwise.data.label_bins` puts a score
    of exactly 5.0 in bin 50, the reference in bin 49; both give the same test shot groups:
    775 many-shot, 202 medium, 23 few-shot pairs). Text is lowercased and split into words and punctuation
    (:func:`tokenize`); the vocabulary (``<pad>`` = 0, ``<unk>`` = 1, then by frequency, tokens
    seen >= ``min_freq`` times, at most ``max_vocab``) is built from the TRAIN sentences only.
    Items ``((ids1, ids2), score)``; batch them with :func:`collate_text_pairs` (also
    ``meta["collate_fn"]``); ``meta["vocab"]`` / ``meta["vocab_size"]`` size the encoder (also
    ``meta["backbone_options"]``). No embeddings are downloaded. ``max_len`` truncates
    sentences (default: keep every token).
    """
    root = Path(root)
    files = {"train": "train_new.tsv", "val": "dev_new.tsv", "test": "test_new.tsv"}
    parsed = {split: read_sts_tsv(root / fname) for split, fname in files.items()}
    tokens = {split: ([tokenize(s) for s in p[0]], [tokenize(s) for s in p[1]]) for split, p in parsed.items()}
    vocab = build_vocab(
        (sent for pair in (tokens["train"][0], tokens["train"][1]) for sent in pair),
        min_freq=min_freq,
        max_size=max_vocab,
    )
    datasets = {
        split: TextPairDataset(
            [encode(t, vocab, max_len) for t in tokens[split][0]],
            [encode(t, vocab, max_len) for t in tokens[split][1]],
            parsed[split][2],
        )
        for split in files
    }
    return RegressionData(
        name="stsb_dir",
        train=datasets["train"],
        val=datasets["val"],
        test=datasets["test"],
        train_labels=parsed["train"][2].copy(),
        val_labels=parsed["val"][2].copy(),
        test_labels=parsed["test"][2].copy(),
        modality="text_pairs",
        input_dim=None,
        bin_width=0.1,
        label_name="score",
        label_description="similarity score",
        label_unit="0-5",
        meta={
            "root": str(root),
            "files": {k: str(root / v) for k, v in files.items()},
            "vocab": vocab,
            "vocab_size": len(vocab),
            "pad_id": 0,
            "collate_fn": collate_text_pairs,
            "backbone_options": {"vocab_size": len(vocab), "padding_idx": 0},
            "tokenizer": "lowercase; words and punctuation (rankwise.data.text.tokenize)",
            "split": "given by the files",
        },
        shot_thresholds=(100, 20),  # the DIR benchmarks' many-shot > 100, few-shot < 20
    )
