"""Imbalanced regression on your own CSV file: plain L1 vs L1 + LDS sample weights, many/medium/few-shot MAE.

Any CSV file with a header row and numeric columns works: ``data.name: csv`` with the options
``path`` (the file) and ``target`` (the label column); every other column is a feature unless you
list ``features``. Without a file this script writes scikit-learn's diabetes data (442 patients,
10 features, a disease-progression score 25..346) to ``diabetes.csv`` and uses it. The label bin
width and the many/medium/few-shot thresholds follow the data (see ``rankwise data show csv``). Run:

    python examples/imbalanced_csv.py                                   # diabetes; ~30 s of CPU
    python examples/imbalanced_csv.py --csv my.csv --target price      # your file
    python examples/imbalanced_csv.py --tiny                            # 1 epoch (used by the tests)

The same runs from the command line (``--set`` takes dotted config keys):

    rankwise train abalone_lds --set data.name=csv --set data.options.path=my.csv \\
        --set data.options.target=price --set run.name=my_lds

Needs the ``train`` extra.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from rankwise.data import get_dataset
from rankwise.recipes import load_config, train


def write_diabetes(path: Path) -> None:
    from sklearn.datasets import load_diabetes

    load_diabetes(as_frame=True, scaled=False).frame.to_csv(path, index=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, help="your CSV file (default: sklearn's diabetes data)")
    parser.add_argument("--target", default="target", help="the label column")
    parser.add_argument("--out", type=Path, default=Path("runs/imbalanced_csv"), help="run directories")
    parser.add_argument("--tiny", action="store_true", help="one epoch (smoke test)")
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.csv
    if path is None:
        path = args.out / "diabetes.csv"
        write_diabetes(path)

    data = get_dataset("csv", path=path, target=args.target)
    many, few = data.shot_thresholds
    print(f"{path}: train/val/test {data.sizes()}, label bin width {data.bin_width:g}")
    print(f"many-shot bins: > {many:.1f} training rows, few-shot: < {few:.1f}")

    common = [
        "data.name=csv",
        f"data.options={{path: '{path}', target: {args.target}}}",
        "data.batch_size=32",
        # the data's thresholds (integer counts: "> 18.2" is "> 18", "< 3.6" is "< 4")
        f"run.many_shot={math.floor(many)}",
        f"run.few_shot={math.ceil(few)}",
        "run.tsne=false",
        f"trainer.max_epochs={1 if args.tiny else 100}",
        "trainer.enable_progress_bar=false",
    ]
    rows = []
    for preset in ("abalone_vanilla", "abalone_lds"):  # L1; L1 + square-root-inverse LDS weights
        method = "L1" if preset == "abalone_vanilla" else "L1 + LDS"
        cfg = load_config(preset, overrides=[*common, f"run.name={preset.replace('abalone', 'csv')}"])
        result = train(cfg, out=args.out / cfg.run.name, overwrite=True, progress=False, verbose=False)
        test = result.metrics["test"]
        rows.append((method, *(test[g]["mae"] for g in ("all", "many", "medium", "few"))))

    print(f"\ntest MAE ({args.target})      all    many  medium     few")
    for method, *maes in rows:
        print(f"{method:<20}" + "".join(f"{m:8.2f}" if m is not None else "       -" for m in maes))


if __name__ == "__main__":
    main()
