"""``rankwise sodeep ...``: train and evaluate SoDeep sorters from the command line.

Until the top-level ``rankwise`` CLI mounts it, run it as ``python -m rankwise.sodeep.cli``::

    python -m rankwise.sodeep.cli train --seq-len 64 --model gru --steps 3000 --seed 0 --out runs/gru64
    python -m rankwise.sodeep.cli evaluate --seq-len 64          # the bundled sorter
    python -m rankwise.sodeep.cli evaluate --weights runs/gru64/gru_64.pt
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from rankwise._cli_help import Command, Group

app = typer.Typer(
    cls=Group,
    help="SoDeep learned differentiable sorters: train and evaluate.",
    no_args_is_help=True,
    add_completion=False,
)


def _guarded(fn: Callable[[], Any]) -> Any:
    """Run ``fn``; a bad option or file prints one ``error: ...`` line and exits 2, Ctrl-C exits 130."""
    try:
        return fn()
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        raise typer.Exit(130) from None
    except (ValueError, TypeError, OSError) as e:
        if isinstance(e, OSError) and e.filename:
            msg = f"{e.strerror or e}: {e.filename}"
        else:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        typer.echo(f"error: {msg}", err=True)
        raise typer.Exit(2) from None


@app.command(cls=Command)
def train(
    seq_len: Annotated[int, typer.Option("--seq-len", help="sequence length the sorter is trained for")] = 64,
    model: Annotated[str, typer.Option("--model", help="gru, lstm or mlp")] = "gru",
    steps: Annotated[int, typer.Option("--steps", help="optimizer steps (one fresh synthetic batch each)")] = 4000,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 128,
    lr: Annotated[float, typer.Option("--lr")] = 1e-3,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: Annotated[Path, typer.Option("--out", help="output folder (checkpoints, weights, report)")] = Path(
        "sodeep_runs"
    ),
    hidden_size: Annotated[int | None, typer.Option("--hidden-size")] = None,
    num_layers: Annotated[int | None, typer.Option("--num-layers")] = None,
    num_features: Annotated[int | None, typer.Option("--num-features", help="GRU/LSTM soft-threshold inputs")] = None,
    eval_num: Annotated[int, typer.Option("--eval-num", help="held-out sequences per family for the report")] = 512,
    threads: Annotated[int | None, typer.Option("--threads", help="torch CPU threads")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress")] = True,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace the sorter a run trained into --out before")
    ] = False,
) -> None:
    """Train a sorter on synthetic sequences, save ``{model}_{seq_len}.pt`` and print its evaluation."""
    from rankwise.sodeep.train import format_report, train_sorter

    res = _guarded(
        lambda: train_sorter(
            seq_len,
            model,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            out=out,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_features=num_features,
            eval_num=eval_num,
            progress_bar=progress,
            num_threads=threads,
            overwrite=overwrite,
        )
    )
    typer.echo(format_report(res["report"]))
    typer.echo(f"trained in {res['seconds']:.1f} s; weights: {res['weights']}")


@app.command(cls=Command)
def evaluate(
    seq_len: Annotated[int, typer.Option("--seq-len", help="bundled sorter to evaluate (ignored with --weights)")] = 64,
    model: Annotated[str, typer.Option("--model")] = "gru",
    weights: Annotated[Path | None, typer.Option("--weights", help="a .pt file written by `train`")] = None,
    num: Annotated[int, typer.Option("--num", help="held-out sequences per family")] = 512,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    real: Annotated[bool, typer.Option("--real/--no-real", help="also evaluate on real regression scores")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Evaluate a sorter: rank MAE and Spearman rho per synthetic family and on real scores."""
    from rankwise.sodeep.hub import sodeep_sorter
    from rankwise.sodeep.train import evaluate_sorter, format_report
    from rankwise.sodeep.weights_io import load_sorter

    sorter = _guarded(lambda: load_sorter(weights) if weights is not None else sodeep_sorter(seq_len, model=model))
    report = _guarded(lambda: evaluate_sorter(sorter, num=num, seed=seed, real=real))
    typer.echo(json.dumps(report, indent=2) if as_json else format_report(report))


if __name__ == "__main__":
    app()
