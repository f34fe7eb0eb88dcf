"""The one training objective of the recipes: task loss + weighted regularizers, with named parts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rankwise.losses import LOSSES
from rankwise.recipes import load_config
from rankwise.recipes.config import ConfigError
from rankwise.recipes.loss_terms import Objective, Term, build_regularizers, build_task_loss, check_takes


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "features": torch.randn(12, 4, generator=g),
        "predictions": torch.randn(12, generator=g, requires_grad=True),
        "targets": torch.randn(12, generator=g),
        "weights": None,  # type: ignore[dict-item]
    }


def test_total_is_the_task_loss_plus_the_weighted_regularizers() -> None:
    cfg = load_config(
        "abalone_ranksim",
        ["loss.regularizers.spearman.weight=0.5", "loss.regularizers.pairwise_difference.weight=0.25"],
    )
    task, regs = build_task_loss(cfg.loss), build_regularizers(cfg.loss.regularizers)
    objective = Objective(task, regs)
    t = _tensors()
    torch.manual_seed(1)
    value = objective(t)
    assert list(value.parts) == [task.name, *(r.name for r in regs)] == objective.names
    assert objective.names == ["regression_l1", "ranksim", "spearman", "pairwise_difference"]
    torch.manual_seed(1)  # ranksim draws random numbers: replay them
    by_hand = task(t) + sum(r.weight * r(t) for r in regs)
    torch.testing.assert_close(value.total, by_hand, rtol=0, atol=0)
    torch.testing.assert_close(
        value.total, value.parts["regression_l1"] + sum(r.weight * value.parts[r.name] for r in regs)
    )
    value.total.backward()
    assert t["predictions"].grad is not None


def test_a_regularizer_of_weight_zero_is_skipped() -> None:
    calls: list[str] = []

    def part(name: str, v: float):
        def fn(tensors):
            calls.append(name)
            return torch.tensor(v)

        return fn

    objective = Objective(
        Term("task", part("task", 2.0)), [Term("off", part("off", 5.0), 0.0), Term("on", part("on", 3.0), 0.5)]
    )
    value = objective({})
    assert calls == ["task", "on"]  # the zero-weight term is not evaluated
    assert value.parts == {"task": torch.tensor(2.0), "on": torch.tensor(3.0)}
    assert float(value.total) == 3.5
    # the config route agrees: a weight-0 regularizer builds no term
    cfg = load_config("abalone_ranksim", ["loss.regularizers.ranksim.weight=0"])
    assert Objective(build_task_loss(cfg.loss), build_regularizers(cfg.loss.regularizers)).names == ["regression_l1"]


def test_term_names_must_differ() -> None:
    with pytest.raises(ValueError, match=r"distinct names.*'a' appears more than once"):
        Objective(Term("a", lambda t: torch.tensor(0.0)), [Term("a", lambda t: torch.tensor(0.0))])
    with pytest.raises(ConfigError, match=r"`loss\.regularizers\.spearman`: the loss 'spearman' is already a term"):
        load_config("abalone_spearman", ["loss.name=spearman"])


def test_logged_under_the_same_keys() -> None:
    logged: dict[str, tuple[float, dict]] = {}

    class Module:
        def log(self, key, v, **kw):
            logged[key] = (float(v), kw)

        def log_dict(self, d, **kw):
            for k, v in d.items():
                logged[k] = (float(v), kw)

    objective = Objective(
        Term("listnet", lambda t: torch.tensor(1.0)), [Term("ranknet", lambda t: torch.tensor(2.0), 0.5)]
    )
    objective.log(Module(), objective({}), batch_size=3)
    assert {k: v for k, (v, _) in logged.items()} == {
        "train/loss": 2.0,
        "train/loss/listnet": 1.0,
        "train/loss/ranknet": 2.0,
    }
    assert logged["train/loss"][1]["on_step"] and not logged["train/loss/listnet"][1]["on_step"]
    assert all(kw["batch_size"] == 3 and kw["sync_dist"] for _, kw in logged.values())
    logged.clear()
    objective.log(Module(), objective({}), batch_size=3, prefix="pretrain")
    assert sorted(logged) == ["pretrain/loss", "pretrain/loss/listnet", "pretrain/loss/ranknet"]


def test_a_loss_of_another_batch_or_an_unknown_one_errors_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"`loss\.name`: loss 'smooth_ap' does not take per-sample predictions"):
        check_takes("smooth_ap", "loss.name", ("predictions", "logits"))
    assert check_takes("listnet", "loss.name", ("padded_lists",)).name == "listnet"
    entry = LOSSES.entry("spearman")
    monkeypatch.setitem(LOSSES._entries, "spearman", dataclasses.replace(entry, takes="volumes"))
    with pytest.raises(
        ConfigError, match=r"`loss\.regularizers\.spearman\.name`: loss 'spearman' declares takes='volumes'"
    ):
        load_config("abalone_spearman")


@pytest.mark.parametrize("every", [1, 2])
def test_epoch_means_as_lightnings(tmp_path, every) -> None:
    # the means Objective.log accumulates itself are the ones Lightning's on_epoch logging gives: same CSV
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    class Net(L.LightningModule):
        def __init__(self, plain: bool) -> None:
            super().__init__()
            self.plain = plain
            self.lin = torch.nn.Linear(3, 1)
            self.objective = Objective(Term("mse", lambda t: ((t["p"] - t["y"]) ** 2).mean()), [])

        def training_step(self, batch, batch_idx):
            x, y = batch
            value = self.objective({"p": self.lin(x).squeeze(-1), "y": y})
            if self.plain:  # Lightning's own reduction
                self.log("train/loss", value.total.detach(), on_step=True, on_epoch=True, batch_size=len(y))
                self.log("train/loss/mse", value.parts["mse"].detach(), on_step=False, on_epoch=True, batch_size=len(y))
            else:
                self.objective.log(self, value, batch_size=len(y))
            return value.total

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(7, 3, generator=g), torch.randn(7, generator=g))
    logs = []
    for plain in (True, False):
        torch.manual_seed(0)
        trainer = L.Trainer(
            max_epochs=2,
            logger=CSVLogger(tmp_path, name=str(plain), version=""),
            log_every_n_steps=every,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
        )
        trainer.fit(Net(plain), torch.utils.data.DataLoader(data, batch_size=3))
        logs.append((tmp_path / str(plain) / "metrics.csv").read_text())
    assert logs[0] == logs[1]
    assert "train/loss_epoch" in logs[0] and "train/loss_step" in logs[0]
