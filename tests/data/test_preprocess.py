"""`rankwise preprocess` / :func:`rankwise.data.preprocess_cohort` on synthetic raw scans (coarse grids
so that the suite stays fast): recovered brain masks and poses against the generator's ground truth,
failures one line each, resumability, nothing written outside ``--out``, the CSV train reads."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("SimpleITK")
nib = pytest.importorskip("nibabel")
pytest.importorskip("nilearn")
pytest.importorskip("torchio")

from rankwise.data import (  # noqa: E402
    DataFormatError,
    make_brain_age_synthetic,
    map_to_scan,
    preprocess_cohort,
    preprocess_t1,
)
from rankwise.data.preprocess import template_grid  # noqa: E402

TEMPLATE = "mni152_4mm"


def _listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One raw scan and three bad rows: a corrupt file, a 2-D image, a scan without the brain."""
    root = tmp_path_factory.mktemp("raw")
    csv_path = make_brain_age_synthetic(root, n=1, spacing=4.0, raw=True, raw_voxel_mm=(2.5, 3.0))
    (root / "corrupt.nii.gz").write_bytes(b"\x1f\x8b not a gzip stream")
    nib.save(nib.Nifti1Image(np.ones((40, 40), np.float32), np.eye(4)), str(root / "flat.nii.gz"))
    scan = nib.load(str(root / "sub-0001_T1w.nii.gz"))
    data = np.asarray(scan.dataobj)
    keep = data.shape[2] // 4  # the lowest quarter of the field of view: neck, no brain
    neck = data[..., :keep] if scan.affine[2, 2] > 0 else data[..., -keep:]
    nib.save(nib.Nifti1Image(neck, scan.affine), str(root / "neck.nii.gz"))
    rows = list(csv.DictReader(csv_path.open()))
    for name in ("corrupt", "flat", "neck"):
        rows.append(rows[0] | {"path": f"{name}.nii.gz", "subject": name})
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return csv_path


@pytest.fixture(scope="module")
def done(cohort: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, dict[str, int]]:
    before = _listing(cohort.parent)
    out = tmp_path_factory.mktemp("pre") / "out"
    result = preprocess_cohort(cohort, out, template=TEMPLATE)
    return out, result, before


def test_good_scans_are_preprocessed_and_bad_ones_fail_one_line_each(cohort: Path, done: tuple) -> None:
    out, result, _ = done
    assert [r["name"] for r in result.records] == ["sub-0001"]
    assert [row for row, _, _ in result.failures] == [3, 4, 5]
    messages = {Path(scan).name: msg for _, scan, msg in result.failures}
    assert "corrupt.nii.gz" in messages["corrupt.nii.gz"] and "cannot be read" in messages["corrupt.nii.gz"]
    assert "3-D" in messages["flat.nii.gz"]
    assert "field of view" in messages["neck.nii.gz"]
    assert all("\n" not in m and str(cohort) in m for m in messages.values())
    for r in result.records:
        assert r["similarity"] > 0.7 and r["in_view"] > 0.99
        img = nib.load(str(out / r["volume"]))
        maps, affine = template_grid(TEMPLATE)
        assert img.shape == maps["t1"].shape and np.allclose(img.affine, affine)
        assert (out / r["qc"]).is_file() and (out / r["transform"]).is_file()


def test_the_recovered_brain_and_pose_match_the_ground_truth(cohort: Path, done: tuple) -> None:
    out, result, _ = done
    maps, affine = template_grid(TEMPLATE)
    lps = np.diag([-1.0, -1.0, 1.0])
    import SimpleITK as sitk

    for r in result.records:
        truth = json.loads((cohort.parent / "truth" / f"{r['name']}.json").read_text())
        scan = cohort.parent / f"{r['name']}_T1w.nii.gz"
        mask = map_to_scan(nib.load(str(out / r["mask"])).get_fdata(), TEMPLATE, out / r["transform"], scan)
        true = nib.as_closest_canonical(nib.load(str(cohort.parent / "truth" / f"{r['name']}_brainmask.nii.gz")))
        a, b = mask.get_fdata() > 0.5, true.get_fdata() > 0.5
        dice = 2 * (a & b).sum() / (a.sum() + b.sum())
        assert dice > 0.9, dice
        # template landmarks: where the subject's brain has them (head scale about the grid centre),
        # moved by the true pose, against where the registration maps them
        m = np.asarray(truth["mni_to_scanner"])
        centre = affine[:3, :3] @ ((np.array(maps["mask"].shape) - 1) / 2) + affine[:3, 3]
        tx = sitk.ReadTransform(str(out / r["transform"]))
        ijk = np.argwhere(maps["mask"] > 0.5)[:: max(1, int(maps["mask"].sum()) // 100)]
        errors = []
        for p in ijk:
            w = affine[:3, :3] @ p + affine[:3, 3]
            expected = m[:3, :3] @ (centre + truth["head_scale"] * (w - centre)) + m[:3, 3]
            got = lps @ np.asarray(tx.TransformPoint(tuple(float(v) for v in lps @ w)))
            errors.append(np.linalg.norm(got - expected))
        assert np.mean(errors) < 3.0, np.mean(errors)  # mm, on a 4 mm grid of 2.5-3 mm scans


def test_nothing_is_written_outside_out_and_the_csv_is_the_training_input(cohort: Path, done: tuple) -> None:
    from rankwise.data import load_nifti_csv

    out, _, before = done
    assert _listing(cohort.parent) == before
    rows = list(csv.DictReader((out / "participants.csv").open()))
    assert list(rows[0]) == ["path", "age", "sex", "site", "subject", "raw_path", "mask", "transform"]
    assert [r["subject"] for r in rows] == ["sub-0001"]
    assert all((out / r["path"]).is_file() and Path(r["raw_path"]).is_file() for r in rows)
    page = (out / "qc" / "index.html").read_text()
    assert "1 scan preprocessed" in page and "3 failed" in page and "sub-0001.png" in page
    items = page.split("<li>")[1:]
    assert len(items) == 3 and all(item.startswith(f"{cohort}, row ") for item in items)  # each row named once
    data = load_nifti_csv(out / "participants.csv", val_fraction=0.0, test_fraction=0.0, cache_dir=str(out / "c"))
    assert len(data.train) == 1
    # `train --data` on this CSV takes the template's grid, not the grid of the brain-age presets
    from rankwise.recipes.own_data import own_datasets

    grid = own_datasets()["nifti"].file_options
    assert grid is not None and grid(out / "participants.csv") == {
        "shape": list(template_grid(TEMPLATE)[0]["mask"].shape)
    }
    assert grid(cohort) == {}  # a raw cohort: the presets' grid


def test_a_second_run_reuses_finished_scans_and_redoes_a_changed_one(
    cohort: Path, done: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out0, _, _ = done
    out = tmp_path / "out"
    shutil.copytree(out0, out)
    folder = tmp_path / "raw"
    shutil.copytree(cohort.parent, folder)
    lines = (folder / "participants.csv").read_text().splitlines()[:2]  # the good scan
    (folder / "participants.csv").write_text("\n".join(lines) + "\n")
    for name in ("sub-0001",):  # the same bytes at another place: still finished
        rec = json.loads((out / "records" / f"{name}.json").read_text())
        assert rec["scan_sha256"]
    import rankwise.data.preprocess as pre

    calls: list[str] = []
    real = pre.preprocess_t1
    monkeypatch.setattr(
        pre, "preprocess_t1", lambda scan, *a, **k: calls.append(Path(scan).name) or real(scan, *a, **k)
    )
    result = preprocess_cohort(folder / "participants.csv", out, template=TEMPLATE)
    assert calls == [] and result.reused == 1 and not result.failures
    img = nib.load(str(folder / "sub-0001_T1w.nii.gz"))
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj) // 2, img.affine), str(folder / "sub-0001_T1w.nii.gz"))
    result = preprocess_cohort(folder / "participants.csv", out, template=TEMPLATE)
    assert calls == ["sub-0001_T1w.nii.gz"] and result.reused == 0


def test_bad_arguments_name_themselves(cohort: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="`template` must be mni152_<spacing>mm"):
        preprocess_cohort(cohort, tmp_path / "o", template="colin27")
    with pytest.raises(ValueError, match="`registration` must be one of"):
        preprocess_cohort(cohort, tmp_path / "o", registration="syn_nonlinear")
    with pytest.raises(ValueError, match="`workers` must be a positive int"):
        preprocess_cohort(cohort, tmp_path / "o", workers=0)
    bad = tmp_path / "bad.csv"
    bad.write_text("path,age,mask\nx.nii.gz,3,m\n")
    with pytest.raises(DataFormatError, match="written by preprocess"):
        preprocess_cohort(bad, tmp_path / "o")
    assert not (tmp_path / "o").exists()
    with pytest.raises(DataFormatError, match="cannot be read"):
        preprocess_t1(cohort.parent / "corrupt.nii.gz", tmp_path / "one", template=TEMPLATE)


def test_the_raw_cohort_holds_the_aligned_subjects(tmp_path: Path) -> None:
    raw = make_brain_age_synthetic(tmp_path / "raw", n=2, spacing=6.0, seed=3, raw=True, raw_voxel_mm=(4.0, 5.0))
    aligned = make_brain_age_synthetic(tmp_path / "aligned", n=2, spacing=6.0, seed=3)
    for name in ("sub-0001", "sub-0002"):
        a = nib.load(str(aligned.parent / f"{name}.nii.gz")).get_fdata()
        b = nib.load(str(raw.parent / "truth" / f"{name}_mni.nii.gz")).get_fdata()
        assert np.array_equal(a, b)
        truth = json.loads((raw.parent / "truth" / f"{name}.json").read_text())
        assert truth["orientation"] in ("LPS", "RAS") and 4.0 <= truth["voxel_mm"] <= 5.0
    assert (raw.parent / "truth" / "aligned.csv").read_text().splitlines()[1].startswith("sub-0001_mni.nii.gz,")

    def table(path: Path) -> list[list[str]]:  # every column but the volume's path
        return [line.split(",")[1:] for line in path.read_text().splitlines()]

    assert table(raw) == table(aligned) == table(raw.parent / "truth" / "aligned.csv")


def test_cli_lists_failures_and_exits_1(cohort: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rankwise.cli import app

    res = CliRunner().invoke(app, ["preprocess", str(cohort), "--out", str(tmp_path / "o"), "--template", "x"])
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "--template" in res.output
    folder = tmp_path / "c"
    folder.mkdir()
    shutil.copy(cohort.parent / "corrupt.nii.gz", folder)
    shutil.copy(cohort.parent / "sub-0001_T1w.nii.gz", folder)
    (folder / "p.csv").write_text("path,age\ncorrupt.nii.gz,50\nsub-0001_T1w.nii.gz,40\n")
    res = CliRunner().invoke(
        app, ["preprocess", str(folder / "p.csv"), "--out", str(tmp_path / "o"), "--template", TEMPLATE]
    )
    assert res.exit_code == 1, res.output
    assert "1 scan preprocessed (0 reused)" in res.output and "1 scan failed:" in res.output
    assert "[1/2]" in res.output and "ETA" in res.output


def test_a_registration_stuck_in_a_wrong_optimum_is_redone_from_other_starts(cohort: Path, tmp_path: Path) -> None:
    """The head tilted by 40 degrees: the centred start ends in a wrong optimum (similarity far under
    0.6), the restarts find the right one; the record says so, and the result matches the upright scan's."""
    scan = nib.load(str(cohort.parent / "sub-0001_T1w.nii.gz"))
    c, s = np.cos(np.radians(40.0)), np.sin(np.radians(40.0))
    centre = scan.affine[:3, :3] @ (np.array(scan.shape) / 2) + scan.affine[:3, 3]
    turn = np.eye(4)
    turn[1:3, 1:3] = [[c, -s], [s, c]]
    turn[:3, 3] = centre - turn[:3, :3] @ centre
    tilted = tmp_path / "tilted.nii.gz"
    nib.save(nib.Nifti1Image(np.asarray(scan.dataobj), turn @ scan.affine), str(tilted))
    upright = preprocess_t1(cohort.parent / "sub-0001_T1w.nii.gz", tmp_path / "a", template=TEMPLATE)
    record = preprocess_t1(tilted, tmp_path / "b", template=TEMPLATE)
    assert not upright["restarted"]
    assert record["restarted"]
    assert record["similarity"] > 0.7
    assert abs(record["similarity"] - upright["similarity"]) < 0.05


def _dice_of(out: Path, row: dict[str, str], cohort: Path) -> float:
    name = row["subject"]
    scan = cohort.parent / f"{name}_T1w.nii.gz"
    warp = out / row["warp"] if row.get("warp") else None
    vol = nib.load(str(out / row["mask"])).get_fdata()
    mask = map_to_scan(vol, TEMPLATE, out / row["transform"], scan, warp=warp)
    true = nib.as_closest_canonical(nib.load(str(cohort.parent / "truth" / f"{name}_brainmask.nii.gz")))
    a, b = mask.get_fdata() > 0.5, true.get_fdata() > 0.5
    return float(2 * (a & b).sum() / (a.sum() + b.sum()))


def test_syn_redoes_an_affine_record_and_maps_the_brain_back_at_least_as_well(
    cohort: Path, done: tuple, tmp_path: Path
) -> None:
    pytest.importorskip("ants")
    import SimpleITK as sitk

    from rankwise.data.preprocess import read_transform

    out0, _, _ = done
    out = tmp_path / "out"
    shutil.copytree(out0, out)
    one = tmp_path / "one.csv"
    lines = cohort.read_text().splitlines()[:2]  # the good scan
    one.write_text(
        lines[0] + "\n" + lines[1].replace("sub-0001_T1w.nii.gz", str(cohort.parent / "sub-0001_T1w.nii.gz"))
    )
    affine_rows = list(csv.DictReader((out0 / "participants.csv").open()))
    result = preprocess_cohort(one, out, template=TEMPLATE, registration="syn")
    assert result.reused == 0 and not result.failures  # the affine record is not the syn one
    rec = result.records[0]
    assert rec["registration"] == "syn" and (out / rec["warp"]).is_file() and (out / rec["inverse_warp"]).is_file()
    assert not [p for p in (out / "transforms").iterdir() if p.name.startswith(".")]  # ANTs' folder is gone
    rows = list(csv.DictReader((out / "participants.csv").open()))
    assert list(rows[0])[-4:] == ["raw_path", "mask", "transform", "warp"] and rows[0]["warp"] == rec["warp"]
    syn, affine = _dice_of(out, rows[0], cohort), _dice_of(out0, affine_rows[0], cohort)
    assert syn >= affine - 1e-9 and syn > 0.9, (syn, affine)
    # the forward and the inverse maps undo each other inside the brain
    fwd = read_transform(out / rec["transform"], warp=out / rec["warp"])
    back = read_transform(out / rec["transform"], warp=out / rec["warp"], inverse=True)
    maps, affine_grid = template_grid(TEMPLATE)
    lps = np.diag([-1.0, -1.0, 1.0])
    for p in np.argwhere(maps["mask"] > 0.5)[::400]:
        x = tuple(float(v) for v in lps @ (affine_grid[:3, :3] @ p + affine_grid[:3, 3]))
        assert np.linalg.norm(np.subtract(back.TransformPoint(fwd.TransformPoint(x)), x)) < 1.0
    assert isinstance(fwd, sitk.CompositeTransform)
    again = preprocess_cohort(one, out, template=TEMPLATE, registration="syn")
    assert again.reused == 1
    from rankwise.data.preprocess import _finished

    scan = cohort.parent / "sub-0001_T1w.nii.gz"
    assert _finished(out, "sub-0001", scan, TEMPLATE, "syn") is not None
    assert _finished(out, "sub-0001", scan, TEMPLATE, "affine") is None  # another registration's record
    (out / rec["inverse_warp"]).unlink()  # a syn record without its field is not finished
    assert _finished(out, "sub-0001", scan, TEMPLATE, "syn") is None


def test_syn_without_antspy_is_one_line_naming_the_extra(
    cohort: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from typer.testing import CliRunner

    from rankwise.cli import app

    monkeypatch.setitem(sys.modules, "ants", None)  # import ants raises ImportError
    with pytest.raises(ImportError, match=r"rankwise\[syn\]"):
        preprocess_cohort(cohort, tmp_path / "o", template=TEMPLATE, registration="syn")
    res = CliRunner().invoke(
        app, ["preprocess", str(cohort), "--out", str(tmp_path / "o"), "--template", TEMPLATE, "--registration", "syn"]
    )
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "rankwise[syn]" in res.output, res.output
    assert not (tmp_path / "o" / "records").exists()


def test_an_out_folder_of_the_users_own_files_is_refused_and_left_as_it_is(cohort: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rankwise.cli import app

    mine = tmp_path / "mine"
    (mine / "qc").mkdir(parents=True)
    (mine / "participants.csv").write_text("my,own\n1,2\n")
    (mine / "qc" / "index.html").write_text("<p>my page</p>")
    before = _listing(mine)
    with pytest.raises(ValueError, match=r"`out` .*mine holds files that `rankwise preprocess` did not write"):
        preprocess_cohort(cohort, mine, template=TEMPLATE)
    res = CliRunner().invoke(app, ["preprocess", str(cohort), "--out", str(mine), "--template", TEMPLATE])
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "--out" in res.output, res.output
    assert _listing(mine) == before and (mine / "participants.csv").read_text() == "my,own\n1,2\n"


def test_the_same_scan_gives_the_same_result_twice(cohort: Path, done: tuple, tmp_path: Path) -> None:
    """The registration's random sampling is seeded: a scan preprocessed again gives the same volume."""
    out, result, _ = done
    again = preprocess_t1(cohort.parent / "sub-0001_T1w.nii.gz", tmp_path / "again", template=TEMPLATE)
    first = nib.load(str(out / result.records[0]["volume"])).get_fdata()
    assert np.array_equal(nib.load(str(tmp_path / "again" / again["volume"])).get_fdata(), first)
    assert again["similarity"] == result.records[0]["similarity"]


def test_a_killed_run_leaves_no_worker_behind(cohort: Path, tmp_path: Path) -> None:
    """``rankwise preprocess --workers 2`` killed (SIGKILL: no clean-up runs): its workers end with it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    two = tmp_path / "two.csv"
    lines = cohort.read_text().splitlines()
    scan = str(cohort.parent / "sub-0001_T1w.nii.gz")
    two.write_text(
        "\n".join(
            [
                lines[0],
                lines[1].replace("sub-0001_T1w.nii.gz", scan),
                lines[1].replace("sub-0001_T1w.nii.gz", scan).replace(",sub-0001", ",copy"),
            ]
        )
        + "\n"
    )
    cmd = [
        sys.executable,
        "-c",
        "from rankwise.cli import main; main()",
        "preprocess",
        str(two),
        "--out",
        str(tmp_path / "o"),
        "--template",
        TEMPLATE,
        "--workers",
        "2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: set[int] = set()
    deadline = time.monotonic() + 120
    while len(children) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        for task in Path(f"/proc/{proc.pid}/task").glob("*/children"):
            children |= {int(v) for v in task.read_text().split()}
    assert proc.poll() is None and children, "the workers did not start"
    time.sleep(4)  # the workers have imported rankwise and are in the middle of their scans
    records = tmp_path / "o" / "records"
    assert proc.poll() is None and not any(records.glob("*.json")), "the scans finished before the kill"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60  # a worker left alive would finish its scan and write its record
    alive = children
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = {
            c
            for c in alive
            if Path(f"/proc/{c}").exists() and "zombie" not in Path(f"/proc/{c}/status").read_text().lower()
        }
    for c in alive:
        os.kill(c, signal.SIGKILL)
    assert not alive, f"workers {sorted(alive)} outlived the killed command"
    assert not any(records.glob("*.json")), "a worker went on writing into --out after the command was killed"
