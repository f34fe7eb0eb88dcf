"""`rankwise preprocess` on the synthetic raw cohort, against the generator's ground truth.

For each subject: the Dice of the recovered brain mask (the template's mask mapped into the scan)
against the true brain on the scan's grid; the mean and largest displacement of 200 template landmarks
(inside the brain) between where the registration maps them and where they are in the scan (the
subject's head scale about the grid centre, then the true pose); seconds per scan. Writes
``benchmarks/results/preprocess_synthetic.json``.

    PYTHONPATH=src python benchmarks/preprocess_synthetic.py --n 50 --workers 1 --work /tmp/pre

``--registration affine,syn`` preprocesses the same scans with each registration in turn (one output
folder each) and writes one summary per registration side by side. The landmarks' truth is the affine
part of the generator's map (head scale, pose); the subject's smooth displacement and ventricle warp
are in the Dice's truth (the generator's brain mask) only.

``--cohort CSV`` preprocesses a cohort made before (``rankwise data make brain-age-synthetic --raw``)
instead of making one; ``--subjects`` a part of it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--work", type=Path, required=True, help="an empty folder for the cohort and the outputs")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "preprocess_synthetic.json")
    ap.add_argument("--cohort", type=Path, default=None, help="a raw cohort made before (its participants.csv)")
    ap.add_argument("--subjects", default="", help="comma-separated subjects of the cohort to preprocess (all)")
    ap.add_argument("--registration", default="affine", help="comma-separated registrations: affine, syn")
    args = ap.parse_args()
    registrations = [r.strip() for r in args.registration.split(",") if r.strip()]

    import nibabel as nib

    from rankwise.data import make_brain_age_synthetic, map_to_scan, preprocess_cohort
    from rankwise.data.preprocess import read_transform, template_grid

    # the code that runs: the commit when the script starts (and whether the tree differs from it)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], capture_output=True, text=True).stdout
    commit += "+dirty" if dirty.strip() else ""
    t0 = time.perf_counter()
    if args.cohort is None:
        csv_path = make_brain_age_synthetic(args.work / "raw", n=args.n, spacing=2.0, raw=True)
    else:
        csv_path = args.cohort.resolve()
    generate = time.perf_counter() - t0 if args.cohort is None else None
    cohort = csv_path
    if args.subjects:
        import csv

        keep = set(args.subjects.split(","))
        with csv_path.open(newline="") as fh:
            rows_in = list(csv.DictReader(fh))
        cohort = args.work / "subset.csv"
        args.work.mkdir(parents=True, exist_ok=True)
        with cohort.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows_in[0]))
            w.writeheader()
            for r in rows_in:
                if r["subject"] in keep:
                    w.writerow({**r, "path": str((csv_path.parent / r["path"]).resolve())})
    maps, affine = template_grid("mni152_2mm")
    lps = np.diag([-1.0, -1.0, 1.0])
    centre = affine[:3, :3] @ ((np.array(maps["mask"].shape) - 1) / 2) + affine[:3, 3]
    ijk = np.argwhere(maps["mask"] > 0.5)
    points = ijk[np.random.default_rng(0).choice(len(ijk), 200, replace=False)]
    world = points @ affine[:3, :3].T + affine[:3, 3]

    def measure(registration: str) -> dict:
        out = args.work / ("out" if registration == "affine" else f"out_{registration}")
        t0 = time.perf_counter()
        status: dict[str, str] = {}

        def note(i: int, n: int, name: str, what: str, seconds: float) -> None:
            status[name] = what

        result = preprocess_cohort(cohort, out, workers=args.workers, registration=registration, on_scan=note)
        wall = time.perf_counter() - t0
        rows = []
        for rec in result.records:
            name = rec["name"]
            truth = json.loads((csv_path.parent / "truth" / f"{name}.json").read_text())
            scan = csv_path.parent / f"{name}_T1w.nii.gz"
            warp = out / rec["warp"] if rec.get("warp") else None
            vol = nib.load(str(out / rec["mask"])).get_fdata()
            mask = map_to_scan(vol, "mni152_2mm", out / rec["transform"], scan, warp=warp)
            true = nib.as_closest_canonical(nib.load(str(csv_path.parent / "truth" / f"{name}_brainmask.nii.gz")))
            a, b = mask.get_fdata() > 0.5, true.get_fdata() > 0.5
            m = np.asarray(truth["mni_to_scanner"])
            tx = read_transform(out / rec["transform"], warp=warp)
            expected = (centre + truth["head_scale"] * (world - centre)) @ m[:3, :3].T + m[:3, 3]
            got = np.array([lps @ np.asarray(tx.TransformPoint(tuple(float(v) for v in lps @ w))) for w in world])
            err = np.linalg.norm(got - expected, axis=1)
            rows.append(
                {
                    "subject": name,
                    "dice": float(2 * (a & b).sum() / (a.sum() + b.sum())),
                    "landmark_mean_mm": float(err.mean()),
                    "landmark_max_mm": float(err.max()),
                    "seconds": rec["seconds"],
                    "restarted": rec["restarted"],
                    "reused": status.get(rec["name"]) == "reused",
                    "similarity": rec["similarity"],
                    "voxel_mm": truth["voxel_mm"],
                    "orientation": truth["orientation"],
                }
            )
        dice = [r["dice"] for r in rows]
        lm = [r["landmark_mean_mm"] for r in rows]
        sec = [r["seconds"] for r in rows]
        return {
            "registration": registration,
            "n": len(result.records) + len(result.failures),
            "preprocessed": len(rows),
            "reused": result.reused,
            "failed": [m for _, _, m in result.failures],
            "dice_mean": float(np.mean(dice)),
            "dice_min": float(np.min(dice)),
            "landmark_mean_mm": float(np.mean(lm)),
            "landmark_worst_subject_mm": float(np.max(lm)),
            "seconds_per_scan_median": float(np.median(sec)),
            "cohort_wall_seconds": wall,
            "subjects": rows,
        }

    measured = [measure(r) for r in registrations]
    meta = {
        "workers": args.workers,
        "generate_seconds": generate,
        "cohort": str(csv_path),
        "subjects_given": args.subjects or "all",
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_average": os.getloadavg(),
    }
    if len(measured) == 1:
        summary = {
            **{k: v for k, v in measured[0].items() if k != "subjects"},
            **meta,
            "subjects": measured[0]["subjects"],
        }
        shown = {k: v for k, v in summary.items() if k != "subjects"}
    else:
        summary = {**meta, "registrations": {m["registration"]: m for m in measured}}
        shown = {m["registration"]: {k: v for k, v in m.items() if k != "subjects"} for m in measured}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(shown, indent=1))


if __name__ == "__main__":
    main()
