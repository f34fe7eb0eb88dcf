"""The sort / median recipes against the reference protocol (Grover et al., ICLR 2019).

* vanilla RS trains at the reference's learning rate (neuralsort ``tf/run_sort.py``: ``lr`` 1e-4);
* the median task has a score network and a separate regression network and minimises the
  paper's expected loss (checked against a slow loop over lists, samples and candidates);
* full resolution, a cosine schedule spanning the recipe's actual steps, and the best checkpoint
  on a held-out validation split (the reference keeps the best validation epoch);
* every registered relaxation is a ``task.method`` with the recipe's orientation (row ``i`` = the
  ``i``-th largest), the rank-based ones through a loss on soft ranks.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

pytest.importorskip("lightning")
pytest.importorskip("torchvision")

from rankwise.data import ClassificationData, TensorPairDataset, load_mnist5k_arrays
from rankwise.recipes import ConfigError, load_config
from rankwise.recipes.optim import lr_factor
from rankwise.recipes.runner import evaluate, train
from rankwise.recipes.sorting import (
    RELAXATIONS,
    SortingModule,
    SortOptions,
    median_loss,
    relaxed_permutation,
    sort_loss,
    true_permutation,
    true_ranks,
)

#: neuralsort tf/run_sort.py: flags.DEFINE_float('lr', 1e-4, 'initial learning rate') -- the vanilla RS setting
REFERENCE_VANILLA_LR = 1e-4


@pytest.fixture(scope="module")
def tiny_digits() -> ClassificationData:
    """160 training / 60 test real digits (disjoint)."""
    images, labels = load_mnist5k_arrays()
    idx = np.random.default_rng(1).permutation(len(labels))[:220]
    x = torch.from_numpy(images[idx]).unsqueeze(1)
    y = torch.from_numpy(labels[idx])
    return ClassificationData(
        name="mnist5k",
        train=TensorPairDataset(x[:160], y[:160]),
        test=TensorPairDataset(x[160:], y[160:]),
        val=None,
        num_classes=10,
        image_shape=tuple(x.shape[1:]),
        train_targets=labels[idx[:160]],
        test_targets=labels[idx[160:]],
        meta={"backbone_options": {"in_channels": 1}},
    )


# ------------------------------------------------------------------------------------------ defect 1


def test_vanilla_preset_uses_the_reference_learning_rate():
    assert load_config("large_mnist_vanilla").optimizer.lr == pytest.approx(REFERENCE_VANILLA_LR)
    # the relaxed methods keep their own rate: the vanilla override does not leak into the base preset
    assert load_config("large_mnist_neuralsort").optimizer.lr == pytest.approx(1e-3)


# ------------------------------------------------------------------------------------------ defect 2


def _slow_median_loss(p_hat, r, y, objective):
    """Loops over samples, lists and candidates, straight from the formulas."""
    p = p_hat.double().reshape(-1, *p_hat.shape[-3:])  # (S, B, n, n)
    s_count, b_count, n, _ = p.shape
    mid = n // 2
    total = 0.0
    for s in range(s_count):
        for b in range(b_count):
            row = [float(p[s, b, mid, j]) for j in range(n)]
            z = sum(row)
            row = [q / z for q in row]
            if objective == "expected":
                total += sum(row[j] * (float(r[b, j]) - float(y[b])) ** 2 for j in range(n))
            else:
                total += (sum(row[j] * float(r[b, j]) for j in range(n)) - float(y[b])) ** 2
    return total / (s_count * b_count)


@pytest.mark.parametrize("objective", ["expected", "point"])
@pytest.mark.parametrize("samples", [None, 3])
def test_median_loss_matches_a_slow_implementation(objective, samples):
    g = torch.Generator().manual_seed(0)
    b, n = 4, 5
    shape = (b, n, n) if samples is None else (samples, b, n, n)
    p_hat = torch.rand(shape, generator=g) + 0.05  # rows deliberately not normalised
    r, y = torch.rand(b, n, generator=g), torch.rand(b, generator=g)
    got = median_loss(p_hat, r, y, objective=objective)
    assert float(got) == pytest.approx(_slow_median_loss(p_hat, r, y, objective), rel=1e-5)
    # the two objectives differ (Jensen: expected >= point), so a swap cannot pass
    other = median_loss(p_hat, r, y, objective="point" if objective == "expected" else "expected")
    assert float(other) != pytest.approx(float(got), rel=1e-3)
    assert float(median_loss(p_hat, r, y, objective="expected")) >= float(median_loss(p_hat, r, y, objective="point"))
    with pytest.raises(ValueError, match="`objective` must be 'expected' or 'point', got 'mse'"):
        median_loss(p_hat, r, y, objective="mse")  # type: ignore[arg-type]


def test_median_module_has_score_and_regression_networks_and_the_papers_loss(tiny_digits):
    cfg = load_config("large_mnist_median_stochastic", ["task.n_samples=3", "task.n=5"])
    assert cfg.task.median_objective == "expected" and cfg.task.method == "stochastic"
    module = SortingModule(cfg, meta=tiny_digits.meta)
    model = module.model
    assert model.regressor is not None and model.regress is None
    score_params = {id(p) for p in model.scorer.parameters()}
    assert score_params.isdisjoint(id(p) for p in model.regressor.parameters())  # two networks, no sharing
    x = torch.rand(2, 5, 1, 28, 112)
    v = torch.tensor([[1.0, 5.0, 3.0, 9.0, 7.0], [20.0, 10.0, 40.0, 30.0, 0.0]])
    torch.manual_seed(3)
    loss = module._median_train_loss(x, v)
    torch.manual_seed(3)
    p_hat = relaxed_permutation(model.scorer(x).float(), cfg.task)
    ref = _slow_median_loss(p_hat.detach(), model.regressor(x).detach(), v.median(-1).values / 9999, "expected")
    assert p_hat.shape == (3, 2, 5, 5)
    assert float(loss.detach()) == pytest.approx(ref, rel=1e-5)
    loss.backward()  # both networks get gradients
    assert all(p.grad is not None for p in model.scorer.parameters())
    assert all(p.grad is not None for p in model.regressor.parameters())
    # the deterministic preset follows the reference's deterministic branch (point estimate)
    assert load_config("large_mnist_median_neuralsort").task.median_objective == "point"
    # the previous objective stays available: one CNN, the middle row selects the embedding
    old = SortingModule(load_config("large_mnist_median_neuralsort", ["task.median_objective=embedding"]))
    assert old.model.regressor is None and old.model.regress is not None


# ------------------------------------------------------------------------------------------ defect 5


def test_presets_train_at_full_resolution_with_a_decaying_schedule_and_validation():
    for name in ("large_mnist_neuralsort", "large_mnist_vanilla", "large_mnist_median_stochastic"):
        cfg = load_config(name)
        assert cfg.task.downsample == 1, name
        assert cfg.schedule.kind == "cosine", name
        assert cfg.task.val_fraction > 0, name


def test_validation_digits_are_held_out_of_the_training_lists(tiny_digits):
    from types import SimpleNamespace

    from rankwise.recipes.sorting import digit_pools

    cfg = load_config("large_mnist_neuralsort", ["task.val_fraction=0.25"])
    xtr, ytr, xva, yva, xte, _ = digit_pools(SimpleNamespace(data=tiny_digits, cfg=cfg))
    assert len(ytr) == 120 and len(yva) == 40 and len(xte) == 60
    train_set = {tuple(im.flatten().tolist()) for im in xtr}
    assert not any(tuple(im.flatten().tolist()) in train_set for im in xva)


class _LrRecorder:
    def __init__(self):
        import lightning as L

        rec = self

        class CB(L.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                rec.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

        self.lrs: list[float] = []
        self.callback = CB()


def test_schedule_spans_the_recipes_steps_and_best_checkpoint_is_the_best_validation_epoch(tmp_path, tiny_digits):
    rec = _LrRecorder()
    sets = [
        "task.n=3",
        "task.steps=6",
        "task.steps_per_epoch=2",
        "task.lists_per_batch=4",
        "task.test_lists=20",
        "task.val_lists=20",
        "task.bn_recalibration=1",
        "task.val_fraction=0.25",
    ]
    cfg = load_config("large_mnist_neuralsort", sets)
    res = train(cfg, out=tmp_path / "run", data=tiny_digits, progress=False, verbose=False, callbacks=[rec.callback])
    # cosine over the 6 steps actually trained (3 epochs of 2), from lr down to near 0
    expected = [1e-3 * lr_factor(s, cfg.schedule, total_steps=6, epochs=3) for s in range(6)]
    assert rec.lrs == pytest.approx(expected)
    assert rec.lrs[0] == pytest.approx(1e-3) and rec.lrs[-1] < 0.1e-3
    # best.ckpt = the epoch with the most validation lists fully correct, ties broken by the
    # positions correct (first such epoch on a full tie)
    with open(res.run_dir / "logs" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/all_correct")]
    full = [float(r["val/all_correct"]) for r in rows]
    pos = [float(r["val/rank_correct"]) for r in rows]
    sel = [float(r["val/selection"]) for r in rows]
    assert len(full) == 3
    for f_, p_, s_ in zip(full, pos, sel, strict=True):
        assert s_ == pytest.approx(f_ + 0.5 / 20 * p_)
    order = sorted(range(3), key=lambda e: (-full[e], -pos[e], e))
    best = torch.load(res.run_dir / "checkpoints" / "best.ckpt", weights_only=True)
    assert best["epoch"] == order[0]
    assert math.isclose(max(sel), max(float(c.get("best_model_score", -1)) for c in _ckpt_states(best)), rel_tol=1e-6)
    # the test metrics are those of the best checkpoint; evaluate() repeats them
    assert evaluate(res.run_dir, data=tiny_digits)["test"] == res.metrics["test"]
    assert res.metrics["seconds_per_step"] > 0


def _ckpt_states(ckpt):
    return [v for k, v in ckpt.get("callbacks", {}).items() if "ModelCheckpoint" in k and "best_model_score" in v]


# ------------------------------------------------------------------------------------------ every relaxation


PERMUTATION = ["neuralsort", "softsort", "diffsort_odd_even", "diffsort_bitonic", "sinkhorn"]


@pytest.mark.parametrize("method", PERMUTATION)
@pytest.mark.parametrize("n", [3, 6])
def test_permutation_relaxations_select_the_ith_largest(method, n):
    g = torch.Generator().manual_seed(n)
    # well-separated scores (gaps >= 1) in a random order per row
    scores = torch.stack([torch.randperm(n, generator=g) for _ in range(4)]).float() * 1.5 - 2.0
    scores = scores + 0.2 * torch.rand(4, n, generator=g)
    sharp = {"diffsort_odd_even": {"steepness": 1000.0}, "diffsort_bitonic": {"steepness": 1000.0}}.get(method, {})
    if method == "sinkhorn":
        sharp = {"epsilon": 1e-3, "max_iter": 2000}
    t = SortOptions(method=method, n=n, tau=0.01, options=sharp)
    p_hat = relaxed_permutation(scores, t)
    torch.testing.assert_close(p_hat, true_permutation(scores), atol=2e-2, rtol=0)
    # at the default settings: rows sum to 1 (and columns: doubly stochastic for the networks and
    # OT; NeuralSort / SoftSort are only row-stochastic) and P̂ @ scores is roughly descending
    soft = relaxed_permutation(scores, SortOptions(method=method, n=n))
    torch.testing.assert_close(soft.sum(-1), torch.ones(4, n), atol=1e-4, rtol=0)
    if method not in ("neuralsort", "softsort"):
        torch.testing.assert_close(soft.sum(-2), torch.ones(4, n), atol=1e-4, rtol=0)
    srt = (soft @ scores.unsqueeze(-1)).squeeze(-1)
    assert (srt[:, 0] >= srt[:, -1]).all()
    # straight-through: exact forward, relaxed gradients
    s = scores.clone().requires_grad_(True)
    hard = relaxed_permutation(s, SortOptions(method=method, n=n, hard=True))
    torch.testing.assert_close(hard.detach(), true_permutation(scores), atol=1e-6, rtol=0)
    (hard * torch.arange(float(n * n)).view(n, n)).sum().backward()
    assert s.grad is not None and torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0


def test_true_ranks_ascending():
    assert true_ranks(torch.tensor([[3.0, 9.0, 1.0, 5.0]])).tolist() == [[2.0, 4.0, 1.0, 3.0]]


#: the options of a rank relaxation that make it (nearly) exact, and that pool the test's scores
_SHARP = {"isotonic": {"regularization_strength": 1e-3}, "lapsum": {"alpha": 1e-3}}
_SMOOTH = {"isotonic": {"regularization_strength": 5.0}, "lapsum": {"alpha": 5.0}}


@pytest.mark.parametrize("method", ["isotonic", "perturbed", "lapsum"])
def test_rank_loss_relaxations_are_zero_at_the_true_order_and_push_towards_it(method):
    r = RELAXATIONS[method]
    assert r.returns == "rank_loss"
    t = SortOptions(method=method, n_samples=50, options=_SHARP.get(method, {}))
    values = torch.tensor([[3.0, 9.0, 1.0, 5.0]])
    ranks = true_ranks(values)
    right = values.clone() / 2  # the true order, well separated
    torch.manual_seed(0)
    assert float(r.fn(right, ranks, t)) == pytest.approx(0.0, abs=1e-6)
    wrong = (-values / 2).requires_grad_(True)  # reversed order
    torch.manual_seed(0)
    # (isotonic: a strength that pools these scores; far apart, the projection sits on a vertex: zero gradient)
    soft = SortOptions(method=method, n_samples=50, options=_SMOOTH.get(method, {}))
    loss = r.fn(wrong, ranks, soft)
    assert float(loss.detach()) > 1.0
    loss.backward()
    # descending the gradient raises the largest number's score relative to the smallest's
    assert float(wrong.grad[0, 1]) < 0 < float(wrong.grad[0, 2])
    with pytest.raises(ValueError, match="gives soft ranks, not a permutation matrix"):
        relaxed_permutation(right, t)


@pytest.mark.parametrize(
    "preset,overrides,match",
    [
        ("large_mnist_median_neuralsort", ["task.method=isotonic"], "the median task needs one of"),
        ("large_mnist_isotonic", ["task.hard=true"], r"`task.hard` .* does not apply to `task.method` 'isotonic'"),
        ("large_mnist_median_neuralsort", ["task.median_objective=mse"], r"`task.median_objective` must be one of"),
        ("large_mnist_neuralsort", ["task.median_objective=point"], r"unknown config key `task.median_objective`"),
        ("large_mnist_neuralsort", ["task.val_fraction=1"], r"`task.val_fraction` must be < 1"),
        ("large_mnist_sinkhorn", ["task.options.eps=0.1"], r"unknown option `task.options.eps`.*epsilon"),
    ],
)
def test_config_errors(preset, overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(preset, overrides)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["large_mnist_median_stochastic", "large_mnist_isotonic", "large_mnist_perturbed"])
def test_new_methods_train_tiny(tmp_path, tiny_digits, preset):
    sets = ["task.n=3", "task.steps=2", "task.lists_per_batch=4", "task.test_lists=20", "task.val_lists=10"]
    res = train(load_config(preset, sets), out=tmp_path / "run", data=tiny_digits, progress=False, verbose=False)
    assert res.metrics["test"]
    assert all(math.isfinite(v) for v in res.metrics["test"].values())


def test_lapsum_relaxation_trains_one_epoch(tmp_path, tiny_digits):
    sets = [
        "task.options.alpha=0.5",
        "task.n=3",
        "task.steps=2",
        "task.steps_per_epoch=2",
        "task.lists_per_batch=4",
        "task.test_lists=20",
        "task.val_lists=10",
    ]
    cfg = load_config("large_mnist_lapsum", sets)
    assert cfg.task.method == "lapsum" and cfg.task.options == {"alpha": 0.5}
    res = train(cfg, out=tmp_path / "run", data=tiny_digits, progress=False, verbose=False)
    assert res.metrics["test"]
    assert all(math.isfinite(v) for v in res.metrics["test"].values())
    with pytest.raises(ConfigError, match="alpha"):
        load_config("large_mnist_lapsum", ["task.options.alpha=-1"])


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("neuralsort", {}),
        ("softsort", {}),
        ("diffsort_odd_even", {"steepness": 200.0}),
        ("diffsort_bitonic", {"steepness": 200.0}),
        ("sinkhorn", {"epsilon": 0.01, "max_iter": 2000}),
    ],
)
def test_permutation_relaxations_from_op_entries_select_the_largest_first(method, options):
    """The op entries' orientation and mass metadata give the recipe's P̂: row i ~ the i-th largest."""
    from rankwise.ops import OPS

    assert any(r.name == method for e in OPS.entries() for r in e.relaxations)
    scores = torch.tensor([[0.3, 2.0, -1.0, 1.1, 0.0], [5.0, -2.0, 1.0, 3.0, 4.0]])
    t = SortOptions(method=method, tau=0.01, options=options)
    p_hat = RELAXATIONS[method].fn(scores, t)
    assert p_hat.shape == (2, 5, 5)
    assert torch.equal(p_hat.argmax(-1), scores.argsort(-1, descending=True))
    torch.testing.assert_close(p_hat.sum(-1), torch.ones(2, 5), atol=2e-2, rtol=0)


def test_gumbel_sinkhorn_relaxation_samples_select_the_largest_first(tiny_digits, tmp_path):
    """Noiseless and cold: the descending sort; with noise: ``n_samples`` doubly stochastic samples whose
    mean still puts the largest score first; the preset trains a step."""
    from rankwise.ops import gumbel_sinkhorn

    scores = torch.tensor([[0.3, 2.0, -1.0, 1.1, 0.0], [5.0, -2.0, 1.0, 3.0, 4.0]], requires_grad=True)
    cold = SortOptions(method="gumbel_sinkhorn", tau=0.01, n_samples=1, options={"noise_factor": 0.0, "n_iters": 200})
    p_hat = relaxed_permutation(scores, cold)
    assert p_hat.shape == (1, 2, 5, 5)
    assert torch.equal(p_hat[0].argmax(-1), scores.detach().argsort(-1, descending=True))
    # the same matrix as the op on X_ij = c_i s_j (an independent construction of the scores' matrix)
    c = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0])
    x = torch.stack([torch.outer(c, row) for row in scores.detach()])
    torch.testing.assert_close(
        p_hat.detach()[0], gumbel_sinkhorn(x, temperature=0.01, noise_factor=0.0, n_iters=200)[0]
    )
    torch.manual_seed(0)
    noisy = relaxed_permutation(scores, SortOptions(method="gumbel_sinkhorn", n_samples=7))
    assert noisy.shape == (7, 2, 5, 5)
    torch.testing.assert_close(noisy.sum(-2), torch.ones(7, 2, 5), atol=1e-5, rtol=0)
    assert torch.equal(noisy.mean(0)[:, 0].argmax(-1), scores.detach().argmax(-1))
    sort_loss(noisy, true_permutation(scores.detach())).backward()
    assert scores.grad is not None and torch.isfinite(scores.grad).all() and scores.grad.abs().sum() > 0
    sets = ["task.n=3", "task.steps=2", "task.lists_per_batch=4", "task.test_lists=20", "task.val_lists=10"]
    res = train(
        load_config("large_mnist_gumbel_sinkhorn", sets),
        out=tmp_path / "run",
        data=tiny_digits,
        progress=False,
        verbose=False,
    )
    assert all(math.isfinite(v) for v in res.metrics["test"].values())
    with pytest.raises(ConfigError, match="n_iters"):
        load_config("large_mnist_gumbel_sinkhorn", ["task.options.n_iters=-1"])


def test_the_median_objective_belongs_to_the_median_task_only(tmp_path):
    from typer.testing import CliRunner

    from rankwise.cli import app
    from rankwise.recipes import config_to_dict, get_recipe
    from rankwise.recipes.runner import load_run_config
    from rankwise.recipes.sorting import MedianOptions
    from tests.cli_helpers import one_error_line

    assert "median_objective" not in SortOptions.model_fields
    assert set(SortOptions.model_fields) < set(MedianOptions.model_fields)
    assert get_recipe("sort").options is SortOptions and get_recipe("median").options is MedianOptions
    r = CliRunner().invoke(app, ["train", "large_mnist_neuralsort", "--set", "task.median_objective=point"])
    assert "`task.median_objective`" in one_error_line(r)
    import yaml

    saved = config_to_dict(load_config("large_mnist_neuralsort", ["task.tau=0.5"]))
    saved["task"]["median_objective"] = "point"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(ConfigError, match=r"unknown config key `task\.median_objective`"):
        load_config(tmp_path / "config.yaml")
    # the median task keeps it
    saved = config_to_dict(load_config("large_mnist_median_neuralsort"))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    assert load_run_config(tmp_path).task.median_objective == "point"


# ------------------------------------------------------------------------------------------ error-free swaps


def _slow_error_free_loss(p_soft, p_hard, values, items, weight, soft):
    """The authors' ``main_multidigit.py`` loss, transcribed with their boolean masks and loop over groups."""
    b, n = values.shape
    p_true = F.one_hot(torch.argsort(values, dim=-1), n).transpose(-2, -1).float()
    loss = F.binary_cross_entropy(p_soft, p_true) if soft else torch.zeros(())
    data = items.reshape(b, n, -1)
    total = torch.zeros(())
    for ind in range(0, n, 4):
        gap = 4 + (n == ind + 5)
        picked = []
        for p in (p_true, p_hard):
            rows = p[:, ind : ind + gap, :]
            k = rows.shape[1]
            mask = torch.tile((rows.sum(1).unsqueeze(1) - 1).abs() < 1e-2, (1, k, 1))
            picked.append(torch.bmm(rows[mask].reshape(b, k, k).transpose(-2, -1), data[:, ind : ind + gap]))
        total = total + F.mse_loss(picked[1], picked[0])
    return loss + weight * total


@pytest.mark.parametrize("network", ["odd_even", "bitonic"])
@pytest.mark.parametrize("n", [3, 5, 6, 9])
def test_error_free_loss_is_the_authors(network, n):
    from rankwise import diffsort
    from rankwise.recipes.sorting import error_free_loss

    g = torch.Generator().manual_seed(n)
    scores = torch.randn(4, n, generator=g, requires_grad=True)
    values = torch.stack([torch.randperm(n, generator=g) for _ in range(4)]).float()
    items = torch.rand(4, n, 1, 3, 2, generator=g)
    for weight, soft in ((1.0, True), (2.5, False)):
        loss = error_free_loss(scores, values, items, network=network, loss_weight=weight, soft_loss=soft)
        (grad,) = torch.autograd.grad(loss, scores)
        s = scores.detach().clone().requires_grad_()
        p_soft = diffsort(s, network=network, steepness=10.0)[1]
        p_hard = diffsort(s, network=network, steepness=10.0, error_free=True)[1]
        ref = _slow_error_free_loss(p_soft, p_hard, values, items, weight, soft)
        (ref_grad,) = torch.autograd.grad(ref, s)
        torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)
        assert float(grad.abs().sum()) > 0


def test_error_free_relaxations_are_exact_forward_and_trained_with_the_authors_loss(tiny_digits):
    for network in ("odd_even", "bitonic"):
        method = f"diffsort_{network}_error_free"
        r = RELAXATIONS[method]
        assert r.returns == "permutation" and r.exact_forward and r.loss is not None
        scores = torch.tensor([[0.3, 2.0, -1.0, 1.1, 0.0], [5.0, -2.0, 1.0, 3.0, 4.0]], requires_grad=True)
        t = SortOptions(method=method)
        p_hat = relaxed_permutation(scores, t)
        assert torch.equal(p_hat.detach(), true_permutation(scores.detach()))  # row i: the i-th largest, exactly
        (p_hat * torch.arange(25.0).view(5, 5)).sum().backward()
        assert scores.grad is not None and scores.grad.abs().sum() > 0
        # the sorted-items term vanishes at the true order and is positive at a wrong one
        items = torch.rand(2, 5, 1, 4, 4)
        right = SortOptions(method=method, options={"soft_loss": False})
        assert float(r.loss(scores.detach(), scores.detach(), items, right)) == 0.0
        assert float(r.loss(scores.detach(), -scores.detach(), items, right)) > 0.0
    # one training step of the recipe's module through the relaxation's loss
    cfg = load_config("large_mnist_diffsort_bitonic_error_free", ["task.n=5", "task.options.loss_weight=2"])
    assert cfg.task.method == "diffsort_bitonic_error_free" and cfg.task.options == {"loss_weight": 2}
    module = SortingModule(cfg, meta=tiny_digits.meta)
    x = torch.rand(2, 5, 1, 28, 112)
    v = torch.tensor([[1.0, 5.0, 3.0, 9.0, 7.0], [20.0, 10.0, 40.0, 30.0, 0.0]])
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    loss = module._sort_train_loss(x, v)
    assert torch.isfinite(loss.detach()) and float(loss.detach()) > 0
    loss.backward()
    grads = [p.grad for p in module.model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads if g is not None)
    before = [p.detach().clone() for p in module.model.parameters()]
    opt.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, module.model.parameters()))


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["task.hard=true"], r"`task.hard` .* its forward is already the exact permutation"),
        (["task.options.distribution=bad"], r"invalid options of relaxation 'diffsort_odd_even_error_free'"),
        (["task.options.loss_weight=-1"], r"loss_weight"),
        (["task.options.tau=1"], r"unknown option `task.options.tau`.*loss_weight"),
    ],
)
def test_error_free_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("large_mnist_diffsort_odd_even_error_free", overrides)


def test_error_free_preset_trains_tiny(tmp_path, tiny_digits):
    sets = ["task.n=3", "task.steps=2", "task.lists_per_batch=4", "task.test_lists=20", "task.val_lists=10"]
    cfg = load_config("large_mnist_diffsort_odd_even_error_free", sets)
    res = train(cfg, out=tmp_path / "run", data=tiny_digits, progress=False, verbose=False)
    assert res.metrics["test"]
    assert all(math.isfinite(v) for v in res.metrics["test"].values())
