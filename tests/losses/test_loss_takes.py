"""Every registered loss says in its registry entry what batch it takes (``takes``), consistently with
the roles of its ``inputs``; a recipe accepts a loss by it."""

from __future__ import annotations

import pytest

from rankwise._registry import INPUT_ROLES, LOSS_INPUTS, Registry
from rankwise.losses import LOSSES

#: the roles a loss of each batch may read
_ROLES = {
    "predictions": {"predictions", "targets", "weights"},
    "features": {"features", "predictions", "targets", "weights"},
    "logits": {"logits", "classes", "levels"},
    "padded_lists": {"predictions", "targets"},
    "embeddings_labels": {"embeddings", "labels"},
    "embedding_pairs": {"embeddings", "labels"},
    "class_logits": {"logits", "classes"},
}


@pytest.mark.parametrize("name", LOSSES.names(load=True))
def test_every_loss_declares_what_it_takes(name: str) -> None:
    entry = LOSSES.entry(name)
    assert entry.takes in LOSS_INPUTS, f"{name}: takes={entry.takes!r}"
    if entry.inputs is not None:
        roles = set(entry.inputs.values())
        assert roles <= _ROLES[entry.takes], f"{name}: roles {sorted(roles)} for takes={entry.takes!r}"
    assert (entry.ordinal is not None) == (entry.takes == "logits"), name


def test_each_batch_has_its_losses() -> None:
    by = {t: sorted(e.name for e in LOSSES.entries() if e.takes == t) for t in LOSS_INPUTS}
    assert {"listnet", "lambda_loss", "neural_ndcg"} <= set(by["padded_lists"])
    assert {"smooth_ap", "fastap", "supcon", "triplet"} <= set(by["embeddings_labels"])
    assert by["embedding_pairs"] == ["npairs"]
    assert by["class_logits"] == ["topk_cross_entropy"]
    assert {"ranksim", "conr", "rnc", "ordinal_entropy"} <= set(by["features"])
    assert {"balanced_mse", "spearman", "regression_l1"} <= set(by["predictions"])


def test_takes_is_checked_and_follows_from_inputs_when_left_out() -> None:
    reg: Registry = Registry("loss")
    with pytest.raises(ValueError, match=r"`takes` of loss 'odd' must be one of .*got 'volumes'"):
        reg.register("odd", takes="volumes")(lambda x: x)
    reg.register("on_features", inputs={"features": "features", "targets": "targets"})(lambda **k: 0)
    reg.register("on_predictions", inputs={"pred": "predictions", "target": "targets"})(lambda **k: 0)
    reg.register("on_logits", inputs={"logits": "logits", "targets": "classes"})(lambda **k: 0)
    reg.register("on_embeddings", inputs={"embeddings": "embeddings", "labels": "labels"})(lambda **k: 0)
    reg.register("lists", inputs={"y_pred": "predictions", "y_true": "targets"}, takes="padded_lists")(lambda **k: 0)
    reg.register("bare")(lambda x: x)
    got = {e.name: e.takes for e in reg.entries()}
    assert got == {
        "bare": None,
        "lists": "padded_lists",
        "on_embeddings": "embeddings_labels",
        "on_features": "features",
        "on_logits": "logits",
        "on_predictions": "predictions",
    }
    assert {"embeddings", "labels"} <= set(INPUT_ROLES)
