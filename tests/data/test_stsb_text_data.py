"""STS-B-DIR loader: GLUE TSVs (quotes kept literally), tokenizer, vocabulary, collate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankwise.data import (
    DataFormatError,
    build_vocab,
    collate_text_pairs,
    get_dataset,
    label_bins,
    load_stsb_dir,
    read_sts_tsv,
    tokenize,
)

HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"


def _row(i: int, s1: str, s2: str, score: str) -> str:
    return f"{i}\tmain-news\theadlines\t2013\t{i:04d}\tnone\tnone\t{s1}\t{s2}\t{score}"


def _write(tmp_path, rows_by_file=None):
    default = {
        "train_new.tsv": [
            _row(0, 'A man said "hello" to the dog.', "A man greets a dog.", "3.8"),
            _row(1, "The cat sleeps.", 'The "big" cat is sleeping', "4.5"),
            _row(2, "Stocks fell.", "It's raining.", "0"),
        ],
        "dev_new.tsv": [_row(0, "A dog barks.", "The zebra runs.", "1.2")],
        "test_new.tsv": [_row(0, "", "Cats sleep.", "5.0"), _row(1, "Hello man", "dog", "0.3")],
    }
    for name, rows in (rows_by_file or default).items():
        (tmp_path / name).write_text("\n".join([HEADER, *rows]) + "\n")
    return tmp_path


def test_tokenize_and_vocab() -> None:
    assert tokenize('He said "Hi!"') == ["he", "said", '"', "hi", "!", '"']
    vocab = build_vocab([["b", "a"], ["a", "c", "b"], ["a"]], min_freq=1)
    assert vocab == {"<pad>": 0, "<unk>": 1, "a": 2, "b": 3, "c": 4}
    assert build_vocab([["b", "a"], ["a"]], min_freq=2) == {"<pad>": 0, "<unk>": 1, "a": 2}
    with pytest.raises(ValueError, match="`min_freq` must be an int >= 1"):
        build_vocab([], min_freq=0)


def test_stsb_tiny(tmp_path) -> None:
    root = _write(tmp_path)
    d = get_dataset("stsb_dir", root=root)
    assert d.sizes() == (3, 1, 2) and d.modality == "text_pairs" and d.bin_width == 0.1 and d.label_name == "score"
    np.testing.assert_allclose(d.train_labels, [3.8, 4.5, 0.0])
    assert d.test_labels.dtype == np.float64
    vocab = d.meta["vocab"]
    assert (
        d.meta["backbone_options"] == {"vocab_size": len(vocab), "padding_idx": 0}
        and len(vocab) == d.meta["vocab_size"]
    )
    assert vocab["<pad>"] == 0 and vocab["<unk>"] == 1 and vocab['"'] > 1 and "zebra" not in vocab
    (a, b), y = d.train[0]
    assert a.dtype == torch.int64 and y.dtype == torch.float32 and y.shape == ()
    assert [k for k, v in vocab.items() if v in a.tolist()] and len(a) == len(
        tokenize('A man said "hello" to the dog.')
    )
    (a, b), y = d.val[0]
    assert vocab["<unk>"] in b.tolist()  # "zebra" is not in the train vocabulary
    (a, b), _ = d.test[0]
    assert a.numel() == 0  # empty sentence kept
    collate = d.meta["collate_fn"]
    (ids1, ids2), yb = collate([d.test[0], d.test[1]])
    assert ids1.shape == (2, 2) and ids2.shape == (2, 3) and ids1[0].tolist() == [0, 0]
    assert yb.tolist() == pytest.approx([5.0, 0.3])
    loader = torch.utils.data.DataLoader(d.train, batch_size=3, collate_fn=collate_text_pairs)
    (ids1, _ids2), yb = next(iter(loader))
    assert ids1.shape[0] == 3 and ids1.dtype == torch.int64 and yb.shape == (3,)
    assert load_stsb_dir(root, max_len=2).train[0][0][0].shape == (2,)


def test_stsb_errors(tmp_path) -> None:
    root = _write(tmp_path)
    (root / "dev_new.tsv").write_text(HEADER + "\n" + _row(0, "a", "b", "1.0") + "\n" + _row(1, "a", "b", "six") + "\n")
    with pytest.raises(DataFormatError, match=r"dev_new\.tsv, row 3: column 'score': cannot parse 'six'"):
        load_stsb_dir(root)
    (root / "dev_new.tsv").write_text(HEADER + "\n" + _row(0, "a", "b", "7") + "\n")
    with pytest.raises(DataFormatError, match=r"dev_new\.tsv, row 2: column 'score': expected a value in \[0, 5\]"):
        load_stsb_dir(root)
    (root / "dev_new.tsv").write_text(HEADER + "\n" + _row(0, "a\tb", "c", "1") + "\n")
    with pytest.raises(DataFormatError, match=r"dev_new\.tsv, row 2: expected 10 tab-separated fields, got 11"):
        load_stsb_dir(root)
    (root / "dev_new.tsv").write_text(HEADER + "\n" + _row(0, "a", "b", "") + "\n")
    with pytest.raises(DataFormatError, match=r"row 2: missing value in column 'score'"):
        load_stsb_dir(root)
    (root / "dev_new.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=r"dev_new\.tsv"):
        load_stsb_dir(root)


def test_stsb_quotes_literal(tmp_path) -> None:
    # an unbalanced quote must not swallow the following lines
    p = tmp_path / "q.tsv"
    p.write_text(HEADER + "\n" + _row(0, 'He said "no', "x", "1") + "\n" + _row(1, "y", "z", "2") + "\n")
    s1, _s2, scores = read_sts_tsv(p)
    assert s1 == ['He said "no', "y"] and scores.tolist() == [1.0, 2.0]


def test_stsb_dir_shared(shared_dir) -> None:
    root = shared_dir / "data" / "sts-b-dir"
    if not (root / "train_new.tsv").is_file():
        pytest.skip("sts-b-dir TSVs are absent")
    d = load_stsb_dir(root)
    assert d.sizes() == (5249, 1000, 1000)
    for lab in (d.train_labels, d.val_labels, d.test_labels):
        assert lab.min() >= 0.0 and lab.max() <= 5.0
    assert d.meta["vocab_size"] > 5000
    for lab in (d.val_labels, d.test_labels):  # balanced: 50 pairs per 0.25-wide bin (5.0 in the last)
        bins = np.minimum(label_bins(lab, 0.25), 19)
        assert np.bincount(bins).tolist() == [50] * 20
    (a, _b), _y = d.test[0]
    assert a.dtype == torch.int64 and a.numel() > 0
