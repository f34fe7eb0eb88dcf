"""The ``nifti`` dataset against hostile input: volumes stored in another orientation, a tampered or
half-written cache, odd numbers and fields in the cohort CSV, volume paths that are not files."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

nib = pytest.importorskip("nibabel")
pytest.importorskip("torchio")

from rankwise.data import DataFileNotFoundError, DataFormatError, load_nifti_csv  # noqa: E402
from rankwise.data.nifti import load_nifti_cohort, looks_like_nifti_csv, preprocess_volume  # noqa: E402

SHAPE = (12, 14, 10)
AFFINE = np.array([[2.0, 0, 0, -10], [0, 2.0, 0, -14], [0, 0, 2.0, -8], [0, 0, 0, 1]])


def _brain(seed: int = 0) -> np.ndarray:
    """An asymmetric volume: any flip or swap of its axes changes it."""
    rng = np.random.default_rng(seed)
    vol = np.zeros(SHAPE, np.float32)
    vol[2:-2, 2:-2, 2:-2] = rng.uniform(100, 200, (SHAPE[0] - 4, SHAPE[1] - 4, SHAPE[2] - 4))
    vol[2:5, 2:4, 2:3] = 400.0
    return vol


def _flip(data: np.ndarray, affine: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """The same image in world space with voxel axis ``axis`` stored in reverse."""
    m = np.eye(4)
    m[axis, axis] = -1
    m[axis, 3] = data.shape[axis] - 1
    return np.flip(data, axis).copy(), affine @ m


def _swap(data: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.swapaxes(data, 0, 1).copy(), affine @ np.eye(4)[[1, 0, 2, 3]]


def _mirror(data: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    for axis in range(3):
        data, affine = _flip(data, affine, axis)
    return data, affine


STORED = {
    "x flipped": lambda d, a: _flip(d, a, 0),
    "axes swapped": _swap,
    "fully mirrored": _mirror,
    "swapped and flipped": lambda d, a: _flip(*_swap(d, a), 2),
}


def _csv(folder: Path, names: list[str], ages: list[str] | None = None, header: str = "path,age") -> Path:
    ages = ages or [str(30 + i) for i in range(len(names))]
    path = folder / "cohort.csv"
    path.write_text("\n".join([header] + [f"{n},{a}" for n, a in zip(names, ages)]) + "\n")
    return path


@pytest.mark.parametrize("stored", list(STORED))
def test_a_volume_stored_in_another_orientation_preprocesses_to_the_same_array(tmp_path: Path, stored: str) -> None:
    vol = _brain()
    data, affine = STORED[stored](vol, AFFINE)
    assert not np.array_equal(data.shape, vol.shape) or not np.array_equal(data, vol)
    np.testing.assert_array_equal(
        preprocess_volume(data, affine, normalize="none"), preprocess_volume(vol, AFFINE, normalize="none")
    )
    nib.save(nib.Nifti1Image(vol, AFFINE), str(tmp_path / "a.nii.gz"))
    nib.save(nib.Nifti1Image(data, affine), str(tmp_path / "b.nii.gz"))
    cohort = load_nifti_cohort(_csv(tmp_path, ["a.nii.gz", "b.nii.gz"]), cache_dir=str(tmp_path / "cache"))
    a, b = (cohort.dataset[i][0]["volume"].numpy() for i in (0, 1))
    np.testing.assert_array_equal(a, b)
    assert not cohort.meta["notes"]


def test_to_canonical_gives_ras_and_keeps_the_world_points() -> None:
    from rankwise.data.nifti import obliquity_degrees, to_canonical

    data, affine = _mirror(*_swap(_brain(), AFFINE))
    out, aff = to_canonical(data, affine)
    assert nib.aff2axcodes(aff) == ("R", "A", "S")
    np.testing.assert_allclose(aff, AFFINE)
    np.testing.assert_array_equal(out, _brain())
    assert obliquity_degrees(affine) == 0.0


def test_an_oblique_volume_is_reordered_not_resampled_and_noted(tmp_path: Path) -> None:
    from rankwise.data.nifti import obliquity_degrees

    t = np.deg2rad(20)
    rot = np.eye(4)
    rot[:2, :2] = [[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]
    vol = _brain()
    nib.save(nib.Nifti1Image(vol, AFFINE), str(tmp_path / "a.nii.gz"))
    nib.save(nib.Nifti1Image(vol, rot @ AFFINE), str(tmp_path / "tilted.nii.gz"))
    assert round(obliquity_degrees(rot @ AFFINE), 6) == 20.0
    data = load_nifti_csv(
        str(_csv(tmp_path, ["a.nii.gz"] * 3 + ["tilted.nii.gz"])), cache_dir=str(tmp_path / "c"), val_fraction=0.0
    )
    notes = [n for n in data.meta["notes"] if "oblique" in n]
    assert len(notes) == 1, data.meta["notes"]
    assert "1 of 4 volumes" in notes[0] and "row 5" in notes[0] and "tilted.nii.gz" in notes[0]
    assert "20.0 degrees" in notes[0] and "not resampled" in notes[0]


# ----------------------------------------------------------------------------------- the cache
def _zeros(p: Path) -> None:
    a = np.load(p)
    np.save(p, np.zeros_like(a))


def _nan(p: Path) -> None:
    a = np.load(p)
    np.save(p, np.full_like(a, np.nan))


def _complex(p: Path) -> None:
    np.save(p, np.load(p).astype(np.complex64))


def _truncated(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:100])


TAMPER = {
    "zeros": _zeros,
    "nan": _nan,
    "complex": _complex,
    "truncated": _truncated,
    "empty": lambda p: p.write_bytes(b""),
    "record removed": lambda p: p.with_suffix(".json").unlink(),
    "record garbled": lambda p: p.with_suffix(".json").write_text("{"),
    "entry removed": lambda p: p.unlink(),
}


@pytest.mark.parametrize("tamper", list(TAMPER))
def test_a_cache_entry_that_fails_its_record_is_rebuilt_with_a_note(tmp_path: Path, tamper: str) -> None:
    for i in range(3):
        nib.save(nib.Nifti1Image(_brain(i), AFFINE), str(tmp_path / f"s{i}.nii.gz"))
    csv = _csv(tmp_path, [f"s{i}.nii.gz" for i in range(3)])
    cache = tmp_path / "cache"
    first = load_nifti_cohort(csv, cache_dir=str(cache))
    want = [first.dataset[i][0]["volume"].numpy().copy() for i in range(3)]
    entry = Path(first.dataset.files[1])
    record = json.loads(entry.with_suffix(".json").read_text())
    assert set(record["npy"]) == {"sha256", "bytes", "shape", "dtype"} and record["npy"]["shape"] == list(SHAPE)
    TAMPER[tamper](entry)
    again = load_nifti_cohort(csv, cache_dir=str(cache))
    for i in range(3):
        np.testing.assert_array_equal(again.dataset[i][0]["volume"].numpy(), want[i])
    notes = [n for n in again.meta["notes"] if "cache" in n]
    assert len(notes) == 1 and "1 cache entry rebuilt" in notes[0] and "row 3" in notes[0], notes
    assert "s1.nii.gz" in notes[0] and str(entry) in notes[0]
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        n for f in again.dataset.files for n in (Path(f).name, Path(f).with_suffix(".json").name)
    )
    third = load_nifti_cohort(csv, cache_dir=str(cache))  # the rebuilt entry verifies
    assert not [n for n in third.meta["notes"] if "cache" in n]


def test_disk_full_while_caching_names_the_file_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(2):
        nib.save(nib.Nifti1Image(_brain(i), AFFINE), str(tmp_path / f"s{i}.nii.gz"))
    csv = _csv(tmp_path, ["s0.nii.gz", "s1.nii.gz"])
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "mine.txt").write_text("the user's")
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(cache)):
            real_write(fd, bytes(data)[:64])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match=r"cohort\.csv, row 2: cannot write volume .*s0\.nii\.gz to the cache ") as err:
        load_nifti_cohort(csv, cache_dir=str(cache))
    assert err.value.errno == errno.ENOSPC
    assert "No space left on device" in str(err.value) and str(cache) in str(err.value)
    assert [p.name for p in cache.iterdir()] == ["mine.txt"]


def test_a_cache_written_by_other_options_or_orientation_rules_is_not_reused(tmp_path: Path) -> None:
    nib.save(nib.Nifti1Image(_brain(), AFFINE), str(tmp_path / "s0.nii.gz"))
    csv = _csv(tmp_path, ["s0.nii.gz"])
    cache = tmp_path / "cache"
    a = load_nifti_cohort(csv, cache_dir=str(cache))
    b = load_nifti_cohort(csv, cache_dir=str(cache), normalize="none")
    assert a.dataset.files != b.dataset.files
    from rankwise.data import nifti

    key = json.loads(Path(a.dataset.files[0]).with_suffix(".json").read_text())
    assert key["oblique_deg"] == 0.0 and nifti._CACHE_VERSION == "3"


# ----------------------------------------------------------------------------------- the CSV
@pytest.mark.parametrize(
    ("age", "message"),
    [
        ("1_0", r"column 'age': cannot parse '1_0' as a number \(digit separators"),
        ("\u0664\u0665", r"column 'age': cannot parse '\u0664\u0665' as a number"),
        ("nan", r"column 'age': value 'nan' is not finite"),
        ("1e39", r"column 'age': value '1e39' is outside the float32 range"),
        ("-3", r"`age` must be a finite number >= 0"),
    ],
)
def test_ages_follow_the_number_rules_of_every_data_file(tmp_path: Path, age: str, message: str) -> None:
    nib.save(nib.Nifti1Image(_brain(), AFFINE), str(tmp_path / "s0.nii.gz"))
    csv = _csv(tmp_path, ["s0.nii.gz", "s0.nii.gz"], ["40", age])
    with pytest.raises(DataFormatError, match=r"cohort\.csv, row 3: " + message + r".*s0\.nii\.gz"):
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "c"))
    with pytest.raises(DataFormatError, match=r"cohort\.csv, row 3: " + message):
        load_nifti_cohort(csv, cache_dir=str(tmp_path / "c"))


def test_the_cohort_csv_has_the_guards_of_the_tabular_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rankwise.data import _files

    nib.save(nib.Nifti1Image(_brain(), AFFINE), str(tmp_path / "s0.nii.gz"))
    csv = tmp_path / "c.csv"
    csv.write_text(f"path,age,site\ns0.nii.gz,40,{'x' * 200_000}\n")
    with pytest.raises(DataFormatError, match=r"c\.csv, row 2: malformed CSV record: field larger than field limit"):
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "k"))
    csv.write_text('path,age\ns0.nii.gz,"40\n')
    with pytest.raises(DataFormatError, match=r"c\.csv, row 2: malformed CSV record.*quote"):
        load_nifti_cohort(csv, cache_dir=str(tmp_path / "k"))
    csv.write_text("path,age\ns0.nii.gz,40\n")
    monkeypatch.setattr(_files, "MAX_DATA_BYTES", 10)
    with pytest.raises(DataFormatError, match=r"c\.csv: the file of 22 bytes or more is larger than the limit"):
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "k"))
    monkeypatch.setattr(_files, "MAX_DATA_BYTES", 2**30)
    monkeypatch.setattr(_files, "MAX_COLUMNS", 2)
    csv.write_text("path,age,site\ns0.nii.gz,40,a\n")
    with pytest.raises(DataFormatError, match=r"c\.csv, row 1: 3 fields: more than the limit of 2 columns"):
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "k"))
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    with pytest.raises(DataFormatError, match=r"fifo\.csv: is not a regular file"):
        load_nifti_csv(str(fifo), cache_dir=str(tmp_path / "k"))
    assert not looks_like_nifti_csv(fifo)  # never opened: a FIFO would block


def test_a_path_column_under_another_name_is_recognised_and_named(tmp_path: Path) -> None:
    nib.save(nib.Nifti1Image(_brain(), AFFINE), str(tmp_path / "s0.nii.gz"))
    csv = _csv(tmp_path, ["s0.nii.gz"], header="file,age")
    assert looks_like_nifti_csv(csv)
    with pytest.raises(DataFormatError, match=r"missing column\(s\) \['path'\].*column 'file' lists NIfTI files: name"):
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "k"))
    other = tmp_path / "other.csv"
    other.write_text("path,age\nimg.png,3\n")
    assert not looks_like_nifti_csv(other)


def test_cli_own_data_route_names_the_path_column(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from typer.testing import CliRunner

    from rankwise.cli import app

    nib.save(nib.Nifti1Image(_brain(), AFFINE), str(tmp_path / "s0.nii.gz"))
    csv = _csv(tmp_path, ["s0.nii.gz"] * 4, header="file,age")
    res = CliRunner().invoke(
        app, ["train", "--data", str(csv), "--target", "age", "--method", "tsan", "--out", str(tmp_path / "run")]
    )
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    assert "missing column(s) ['path']" in errors[0] and "column 'file' lists NIfTI files" in errors[0]


@pytest.mark.parametrize(
    ("kind", "says"), [("fifo", "is a FIFO (named pipe)"), ("dir", "is a directory"), ("dev", "is a character device")]
)
def test_a_volume_path_that_is_not_a_file_says_what_it_is(tmp_path: Path, kind: str, says: str) -> None:
    nib.save(nib.Nifti1Image(_brain(), AFFINE), str(tmp_path / "s0.nii.gz"))
    special = {"fifo": tmp_path / "v.nii.gz", "dir": tmp_path / "v.nii.gz", "dev": Path("/dev/zero")}[kind]
    if kind == "fifo":
        os.mkfifo(special)
    elif kind == "dir":
        special.mkdir()
    csv = _csv(tmp_path, ["s0.nii.gz", str(special)])
    with pytest.raises(
        DataFormatError, match=re.escape(f"cohort.csv, row 3: volume {special} {says}, not a NIfTI")
    ) as e:
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "k"))
    assert not isinstance(e.value, DataFileNotFoundError)
    csv = _csv(tmp_path, ["s0.nii.gz", str(tmp_path / "gone.nii.gz")])
    with pytest.raises(DataFileNotFoundError, match=r"row 3: volume .*gone\.nii\.gz does not exist"):
        load_nifti_csv(str(csv), cache_dir=str(tmp_path / "k"))
