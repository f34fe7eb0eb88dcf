"""The ``rankwise`` command line (typer + rich).

::

    rankwise demo                                   # abalone: L1 vs +LDS vs Balanced MSE
    rankwise train abalone_ranksim --set trainer.max_epochs=50 --set loss.regularizers.ranksim.weight=1

Expected user errors (bad config, data file, run directory, checkpoint, unwritable output, full
disk, a missing optional dependency: the ``pip install 'rankwise[EXTRA]'`` that installs it) print
one ``error: ...`` line on stderr and exit with status 2; a NaN/inf loss exits 1; SIGTERM exits
143 (the run is marked ``failed`` in its meta.json); ``--debug`` shows tracebacks. Heavy packages
(Lightning, torchvision, matplotlib) are imported only by the commands that use them.
    rankwise train my.yaml --resume --out runs/my   # continue a killed run from its last checkpoint
    rankwise evaluate runs/abalone_ranksim
    rankwise predict runs/my_run --data new.csv     # predictions for new rows -> runs/my_run/predictions/new.csv
    rankwise --debug train ...                      # show the traceback of an error (or RANKWISE_DEBUG=1)
    rankwise --version
    rankwise compare abalone_vanilla abalone_lds --seeds 0,1,2 --out runs/cmp
    rankwise data list | rankwise data show abalone
    rankwise data make brain-age-synthetic --n 400 --spacing 4 --out data/brain_age_synthetic
    rankwise presets
    rankwise sodeep train --seq-len 64 --model gru
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from rankwise._cli_help import Command, Group
from rankwise._progress import eta as _eta
from rankwise._progress import progress_lines
from rankwise._progress import runs_line as _runs_line

__all__ = ["app", "main"]

app = typer.Typer(
    cls=Group,
    name="rankwise",
    help="Train and compare deep imbalanced regression / ranking / contrastive recipes (rankwise).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(
    cls=Group,
    help="Offline datasets: list them, show one with its label histogram, make a synthetic one.",
    no_args_is_help=True,
)
app.add_typer(data_app, name="data")

#: env var switching ``rankwise demo`` to its reduced (test) mode
ENV_DEMO_QUICK = "RANKWISE_DEMO_QUICK"
#: env var equivalent of ``rankwise --debug`` (tracebacks instead of one-line errors)
ENV_DEBUG = "RANKWISE_DEBUG"

_state = {"debug": False, "signalled": False}


def _print_version(value: bool) -> None:
    if value:
        from rankwise import __version__

        typer.echo(f"rankwise {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[
        bool, typer.Option("--debug", help=f"show the traceback of an error (also env {ENV_DEBUG}=1)")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Train and compare deep imbalanced regression / ranking / contrastive recipes (rankwise)."""
    _state["debug"] = debug or os.environ.get(ENV_DEBUG, "") not in ("", "0")


#: the demo's methods: the L1 baseline and the imbalance methods that measurably help abalone's
#: rare ages (docs/results.md, sections 5-6). RankSim is not among them: it does not improve
#: abalone at any weight from 0.03 to 100 (results.md section 6 explains why).
DEMO_METHODS = {
    "L1 (vanilla)": "abalone_vanilla",
    "+LDS (sqrt_inv)": "abalone_lds",
    "Balanced MSE (BMC)": "abalone_balanced_mse",
}


def _mount_sodeep() -> None:
    try:
        from rankwise.sodeep.cli import app as sodeep_app
    except Exception as exc:  # pragma: no cover - only when the SoDeep package is broken/absent
        err = f"{type(exc).__name__}: {exc}"
        fallback = typer.Typer(cls=Group, help="SoDeep learned sorters (unavailable in this installation).")

        @fallback.callback(invoke_without_command=True)
        def _unavailable() -> None:
            typer.echo(f"rankwise sodeep is unavailable: {err}", err=True)
            raise typer.Exit(1)

        app.add_typer(fallback, name="sodeep")
        return
    app.add_typer(sodeep_app, name="sodeep", help="SoDeep learned differentiable sorters: train and evaluate.")


_mount_sodeep()


def _console(stderr: bool = False) -> Any:
    """Rich console of stdout (``stderr``: of stderr); when it is not a terminal (a file, a pipe) lines are
    never wrapped."""
    from rich.console import Console

    con = Console(stderr=stderr)
    if not con.is_terminal and "COLUMNS" not in os.environ:
        con = Console(width=10_000, stderr=stderr)
    return con


@contextlib.contextmanager
def _data_warnings(con: Any, *, repeat: bool = True) -> Any:
    """Print the warnings about a run's data (``DataDefaultsWarning``) and about an unfinished run
    (``UnfinishedRunWarning``) as ``warning: ...`` lines and the notes
    (``DataNote``) as ``note: ...``; ``repeat=False``: each distinct message once (the runs of a comparison)."""
    import warnings

    from rankwise.recipes.common import DataDefaultsWarning, DataNote
    from rankwise.recipes.rundir import ChangedDataWarning, UnfinishedRunWarning

    shown = warnings.showwarning
    seen: set[str] = set()

    def show(message: Any, category: Any, *args: Any, **kw: Any) -> None:
        if issubclass(category, DataDefaultsWarning) and not repeat:
            if str(message) in seen:
                return
            seen.add(str(message))
        if issubclass(category, DataNote):
            con.print(f"note: {message}", highlight=False, soft_wrap=True)
        elif issubclass(category, (DataDefaultsWarning, ChangedDataWarning, UnfinishedRunWarning)):
            con.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)
        else:
            shown(message, category, *args, **kw)

    with warnings.catch_warnings():  # restores showwarning and the filters
        warnings.simplefilter("always", DataDefaultsWarning)
        warnings.simplefilter("always", ChangedDataWarning)
        warnings.showwarning = show
        yield


def _fail(msg: str, code: int = 2) -> None:
    """Print ``error: MSG`` as one line on stderr (the message verbatim: ``[train]`` is no markup), exit ``code``."""
    from rich.markup import escape

    text = escape(" ".join(str(msg).split()))
    sys.stdout.flush()  # what the command printed before comes first
    _console(stderr=True).print(f"[bold red]error:[/] {text}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(code)


def _error_code(e: BaseException) -> tuple[int, str] | None:
    """(exit status, one-line message) of an expected error, ``None`` for an unexpected one."""
    import signal

    from rankwise._extras import missing_dependency

    if isinstance(e, ImportError):  # before the imports below, which may need the missing module
        missing = missing_dependency(e)
        return None if missing is None else (2, missing)

    from rankwise.data import DataFormatError
    from rankwise.recipes.common import NonFiniteLossError
    from rankwise.recipes.config import UserError
    from rankwise.recipes.rundir import RunTerminated, termination_of

    e = termination_of(e) or e  # a DataLoader worker killed by the signal that stopped the run
    if isinstance(e, (UserError, DataFormatError)):
        return 2, str(e)
    if isinstance(e, NonFiniteLossError):
        return 1, str(e)
    if isinstance(e, RunTerminated):
        return 128 + e.signum, f"{e}; the run is marked failed in its meta.json (continue it with --resume)"
    if isinstance(e, KeyboardInterrupt):  # Ctrl-C outside a run (a run raises RunTerminated(SIGINT))
        return 130, str(e) or "interrupted"
    if isinstance(e, SystemExit) and type(e).__name__ == "SIGTERMException":  # Lightning's own SIGTERM stop
        return 128 + signal.SIGTERM, "terminated by signal SIGTERM; the run is marked failed in its meta.json"
    if isinstance(e, OSError):
        where = f": {e.filename}" if e.filename else ""
        return 2, f"{e.strerror or e}{where}"
    if isinstance(e, MemoryError):
        return 1, "out of memory; try a smaller data.batch_size or model"
    return None


def _run_guarded(fn: Any) -> Any:
    """Run ``fn``; an expected error becomes one ``error: ...`` line and an exit status (see module doc)."""
    try:
        return fn()
    except typer.Exit:
        raise
    except BaseException as e:
        if _state["debug"]:
            raise
        known = _error_code(e)
        if known is None:
            if isinstance(e, SystemExit):
                raise
            _fail(f"unexpected {type(e).__name__}: {e} (run with --debug for the traceback)", code=1)
            raise
        code, msg = known
        if code >= 128:  # a signal ended the command: main() exits without tearing down the interpreter
            _state["signalled"] = True
        _fail(msg, code=code)
        raise


def _parse_devices(devices: str | None) -> Any:
    if devices is None:
        return None
    d = devices.strip()
    if d.isdigit() or (d.startswith("-") and d[1:].isdigit()):
        return int(d)
    if "," in d:
        parts = [v.strip() for v in d.split(",")]
        if not all(v.isdigit() for v in parts):
            _fail(f"--devices expects auto, a count or a list of device indices such as 0,1; got {devices!r}")
        return [int(v) for v in parts]
    return d


def _print_tables(tables: list[tuple[list[str], list[list[str]]]], title: str) -> None:
    """Print the ``(header, rows)`` tables a recipe makes of its results (``Recipe.tables``)."""
    from rich import box
    from rich.table import Table

    con = _console()
    con.print(title, highlight=False)
    for header, rows in tables:
        # compact borders so that a six-column table fits an 80-column log; a cell that still does not
        # fit wraps (fold) instead of being cut to "1.35 ± 0.…"
        table = Table(title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for i, h in enumerate(header):
            table.add_column(h, overflow="fold", justify="left" if i == 0 else "right")
        for r in rows:
            table.add_row(*r)
        con.print(table)


# ------------------------------------------------------------------------------------------ commands


def _new_run_config(
    config: str | None,
    data: Path | None,
    target: str | None,
    method: str,
    dataset: str | None,
    overrides: list[str],
    con: Any,
    *,
    quiet: bool = False,
) -> Any:
    """The config of a new run: a preset / YAML file with ``overrides``, or the user's own table (``--data``)."""
    if data is None:
        from rankwise.recipes import load_config

        return load_config(config, overrides)
    from rankwise.recipes.own_data import own_data_config

    cfg, defaults = own_data_config(data, str(target), method, dataset=dataset, overrides=overrides)
    if not quiet:
        con.print(f"defaults from {data}: {defaults.describe()}", highlight=False, soft_wrap=True)
    return cfg


@app.command(cls=Command)
def train(
    config: Annotated[
        str | None,
        typer.Argument(help="YAML config file or preset name (see `rankwise presets`); omit it with --data"),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data", help="your own table: a CSV file (bins, shot groups, batch size and epochs come from it)"
        ),
    ] = None,
    target: Annotated[str | None, typer.Option("--target", help="with --data: the label column")] = None,
    method: Annotated[
        str, typer.Option("--method", help="with --data: vanilla, lds, fds, ranksim, balanced_mse, ... (a preset's)")
    ] = "lds",
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", help="with --data: the loader (csv, image_csv, ...; default from the file name)"),
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="override: key.sub=value (YAML value)")] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue the run directory from its last checkpoint")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="run directory (default: run.out_dir/run.name)")
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing rankwise run directory")] = False,
    devices: Annotated[str | None, typer.Option(help="Lightning devices: auto, N or a list 0,1")] = None,
    accelerator: Annotated[str | None, typer.Option(help="cpu, gpu, cuda, mps, auto")] = None,
    strategy: Annotated[str | None, typer.Option(help="Lightning strategy, e.g. ddp")] = None,
    num_nodes: Annotated[int | None, typer.Option("--num-nodes", help="number of nodes")] = None,
    precision: Annotated[str | None, typer.Option(help="32-true, 16-mixed, bf16-mixed, ...")] = None,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="progress bar, or one line per epoch")
    ] = True,
) -> None:
    """Train one run; writes config, checkpoints, logs, metrics.json and plots to the run directory.

    Your own table: `rankwise train --data my.csv --target price --method lds` (no preset needed).
    """
    from rankwise.distributed import torchrun_trainer_defaults

    if (config is None) == (data is None):
        both = ", not both" if config is not None else ""
        _fail(f"give a config (a preset name or YAML file) or --data FILE --target COLUMN{both}")
    if data is not None and not target:
        _fail("--data needs --target: the label column of the file")

    overrides = list(set_ or [])
    # under torchrun: devices / num_nodes / strategy="ddp" from its environment unless given
    launch = torchrun_trainer_defaults()
    hardware = {
        "devices": _parse_devices(devices) if devices is not None else launch.get("devices"),
        "accelerator": accelerator,
        "strategy": strategy if strategy is not None else launch.get("strategy"),
        "num_nodes": num_nodes if num_nodes is not None else launch.get("num_nodes"),
    }
    hardware = {k: v for k, v in hardware.items() if v is not None}
    if not resume:  # a new run: overrides of its config; a resumed run: applied to its saved config
        for key, value in (*hardware.items(), ("precision", precision)):
            if value is not None:
                overrides.append(f"trainer.{key}={value}")

    if resume and set_:
        _console().print(
            "[yellow]warning:[/] --resume continues with the config saved in the run directory; "
            f"ignoring {', '.join(set_)} (--devices/--accelerator/--strategy/--num-nodes still apply; --precision "
            "must be the run's own)",
            highlight=False,
            soft_wrap=True,
        )
    con = _console()

    def go() -> Any:
        from rankwise.recipes.runner import train as run_train

        run_dir, cfg = out, None
        if resume:  # the run continues with its saved config, read once by run_train
            from rankwise.recipes.runner import check_resumes_same_run, named_run

            if run_dir is None:  # the directory the config names
                named = _new_run_config(config, data, target, method, dataset, [], con, quiet=True)
                run_dir = Path(named.run.out_dir) / named.run.name
                check_resumes_same_run(run_dir, named.recipe, named.data.name, str(config or data))
            elif config is not None:  # the run it names must be the one in the directory
                check_resumes_same_run(run_dir, *named_run(config), config)
        else:
            cfg = _new_run_config(config, data, target, method, dataset, overrides, con)
        return run_train(
            cfg,
            out=run_dir,
            resume=resume,
            overwrite=overwrite,
            progress=progress,
            # --precision too: a resume refuses one that differs from the precision the run trained at
            trainer_overrides={**hardware, **({"precision": precision} if precision else {})} if resume else None,
            log_epoch=lambda line: con.print(line, highlight=False, soft_wrap=True),
        )

    with _data_warnings(con), progress_lines(progress):
        res = _run_guarded(go)
    if not res.metrics:  # rank > 0 of a distributed run
        return
    from rankwise.recipes.registry import get_recipe

    recipe = get_recipe(res.config.recipe)
    _print_tables(recipe.tables({res.config.run.name: [res.metrics]}), f"test metrics: {res.run_dir}")
    con.print(f"run directory: [bold]{res.run_dir}[/]")


@app.command(cls=Command)
def evaluate(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `rankwise train`")],
    plots: Annotated[bool, typer.Option("--plots/--no-plots")] = True,
    checkpoint: Annotated[
        str | None, typer.Option(help="best or last (default: the one the recipe evaluates after training)")
    ] = None,
    allow_changed_data: Annotated[
        bool,
        typer.Option(
            "--allow-changed-data",
            help="evaluate on data that changed since training (results to RUN_DIR/changed_data/, not metrics.json)",
        ),
    ] = False,
    progress: Annotated[
        bool,
        typer.Option("--progress/--no-progress", help="progress lines of a long data read (after 2 s), or none"),
    ] = True,
) -> None:
    """Re-evaluate a run's checkpoint on its test set (rewrites metrics.json and plots).

    Data that changed since training (a data file, config.yaml's data section) are refused.
    """

    def go() -> Any:
        from rankwise.recipes.registry import get_recipe
        from rankwise.recipes.runner import evaluate as run_eval

        metrics = run_eval(run_dir, plots=plots, checkpoint=checkpoint, allow_changed_data=allow_changed_data)
        return get_recipe(metrics["recipe"]), metrics

    con = _console()
    with _data_warnings(con), progress_lines(progress):
        recipe, metrics = _run_guarded(go)
    where = f"{run_dir / 'changed_data'} (changed data)" if metrics.get("changed_data") else str(run_dir)
    _print_tables(recipe.tables({run_dir.name: [metrics]}), f"test metrics: {where}")


@app.command(cls=Command)
def predict(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `rankwise train`")],
    data: Annotated[
        Path,
        typer.Option(
            "--data",
            help="file of new rows: a CSV with the training file's feature (or image path) columns by name, "
            "the target column optional (brain_age: a cohort CSV of volumes; ltr: a LETOR file)",
        ),
    ],
    out: Annotated[  # text, not a Path: `out/` (a folder) keeps its separator
        str | None,
        typer.Option(
            "--out",
            "-o",
            metavar="<path>",
            help="predictions CSV to write (default: RUN_DIR/predictions/<FILE stem>.csv)",
        ),
    ] = None,
    checkpoint: Annotated[
        str | None, typer.Option(help="best or last (default: the one the recipe evaluates after training)")
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing predictions file")] = False,
    allow_changed_data: Annotated[
        bool,
        typer.Option("--allow-changed-data", help="predict although the run's data changed since training"),
    ] = False,
    preprocess_out: Annotated[
        Path | None,
        typer.Option(
            "--preprocess-out",
            help="brain_age run trained on `rankwise preprocess` scans, raw --data: preprocess the scans into "
            "this folder with the run's template first",
        ),
    ] = None,
    progress: Annotated[
        bool,
        typer.Option(
            "--progress/--no-progress", help="progress lines of a long read and of the blocks predicted (after 2 s)"
        ),
    ] = True,
) -> None:
    """Predict new rows with a trained run: writes the file's columns plus `prediction` as CSV.

    Columns are read by name and standardized as for training; predictions are in the target's units.

    With the target column in the file, the MAE is printed.

    Recipes: dir, rrt, rnc (tables, image lists); brain_age (NIfTI cohorts: bias-corrected ages too; raw scans
    of a run trained on `rankwise preprocess` output: --preprocess-out DIR preprocesses them first).

    ltr (LETOR files: a score and rank per document); supcon, retrieval (image paths: a class); topk (image
    paths or feature columns: a class and its top k).
    """

    err = _console(stderr=True)

    def on_scan(done: int, total: int, name: str, status: str, seconds: float) -> None:
        err.print(f"preprocess [{done}/{total}] {name}: {status}", highlight=False, markup=False, soft_wrap=True)

    def go() -> Any:
        from rankwise._progress import Steps
        from rankwise.recipes.predict_data import target_column
        from rankwise.recipes.runner import (
            check_predictions_path,
            default_predictions_path,
            load_run_config,
            predict_blocks,
            predictions_mae,
            write_prediction_blocks,
        )

        path: str | Path = out if out is not None else default_predictions_path(run_dir, data)
        check_predictions_path(path, overwrite=overwrite, data=data, run_dir=run_dir)  # before the model runs
        target = target_column(load_run_config(run_dir))
        blocks = predict_blocks(
            run_dir,
            data,
            checkpoint=checkpoint,
            allow_changed_data=allow_changed_data,
            preprocess_out=preprocess_out,
            on_scan=on_scan,
        )
        errors = [0.0, 0]  # the absolute errors' sum and count over the blocks
        steps = Steps(f"predicting {data.name}", unit="rows")

        def scored(blocks: Any) -> Any:
            for columns in blocks:
                mae = predictions_mae(columns, target) if target is not None else None
                if mae is not None:
                    errors[0] += mae[0] * mae[1]
                    errors[1] += mae[1]
                yield columns
                steps.advance(len(next(iter(columns.values()), ())))
            steps.close()

        try:
            written, rows = write_prediction_blocks(scored(blocks), path, overwrite=overwrite)
        finally:  # the run directory's lock, also where the blocks were not all read
            close = getattr(blocks, "close", None)
            if close is not None:
                close()
        return written, rows, (errors[0] / errors[1], int(errors[1])) if errors[1] else None

    con = _console()
    with _data_warnings(con), progress_lines(progress):
        written, rows, mae = _run_guarded(go)
    score = f"; MAE {mae[0]:.4g} on the {mae[1]} row(s) with a target value" if mae is not None else ""
    con.print(f"{rows} row(s) predicted: {written}{score}", highlight=False, soft_wrap=True)


#: most seeds one `rankwise compare` accepts
MAX_SEEDS = 1000


def _parse_seeds(seeds: str) -> list[int]:
    try:
        if "-" in seeds and "," not in seeds:
            lo, hi = (int(v) for v in seeds.split("-"))
            out = list(range(lo, hi + 1)) if 0 <= hi - lo < MAX_SEEDS else []
        else:
            out = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        out = []
    if not out or any(s < 0 for s in out) or len(out) > MAX_SEEDS:
        _fail(f"--seeds expects e.g. 0,1,2 or 0-4 (seeds >= 0, increasing, at most {MAX_SEEDS}), got {seeds!r}")
    return out


@app.command(cls=Command)
def compare(
    sources: Annotated[list[str], typer.Argument(help="configs / presets (trained per seed) or run directories")],
    seeds: Annotated[str, typer.Option(help="seeds, e.g. 0,1,2 or 0-4")] = "0,1,2",
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="override applied to every config")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder (runs/ + report.md)")] = Path("runs/compare"),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="retrain runs that already finished")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress")] = False,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="runs trained at once (0: CPU cores / a run's num_threads)")
    ] = 1,
) -> None:
    """Several methods x seeds: mean ± std table of their recipe and a markdown report (OUT/report.md)."""
    if jobs < 0:
        _fail(f"--jobs must be >= 0 (0: as many as the CPU cores hold), got {jobs}")
    seed_list = _parse_seeds(seeds)
    t0 = time.perf_counter()
    finished = [0]

    def on_run(method: str, seed: int, res: Any) -> None:
        from rankwise.recipes.registry import get_recipe

        line = get_recipe(res.config.recipe).summary(res.metrics)
        finished[0] += 1
        trained = sum(1 for src in sources if not (Path(src) / "config.yaml").is_file())  # not run directories
        runs = _runs_line(finished[0], trained * len(seed_list), time.perf_counter() - t0)
        _console().print(f"  {method} seed {seed}: {line}  ({res.run_dir}) {runs}", highlight=False)

    def go() -> Any:
        from rankwise.recipes.runner import compare as run_compare

        return run_compare(
            sources,
            seeds=seed_list,
            out=out,
            overrides=list(set_ or []),
            progress=progress,
            overwrite=overwrite,
            on_run=on_run,
            jobs=jobs or None,
        )

    with _data_warnings(_console(), repeat=False), progress_lines(progress):
        res = _run_guarded(go)
    _print_tables(
        res.recipe.tables(res.results), f"test metrics, mean ± std over seeds ({time.perf_counter() - t0:.0f} s)"
    )
    _console().print(f"report: [bold]{res.report}[/]")


@app.command(cls=Command)
def demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="output folder")] = Path("runs/demo"),
    seeds: Annotated[int, typer.Option(help="number of seeds per method")] = 3,
    quick: Annotated[
        bool, typer.Option("--quick", help=f"tiny smoke-test version (also env {ENV_DEMO_QUICK}=1)")
    ] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite/--reuse", help="retrain runs already in OUT")] = True,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="runs trained at once (0: one per CPU core, as each run uses one)")
    ] = 0,
) -> None:
    """Abalone ages (real data, DIR split): vanilla L1, +LDS, Balanced MSE over several seeds.

    Both imbalance methods lower the few-shot MAE well beyond seed noise (docs/results.md section 5);
    RankSim is not shown because it does not improve abalone at any weight (section 6).

    Prints the many/medium/few-shot table (MAE and GM, mean ± std) and writes OUT/report.md + plots.
    """
    quick = quick or os.environ.get(ENV_DEMO_QUICK, "") not in ("", "0")
    if seeds < 1:
        _fail(f"--seeds must be >= 1, got {seeds}")
    if jobs < 0:
        _fail(f"--jobs must be >= 0 (0: one per CPU core), got {jobs}")
    overrides = ["trainer.enable_progress_bar=false", "report.tsne=false"]
    if quick:
        overrides += ["trainer.max_epochs=2", "trainer.limit_train_batches=3", "report.tsne=false"]
        seeds = min(seeds, 1)
    con = _console()
    con.print(
        f"[bold]rankwise demo[/]: abalone age regression, {len(DEMO_METHODS)} methods x {seeds} seed(s)"
        + (" (quick mode)" if quick else "")
    )
    t0 = time.perf_counter()
    finished = [0]

    def on_run(method: str, seed: int, res: Any) -> None:
        m = res.metrics["test"]
        label = {v: k for k, v in DEMO_METHODS.items()}[method]
        finished[0] += 1
        con.print(
            f"  {label:<18} seed {seed}: MAE all {m['all']['mae']:.3f} | few {m['few']['mae']:.3f}  "
            + _runs_line(finished[0], len(DEMO_METHODS) * seeds, time.perf_counter() - t0),
            highlight=False,
        )

    def go() -> Any:
        from rankwise.recipes.runner import compare as run_compare

        return run_compare(
            list(DEMO_METHODS.values()),
            seeds=list(range(seeds)),
            out=out,
            overrides=overrides,
            overwrite=overwrite,
            on_run=on_run,
            plot_first_seed_only=True,
            jobs=jobs or None,
            title="rankwise demo: abalone age (DIR split)",
            extra="Methods: " + ", ".join(f"`{v}` = {k}" for k, v in DEMO_METHODS.items()),
        )

    res = _run_guarded(go)
    elapsed = time.perf_counter() - t0
    pretty = {label: res.results[preset] for label, preset in DEMO_METHODS.items() if preset in res.results}
    _print_tables(
        res.recipe.tables(pretty),
        f"abalone test set (age in years), mean ± std over {seeds} seed(s); many > 100, "
        f"few < 20 training shells per age",
    )
    from rankwise._fileio import atomic_write

    total = f"\nTotal demo time: {elapsed:.1f} s ({seeds} seed(s), {len(DEMO_METHODS)} methods).\n"
    atomic_write(res.report, Path(res.report).read_text(encoding="utf-8") + total)
    con.print(f"report: [bold]{res.report}[/]  (total {elapsed:.1f} s)")


presets_app = typer.Typer(
    cls=Group,
    help="List the bundled presets: recipe, dataset, expected time on 2 CPU cores and what each one trains.",
)
app.add_typer(presets_app, name="presets")


@presets_app.callback(invoke_without_command=True)
def presets(ctx: typer.Context) -> None:
    """List the bundled presets: recipe, dataset, expected time on 2 CPU cores and what each one trains.

    `rankwise presets show NAME` prints one preset's YAML (its `extends:` merged in).
    """
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    from rankwise.recipes.config import PRESET_DIR, list_presets, load_raw

    table = Table(title=f"presets ({PRESET_DIR})", title_justify="left")
    table.add_column("preset", no_wrap=True)
    table.add_column("recipe", no_wrap=True)
    table.add_column("dataset", no_wrap=True)
    table.add_column("time (2 CPU cores)")
    table.add_column("description")
    for name, desc in list_presets().items():
        raw = load_raw(name)
        dataset = str((raw.get("data") or {}).get("name", "abalone"))
        table.add_row(name, str(raw.get("recipe", "dir")), dataset, str(raw.get("expected_time", "")), desc)
    _console().print(table)


@presets_app.command("show", cls=Command)
def presets_show(name: Annotated[str, typer.Argument(help="a preset name (see `rankwise presets`)")]) -> None:
    """Print a preset's YAML, its `extends:` merged in: a config to copy, edit and train."""

    def text() -> str:
        import yaml

        from rankwise.recipes.config import load_raw, preset_path

        return yaml.safe_dump(load_raw(preset_path(name)), sort_keys=False, allow_unicode=True, width=100)

    typer.echo(_run_guarded(text), nl=False)


@app.command("preprocess", cls=Command)
def preprocess(
    csv_file: Annotated[Path, typer.Argument(metavar="RAW.csv", help="cohort CSV: a `path` column of raw T1 scans")],
    out: Annotated[Path, typer.Option("--out", help="folder of the preprocessed volumes, transforms and QC page")],
    template: Annotated[str, typer.Option(help="template and grid: mni152_<spacing>mm")] = "mni152_2mm",
    registration: Annotated[
        str, typer.Option(help="registration to the template: affine or syn (affine then SyN, needs ANTsPy)")
    ] = "affine",
    workers: Annotated[int, typer.Option(help="scans preprocessed at a time (processes)")] = 1,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="a line per scan with the ETA")] = True,
) -> None:
    """Raw T1 scans to the brain-age input: N4, registration to MNI152, brain mask, QC page (resumable)."""
    con = _console()
    err = _console(stderr=True)

    reused = [0, 0.0]  # scans reused so far, and the seconds they took (the ETA counts the others)

    def on_scan(done: int, total: int, name: str, status: str, seconds: float) -> None:
        if status == "reused":
            reused[0] += 1
            reused[1] = seconds
        if not progress and not status.startswith("failed"):
            return
        worked = done - reused[0]
        if done >= total:
            eta = "last scan"
        elif worked == 0:
            eta = "ETA after the first scan preprocessed"
        else:
            eta = _eta((total - done) * (seconds - reused[1]) / worked)
        err.print(f"[{done}/{total}] {name}: {status} ({eta})", highlight=False, markup=False, soft_wrap=True)

    def run() -> Any:
        from rankwise.data import preprocess_cohort
        from rankwise.recipes.config import UserError

        if progress:
            err.print(
                f"preprocessing the scans of {csv_file} into {out}, {workers} at a time "
                "(a minute or more per scan; a line per scan)",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )

        try:
            return preprocess_cohort(
                csv_file, out, template=template, registration=registration, workers=workers, on_scan=on_scan
            )
        except KeyboardInterrupt:
            raise KeyboardInterrupt(
                f"interrupted; the finished scans are kept in {out}: the same command continues where it stopped"
            ) from None
        except (ValueError, TypeError) as e:
            from rankwise.data import DataFormatError

            if isinstance(e, DataFormatError):
                raise
            raise UserError(_option_names(str(e), ("template", "registration", "workers", "out"))) from None

    result = _run_guarded(run)
    con.print(
        f"{len(result.records)} scan{'' if len(result.records) == 1 else 's'} preprocessed ({result.reused} reused): "
        f"{result.csv}; "
        f"quality control: {result.page}",
        highlight=False,
        soft_wrap=True,
    )
    if result.failures:
        n = len(result.failures)
        err.print(f"{n} scan{'' if n == 1 else 's'} failed:", highlight=False)
        for _row, _, message in result.failures:
            err.print(f"  {message}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command("config", cls=Command)
def config_reference(
    recipe: Annotated[
        str | None,
        typer.Argument(help="a recipe (its `task` options and the sections it reads); omit it for the shared sections"),
    ] = None,
) -> None:
    """List the config fields: dotted key, type, default, range and meaning (read from the config's JSON schema)."""
    from rich.markup import escape
    from rich.table import Table

    def rows() -> Any:
        from rankwise.recipes import config_fields
        from rankwise.recipes.config import ConfigError

        try:
            return config_fields(recipe)
        except ValueError as e:
            raise ConfigError(f"`recipe`: {e}") from None

    fields = _run_guarded(rows)
    table = Table(title=f"config fields{f' of recipe {recipe}' if recipe else ''}", title_justify="left")
    for column in ("key", "type", "default", "range", "meaning"):
        table.add_column(column, overflow="fold")
    for f in fields:
        default = "(required)" if type(f.default).__name__ == "PydanticUndefinedType" else repr(f.default)
        table.add_row(*(escape(c) for c in (f.key, f.type, default, f.range, f.doc)))
    _console().print(table)


@data_app.command("list", cls=Command)
def data_list() -> None:
    """List the registered datasets."""
    from rich.table import Table

    from rankwise.data import dataset_info, list_datasets

    table = Table(title="datasets", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("description")
    for name in list_datasets():
        table.add_row(name, dataset_info(name).splitlines()[0])
    _console().print(table)


def _plain_text(doc: str) -> str:
    """A docstring as plain text: ``code``, :role:`~a.b.name` and :math:`x` lose their markup."""
    import re

    def math(m: Any) -> str:
        return re.sub(r"\\sqrt\{([^}]*)\}", "\u221a\\1", m.group(1)).replace("\\times", "x")

    doc = re.sub(r":math:`([^`]+)`", math, doc)
    doc = re.sub(r":[a-z]+:`~?(?:[\w]+\.)*([^`]+)`", lambda m: m.group(1), doc)
    return re.sub(r"``([^`]+)``", r"\1", doc)


def _missing_options(name: str, opts: dict[str, Any]) -> list[str]:
    """The required parameters of dataset ``name``'s loader that ``opts`` does not give."""
    import inspect

    from rankwise.data import DATASETS

    params = inspect.signature(DATASETS.get(name)).parameters.values()
    return [
        p.name
        for p in params
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in opts
    ]


make_app = typer.Typer(cls=Group, help="Write an offline dataset to disk.", no_args_is_help=True)
#: the arguments of ``make_ltr_synthetic`` that ``data make ltr-synthetic`` sets from its options
_LTR_OPTIONS = ("seed", "train_queries", "val_queries", "test_queries", "num_features", "informative")


def _option_names(msg: str, names: tuple[str, ...]) -> str:
    """A library message with the `argument` names of a command's options spelled as its options
    (`train_queries` -> --train-queries), so that the error line names what the user typed."""
    import re

    def spell(m: Any) -> str:
        return f"--{m.group(1).replace('_', '-')}" if m.group(1) in names else m.group(0)

    return re.sub(r"`(\w+)`", spell, msg)


data_app.add_typer(make_app, name="make")


@make_app.command("brain-age-synthetic", cls=Command)
def data_make_brain_age_synthetic(
    out: Annotated[Path, typer.Option("--out", help="folder of the NIfTI volumes and participants.csv")],
    n: Annotated[int, typer.Option("--n", help="number of subjects")] = 400,
    spacing: Annotated[float, typer.Option(help="voxel size in mm (2: 91x109x91, 4: 46x54x46)")] = 2.0,
    seed: Annotated[int, typer.Option(help="seed of ages, sexes, sites and per-subject variation")] = 0,
    sites: Annotated[int, typer.Option(help="number of synthetic scanner sites")] = 2,
    raw: Annotated[
        bool, typer.Option("--raw", help="raw scans (skull, neck, random pose, voxel size and bias) for preprocess")
    ] = False,
    patients: Annotated[
        float, typer.Option(help="fraction of subjects in a `patient` group whose brains look older (a `group` column)")
    ] = 0.0,
    patient_shift: Annotated[float, typer.Option(help="years the patients' brains look older")] = 5.0,
) -> None:
    """Synthetic brain-age cohort from nilearn's MNI152 templates (every number from it is synthetic)."""

    def make() -> Path:
        from rankwise.data import make_brain_age_synthetic

        try:
            return make_brain_age_synthetic(
                out,
                n=n,
                spacing=spacing,
                seed=seed,
                sites=sites,
                raw=raw,
                patients=patients,
                patient_shift=patient_shift,
            )
        except (ValueError, TypeError) as e:
            from rankwise.recipes.config import UserError

            raise UserError(
                _option_names(str(e), ("n", "spacing", "seed", "sites", "patients", "patient_shift"))
            ) from None

    csv_path = _run_guarded(make)
    _console().print(f"{n} synthetic subjects: {csv_path}", highlight=False)


@make_app.command("ltr-synthetic", cls=Command)
def data_make_ltr_synthetic(
    out: Annotated[Path, typer.Option("--out", help="folder of train.txt, vali.txt and test.txt (LETOR format)")],
    seed: Annotated[int, typer.Option(help="seed of the relevance model, queries and documents")] = 0,
    train_queries: Annotated[int, typer.Option(help="training queries")] = 500,
    val_queries: Annotated[int, typer.Option(help="validation queries")] = 100,
    test_queries: Annotated[int, typer.Option(help="test queries")] = 200,
    num_features: Annotated[int, typer.Option(help="features per document")] = 46,
    informative: Annotated[int, typer.Option(help="features carrying the relevance signal (the first ones)")] = 10,
) -> None:
    """Synthetic learning-to-rank queries as LETOR files (dataset ltr_synthetic; every number from it is synthetic)."""

    def make() -> Path:
        from rankwise.data import make_ltr_synthetic

        try:
            return make_ltr_synthetic(
                out,
                seed=seed,
                train_queries=train_queries,
                val_queries=val_queries,
                test_queries=test_queries,
                num_features=num_features,
                informative=informative,
            )
        except (ValueError, TypeError, FileExistsError) as e:
            from rankwise.recipes.config import UserError

            msg = str(e.args[-1] if isinstance(e, FileExistsError) else e)
            raise UserError(_option_names(msg, _LTR_OPTIONS)) from None

    folder = _run_guarded(make)
    _console().print(
        f"synthetic LETOR files: {folder} (train.txt, vali.txt, test.txt); read them with "
        f"`data: {{name: letor, options: {{path: {folder}, num_features: {num_features}}}}}`",
        highlight=False,
    )


def _show_ranking(con: Any, data: Any) -> None:
    """Queries, documents and the relevance-grade counts of a learning-to-rank dataset."""
    import numpy as np

    con.print(
        f"\n[bold]{data.name}[/]: {data.num_features} features; queries train/val/test = "
        f"{'/'.join(str(s) for s in data.sizes())}"
    )
    for split in ("train", "val", "test"):
        lists = getattr(data, split)
        lengths = lists.lengths
        y = lists.y.numpy()
        grades, counts = np.unique(y, return_counts=True)
        per_grade = ", ".join(f"{g:g}: {c}" for g, c in zip(grades.tolist(), counts.tolist()))
        no_rel = sum(1 for a, b in zip(lists.offsets[:-1], lists.offsets[1:]) if not (y[a:b] > 0).any())
        con.print(
            f"{split:>5}: {lists.num_documents} documents, {int(lengths.min()) if len(lengths) else 0}-"
            f"{int(lengths.max()) if len(lengths) else 0} per query, {no_rel} queries without a relevant document; "
            f"grades {per_grade}",
            highlight=False,
        )


@data_app.command("show", cls=Command)
def data_show(
    name: Annotated[str, typer.Argument(help="dataset name (see `rankwise data list`)")],
    option: Annotated[list[str] | None, typer.Option("--option", "-O", help="loader option key=value")] = None,
    plot: Annotated[Path | None, typer.Option(help="write the label histogram PNG here")] = None,
    info_only: Annotated[bool, typer.Option("--info-only", help="print the description without loading")] = False,
) -> None:
    """Describe a dataset, load it and print split sizes and the training label histogram."""
    from rankwise.data import dataset_info, label_histogram

    con = _console()
    try:
        con.print(_plain_text(dataset_info(name)), highlight=False, markup=False, soft_wrap=True)
    except ValueError as e:
        _fail(str(e))
    if info_only:
        return
    from rankwise.recipes.config import UserError, parse_yaml

    opts: dict[str, Any] = {}
    for item in option or []:
        if "=" not in item:
            _fail(f"--option expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        try:
            opts[k.strip()] = parse_yaml(v, f"--option {k.strip()}") if v.strip() else ""
        except UserError as e:
            _fail(str(e))
    if plot is not None:
        plot = _plot_target(plot)
    from rankwise.data import get_dataset

    def load() -> Any:
        from rankwise.data import DataFormatError
        from rankwise.recipes.config import ConfigError

        missing = _missing_options(name, opts)
        if missing:
            example = " ".join(f"-O {m}=..." for m in missing)
            raise ConfigError(
                f"dataset {name!r} needs the option(s) {', '.join(missing)}: rankwise data show {name} {example}"
            )
        try:
            return get_dataset(name, **opts)
        except DataFormatError:
            raise
        except (ValueError, TypeError) as e:
            raise ConfigError(f"cannot load dataset {name!r}: {e}") from None

    with progress_lines():
        data: Any = _run_guarded(load)
    from rankwise.data import task_of

    task = task_of(name, data)
    if task == "ranking":
        _show_ranking(con, data)
        return
    if task == "classification":
        con.print(f"classification data: {data.num_classes} classes, train {len(data.train)}, test {len(data.test)}")
        return
    con.print(
        f"\n[bold]{data.name}[/]: modality {data.modality}, input_dim {data.input_dim}, label '{data.label_name}', "
        f"bin width {data.bin_width:g}; train/val/test = {'/'.join(str(s) for s in data.sizes())}"
    )
    from rankwise.recipes.common import shot_thresholds

    def histogram() -> Any:
        from rankwise.recipes.config import ConfigError

        try:
            return shot_thresholds(data), label_histogram(data.train_labels, data.bin_width)
        except ValueError as e:  # e.g. labels too far from the origin for the bin width
            raise ConfigError(f"dataset {name!r}: cannot bin the training labels: {e}") from None

    (many, few), hist = _run_guarded(histogram)
    con.print(f"shot groups: many > {many:.3g}, few < {few:.3g} training examples per bin", highlight=False)
    counts = hist.counts
    top = max(int(counts.max()) if counts.size else 1, 1)
    step = max(1, len(counts) // 60)
    for i in range(0, len(counts), step):
        c = int(counts[i : i + step].sum())
        shot = "many" if c > many * step else "few" if c < few * step else "med"
        bar = "#" * max(0, round(40 * c / (top * step)))
        con.print(f"{hist.edges[i]:>9.3g} {c:>6d} {shot:>4} {bar}", highlight=False)
    if plot is not None:
        from rankwise.recipes.reports import plot_label_histogram

        target = plot

        def draw() -> Path:
            from rankwise.recipes.config import ConfigError

            try:
                return plot_label_histogram(
                    data.train_labels,
                    data.bin_width,
                    target,
                    test_labels=data.test_labels,
                    title=f"{data.name}: {data.label_name}",
                    label=data.label_axis,
                )
            except ValueError as e:  # e.g. an image format matplotlib does not write
                raise ConfigError(f"--plot {target}: {e}") from None

        con.print(f"histogram: {_run_guarded(draw)}", soft_wrap=True, highlight=False, markup=False)


def _plot_target(plot: Path) -> Path:
    """The PNG file ``--plot`` writes (``.png`` added without a suffix); refuse a folder or a missing parent."""
    target = plot if plot.suffix else plot.with_name(plot.name + ".png")
    if plot.is_dir() or target.is_dir():
        _fail(f"--plot {plot} is a directory; give a file name such as {plot / 'labels.png'}")
    parent = target.parent
    if not parent.is_dir():
        _fail(f"--plot {plot}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        _fail(f"--plot {plot}: the folder {parent} is not writable")
    return target


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``rankwise``).

    A command ended by a signal (SIGTERM, SIGINT, SIGHUP: the run is already marked failed, its lock
    released and its logs closed) exits at once with ``os._exit``: tearing down an interpreter that
    loaded torch and Lightning takes seconds (its garbage collection of every module), which a
    process asked to stop must not spend.
    """
    try:
        app(args=argv if argv is not None else sys.argv[1:], prog_name="rankwise")
    except SystemExit as e:
        if not _state.get("signalled"):
            raise
        code = e.code if isinstance(e.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
