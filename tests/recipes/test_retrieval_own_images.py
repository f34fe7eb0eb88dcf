"""The retrieval recipe on a user's own image folder through an MNIST preset: settings that do not fit it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lightning")
pytest.importorskip("PIL")

from typer.testing import CliRunner

from rankwise.cli import app
from tests.cli_helpers import one_error_line

runner = CliRunner()


def _folder(root: Path, classes: int, per_class: int) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        d = root / f"class{c}"
        d.mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray((rng.random((12, 12, 3)) * 255).astype("uint8")).save(d / f"{i}.png")
    return root


def _train(root: Path, out: Path, *sets: str):
    args = [f"data.options.root={root}", "task.steps=2", "task.steps_per_epoch=2", "report.plots=false", *sets]
    sets_ = [a for item in ["data.name=image_folder", *args] for a in ("--set", item)]
    return runner.invoke(app, ["train", "mnist5k_smooth_ap", "--no-progress", "-o", str(out), *sets_])


def test_a_test_split_without_two_images_of_a_class_is_refused_before_training(tmp_path: Path) -> None:
    root = _folder(tmp_path / "imgs", classes=3, per_class=6)  # 20 % test: one image per class
    line = one_error_line(_train(root, tmp_path / "run"))
    assert "test split of dataset `image_folder` has no class with two images" in line
    assert "data.options.test_fraction" in line and not (tmp_path / "run").exists()


def test_fewer_classes_than_the_preset_batches_is_one_warning_and_metrics_are_numbers(tmp_path: Path) -> None:
    import json
    import math

    root = _folder(tmp_path / "imgs", classes=3, per_class=6)
    r = _train(root, tmp_path / "run", "data.options.test_fraction=0.5")
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.output.splitlines() if "classes_per_batch" in ln]
    assert warnings == [
        "warning: `task.classes_per_batch` = 8 is more than the 3 classes of the training split of `image_folder`: "
        "every batch holds 3 classes x 8 images"
    ]
    test = json.loads((tmp_path / "run" / "metrics.json").read_text())["test"]
    assert all(math.isfinite(v) for v in test.values()), test
