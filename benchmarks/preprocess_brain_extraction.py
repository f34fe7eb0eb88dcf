"""Brain extraction on the synthetic raw cohort: the template's brain mask mapped through the
registration (what ``rankwise preprocess`` does) against BET (Smith, Human Brain Mapping 2002) as
re-implemented by the ``brainextractor`` package (no network weights), both scored by the Dice against
the generator's true brain mask on the scan's grid.

BET runs on each raw scan after rankwise's N4 bias-field correction (``brainextractor.BrainExtractor``
with its default parameters, 1000 surface iterations; ``pip install brainextractor``, a benchmark peer
only); its seconds exclude N4 and include, for the first scan, numba's compilation. The template route's Dice is
that of ``benchmarks/preprocess_synthetic.py`` outputs in ``--work`` (one folder per registration,
``out`` for affine and ``out_syn`` for syn), recomputed here from the records there when the subject
is scored; its seconds are the
whole preprocessing of the scan (N4, registration, resampling, QC) from the record.

    PYTHONPATH=src python benchmarks/preprocess_synthetic.py --cohort RAW/participants.csv \\
        --subjects sub-0001,sub-0002 --registration affine,syn --work /tmp/bench \\
        --out benchmarks/results/preprocess_synthetic_syn.json
    PYTHONPATH=src python benchmarks/preprocess_brain_extraction.py --cohort RAW/participants.csv \\
        --subjects sub-0001,sub-0002 --work /tmp/bench

Writes ``benchmarks/results/preprocess_brain_extraction.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    return float(2 * (a & b).sum() / (a.sum() + b.sum()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", type=Path, required=True, help="a raw synthetic cohort (its participants.csv)")
    ap.add_argument("--subjects", required=True, help="comma-separated subjects")
    ap.add_argument("--work", type=Path, required=True, help="the --work folder of preprocess_synthetic.py")
    ap.add_argument("--iterations", type=int, default=1000, help="BET's surface iterations")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "preprocess_brain_extraction.json")
    args = ap.parse_args()

    import nibabel as nib
    from brainextractor import BrainExtractor

    from rankwise.data import map_to_scan
    from rankwise.data.nifti import read_volume, to_canonical
    from rankwise.data.preprocess import _array, _n4, _to_sitk

    raw = args.cohort.resolve().parent
    names = [s for s in args.subjects.split(",") if s]
    routes = {name: args.work / folder for name, folder in (("affine", "out"), ("syn", "out_syn"))}
    rows: list[dict] = []

    def med(key: str) -> float | None:
        values = [r[key] for r in rows if key in r]
        return float(np.median(values)) if values else None

    def mean(key: str) -> float | None:
        values = [r[key] for r in rows if key in r]
        return float(np.mean(values)) if values else None

    def write() -> dict:
        methods = {"bet": "bet", **{f"template_{r}": f"template_{r}" for r in routes}}
        summary = {
            "subjects_n": len(rows),
            "subjects_asked": names,
            "methods": {
                m: {
                    "n": sum(f"{k}_dice" in r for r in rows),
                    "dice_mean": mean(f"{k}_dice"),
                    "dice_min": min((r[f"{k}_dice"] for r in rows if f"{k}_dice" in r), default=None),
                    "seconds_median": med(f"{k}_seconds"),
                }
                for m, k in methods.items()
            },
            "bet_iterations": args.iterations,
            "bet_seconds_note": "the first subject's BET seconds include numba's compilation",
            "n4_seconds_median": med("n4_seconds"),
            "cohort": str(args.cohort),
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip(),
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "load_average": os.getloadavg(),
            "subjects": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
        return summary

    for i, name in enumerate(names):
        scan = raw / f"{name}_T1w.nii.gz"
        true = nib.as_closest_canonical(nib.load(str(raw / "truth" / f"{name}_brainmask.nii.gz")))
        truth = true.get_fdata() > 0.5
        data, affine = to_canonical(*read_volume(scan, (args.cohort, i + 1)))
        assert np.allclose(affine, true.affine), name
        t0 = time.perf_counter()
        corrected = _array(_n4(_to_sitk(np.clip(data, 0, None), affine)))
        n4_seconds = time.perf_counter() - t0
        img = nib.Nifti1Image(corrected.astype(np.float32), affine)
        with contextlib.redirect_stdout(io.StringIO()):
            t0 = time.perf_counter()
            bet = BrainExtractor(img)
            bet.run(iterations=args.iterations)
            mask = bet.compute_mask() > 0.5
            seconds = time.perf_counter() - t0
        row = {"subject": name, "bet_dice": _dice(mask, truth), "bet_seconds": seconds, "n4_seconds": n4_seconds}
        for route, out in routes.items():
            rec_path = out / "records" / f"{name}.json"
            if not rec_path.is_file():
                continue
            rec = json.loads(rec_path.read_text())
            warp = out / rec["warp"] if rec.get("warp") else None
            vol = nib.load(str(out / rec["mask"])).get_fdata()
            mapped = map_to_scan(vol, rec["template"], out / rec["transform"], scan, warp=warp).get_fdata() > 0.5
            row[f"template_{route}_dice"] = _dice(mapped, truth)
            row[f"template_{route}_seconds"] = rec["seconds"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        summary = write()  # after each subject: a stopped run keeps what it measured
    print(json.dumps({k: v for k, v in summary.items() if k != "subjects"}, indent=1))


if __name__ == "__main__":
    main()
