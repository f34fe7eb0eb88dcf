"""Scores of new LETOR files from a trained learning-to-rank run (the ``ltr`` recipe's ``predict_file``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("sklearn")

from typer.testing import CliRunner

from rankwise.cli import app
from rankwise.data import DataFormatError, make_ltr_synthetic
from rankwise.recipes import predict
from rankwise.recipes.learning_to_rank import ltr_metrics

runner = CliRunner()

#: ``--set`` overrides that make the MSLR preset train on the small synthetic files in seconds
TINY = [
    "data.options.fold=null",
    "model.options.hidden=[16]",
    "model.options.feature_dim=16",
    "data.batch_size=8",
    "data.eval_batch_size=7",  # batches of several queries of different lengths: padding inside a batch
    "data.num_workers=0",
    "trainer.max_epochs=3",
    "trainer.num_threads=1",
    "task.slate_length=10",
    "report.plots=false",
]


def _predict(run_dir: Path, path: Path, checkpoint: str | None = None) -> dict[str, Any]:
    return predict(run_dir, path, checkpoint=checkpoint)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ltr_predict")
    own = make_ltr_synthetic(root / "own", train_queries=40, val_queries=10, test_queries=24, seed=3)
    run_dir = root / "run"
    args = ["train", "mslr_web10k_listnet", "--out", str(run_dir), "--no-progress"]
    args += [a for s in [f"data.options.path={own}", *TINY] for a in ("--set", s)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return run_dir, own


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_scores_of_the_runs_own_test_file_give_its_test_metrics(trained):
    run_dir, own = trained
    out = _predict(run_dir, own / "test.txt")
    lines = _lines(own / "test.txt")
    assert list(out) == ["qid", "document", "relevance", "score", "rank"]
    assert len(out["score"]) == len(lines) and np.isfinite(out["score"]).all()
    assert out["qid"].tolist() == [int(ln.split()[1].removeprefix("qid:")) for ln in lines]
    assert out["relevance"].tolist() == [float(ln.split()[0]) for ln in lines]
    assert out["document"].tolist() == list(range(1, len(lines) + 1))
    # the test metrics of the run, recomputed from the scores of the file, query by query
    metrics = json.loads((run_dir / "metrics.json").read_text())["test"]
    qids = out["qid"]
    per_query = []
    for q in dict.fromkeys(qids.tolist()):
        m = qids == q
        s = torch.tensor(out["score"][m], dtype=torch.float32)[None]
        y = torch.tensor(out["relevance"][m], dtype=torch.float32)[None]
        per_query.append(ltr_metrics(s, y, [1, 3, 5, 10]))
    for key in ("ndcg@1", "ndcg@5", "ndcg@10", "mrr"):
        mine = float(torch.cat([p[key] for p in per_query]).mean()) * 100.0
        assert mine == pytest.approx(metrics[key], abs=1e-4), key


def test_rank_within_each_query_follows_the_scores(trained):
    run_dir, own = trained
    out = _predict(run_dir, own / "test.txt")
    for q in np.unique(out["qid"]):
        m = np.flatnonzero(out["qid"] == q)
        # slow reference: sort the query's documents by decreasing score, equal scores in file order
        ordered = sorted(m.tolist(), key=lambda i: (-out["score"][i], i))
        assert [int(out["rank"][i]) for i in ordered] == list(range(1, len(m) + 1))


def test_shuffled_interleaved_documents_get_the_same_scores(trained, tmp_path):
    """Documents of a query need not be contiguous or in the training files' order: each keeps its score."""
    run_dir, own = trained
    lines = _lines(own / "test.txt")
    perm = np.random.default_rng(0).permutation(len(lines))
    shuffled = tmp_path / "shuffled.txt"
    shuffled.write_text("\n".join(lines[i] for i in perm) + "\n")
    base, out = _predict(run_dir, own / "test.txt"), _predict(run_dir, shuffled)
    np.testing.assert_allclose(out["score"], base["score"][perm], rtol=1e-5, atol=1e-6)
    assert out["qid"].tolist() == base["qid"][perm].tolist()
    assert out["document"].tolist() == list(range(1, len(lines) + 1))


def test_unlabelled_documents_and_either_checkpoint(trained, tmp_path):
    """A file of new documents without known grades (all 0) is scored; each checkpoint's scores are its
    network's outputs on the standardised features (the network rebuilt here from the weights)."""
    from rankwise.data import read_letor, standardize_like
    from rankwise.recipes.learning_to_rank import LTRModule
    from rankwise.recipes.registry import get_recipe
    from rankwise.recipes.rundir._lifecycle import load_data
    from rankwise.recipes.runner import load_run_config

    run_dir, own = trained
    lines = _lines(own / "test.txt")[:9]
    new = tmp_path / "new.txt"
    new.write_text("\n".join("0 " + ln.split(" ", 1)[1] for ln in lines) + "\n")
    cfg = load_run_config(run_dir)
    data = load_data(cfg, get_recipe(cfg.recipe))
    x, _, _ = read_letor(new, num_features=data.num_features)
    feats = torch.from_numpy(standardize_like(x.toarray(), data.meta))
    scores = {}
    for name in ("best", "last"):
        out = _predict(run_dir, new, name)
        assert (out["relevance"] == 0).all()
        module = LTRModule(cfg, num_features=data.num_features, meta=data.meta).eval()
        state = torch.load(run_dir / "checkpoints" / f"{name}.ckpt", map_location="cpu", weights_only=True)
        module.load_state_dict(state["state_dict"])
        with torch.no_grad():
            expected = module(feats[None]).reshape(-1).double().numpy()
        np.testing.assert_allclose(out["score"], expected, rtol=1e-5, atol=1e-6)
        scores[name] = out["score"]
    np.testing.assert_allclose(_predict(run_dir, new)["score"], scores["best"])  # default: best


def test_a_file_the_run_cannot_read_is_a_data_format_error(trained, tmp_path):
    run_dir, own = trained
    width = int(_lines(own / "train.txt")[0].split()[-1].split(":")[0])
    bad = tmp_path / "wide.txt"
    bad.write_text(f"1 qid:1 1:0.5\n0 qid:1 {width + 1}:0.25\n")
    with pytest.raises(DataFormatError) as err:
        _predict(run_dir, bad)
    assert "wide.txt, row 2" in str(err.value) and f"above the {width} features the run's model scores" in str(
        err.value
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataFormatError, match="no document"):
        _predict(run_dir, empty)


def test_the_command_writes_one_row_per_document(trained, tmp_path):
    """``rankwise predict`` writes the columns as CSV (no MAE line: the grades are not a target)."""
    import csv

    run_dir, own = trained
    out = tmp_path / "scores.csv"
    r = runner.invoke(app, ["predict", str(run_dir), "--data", str(own / "test.txt"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(open(out)))
    base = _predict(run_dir, own / "test.txt")
    assert list(rows[0]) == ["qid", "document", "relevance", "score", "rank"]
    assert [int(row["rank"]) for row in rows] == base["rank"].tolist()
    # the network's float32 scores, written in their shortest form, read back exactly
    assert base["score"].dtype == np.float32
    assert [row["score"] for row in rows] == [str(v) for v in base["score"]]
    assert np.array_equal(np.asarray([row["score"] for row in rows], dtype=np.float32), base["score"])
    line = " ".join(r.output.split())
    assert f"{len(base['score'])} row(s) predicted: {out}" in line and "MAE" not in line


def test_large_qids_are_kept_exactly_and_one_beyond_int64_is_one_error_line(trained, tmp_path):
    run_dir, _ = trained
    big = 2**63 - 1
    new = tmp_path / "big_qids.txt"
    new.write_text(f"1 qid:{big} 1:0.5\n0 qid:{big} 1:0.25\n2 qid:123456789012 2:1.0\n")
    cols = _predict(run_dir, new)
    assert cols["qid"].tolist() == [big, big, 123456789012]
    assert sorted(cols["rank"][:2].tolist()) == [1, 2] and cols["rank"][2] == 1
    over = tmp_path / "over.txt"
    over.write_text(f"1 qid:7 1:0.5\n0 qid:{big + 1} 1:0.25\n")
    r = runner.invoke(app, ["predict", str(run_dir), "--data", str(over), "--out", str(tmp_path / "o.csv")])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in r.output
    line = " ".join(r.output.split())
    assert "over.txt, row 2" in line and f"qid '{big + 1}'" in line and "64-bit" in line
    assert not (tmp_path / "o.csv").exists()


def test_a_new_file_beyond_the_dense_limit_is_refused_before_it_is_expanded(trained, tmp_path, monkeypatch):
    from rankwise.data import letor, load_letor

    run_dir, own = trained
    data = load_letor(str(own))
    held = (data.train.num_documents + data.val.num_documents + data.test.num_documents) * data.num_features
    monkeypatch.setattr(letor, "MAX_DENSE_ELEMENTS", held)  # the run's own files fit, 4 x train.txt does not
    new = tmp_path / "many.txt"
    new.write_text((own / "train.txt").read_text() * 4)
    with pytest.raises(DataFormatError, match=r"many\.txt: [\d,]+ documents x \d+ features = .* more than the limit"):
        _predict(run_dir, new)
