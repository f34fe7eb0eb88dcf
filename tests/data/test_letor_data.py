"""The LETOR / svmlight reader, query grouping, padding, slate sampling, standardisation and bad input."""

from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from rankwise.data import (
    DataFileNotFoundError,
    DataFormatError,
    SlateSampler,
    get_dataset,
    load_letor,
    ltr_synthetic_arrays,
    make_ltr_synthetic,
    pad_lists,
    read_letor,
)
from rankwise.data.letor import QueryLists, group_queries

TRAIN = """\
# a comment line
2 qid:10 1:0.5 3:-1.25 # doc a
0 qid:10 2:3e-1
1 qid:4 1:1 2:2 3:3 4:4

0 qid:4 4:-0.5
3 qid:10 1:.25 2:+7   # doc c of query 10 again, after query 4
"""


def _hand_parse(text: str, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An independent parser of the format (dense float64, no validation)."""
    xs, ys, qs = [], [], []
    for line in text.splitlines():
        body = line.split("#")[0].split()
        if not body:
            continue
        ys.append(float(body[0]))
        qs.append(int(body[1].split(":")[1]))
        row = np.zeros(d)
        for tok in body[2:]:
            i, v = tok.split(":")
            row[int(i) - 1] = float(v)
        xs.append(row)
    return np.array(xs), np.array(ys), np.array(qs)


def _write_fold(root: Path, train: str, val: str, test: str, names=("train.txt", "vali.txt", "test.txt")) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in zip(names, (train, val, test)):
        (root / name).write_text(text)
    return root


VAL = "1 qid:7 1:2 2:2\n0 qid:7 3:5\n"
TEST = "0 qid:8 1:1\n2 qid:8 4:1\n0 qid:9 2:1\n"


def test_read_letor_equals_a_hand_parse(tmp_path: Path) -> None:
    p = tmp_path / "train.txt"
    p.write_text(TRAIN)
    x, y, qid = read_letor(p, num_features=4)
    hx, hy, hq = _hand_parse(TRAIN, 4)
    np.testing.assert_array_equal(x.toarray(), hx.astype(np.float32))
    np.testing.assert_array_equal(y, hy)
    np.testing.assert_array_equal(qid, hq)
    assert x.dtype == np.float32 and y.dtype == np.float32 and qid.dtype == np.int64
    gz = tmp_path / "train.txt.gz"
    gz.write_bytes(gzip.compress(TRAIN.encode()))
    np.testing.assert_array_equal(read_letor(gz, num_features=4)[0].toarray(), hx.astype(np.float32))
    bad = tmp_path / "bad.txt.bz2"
    bad.write_bytes(bz2.compress(b"1 qid:1 1:1\n2 qid:1 2:x\n"))
    with pytest.raises(DataFormatError, match=r"row 2: feature 2: cannot parse 'x'"):
        read_letor(bad)  # a compressed file's bad line is found too
    assert read_letor(p)[0].shape == (5, 4)  # num_features None: the largest index


def test_queries_grouped_in_order_of_first_appearance(tmp_path: Path) -> None:
    hx, hy, hq = _hand_parse(TRAIN, 4)
    lists = group_queries(hx.astype(np.float32), hy.astype(np.float32), hq)
    assert lists.qids.tolist() == [10, 4] and lists.lengths.tolist() == [3, 2]
    x10, y10 = lists[0]
    assert y10.tolist() == [2.0, 0.0, 3.0]  # the later document of query 10 joins its list, file order kept
    np.testing.assert_array_equal(x10.numpy(), hx[[0, 1, 4]].astype(np.float32))
    assert lists[1][1].tolist() == [1.0, 0.0]


def test_pad_lists_pads_with_minus_one_and_zero_features() -> None:
    a = (torch.ones(3, 2), torch.tensor([1.0, 0.0, 2.0]))
    b = (torch.full((1, 2), 5.0), torch.tensor([4.0]))
    x, y = pad_lists([a, b])
    assert x.shape == (2, 3, 2) and y.tolist() == [[1.0, 0.0, 2.0], [4.0, -1.0, -1.0]]
    assert x[1, 1:].abs().sum() == 0 and torch.equal(x[1, 0], torch.full((2,), 5.0))


def test_slate_sampler_caps_lists_with_seeded_subsets() -> None:
    n, d = 30, 3
    x = torch.arange(n * d, dtype=torch.float32).reshape(n, d)
    y = torch.zeros(n)
    y[17] = 2.0  # one relevant document
    lists = QueryLists(
        np.concatenate([x.numpy(), x[:4].numpy()]),
        np.concatenate([y.numpy(), np.ones(4, np.float32)]),
        np.array([0, n, n + 4]),
        np.array([1, 2]),
    )
    s = SlateSampler(lists, 8, seed=3)
    draws = []
    for g in range(20):
        xs, ys = s[2 * g]  # query 0
        assert xs.shape == (8, d) and ys.shape == (8,)
        rows = (xs[:, 0] / d).long()
        assert len(set(rows.tolist())) == 8 and torch.equal(x[rows], xs) and torch.equal(y[rows], ys)
        assert (ys > 0).sum() == 1  # the relevant document is kept in every slate
        draws.append(tuple(rows.tolist()))
    assert len(set(draws)) > 15  # fresh subsets per item
    assert torch.equal(s[6][0], SlateSampler(lists, 8, seed=3)[6][0])  # seeded by the item
    assert s[1][0].shape == (4, d)  # a shorter query is returned whole
    assert SlateSampler(lists, None, seed=0)[0][0].shape == (n, d)
    with pytest.raises(ValueError, match="slate_length"):
        SlateSampler(lists, 0, seed=0)


def test_standardisation_is_fitted_on_the_training_documents_only(tmp_path: Path) -> None:
    root = _write_fold(tmp_path / "d", TRAIN, VAL, TEST)
    data = load_letor(str(root), num_features=4)
    hx, _, _ = _hand_parse(TRAIN, 4)
    mean, std = hx.mean(0), hx.std(0)
    np.testing.assert_allclose(data.meta["mean"], mean)
    np.testing.assert_allclose(data.meta["std"], std)
    vx, _, _ = _hand_parse(VAL, 4)
    np.testing.assert_allclose(data.val.x.numpy(), ((vx - mean) / std).astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(data.train.x.numpy().mean(0), 0.0, atol=1e-6)
    # other validation / test files leave the training statistics unchanged
    other = load_letor(str(_write_fold(tmp_path / "e", TRAIN, "4 qid:1 1:100 2:-50\n", TEST)), num_features=4)
    np.testing.assert_array_equal(other.meta["mean"], data.meta["mean"])
    raw = load_letor(str(root), num_features=4, standardize=False)
    np.testing.assert_array_equal(raw.val.x.numpy(), vx.astype(np.float32))
    assert raw.meta["mean"] is None


def test_constant_feature_is_only_centred(tmp_path: Path) -> None:
    root = _write_fold(tmp_path / "d", "1 qid:1 1:3 2:1\n0 qid:1 1:3 2:2\n", "1 qid:2 1:5 2:1\n", "0 qid:3 1:3\n")
    data = load_letor(str(root))
    assert data.meta["std"][0] == 1.0 and data.val.x[0, 0].item() == 2.0


def test_queries_without_relevant_documents_kept_or_dropped(tmp_path: Path) -> None:
    root = _write_fold(tmp_path / "d", TRAIN + "0 qid:99 1:1\n0 qid:99 2:1\n", VAL, TEST)
    kept = load_letor(str(root), num_features=4)
    assert kept.sizes() == (3, 1, 2)
    train_only = load_letor(str(root), num_features=4, drop_no_relevant="train")
    assert train_only.sizes() == (2, 1, 2) and train_only.train.qids.tolist() == [10, 4]
    assert train_only.meta["dropped_queries"] == {"train": 1, "val": 0, "test": 0}
    every = load_letor(str(root), num_features=4, drop_no_relevant="all")
    assert every.sizes() == (2, 1, 1) and every.test.qids.tolist() == [8]
    # dropped queries do not enter the training statistics
    hx, _, _ = _hand_parse(TRAIN, 4)
    np.testing.assert_allclose(train_only.meta["mean"], hx.mean(0))
    with pytest.raises(ValueError, match="drop_no_relevant"):
        load_letor(str(root), drop_no_relevant="some")  # type: ignore[arg-type]


def test_fold_layout_and_missing_files(tmp_path: Path) -> None:
    _write_fold(tmp_path / "mslr" / "Fold2", TRAIN, VAL, TEST)
    assert load_letor(str(tmp_path / "mslr"), fold=2, num_features=4).sizes() == (2, 1, 2)
    with pytest.raises(DataFileNotFoundError, match="Fold1"):
        load_letor(str(tmp_path / "mslr"), fold=1)
    with pytest.raises(DataFileNotFoundError, match="LETOR folder not found"):
        load_letor(str(tmp_path / "absent"))
    with pytest.raises(DataFileNotFoundError, match=r"vali\.txt.*the val file is missing"):
        _write_fold(tmp_path / "partial", TRAIN, VAL, TEST)
        (tmp_path / "partial" / "vali.txt").unlink()
        load_letor(str(tmp_path / "partial"))
    yahoo = _write_fold(tmp_path / "yahoo", TRAIN, VAL, TEST, ("set1.train.txt", "set1.valid.txt", "set1.test.txt"))
    assert load_letor(str(yahoo), train="set1.train.txt", val="set1.valid.txt", test="set1.test.txt").sizes() == (
        2,
        1,
        2,
    )


BAD = [
    ("2 qid:1 1:0.5\nx qid:1 1:1\n", 2, "relevance: cannot parse 'x'"),
    ("2 qid:1 1:0.5\n-1 qid:1 1:1\n", 2, "relevance -1 is negative"),
    ("2 qid:1 1:0.5\n1 1:1\n", 2, "expected `qid:<integer>`"),
    ("2 qid:a 1:0.5\n", 1, "qid 'a' is not an integer"),
    ("2 qid:1.5 1:0.5\n", 1, "qid '1.5' is not an integer"),
    ("1 qid:1 1:1\n\n2 qid:1 0:0.5\n", 3, "feature index 0"),
    ("2 qid:1 1:0.5 5:1\n", 1, "feature index 5 is above `num_features` = 4"),
    ("2 qid:1 3:0.5 2:1\n", 1, "feature index 2 after 3"),
    ("2 qid:1 1:0.5 1:1\n", 1, "feature index 1 after 1"),
    ("2 qid:1 1:0.5 hello\n", 1, "expected `<feature index>:<value>`, got 'hello'"),
    ("2 qid:1 1:0.5\n1 qid:1 2:nan\n", 2, "feature 2: cannot parse 'nan'"),
    ("2 qid:1 1:inf\n", 1, "feature 1: cannot parse 'inf'"),
    ("2 qid:1 1:1e39\n", 1, "feature 1: value '1e39' is outside the float32 range"),
    ("nan qid:1 1:1\n", 1, "relevance: cannot parse 'nan'"),
    ("2 qid:1 1:abc\n", 1, "feature 1: cannot parse 'abc'"),
]


@pytest.mark.parametrize(("text", "line", "message"), BAD)
def test_bad_input_names_the_file_and_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    p = tmp_path / "bad.txt"
    p.write_text(text)
    with pytest.raises(DataFormatError) as info:
        read_letor(p, num_features=4)
    err = info.value
    assert err.path == str(p) and err.row == line, str(err)
    assert message in str(err) and str(err).startswith(f"{p}, row {line}: ")


def test_empty_file_and_bad_num_features(tmp_path: Path) -> None:
    p = tmp_path / "empty.txt"
    p.write_text("# only a comment\n")
    with pytest.raises(DataFormatError, match="no document"):
        read_letor(p)
    with pytest.raises(ValueError, match="num_features"):
        read_letor(p, num_features=0)
    with pytest.raises(TypeError, match="num_features"):
        read_letor(p, num_features=2.5)  # type: ignore[arg-type]


def test_bad_line_is_one_error_line_through_the_cli(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rankwise.cli import app
    from tests.cli_helpers import one_error_line

    root = _write_fold(tmp_path / "d", TRAIN, VAL, "0 qid:8 1:1\n2 qid:x 4:1\n")
    r = CliRunner().invoke(app, ["data", "show", "letor", "-O", f"path={root}", "-O", "num_features=4"])
    line = one_error_line(r)
    assert line == f"error: {root / 'test.txt'}, row 2: qid 'x' is not an integer"


def test_synthetic_files_read_back_equal_the_in_memory_dataset(tmp_path: Path) -> None:
    opts = {"seed": 4, "train_queries": 30, "val_queries": 6, "test_queries": 7, "num_features": 12, "informative": 4}
    folder = make_ltr_synthetic(tmp_path / "syn", **opts)
    from_files = load_letor(str(folder), num_features=12)
    in_memory = get_dataset("ltr_synthetic", **opts)
    for split in ("train", "val", "test"):
        a, b = getattr(from_files, split), getattr(in_memory, split)
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        assert np.array_equal(a.offsets, b.offsets) and np.array_equal(a.qids, b.qids)
    with pytest.raises(FileExistsError):
        make_ltr_synthetic(folder, **opts)  # never overwrites


def test_synthetic_relevance_model() -> None:
    parts = ltr_synthetic_arrays(seed=1, train_queries=400, val_queries=50, test_queries=50)
    x, y, qid = parts["train"]
    shares = np.bincount(y.astype(int), minlength=5) / len(y)
    np.testing.assert_allclose(shares, [0.517, 0.325, 0.134, 0.017, 0.007], atol=2e-3)  # MSLR-WEB10K's grades
    assert x.shape[1] == 46 and set(np.unique(qid).tolist()) == set(range(1, 401))
    assert 10 <= np.bincount(qid)[1:].min() and np.bincount(qid).max() <= 50
    # the informative features predict the grade within a query; the noise features do not
    z = (x - x.mean(0)) / x.std(0)
    corr = [abs(np.corrcoef(z[:, j], y)[0, 1]) for j in range(46)]
    assert np.mean(corr[:10]) > 3 * np.mean(corr[10:])
    assert parts["val"][2].min() == 401 and parts["test"][2].min() == 451
    with pytest.raises(ValueError, match="min_docs"):
        ltr_synthetic_arrays(min_docs=5, max_docs=4)


@pytest.mark.parametrize(
    "opts,error,needle",
    [
        ({"train_queries": -3}, ValueError, "`train_queries` must be >= 1, got -3"),
        ({"val_queries": 0}, ValueError, "`val_queries` must be >= 1, got 0"),
        ({"informative": 0}, ValueError, "`informative` must be >= 1"),
        ({"seed": -1}, ValueError, "`seed` must be >= 0, got -1"),
        ({"test_queries": 2.0}, TypeError, "`test_queries` must be an int, got float"),
        ({"num_features": True}, TypeError, "`num_features` must be an int, got bool"),
        ({"seed": "0"}, TypeError, "`seed` must be an int, got str"),
        ({"train_queries": 10**7}, ValueError, "must be at most 200,000,000 feature values"),
    ],
)
def test_synthetic_options_are_checked_by_the_shared_validator(opts, error, needle) -> None:
    with pytest.raises(error) as info:
        ltr_synthetic_arrays(**opts)
    assert needle in str(info.value)


def test_blockwise_standardisation_equals_numpy_and_leaves_the_inputs_alone(monkeypatch) -> None:
    import rankwise.data.letor as letor
    from rankwise.data import build_ranking_data

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((11, 3)) * [1.0, 1e3, 1e-3] + [5.0, -2e4, 0.0]).astype(np.float32)
    y = rng.integers(0, 3, 11).astype(np.float32)
    qid = np.repeat(np.arange(4), [3, 3, 3, 2])
    parts = {s: (x.copy(), y.copy(), qid.copy()) for s in ("train", "val", "test")}
    monkeypatch.setattr(letor, "_BLOCK_ROWS", 2)  # six blocks
    data = build_ranking_data("t", parts)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(data.meta["mean"], x64.mean(0), rtol=1e-12)
    np.testing.assert_allclose(data.meta["std"], x64.std(0), rtol=1e-10)
    np.testing.assert_allclose(data.test.x.numpy(), (x64 - x64.mean(0)) / x64.std(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(parts["train"][0], x)  # the caller's arrays are not standardised in place


def test_cli_make_show_and_missing_dataset_folder(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from rankwise.cli import app
    from tests.cli_helpers import one_error_line

    runner = CliRunner()
    out = tmp_path / "syn"
    args = ["data", "make", "ltr-synthetic", "--out", str(out), "--train-queries", "6", "--val-queries", "2"]
    bad = one_error_line(runner.invoke(app, [*args, "--num-features", "5"]))
    assert bad == "error: --informative (10) must be <= --num-features (5)"
    r = runner.invoke(app, [*args, "--test-queries", "3", "--num-features", "5", "--informative", "2"])
    assert r.exit_code == 0, r.output
    assert load_letor(str(out), num_features=5).sizes() == (6, 2, 3)
    again = one_error_line(runner.invoke(app, [*args, "--test-queries", "3"]))
    assert "train.txt exists" in again
    shown = runner.invoke(app, ["data", "show", "letor", "-O", f"path={out}"])
    assert shown.exit_code == 0 and "queries train/val/test = 6/2/3" in shown.output and "grades 0:" in shown.output
    monkeypatch.chdir(tmp_path)
    for preset in ("mslr_web10k_listnet", "yahoo_ltr_neural_ndcg"):
        line = one_error_line(runner.invoke(app, ["train", preset, "--out", str(tmp_path / preset)]))
        assert "LETOR folder not found" in line and "data.options.path" in line
