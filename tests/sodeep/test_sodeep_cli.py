"""The ``rankwise sodeep`` typer app: a tiny training run and an evaluation."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("lightning")
typer_testing = pytest.importorskip("typer.testing")

from rankwise.sodeep.cli import app  # noqa: E402
from rankwise.sodeep.weights_io import load_sorter  # noqa: E402


def test_cli_train_writes_checkpoint_and_weights(tmp_path) -> None:
    runner = typer_testing.CliRunner()
    out = tmp_path / "run"
    args = [
        "train",
        "--seq-len",
        "8",
        "--model",
        "gru",
        "--steps",
        "3",
        "--batch-size",
        "8",
        "--seed",
        "1",
        "--hidden-size",
        "8",
        "--num-layers",
        "1",
        "--eval-num",
        "4",
        "--no-progress",
        "--out",
        str(out),
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "families_mean" in res.output
    assert (out / "checkpoints" / "last.ckpt").is_file()
    weights = out / "gru_8.pt"
    payload = torch.load(weights, weights_only=True)
    assert payload["train"]["steps"] == 3 and payload["train"]["seed"] == 1
    assert "families_mean" in payload["metrics"]
    sorter = load_sorter(weights)
    assert sorter(torch.randn(2, 8)).shape == (2, 8)
    report = json.loads((out / "report.json").read_text())
    assert set(report["report"]) >= {"uniform", "ties", "families_mean"}

    # the same seed gives the same weights (reproducible training)
    out2 = tmp_path / "run2"
    res2 = runner.invoke(app, [*args[:-1], str(out2)])
    assert res2.exit_code == 0, res2.output
    s2 = torch.load(out2 / "gru_8.pt", weights_only=True)["state_dict"]
    for k, v in payload["state_dict"].items():
        torch.testing.assert_close(s2[k], v, rtol=0, atol=0)

    res3 = runner.invoke(app, ["evaluate", "--weights", str(weights), "--num", "4", "--no-real", "--json"])
    assert res3.exit_code == 0, res3.output
    assert "families_mean" in json.loads(res3.output)

    # a second run into the same folder is refused, naming the file; --overwrite replaces it and only it
    (out / "notes.txt").write_text("mine")
    before = weights.read_bytes()
    res4 = runner.invoke(app, args)
    assert res4.exit_code == 2
    assert res4.output.strip().splitlines() == [
        f"error: {weights} exists (a sorter trained into {out} before): pass overwrite=True (--overwrite) to "
        "replace it, or choose another out (--out)"
    ]
    assert weights.read_bytes() == before
    res5 = runner.invoke(app, [*args, "--overwrite"])
    assert res5.exit_code == 0, res5.output
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["last.ckpt"]


def test_cli_rejects_bad_model(tmp_path) -> None:
    runner = typer_testing.CliRunner()
    res = runner.invoke(app, ["train", "--model", "exact", "--steps", "1", "--out", str(tmp_path)])
    assert res.exit_code == 2
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "`model` must be one of" in errors[0]
    assert "Traceback" not in res.output


def test_train_sorter_function_mlp(tmp_path) -> None:
    from rankwise.sodeep import train_sorter

    res = train_sorter(
        6,
        "mlp",
        steps=2,
        batch_size=4,
        seed=0,
        out=tmp_path,
        hidden_size=8,
        num_layers=1,
        eval_num=2,
        progress_bar=False,
    )
    assert res["weights"].name == "mlp_6.pt"
    s = load_sorter(res["weights"])
    assert s.model_name == "mlp" and s(torch.randn(3, 6)).shape == (3, 6)
    assert 0.0 <= res["report"]["families_mean"]["mae_rank"] <= 6


def test_cli_help_lists_commands() -> None:
    res = typer_testing.CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0 and "train" in res.output and "evaluate" in res.output
