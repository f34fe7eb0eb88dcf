"""Imbalanced regression on your own CSV file: plain L1 vs L1 + LDS sample weights, many/medium/few-shot MAE.

Any CSV file with a header row and numeric columns works. Without a file this script writes
scikit-learn's diabetes data (442 patients, 10 features, a disease-progression score 25..346) to
``diabetes.csv`` and uses it. The label bin width, the many/medium/few-shot thresholds, the batch
size and the number of epochs come from the data (``rankwise.recipes.own_data``), as on the
command line:

    rankwise train --data my.csv --target price --method lds

Run:

    python examples/imbalanced_csv.py                                   # diabetes; ~2 min of CPU
    python examples/imbalanced_csv.py --csv my.csv --target price      # your file
    python examples/imbalanced_csv.py --tiny                            # 1 epoch (used by the tests)

Needs the ``train`` extra.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rankwise.recipes import train
from rankwise.recipes.own_data import own_data_config


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

    overrides = [
        "report.tsne=false",
        "trainer.enable_progress_bar=false",
        *(["trainer.max_epochs=1"] if args.tiny else []),
    ]
    rows = []
    for method, label in (("vanilla", "L1"), ("lds", "L1 + LDS")):
        cfg, defaults = own_data_config(path, args.target, method, overrides=overrides)
        if not rows:
            print(f"{path}: defaults from the data: {defaults.describe()}")
        result = train(cfg, out=args.out / cfg.run.name, overwrite=True, progress=False, verbose=False)
        test = result.metrics["test"]
        rows.append((label, *(test[g]["mae"] for g in ("all", "many", "medium", "few"))))

    print(f"\ntest MAE ({args.target})      all    many  medium     few")
    for method, *maes in rows:
        print(f"{method:<20}" + "".join(f"{m:8.2f}" if m is not None else "       -" for m in maes))


if __name__ == "__main__":
    main()
