"""Training overhead: ``rankwise train`` against a plain PyTorch loop doing the same work.

Usage::

    python benchmarks/training_overhead.py                      # every family, 1 and 2 threads
    python benchmarks/training_overhead.py --cases abalone_vanilla --threads 1
    python benchmarks/training_overhead.py --markdown benchmarks/results/training_overhead.json

For each case of ``CASES``, one preset of each recipe family at a CPU size (the case's ``--set``
overrides, the same for both arms), in one process:

* deep imbalanced regression: ``abalone_vanilla`` and ``abalone_ranksim`` (3 epochs of 12 steps of
  256 rows);
* contrastive: ``mnist5k_supcon``, stage 1 for one epoch (8 steps of 32 images, two views each), then
  its linear probe (2 epochs, part of the fixed cost);
* learning to rank: ``ltr_synthetic_listnet`` (3 epochs of 16 steps of 32 queries);
* retrieval: ``digits_smooth_ap`` (40 steps of 64 images, 8 classes x 8);
* sorting: ``large_mnist_neuralsort`` (40 steps of 8 lists of 5 four-digit numbers);
* brain age: ``brain_age_tsan_synthetic``, TSAN's stage 1 alone (``task.stages=1``: ScaleDense), 3
  epochs at batch 4 on a synthetic cohort of 40 volumes at 8 mm made for the benchmark.

Every family reaches the run's weights exactly (max |dw| 0 in the results): the loops run the same
CPU kernels in the same order, so no family needs a looser tolerance than ``TOL``.

(a) **rankwise**: the library's own training entry point, :func:`rankwise.recipes.runner.train`,
    in-process (what ``rankwise train`` calls after parsing its arguments), with the preset's
    ``--set`` overrides of the case, a fresh run directory, plots on (as the preset asks);
(b) **hand loop**: a plain PyTorch loop written here, without Lightning or the recipes' training
    steps: the run's network (the copy of its modules taken when its fit starts: the same
    architecture and initial weights), the run's training ``DataLoader`` (the same data and batch
    order: its sampler's ``set_epoch`` is called every epoch), the loss written out from the
    library's loss functions, the optimizer and learning-rate factor of the run's config
    (:func:`rankwise.recipes.optim.build_optimizer`, :func:`rankwise.recipes.optim.lr_factor`),
    and the per-step reseeding of the recipes (:func:`rankwise.recipes.common.reseed`). It must end
    at the run's final weights within ``TOL`` (asserted; the JSON records the largest absolute
    difference): the two do the same work.

Per run:

* **step time**: the wall time (and the process's CPU time, which load from other processes does not
  inflate) from one training step's end to the next one's end (data fetch,
  forward, backward, optimizer and scheduler step, and for rankwise the Lightning hooks and
  logging between them; a Lightning callback times rankwise's, the loop times its own); the
  steady state is the median over the steps after the first ``WARMUP`` of the run, the first step
  of every epoch excluded (it holds the epoch's loader start, and for rankwise the previous
  epoch's validation and checkpoints);
* **fixed cost**, itemized with timers and hooks: ``startup`` (from the call of ``train`` to the
  first fit's start: config checks, data, run directory, model, Trainer), ``first_batch_extra``
  (the first step less the steady median), ``validation`` (Lightning's validation loops),
  ``checkpoints`` (writing ``.ckpt`` files: ``AtomicCheckpointIO.save_checkpoint``), ``plots`` and
  ``tsne`` (the ``plot_*`` functions of :mod:`rankwise.recipes.reports` and
  :mod:`rankwise.recipes.brain_age.plots`, t-SNE apart), ``evaluation_reports`` (outside the fits:
  test evaluation, predictions, metrics.json, meta/data records, less plots), ``loop_other``
  (inside the fits, what is neither a step, validation nor a checkpoint: epoch hooks, loggers, the
  loaders' start); and ``process_start`` once per benchmark: a fresh interpreter importing what
  ``rankwise train`` imports (``python -c "import rankwise.cli, lightning"``), in a subprocess;
* **peak memory**: the process's RSS high-water mark (Linux ``VmHWM``) during the run, reset before
  each run by writing ``5`` to ``/proc/self/clear_refs``; where that is not possible the JSON says
  ``rss_peak_kind: "ru_maxrss"`` (the process's high-water since it started).

JSON: ``benchmarks/results/training_overhead.json`` (commit, date, machine, load average).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the numba kernels load before the first call returns (as benchmarks/_timing.py sets it): no background
# thread spends CPU time during the timed steps
os.environ.setdefault("RANKWISE_NUMBA", "sync")

TOL = 1e-6
WARMUP = 3
OUT = Path(__file__).parent / "results" / "training_overhead.json"
QUIET = ["trainer.accelerator=cpu", "trainer.enable_progress_bar=false"]


# ------------------------------------------------------------------------------------------ hand loops


@dataclass
class Family:
    """How the hand loop trains one family: the attributes it copies from the run's LightningModule when
    the fit starts (``modules``: names; its ``nn.Module`` ones are trained and compared, others, such as a
    scale, are read by the loss) and its loss on a batch (``loss(mods, batch)``). The losses are written
    out with the options of the case's preset (the benchmark's cases do not override them)."""

    modules: tuple[str, ...]
    loss: Callable[[dict[str, Any], Any], Any]


def _dir_loss(regularizer: bool) -> Callable[[dict[str, Any], Any], Any]:
    def loss(m: dict[str, Any], batch: Any) -> Any:
        from rankwise.imbalanced import regression_loss
        from rankwise.losses import ranksim_loss

        x, y = batch
        y = y.reshape(-1).float()
        feats = m["backbone"](x)
        pred = m["head"](feats).squeeze(-1)
        total = regression_loss(pred, y, kind="l1")
        if regularizer:  # abalone_ranksim: gamma 0.03, lambda 2 on the encoder output
            total = total + 0.03 * ranksim_loss(feats, y, interpolation_lambda=2.0)
        return total

    return loss


def _supcon_loss(m: dict[str, Any], batch: Any) -> Any:
    """mnist5k_supcon: SupCon of the projected, normalized views (temperature 0.1, base 0.07, ``out``)."""
    import torch.nn.functional as F

    from rankwise.losses import supcon_loss

    views, y = batch
    bsz, n_views = views.shape[0], views.shape[1]
    h = m["encoder"](views.flatten(0, 1))
    z = F.normalize(m["head"](h).float(), dim=-1).view(bsz, n_views, -1)
    return supcon_loss(z, y, temperature=0.1, base_temperature=0.07, variant="out")


def _ltr_loss(m: dict[str, Any], batch: Any) -> Any:
    """ltr_synthetic_listnet: ListNet of the per-document scores of the padded lists."""
    from rankwise.losses import listnet_loss

    x, y = batch
    return listnet_loss(m["head"](m["net"](x)).squeeze(-1).float(), y)


def _retrieval_loss(m: dict[str, Any], batch: Any) -> Any:
    """digits_smooth_ap: Smooth-AP (its default temperature) of the linear embedding of the CNN features."""
    from rankwise.losses import smooth_ap_loss

    x, y = batch
    f = m["net"](x)
    return smooth_ap_loss(m["head"](f.flatten(1) if f.dim() > 2 else f).float(), y)


def _sort_loss(m: dict[str, Any], batch: Any) -> Any:
    """large_mnist_neuralsort: the row-wise cross-entropy of NeuralSort's permutation (tau 1) against the
    descending one."""
    import torch
    import torch.nn.functional as F

    from rankwise import neural_sort

    x, v = batch
    p_hat = neural_sort(m["model"](x).float(), tau=1.0)
    p_true = F.one_hot(v.argsort(dim=-1, descending=True), v.shape[-1]).to(torch.float32)
    return -(p_true * torch.log(p_hat.float().clamp_min(1e-9))).sum(-1).mean()


def _brain_age_loss(m: dict[str, Any], batch: Any) -> Any:
    """brain_age_tsan_synthetic, stage 1: ScaleDense's age, MSE + 10 x Spearman (isotonic soft ranks,
    strength 0.1) + 10 x the pairwise-difference loss on random pairs."""
    from rankwise.imbalanced import regression_loss
    from rankwise.losses import pairwise_difference_loss, spearman_loss

    x, y = batch
    y = y.reshape(-1).float()
    net = m["net"]
    pred = m["age_scale"] * net.final_layers(net.features(x["volume"], x["sex"])).reshape(-1)
    total = regression_loss(pred, y, kind="mse")
    total = total + 10.0 * spearman_loss(pred, y, ranker="isotonic", regularization_strength=0.1)
    return total + 10.0 * pairwise_difference_loss(pred, y, pairs="random")


FAMILIES: dict[str, Family] = {
    "dir": Family(("backbone", "head"), _dir_loss(False)),
    "dir_ranksim": Family(("backbone", "head"), _dir_loss(True)),
    "supcon": Family(("encoder", "head"), _supcon_loss),
    "ltr": Family(("net", "head"), _ltr_loss),
    "retrieval": Family(("net", "head"), _retrieval_loss),
    "sort": Family(("model",), _sort_loss),
    "brain_age": Family(("net", "age_scale"), _brain_age_loss),
}


@dataclass
class Case:
    preset: str
    family: str
    sets: list[str]
    data: str | None = None  # "cohort": a synthetic brain-age cohort made for the benchmark


DIR = ["trainer.max_epochs=3", "trainer.limit_train_batches=12", "report.plot_samples=200"]
#: the synthetic cohort of the brain-age case (made once per benchmark): 40 volumes at 8 mm
COHORT = {"n": 40, "spacing": 8.0}
CASES: dict[str, Case] = {
    "abalone_vanilla": Case("abalone_vanilla", "dir", DIR),
    "abalone_ranksim": Case("abalone_ranksim", "dir_ranksim", DIR),
    # one epoch of 8 steps of 32 images (two views each) from 256 training images; a 2-epoch probe
    "mnist5k_supcon": Case(
        "mnist5k_supcon",
        "supcon",
        [
            "trainer.max_epochs=1",
            "task.train_subset=256",
            "data.batch_size=32",
            "task.probe_epochs=2",
            "report.tsne=false",
        ],
    ),
    "ltr_synthetic_listnet": Case("ltr_synthetic_listnet", "ltr", ["trainer.max_epochs=3"]),
    "digits_smooth_ap": Case("digits_smooth_ap", "retrieval", ["task.steps=40", "task.steps_per_epoch=20"]),
    "large_mnist_neuralsort": Case(
        "large_mnist_neuralsort",
        "sort",
        ["task.steps=40", "task.val_lists=50", "task.test_lists=100", "task.lists_per_batch=8"],
    ),
    "brain_age_tsan_synthetic": Case(
        "brain_age_tsan_synthetic",
        "brain_age",
        ["task.stages=1", "trainer.max_epochs=3", "data.batch_size=4", "data.options.shape=[23,27,23]"],
        data="cohort",
    ),
}


# ------------------------------------------------------------------------------------------ timers


@dataclass
class Timers:
    """Exclusive wall time per bucket: a timed call inside another is subtracted from the outer one."""

    seconds: dict[str, float] = field(default_factory=dict)
    _stack: list[list[Any]] = field(default_factory=list)

    @contextlib.contextmanager
    def time(self, bucket: str) -> Iterator[None]:
        t0 = time.perf_counter()
        frame = [bucket, 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            spent = time.perf_counter() - t0
            self.seconds[bucket] = self.seconds.get(bucket, 0.0) + spent - frame[1]
            if self._stack:
                self._stack[-1][1] += spent


TIMERS = Timers()


#: (owner, name, original) of every attribute the timers replaced (:func:`uninstall_timers` puts them back)
_REPLACED: list[tuple[Any, str, Any]] = []


def _wrap(owner: Any, name: str, bucket: str) -> None:
    fn = getattr(owner, name)
    if getattr(fn, "_timed", False):
        return
    _REPLACED.append((owner, name, fn))

    def timed(*args: Any, **kwargs: Any) -> Any:
        with TIMERS.time(bucket):
            return fn(*args, **kwargs)

    timed._timed = True  # type: ignore[attr-defined]
    setattr(owner, name, timed)


def install_timers() -> None:
    """Wrap the checkpoint writer and the plot functions with :data:`TIMERS`."""
    from rankwise.recipes import reports
    from rankwise.recipes.brain_age import plots as brain_age_plots
    from rankwise.recipes.rundir import _trainer

    make = _trainer.AtomicCheckpointIO
    if not getattr(make, "_timed", False):  # a new plug-in class per Trainer: its instances' writes are timed

        def timed_io(*args: Any, **kwargs: Any) -> Any:
            io = make(*args, **kwargs)
            fn = io.save_checkpoint

            def timed(*a: Any, **kw: Any) -> Any:
                with TIMERS.time("checkpoints"):
                    return fn(*a, **kw)

            io.save_checkpoint = timed
            return io

        timed_io._timed = True  # type: ignore[attr-defined]
        _REPLACED.append((_trainer, "AtomicCheckpointIO", make))
        _trainer.AtomicCheckpointIO = timed_io  # type: ignore[assignment]
    for mod in (reports, brain_age_plots):
        for name in dir(mod):
            if name.startswith("plot_") and callable(getattr(mod, name)):
                _wrap(mod, name, "tsne" if name == "plot_tsne" else "plots")


def uninstall_timers() -> None:
    """Put back what :func:`install_timers` replaced (the checkpoint plug-in class and the plot functions)."""
    while _REPLACED:
        owner, name, original = _REPLACED.pop()
        setattr(owner, name, original)


def _probe_class() -> Any:
    import lightning as L
    import torch

    class Probe(L.Callback):
        """Step ends, validation and fit spans of every fit; at the first fit's start, copies of the modules
        the hand loop trains; at the end of training, the final weights."""

        def __init__(self, family: Family) -> None:
            self.family = family
            self.fits: list[dict[str, Any]] = []
            self.captured: dict[str, Any] | None = None
            self.final: dict[str, torch.Tensor] = {}
            self._val_t0 = 0.0
            self._prev = self._prev_cpu = 0.0

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self.fits.append(
                {"start": time.perf_counter(), "steps": [], "cpu": [], "epoch_first": [], "validation": 0.0}
            )
            if self.captured is None:
                dm = trainer.datamodule
                self.captured = {
                    "modules": {n: copy.deepcopy(getattr(pl_module, n)) for n in self.family.modules},
                    "loader": dm.train_dataloader() if dm is not None else trainer.fit_loop._data_source.instance,
                    "seed": None,
                }

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if self.captured is not None and "epochs" not in self.captured:
                self.captured |= {
                    "epochs": int(trainer.max_epochs),
                    "batches": int(trainer.num_training_batches),
                    "total": int(trainer.estimated_stepping_batches),
                }

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self._prev, self._prev_cpu = time.perf_counter(), time.process_time()
            self.fits[-1]["epoch_first"].append(len(self.fits[-1]["steps"]))

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            now, cpu = time.perf_counter(), time.process_time()
            self.fits[-1]["steps"].append(now - self._prev)
            self.fits[-1]["cpu"].append(cpu - self._prev_cpu)
            self._prev, self._prev_cpu = now, cpu

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            self._val_t0 = time.perf_counter()

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            self.fits[-1]["validation"] += time.perf_counter() - self._val_t0

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if len(self.fits) == 1:
                self.final = _weights({n: getattr(pl_module, n) for n in self.family.modules}, clone=True)

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            self.fits[-1]["end"] = time.perf_counter()

    return Probe


# ------------------------------------------------------------------------------------------ measuring


def _weights(mods: dict[str, Any], clone: bool = False) -> dict[str, Any]:
    """The state of the ``nn.Module`` values of ``mods`` under ``<name>.<key>``."""
    import torch

    return {
        f"{n}.{k}": v.detach().clone() if clone else v
        for n, m in mods.items()
        if isinstance(m, torch.nn.Module)
        for k, v in m.state_dict().items()
    }


def _reset_peak() -> str:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return "VmHWM"
    except OSError:
        return "ru_maxrss"


def _peak_mib(kind: str) -> float:
    if kind == "VmHWM":
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def steady(steps: list[float], firsts: list[int]) -> list[float]:
    """The steady-state steps: after the first :data:`WARMUP`, without the first step of each epoch."""
    skip = set(firsts)
    return [t for i, t in enumerate(steps) if i >= WARMUP and i not in skip]


def _ms(values: list[float]) -> float:
    return round(1000 * statistics.median(values), 4) if values else float("nan")


def run_rankwise(
    case: Case, threads: int, work: Path, cohort: Path | None, sets: list[str]
) -> tuple[dict[str, Any], Any]:
    from rankwise.recipes import load_config
    from rankwise.recipes.runner import train

    install_timers()
    TIMERS.seconds.clear()
    family = FAMILIES[case.family]
    extra = [f"trainer.num_threads={threads}", *QUIET]
    if cohort is not None:
        extra += [f"data.options.csv={cohort}", f"data.options.cache_dir={work / 'cache'}"]
    probe = _probe_class()(family)
    kind = _reset_peak()
    rss0 = _peak_mib(kind)
    t0 = time.perf_counter()
    cfg = load_config(case.preset, [*sets, *extra])
    res = train(cfg, out=work / f"{case.preset}_{threads}", progress=False, verbose=False, callbacks=[probe])
    total = time.perf_counter() - t0
    peak = _peak_mib(kind)
    fits = probe.fits
    steps = [s for f in fits for s in f["steps"]]
    cpu = [s for f in fits for s in f["cpu"]]
    firsts: list[int] = []
    offset = 0
    for f in fits:
        firsts += [offset + i for i in f["epoch_first"]]
        offset += len(f["steps"])
    st = steady(steps, firsts)
    median = statistics.median(st)
    in_fit = sum(f["end"] - f["start"] for f in fits)
    validation = sum(f["validation"] for f in fits)
    sec = dict(TIMERS.seconds)
    ckpt = sec.get("checkpoints", 0.0)
    plots, tsne = sec.get("plots", 0.0), sec.get("tsne", 0.0)
    startup = fits[0]["start"] - t0
    fixed = {
        "startup": startup,
        "first_batch_extra": steps[0] - median,
        "validation": validation,
        "checkpoints": ckpt,
        "plots": plots,
        "tsne": tsne,
        "evaluation_reports": total - in_fit - startup - plots - tsne,
        "loop_other": in_fit - sum(steps) - validation - ckpt,
    }
    out = {
        "steps": len(steps),
        "steady_steps": len(st),
        "step_ms": _ms(st),
        "step_cpu_ms": _ms(steady(cpu, firsts)),
        "total_s": round(total, 3),
        "train_steps_s": round(sum(steps), 3),
        "fixed_s": {k: round(v, 3) for k, v in fixed.items()},
        "fixed_total_s": round(total - median * len(steps), 3),
        "rss_peak_mib": round(peak, 1),
        "rss_start_mib": round(rss0, 1),
        "rss_peak_kind": kind,
        "fits": len(fits),
        "run_dir_metrics": sorted(res.metrics),
    }
    return out, probe


def run_hand(case: Case, threads: int, probe: Any, cfg: Any) -> tuple[dict[str, Any], float]:
    import torch

    from rankwise.recipes.common import reseed
    from rankwise.recipes.optim import build_optimizer, lr_factor

    family = FAMILIES[case.family]
    cap = probe.captured
    mods = cap["modules"]
    loader = cap["loader"]
    torch.set_num_threads(threads)
    nets = [m for m in mods.values() if isinstance(m, torch.nn.Module)]
    params = [p for m in nets for p in m.parameters() if p.requires_grad]
    kind = _reset_peak()
    t0 = time.perf_counter()
    opt = build_optimizer(params, cfg.optimizer)
    s = cfg.schedule
    sched = None
    if not (s.kind == "none" and s.warmup_epochs == 0):
        total, epochs = max(1, cap["total"]), max(1, cap["epochs"])
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: lr_factor(step, s, total_steps=total, epochs=epochs)
        )
    steps: list[float] = []
    cpu: list[float] = []
    firsts: list[int] = []
    step = 0
    for epoch in range(cap["epochs"]):
        for sampler in (getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        for m in nets:
            m.train()
        firsts.append(len(steps))
        prev, prev_cpu = time.perf_counter(), time.process_time()
        for i, batch in enumerate(loader):
            if i >= cap["batches"]:
                break
            reseed(cfg.run.seed, step)
            loss = family.loss(mods, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            step += 1
            now, now_cpu = time.perf_counter(), time.process_time()
            steps.append(now - prev)
            cpu.append(now_cpu - prev_cpu)
            prev, prev_cpu = now, now_cpu
    total_s = time.perf_counter() - t0
    peak = _peak_mib(kind)
    final = _weights(mods)
    if final.keys() != probe.final.keys():
        raise AssertionError(f"{case.preset}: the hand loop trains {sorted(final)}, rankwise {sorted(probe.final)}")
    diff = max(
        (float((final[k].double() - probe.final[k].double()).abs().max()) for k in final if final[k].numel()),
        default=0.0,
    )
    st = steady(steps, firsts)
    return {
        "steps": len(steps),
        "steady_steps": len(st),
        "step_ms": _ms(st),
        "step_cpu_ms": _ms(steady(cpu, firsts)),
        "total_s": round(total_s, 3),
        "rss_peak_mib": round(peak, 1),
        "rss_peak_kind": kind,
    }, diff


def process_start() -> float:
    """Wall seconds of a fresh interpreter importing what ``rankwise train`` imports."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import rankwise.cli, lightning"], check=True, env=os.environ.copy())
    return round(time.perf_counter() - t0, 3)


def measure_case(
    name: str, threads: int, work: Path, cohort: Path | None = None, extra: list[str] | None = None
) -> dict[str, Any]:
    """One row: case ``name`` at ``threads`` through rankwise, then through the hand loop (``extra``: more
    ``--set`` overrides after the case's own); raises ``AssertionError`` when their final weights differ
    by more than :data:`TOL` or they trained a different number of steps."""
    from rankwise.recipes import load_config

    case = CASES[name]
    sets = [*case.sets, *(extra or [])]
    rw, probe = run_rankwise(case, threads, work, cohort, sets)
    cfg = load_config(case.preset, sets)
    hand, diff = run_hand(case, threads, probe, cfg)
    if not diff <= TOL:
        raise AssertionError(f"{name} ({threads} threads): the hand loop ends {diff:.3g} from rankwise's weights")
    if hand["steps"] != rw["steps"] or rw["fits"] != 1:
        raise AssertionError(f"{name}: rankwise ran {rw['steps']} steps ({rw['fits']} fits), the loop {hand['steps']}")
    return {
        "case": name,
        "preset": case.preset,
        "overrides": sets,
        "threads": threads,
        "rankwise": rw,
        "hand": hand,
        "ratio": round(rw["step_ms"] / hand["step_ms"], 3),
        "cpu_ratio": round(rw["step_cpu_ms"] / hand["step_cpu_ms"], 3),
        "max_abs_weight_diff": diff,
    }


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(names: list[str], threads: list[int], out: Path) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from _timing import loadavg, machine
    from rankwise.recipes.rundir import quiet_lightning

    quiet_lightning()
    load_before = loadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    with tempfile.TemporaryDirectory(prefix="training_overhead_") as tmp:
        work = Path(tmp)
        cohort = None
        for name in names:
            if CASES[name].data == "cohort" and cohort is None:
                from rankwise.data.synthetic_mri import make_brain_age_synthetic

                cohort = make_brain_age_synthetic(work / "cohort", **COHORT)
            for n in threads:
                row = measure_case(name, n, work, cohort if CASES[name].data == "cohort" else None)
                rows.append(row)
                print(
                    f"{name} threads={n}: rankwise {row['rankwise']['step_ms']:.3f} ms/step, hand "
                    f"{row['hand']['step_ms']:.3f} ms/step, ratio {row['ratio']:.2f}, max |dw| "
                    f"{row['max_abs_weight_diff']:.2g}",
                    flush=True,
                )
    result = {
        "benchmark": "training_overhead",
        "commit": _git_commit(),
        "date": started,
        "machine": machine(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "threads": threads,
        "tolerance": TOL,
        "warmup_steps": WARMUP,
        "process_start_s": process_start(),
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


# ------------------------------------------------------------------------------------------ docs table


def markdown(result: dict[str, Any]) -> str:
    """The docs table of a result (``--markdown JSON``)."""
    load = "/".join(f"{x:g}" for x in result["loadavg_before"]) or "n/a"
    threads = ", ".join(str(t) for t in result["threads"])
    lines = [
        f"Commit `{result['commit']}`, {result['date']}, {result['machine']['platform']} "
        f"({result['machine']['cpu_count']} CPUs, torch {result['machine']['torch']}), load average {load} "
        f"before the run, threads {threads}; a fresh `import rankwise.cli, lightning`: "
        f"{result['process_start_s']:.2f} s.",
        "",
        "| case | threads | steps | rankwise ms/step (CPU) | hand loop ms/step (CPU) | ratio (CPU) | max \\|Δw\\| "
        "| start-up s "
        "| first batch s | validation s | checkpoints s | plots s | t-SNE s | evaluation + reports s | loop other s "
        "| peak RSS MiB (rankwise / hand) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        rw, f = r["rankwise"], r["rankwise"]["fixed_s"]
        lines.append(
            f"| {r['case']} | {r['threads']} | {rw['steps']} | {rw['step_ms']:.2f} ({rw['step_cpu_ms']:.2f}) "
            f"| {r['hand']['step_ms']:.2f} ({r['hand']['step_cpu_ms']:.2f}) | {r['ratio']:.2f} ({r['cpu_ratio']:.2f}) "
            f"| {r['max_abs_weight_diff']:.1e} | {f['startup']:.2f} | {f['first_batch_extra']:.2f} "
            f"| {f['validation']:.2f} | {f['checkpoints']:.2f} | {f['plots']:.2f} | {f['tsne']:.2f} "
            f"| {f['evaluation_reports']:.2f} | {f['loop_other']:.2f} "
            f"| {rw['rss_peak_mib']:.0f} / {r['hand']['rss_peak_mib']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--markdown", type=Path, metavar="JSON", help="print the docs table of a result JSON and exit")
    args = p.parse_args(argv)
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    run(names, [int(t) for t in args.threads.split(",")], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
