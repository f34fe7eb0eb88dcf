"""The ``nifti`` dataset: CSV columns, preprocessing, the cache, the subject split and every bad input."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

nib = pytest.importorskip("nibabel")
pytest.importorskip("torchio")

from rankwise.data import DataFormatError, RegressionData, get_dataset, load_nifti_csv, preprocess_volume  # noqa: E402

SHAPE = (20, 24, 20)


def _volume(rng: np.random.Generator, shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    vol = np.zeros(shape, np.float32)
    if len(shape) == 3:
        vol[4:-4, 4:-4, 4:-4] = rng.uniform(100, 200, (shape[0] - 8, shape[1] - 8, shape[2] - 8))
    return vol


def _write(path: Path, vol: np.ndarray, zooms: float = 2.0) -> None:
    nib.save(nib.Nifti1Image(vol, np.diag([zooms, zooms, zooms, 1.0])), str(path))


def _cohort(root: Path, n: int = 12, extra_cols: str = "", rows: list[str] | None = None) -> Path:
    rng = np.random.default_rng(0)
    lines = ["path,age,sex,site,subject" + extra_cols]
    for i in range(n):
        _write(root / f"s{i}.nii.gz", _volume(rng))
        lines.append(f"s{i}.nii.gz,{20 + 5 * i},{'M' if i % 2 else 'F'},site{i % 2},sub{i // 2}")
    if rows is not None:
        lines = [lines[0], *rows] if rows and rows[0] != "KEEP" else lines + rows[1:]
    csv = root / "cohort.csv"
    csv.write_text("\n".join(lines) + "\n")
    return csv


def test_loads_splits_by_subject_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    csv = _cohort(tmp_path)
    cache = tmp_path / "cache"
    data = get_dataset("nifti", csv=str(csv), cache_dir=str(cache), val_fraction=0.2, test_fraction=0.2, seed=3)
    assert isinstance(data, RegressionData)
    assert sum(data.sizes()) == 12 and data.modality == "volumes" and data.meta["has_sex"]
    subjects = {s: set(data.meta[f"{s}_subjects"]) for s in ("train", "val", "test")}
    assert not (subjects["train"] & subjects["val"] or subjects["train"] & subjects["test"])
    assert len(subjects["val"]) == len(subjects["test"]) == 1  # 6 subjects, round(0.2 * 6) each
    x, y = data.train[0]
    assert x["volume"].shape == (1, *SHAPE) and x["volume"].dtype == torch.float32
    row = data.meta["train_rows"][0] - 2  # the CSV row of that item
    assert float(y) == 20 + 5 * row
    assert x["sex"].tolist() == ([0.0, 1.0] if row % 2 else [1.0, 0.0])
    # brain z-score of the authors' loader, computed independently from the file
    raw = np.asarray(nib.load(str(tmp_path / f"s{row}.nii.gz")).get_fdata(), np.float64)
    brain = raw > 0
    expect = np.where(brain, (raw - raw[brain].mean()) / raw[brain].std(), raw)
    np.testing.assert_allclose(x["volume"][0].numpy(), expect, atol=2e-3 * np.abs(expect).max())
    assert len(list(cache.glob("*.npy"))) == 12
    # warm cache: no NIfTI is decoded again
    monkeypatch.setattr(nib, "load", lambda *a, **k: pytest.fail("decoded a cached volume"))
    again = load_nifti_csv(str(csv), cache_dir=str(cache), val_fraction=0.2, test_fraction=0.2, seed=3)
    assert again.meta["train_subjects"] == data.meta["train_subjects"]


def test_split_column_shape_and_spacing(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    lines = ["path,age,split"]
    for i, split in enumerate(["train", "train", "val", "test"]):
        _write(tmp_path / f"v{i}.nii", _volume(rng, (18 + 2 * i, 24, 20)), zooms=2.0)
        lines.append(f"{tmp_path / f'v{i}.nii'},{30 + i},{split}")
    (tmp_path / "c.csv").write_text("\n".join(lines))
    data = load_nifti_csv(str(tmp_path / "c.csv"), shape=[16, 16, 16], cache_dir=str(tmp_path / "k"))
    assert data.sizes() == (2, 1, 1) and data.meta["split"] == "csv" and not data.meta["has_sex"]
    assert data.train[1][0]["volume"].shape == (1, 16, 16, 16)
    assert data.train[0][0]["sex"].tolist() == [0.0, 0.0]
    out = preprocess_volume(_volume(rng), np.diag([2.0, 2.0, 2.0, 1.0]), spacing=4.0, normalize="none")
    assert out.shape == (10, 12, 10)
    with pytest.raises(DataFormatError, match=r"c\.csv, row 3: volume .*v1\.nii has shape \(20, 24, 20\).*row 2"):
        load_nifti_csv(str(tmp_path / "c.csv"), cache_dir=str(tmp_path / "k"))


def _bad_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    rng = np.random.default_rng(2)
    _write(tmp_path / "flat.nii.gz", np.ones((20, 24), np.float32))
    _write(tmp_path / "four.nii.gz", np.ones((20, 24, 20, 3), np.float32))
    nan = _volume(rng)
    nan[10, 10, 10] = np.nan
    _write(tmp_path / "nan.nii.gz", nan)
    good = (tmp_path / "s0.nii.gz").read_bytes()
    (tmp_path / "trunc.nii.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "corrupt.nii.gz").write_bytes(gzip.compress(b"this is not a nifti header" * 20))
    return {
        "missing": (["KEEP", "nope.nii.gz,40,M,s,x1"], r"row 14: volume .*nope\.nii\.gz does not exist"),
        "truncated": (["KEEP", "trunc.nii.gz,40,M,s,x1"], r"row 14: volume .*trunc\.nii\.gz cannot be read"),
        "corrupt": (["KEEP", "corrupt.nii.gz,40,M,s,x1"], r"row 14: volume .*corrupt\.nii\.gz cannot be read"),
        "2-D": (["KEEP", "flat.nii.gz,40,M,s,x1"], r"row 14: volume .*flat\.nii\.gz must be a 3-D volume"),
        "4-D": (["KEEP", "four.nii.gz,40,M,s,x1"], r"row 14: volume .*four\.nii\.gz must be a 3-D volume"),
        "nan": (["KEEP", "nan.nii.gz,40,M,s,x1"], r"row 14: volume .*nan\.nii\.gz has 1 NaN/inf voxels"),
        "negative age": (["KEEP", "s1.nii.gz,-3,M,s,x1"], r"row 14: `age` must be a finite number >= 0.*s1\.nii"),
        "text age": (["KEEP", "s1.nii.gz,old,M,s,x1"], r"row 14: column 'age': cannot parse 'old' .*s1\.nii"),
        "sex": (["KEEP", "s1.nii.gz,40,X,s,x1"], r"row 14: unknown sex value 'X'.*s1\.nii"),
    }


@pytest.mark.parametrize(
    "case", ["missing", "truncated", "corrupt", "2-D", "4-D", "nan", "negative age", "text age", "sex"]
)
def test_bad_input_names_file_and_row(tmp_path: Path, case: str) -> None:
    _cohort(tmp_path)
    rows, message = _bad_cases(tmp_path)[case]
    csv = _cohort(tmp_path, rows=rows)
    with pytest.raises(DataFormatError, match=r"cohort\.csv, " + message) as err:
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "cache"))
    assert "\n" not in str(err.value)


def test_subject_in_two_splits_and_csv_errors(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    _write(tmp_path / "a.nii.gz", _volume(rng))
    (tmp_path / "c.csv").write_text("path,age,subject,split\na.nii.gz,30,s1,train\na.nii.gz,31,s1,test\n")
    with pytest.raises(DataFormatError, match=r"c\.csv, row 3: subject 's1' is in two splits: row 2 \(train\), row 3"):
        load_nifti_csv(str(tmp_path / "c.csv"), cache_dir=str(tmp_path / "k"))
    (tmp_path / "d.csv").write_text("file,age\na.nii.gz,30\n")
    with pytest.raises(DataFormatError, match=r"d\.csv, row 1: missing column\(s\) \['path'\]"):
        load_nifti_csv(str(tmp_path / "d.csv"))
    (tmp_path / "e.csv").write_bytes("path,age\n\xe9.nii,3\n".encode("latin-1"))
    with pytest.raises(DataFormatError, match=r"e\.csv: not valid UTF-8"):
        load_nifti_csv(str(tmp_path / "e.csv"))
    with pytest.raises(ValueError, match="`shape` must be three positive ints"):
        load_nifti_csv(str(tmp_path / "c.csv"), shape=[4, 4])


def test_cli_bad_input_is_one_error_line_and_writes_no_run(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from typer.testing import CliRunner

    from rankwise.cli import app

    _cohort(tmp_path)
    csv = _cohort(tmp_path, rows=["KEEP", "s1.nii.gz,40,unknown,s,x1"])
    out = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        [
            "train",
            "brain_age_tsan_synthetic",
            "--out",
            str(out),
            "--set",
            f"data.options.csv={csv}",
            "--set",
            f"data.options.cache_dir={tmp_path / 'cache'}",
        ],
    )
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in res.output
    assert "cohort.csv, row 14" in lines[0] and "unknown sex value 'unknown'" in lines[0]
    assert not out.exists()


def _patched_header(tmp_path: Path, name: str, offset: int, fmt: str, *values: float) -> None:
    import struct

    rng = np.random.default_rng(4)
    path = tmp_path / name
    nib.save(nib.Nifti1Image(_volume(rng), np.diag([2.0, 2.0, 2.0, 1.0])), str(path))
    raw = bytearray(path.read_bytes())
    struct.pack_into(fmt, raw, offset, *values)
    if offset == 80:  # pixdim: drop qform/sform so the affine comes from pixdim
        struct.pack_into("<2h", raw, 252, 0, 0)
    path.write_bytes(bytes(raw))


def test_hostile_volumes_and_rows_name_file_and_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rankwise.data.nifti as nifti

    _cohort(tmp_path)
    rng = np.random.default_rng(5)
    nib.save(nib.Nifti1Image(_volume(rng).astype(np.complex64), np.eye(4)), str(tmp_path / "cplx.nii"))
    _patched_header(tmp_path, "pixnan.nii", 80, "<3f", np.nan, np.nan, np.nan)
    _patched_header(tmp_path, "huge.nii", 40, "<4h", 3, 30000, 30000, 30000)
    nib.save(nib.Nifti1Image(_volume(rng), np.diag([1e30, 1e30, 1e30, 1.0])), str(tmp_path / "far.nii"))
    cases = {
        "cplx.nii,40,M,s,x1": (r"row 14: volume .*cplx\.nii holds complex64 voxels", {}),
        "pixnan.nii,40,M,s,x1": (r"row 14: volume .*pixnan\.nii: the header's affine is not finite", {}),
        "huge.nii,40,M,s,x1": (r"row 14: volume .*huge\.nii: its header declares \(30000, 30000, 30000\)", {}),
        "far.nii,40,M,s,x1": (r"row 14: volume .*far\.nii: resampling .* gives more than", {"spacing": 4.0}),
        "s1.nii.gz,40,M,s,x1,extra": (r"row 14: 6 fields, the header has 5", {}),
    }
    for row, (message, opts) in cases.items():
        csv = _cohort(tmp_path, rows=["KEEP", row])
        with pytest.raises(DataFormatError, match=r"cohort\.csv, " + message) as err:
            load_nifti_csv(str(csv), cache_dir=str(tmp_path / "cache"), **opts)
        assert "\n" not in str(err.value)
    csv = _cohort(tmp_path)
    with pytest.raises(DataFormatError, match=r"row 2: volume .*s0\.nii\.gz: resampling .* gives more than"):
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "cache"), spacing=1e-3)
    monkeypatch.setattr(nifti, "MAX_VOLUME_BYTES", 1000)
    with pytest.raises(DataFormatError, match=r"row 2: volume .*s0\.nii\.gz is [\d,]+ bytes, over the limit of 1,000"):
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "cache2"))


def test_hostile_options_and_splits(tmp_path: Path) -> None:
    csv = _cohort(tmp_path)
    kw = {"cache_dir": str(tmp_path / "cache")}
    for spacing in (float("nan"), float("inf"), "1e-3", [2.0, 2.0], True, -1.0):
        with pytest.raises(ValueError, match="`spacing` must be a positive number of mm or three"):
            load_nifti_csv(str(csv), spacing=spacing, **kw)
    with pytest.raises(ValueError, match=r"`shape` \[100000, 100000, 100000\] has more than"):
        load_nifti_csv(str(csv), shape=[100000, 100000, 100000], **kw)
    with pytest.raises(TypeError, match="`augment` must be true or false, got 'abc'"):
        load_nifti_csv(str(csv), augment="abc", **kw)  # type: ignore[arg-type]
    (tmp_path / "t.csv").write_text("path,age,split\ns0.nii.gz,30,test\ns1.nii.gz,40,val\n")
    with pytest.raises(DataFormatError, match=r"t\.csv: no row is in the train split"):
        load_nifti_csv(str(tmp_path / "t.csv"), **kw)


@pytest.mark.parametrize("scale", [1e6, 1e-30])
def test_cache_keeps_intensities_float16_cannot_hold(tmp_path: Path, scale: float) -> None:
    rng = np.random.default_rng(6)
    vols = []
    lines = ["path,age"]
    for i in range(6):
        vol = _volume(rng) * np.float32(scale / 150.0)
        vols.append(vol)
        _write(tmp_path / f"v{i}.nii", vol)
        lines.append(f"v{i}.nii,{30 + i}")
    (tmp_path / "c.csv").write_text("\n".join(lines) + "\n")
    data = load_nifti_csv(str(tmp_path / "c.csv"), cache_dir=str(tmp_path / "k"), normalize="none", test_fraction=0.0)
    for ds in (data.train, data.val):
        for j in range(len(ds)):
            x, _ = ds[j]
            ref = torch.from_numpy(vols[int(Path(ds.subjects[j]).stem[1:])])
            assert torch.isfinite(x["volume"]).all()
            assert torch.allclose(x["volume"][0], ref, rtol=1e-3, atol=0.0)


def test_cli_data_show_labels_beyond_the_bins_is_one_error_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rankwise.cli import app
    from tests.cli_helpers import one_error_line

    csv = _cohort(tmp_path, rows=["KEEP", "s1.nii.gz,1e30,M,s,x1"])
    r = CliRunner().invoke(app, ["data", "show", "nifti", "-O", f"csv={csv}", "-O", f"cache_dir={tmp_path / 'k'}"])
    assert "cannot bin the training labels" in one_error_line(r)


def test_a_crop_that_cuts_into_the_brain_is_noted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 mm volumes through a grid meant for 2 mm (a preset's ``shape``): the centred crop keeps about half
    of each brain, which ``meta["notes"]`` says (naming the option, a row, the share kept and the voxel
    size), also when the volumes come from the cache; resampling first, or resizing, is not noted."""
    rng = np.random.default_rng(4)
    lines = ["path,age"]
    for i in range(4):
        vol = np.zeros((40, 48, 40), np.float32)
        vol[8:-8, 8:-8, 8:-8] = rng.uniform(100, 200, (24, 32, 24))
        _write(tmp_path / f"h{i}.nii.gz", vol, zooms=1.0)
        lines.append(f"h{i}.nii.gz,{30 + i}")
    csv = tmp_path / "c.csv"
    csv.write_text("\n".join(lines) + "\n")
    cache = str(tmp_path / "k")
    data = load_nifti_csv(str(csv), shape=[20, 24, 20], cache_dir=cache, val_fraction=0.0, test_fraction=0.25)
    (note,) = data.meta["notes"]
    kept = 20 * 24 * 20 / (24 * 32 * 24)
    assert "`data.options.shape` [20, 24, 20]" in note and "4 of 4 volumes" in note
    assert f"{kept:.0%} kept" in note and "voxel size 1 x 1 x 1 mm" in note and "`data.options.spacing`" in note
    monkeypatch.setattr(nib, "load", lambda *a, **k: pytest.fail("decoded a cached volume"))
    again = load_nifti_csv(str(csv), shape=[20, 24, 20], cache_dir=cache, val_fraction=0.0, test_fraction=0.25)
    assert again.meta["notes"] == [note]
    monkeypatch.undo()
    for options in ({"spacing": 2.0}, {"resize": "resample"}):
        fine = load_nifti_csv(str(csv), shape=[20, 24, 20], cache_dir=cache, test_fraction=0.25, **options)
        assert fine.meta["notes"] == [] and fine.train[0][0]["volume"].shape == (1, 20, 24, 20)
    # 2 mm volumes whose crop removes only background: nothing to say
    assert _cohort_notes(tmp_path / "two") == []


def _cohort_notes(root: Path) -> list[str]:
    root.mkdir()
    return load_nifti_csv(str(_cohort(root)), shape=[16, 16, 16], cache_dir=str(root / "k")).meta["notes"]


def test_a_cohort_records_every_volume_it_reads(tmp_path: Path) -> None:
    """Inside ``recording_reads`` the loader records the CSV and each volume (a run fingerprints them)."""
    from rankwise.data._files import recording_reads

    csv = _cohort(tmp_path, n=6)
    with recording_reads() as read:
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "cache"), val_fraction=0.2, test_fraction=0.2)
    got = {Path(p).resolve() for p in read}
    assert {(tmp_path / f"s{i}.nii.gz").resolve() for i in range(6)} <= got
