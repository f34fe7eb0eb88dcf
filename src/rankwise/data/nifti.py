"""T1-weighted MRI cohorts from a CSV of NIfTI files (``nifti``) and the offline synthetic cohort.

``load_nifti_csv(csv, ...)`` reads a CSV with columns ``path`` (relative to the CSV's folder, or
absolute), ``age`` and optionally ``sex`` (M/F, male/female, 1/0 with 1 = male), ``site``,
``subject``, ``split`` (train/val/test). Every volume is checked, preprocessed once and cached:

1. read with nibabel (3-D; a 4-D volume with one frame is accepted), finite voxels;
2. reoriented to RAS+ from the affine (:func:`to_canonical`, nibabel's closest canonical orientation:
   flips and permutations of the voxel axes, exact); an oblique affine is reordered, not resampled,
   and noted (``meta["notes"]``) beyond :data:`OBLIQUE_WARN_DEG`;
3. ``spacing``: resampled to that voxel size (mm) with TorchIO's ``Resample``;
4. ``shape``: centred crop/pad (TorchIO's ``CropOrPad``, ``resize="crop_or_pad"``) or a
   resample to the grid (``Resize``, ``resize="resample"``); without ``shape`` every volume must
   have the shape of the first one;
5. intensities: z-score over the voxels > 0 (the brain, after skull stripping), voxels <= 0 kept
   as they are, as the TSAN authors' loader (``normalize="brain_zscore"``; ``"none"`` keeps them).

The preprocessed volumes are float16 ``.npy`` files (float32 where float16 cannot hold them) in
``cache_dir`` keyed by the file's bytes, the options and the preprocessing's version, read back as
memory maps, so epochs after the first never decode gzip again. Each entry's ``.json`` records its
SHA-256, size, shape and dtype; an entry that does not match is rebuilt and noted. Under the
``rankwise`` commands, checking and caching a cohort for longer than 2 s prints progress lines on
stderr (volumes done, ETA; none with ``--no-progress``). The CSV is read by
the rules of :mod:`rankwise.data._files` (ages by its ``parse_number``). Any bad row raises
:class:`~rankwise.data.DataFormatError` naming the CSV, the row and the volume.

:func:`make_brain_age_synthetic` writes an offline cohort built from the MNI152 templates that
the ``nilearn`` wheel ships (see its docstring for the age model). nibabel, nilearn and TorchIO
(the ``mri`` extra) are imported inside the functions that use them.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from rankwise._fileio import atomic_path, write_all
from rankwise._progress import Steps
from rankwise.data._base import DataFileNotFoundError, DataFormatError, RegressionData, register_dataset
from rankwise.data._files import check_header, csv_records, file_digest, note_read, parse_number, read_text

__all__ = [
    "PREPROCESSING_OPTIONS",
    "PREPROCESS_COLUMNS",
    "SEX_VALUES",
    "NiftiCohort",
    "NiftiPreprocessing",
    "NiftiVolumeDataset",
    "load_nifti_cohort",
    "load_nifti_csv",
    "looks_like_nifti_csv",
    "obliquity_degrees",
    "parse_sex",
    "preprocess_volume",
    "preprocessed_template",
    "to_canonical",
]

#: accepted ``sex`` values (case-insensitive) -> 1 (male) / 0 (female)
SEX_VALUES = {"m": 1, "male": 1, "1": 1, "f": 0, "female": 0, "0": 0}
_SPLITS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
#: the columns :func:`rankwise.data.preprocess_cohort` adds to the cohort CSV it writes
PREPROCESS_COLUMNS = ("raw_path", "mask", "transform")
#: the cache entries' format and what the preprocessing does (3: volumes reoriented to RAS+ first, entries
#: recorded with their checksum, shape and dtype)
_CACHE_VERSION = "3"
#: the voxel order every volume is brought to before the other steps (nibabel's closest canonical)
CANONICAL = ("R", "A", "S")
#: an affine whose voxel axes lie further than this (degrees) from the world axes is reported as oblique
OBLIQUE_WARN_DEG = 1.0
#: largest volume file (on disk) and largest decoded volume (header dims x voxel size), bytes
MAX_VOLUME_BYTES = 2**30
#: largest preprocessed grid (voxels) that ``shape`` / ``spacing`` may ask for
MAX_GRID_VOXELS = 2**27


def parse_sex(value: str) -> int | None:
    """``"M"``/``"male"``/``"1"`` -> 1, ``"F"``/``"female"``/``"0"`` -> 0, ``""`` -> None; else ``ValueError``."""
    v = str(value).strip().lower()
    if v == "":
        return None
    if v.endswith(".0") and v[:-2] in ("0", "1"):
        v = v[:-2]
    if v not in SEX_VALUES:
        raise ValueError(f"unknown sex value {value!r}; expected one of M/F, male/female, 1/0 (1 = male)")
    return SEX_VALUES[v]


def _mri_modules() -> tuple[Any, Any]:
    try:
        import nibabel
        import torchio
    except ImportError as e:  # pragma: no cover - the mri extra is missing
        raise ImportError(f"the nifti dataset needs nibabel and torchio: pip install 'rankwise[mri]' ({e})") from None
    return nibabel, torchio


def _brain_zscore(vol: np.ndarray) -> np.ndarray:
    """z-score of the voxels > 0; voxels <= 0 unchanged; a constant brain gives zeros (the authors' rule)."""
    mask = vol > 0
    n = int(mask.sum())
    if n == 0:
        return np.zeros_like(vol)
    brain = vol[mask].astype(np.float64)
    mean = brain.mean()
    std = math.sqrt(float(((brain - mean) ** 2).mean()))
    if std == 0:
        return np.zeros_like(vol)
    out = vol.copy()
    out[mask] = ((brain - mean) / std).astype(vol.dtype)
    return out


def preprocess_volume(
    data: np.ndarray,
    affine: np.ndarray,
    *,
    spacing: float | Sequence[float] | None = None,
    shape: Sequence[int] | None = None,
    resize: Literal["crop_or_pad", "resample"] = "crop_or_pad",
    normalize: Literal["brain_zscore", "none"] = "brain_zscore",
) -> np.ndarray:
    """One volume through the preprocessing of :func:`load_nifti_csv` (float32 ``(D, H, W)``).

    Example:
        >>> vol = np.zeros((20, 20, 20), np.float32); vol[5:15, 5:15, 5:15] = 3.0; vol[8, 8, 8] = 5.0
        >>> out = preprocess_volume(vol, np.eye(4), spacing=2.0, shape=(12, 12, 12))
        >>> out.shape, round(float(out[out != 0].mean()), 2) == 0.0
        ((12, 12, 12), True)
    """
    return _preprocess(data, affine, spacing, shape, resize, normalize)[0]


def _preprocess(
    data: np.ndarray,
    affine: np.ndarray,
    spacing: float | Sequence[float] | None,
    shape: Sequence[int] | None,
    resize: str,
    normalize: str,
) -> tuple[np.ndarray, float]:
    """:func:`preprocess_volume` and the fraction of the voxels > 0 that the centred crop to ``shape``
    kept (1.0 without a crop)."""
    _, tio = _mri_modules()
    data, affine = to_canonical(data, affine)
    img = tio.ScalarImage(tensor=torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))[None], affine=affine)
    if spacing is not None:
        img = tio.Resample(spacing)(img)
    kept = 1.0
    if shape is not None:
        shape3 = tuple(int(s) for s in shape)
        if resize == "crop_or_pad":
            before = int((img.data > 0).sum())
            img = tio.CropOrPad(shape3)(img)
            kept = int((img.data > 0).sum()) / before if before else 1.0
        else:
            img = tio.Resize(shape3)(img)
    vol = img.data[0].numpy().astype(np.float32)
    return (_brain_zscore(vol) if normalize == "brain_zscore" else vol), kept


def to_canonical(data: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``data`` with its voxel axes flipped and permuted to :data:`CANONICAL` (RAS+: the voxel axes run
    from left to Right, posterior to Anterior, inferior to Superior) and the
    affine that maps the new voxels to the same world points: nibabel's ``as_closest_canonical``.

    Exact (no interpolation). An oblique affine (voxel axes rotated against the world axes) is brought
    to the closest canonical order; its obliquity remains (see :func:`obliquity_degrees`).

    Example:
        >>> vol = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        >>> flipped = np.diag([-1.0, 1.0, 1.0, 1.0]); flipped[0, 3] = 1.0  # x stored right to left
        >>> out, aff = to_canonical(vol[::-1], flipped)
        >>> bool((out == vol).all()), aff[0].tolist()
        (True, [1.0, 0.0, 0.0, 0.0])
    """
    nib, _ = _mri_modules()
    orient = nib.orientations
    transform = orient.ornt_transform(orient.io_orientation(affine), orient.axcodes2ornt(CANONICAL))
    out = orient.apply_orientation(data, transform)
    return np.ascontiguousarray(out), affine @ orient.inv_ornt_aff(transform, data.shape)


def obliquity_degrees(affine: np.ndarray) -> float:
    """The largest angle (degrees) between a voxel axis of ``affine`` and the world axis it is closest to
    (nibabel's ``affines.obliquity``); 0 for an affine whose axes are flips and permutations of the world's."""
    nib, _ = _mri_modules()
    return float(np.degrees(np.abs(nib.affines.obliquity(affine)).max()))


class NiftiVolumeDataset(Dataset):
    """Items ``({"volume": (1, D, H, W) float32, "sex": (2,) one-hot}, age)`` from cached float16 volumes.

    ``sex`` is all zeros for a subject without a sex value. ``transform``: an optional TorchIO
    transform applied to every item (training augmentation).
    """

    def __init__(
        self,
        files: Sequence[str],
        ages: np.ndarray,
        sex: np.ndarray,
        subjects: Sequence[str],
        transform: Any = None,
    ) -> None:
        self.files = list(files)
        self.ages = np.asarray(ages, dtype=np.float32)
        self.sex = np.asarray(sex, dtype=np.int64)
        self.subjects = list(subjects)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        vol = torch.from_numpy(np.load(self.files[index], mmap_mode="r").astype(np.float32))[None]
        if self.transform is not None:
            vol = self.transform(vol)
        s = int(self.sex[index])
        onehot = torch.zeros(2)
        if s >= 0:
            onehot[s] = 1.0
        return {"volume": vol, "sex": onehot}, torch.tensor(float(self.ages[index]))


def _check_volume_file(path: Path, where: tuple[Path, int]) -> os.stat_result:
    """The ``stat`` of a volume path that is a regular file; else an error saying what it is."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DataFileNotFoundError(*where, f"volume {path} does not exist") from None
    except OSError as e:
        raise DataFormatError(*where, f"volume {path} cannot be read: {e.strerror or e}") from None
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    for test, kind in kinds:
        if test(st.st_mode):
            raise DataFormatError(*where, f"volume {path} is {kind}, not a NIfTI file")
    if not stat.S_ISREG(st.st_mode):
        raise DataFormatError(*where, f"volume {path} is not a regular file")
    note_read(path)  # a run records the volumes it read (their fingerprints, in its data.json)
    return st


def _read_volume(path: Path, where: tuple[Path, int]) -> tuple[np.ndarray, np.ndarray]:
    nib, _ = _mri_modules()
    csv_path, row = where
    _check_volume_file(path, where)
    try:
        img = nib.load(str(path))
        dims = tuple(int(d) for d in img.shape)
        kind = np.dtype(img.get_data_dtype()).kind
        declared = math.prod(dims) * np.dtype(img.get_data_dtype()).itemsize
    except Exception as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        raise DataFormatError(csv_path, row, f"volume {path} cannot be read (truncated or corrupt?): {msg}") from None
    if declared > MAX_VOLUME_BYTES:
        raise DataFormatError(
            csv_path,
            row,
            f"volume {path}: its header declares {dims} voxels ({declared:,} bytes), larger than "
            f"the limit of {MAX_VOLUME_BYTES:,} bytes",
        )
    if kind not in "iuf":
        raise DataFormatError(
            csv_path, row, f"volume {path} holds {np.dtype(img.get_data_dtype())} voxels; expected real intensities"
        )
    try:
        data = np.asarray(img.get_fdata(dtype=np.float32))
        affine = np.asarray(img.affine, dtype=np.float64)
    except Exception as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        raise DataFormatError(csv_path, row, f"volume {path} cannot be read (truncated or corrupt?): {msg}") from None
    if not np.isfinite(affine).all() or abs(np.linalg.det(affine[:3, :3])) < 1e-12:
        raise DataFormatError(
            csv_path, row, f"volume {path}: the header's affine is not finite or not invertible (voxel sizes)"
        )
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise DataFormatError(csv_path, row, f"volume {path} must be a 3-D volume, got shape {tuple(data.shape)}")
    bad = int((~np.isfinite(data)).sum())
    if bad:
        raise DataFormatError(csv_path, row, f"volume {path} has {bad} NaN/inf voxels")
    return data, affine


def _read_rows(csv_path: Path, target: str | None = "age") -> list[dict[str, Any]]:
    """The CSV's rows (stripped values, ``_row``: the 1-based line); ``path`` and ``target`` (unless
    None) are required columns.

    Read by the rules of every data file (:mod:`rankwise.data._files`): UTF-8, at most
    ``MAX_DATA_BYTES`` and ``MAX_COLUMNS`` columns, fields within the ``csv`` module's field limit,
    closed quotes; a row with fewer fields than the header has empty values for the others."""
    text = read_text(csv_path, "cohort CSV")
    records = csv_records(text, csv_path)
    first = next(records, None)
    if first is None:
        raise DataFormatError(csv_path, None, "the CSV is empty")
    # one value per name: a repeated name would keep only its last column
    header = check_header(first[1], csv_path, allow_unnamed=True)
    rows = []
    for i, fields in records:
        if len(fields) > len(header):
            raise DataFormatError(csv_path, i, f"{len(fields)} fields, the header has {len(header)}")
        values = fields + [""] * (len(header) - len(fields))
        rows.append({k: v.strip() for k, v in zip(header, values)} | {"_row": i})
    missing = [c for c in ("path", target) if c is not None and c not in header]
    if missing:
        listing = [k for k in header if rows and _is_nifti_name(str(rows[0].get(k, "")))]
        hint = f" (column {listing[0]!r} lists NIfTI files: name it `path`)" if "path" in missing and listing else ""
        raise DataFormatError(csv_path, 1, f"missing column(s) {missing}; the header is {header}{hint}")
    if not rows:
        raise DataFormatError(csv_path, None, "the CSV has no data rows")
    return rows


#: the cohort CSV reader, for the other readers of cohort CSVs (:mod:`rankwise.data.preprocess`)
read_cohort_rows = _read_rows
#: the checked volume reader (one error line naming the CSV row), for the other readers of volumes
read_volume = _read_volume


def _preprocess_records(rows: list[dict[str, Any]], csv_path: Path) -> dict[str, str] | None:
    """``{"template", "registration"}`` of a cohort CSV written by :func:`rankwise.data.preprocess_cohort`
    (its :data:`PREPROCESS_COLUMNS`, each row's record ``records/<name>.json`` next to the CSV); ``None`` for
    another CSV or one whose records are missing. Rows preprocessed with different templates are a
    :class:`~rankwise.data.DataFormatError` naming the row."""
    if not rows or not all(c in rows[0] for c in PREPROCESS_COLUMNS):
        return None
    found: dict[str, str] | None = None
    for r in rows:
        name = Path(r["transform"]).name.removesuffix(".tfm")
        try:
            rec = json.loads((csv_path.parent / "records" / f"{name}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(rec, dict) or not isinstance(rec.get("template"), str):
            return None
        this = {"template": rec["template"], "registration": str(rec.get("registration", "affine"))}
        if found is not None and this != found:
            raise DataFormatError(
                csv_path, r["_row"], f"preprocessed with {this}, the rows before it with {found}: one template a cohort"
            )
        found = this
    return found


def preprocessed_template(csv_path: str | Path) -> str | None:
    """The template of a cohort CSV that :func:`rankwise.data.preprocess_cohort` wrote, else ``None``."""
    csv_path = Path(csv_path)
    found = _preprocess_records(read_cohort_rows(csv_path, None), csv_path)
    return None if found is None else found["template"]


def _is_nifti_name(value: str) -> bool:
    return value.strip().lower().endswith((".nii", ".nii.gz"))


def _parse_row(
    r: dict[str, Any], csv_path: Path, root: Path, target: str = "age", *, age_optional: bool = False
) -> dict[str, Any]:
    """One CSV row checked and parsed; with ``age_optional`` a missing or empty ``target`` is NaN."""
    row = r["_row"]
    if not r["path"]:
        raise DataFormatError(csv_path, row, "empty `path`")
    p = Path(r["path"])
    path = p if p.is_absolute() else root / p
    age = math.nan if age_optional and not r.get(target, "") else _parse_age(r, csv_path, row, target, path)
    try:
        sex = parse_sex(r.get("sex", ""))
    except ValueError as e:
        raise DataFormatError(csv_path, row, f"{e} ({path})") from None
    split = r.get("split", "").lower()
    if split and split not in _SPLITS:
        raise DataFormatError(csv_path, row, f"`split` must be train, val or test, got {r['split']!r} ({path})")
    subject = r.get("subject", "") or r["path"]
    return {
        "row": row,
        "path": path,
        "age": age,
        "sex": -1 if sex is None else sex,
        "site": r.get("site", ""),
        "subject": subject,
        "split": _SPLITS.get(split, ""),
    }


def _parse_age(r: dict[str, Any], csv_path: Path, row: int, target: str, path: Path) -> float:
    """The label of one row, read by the number rules of every data file
    (:func:`~rankwise.data._files.parse_number`: plain ASCII decimals) and >= 0."""
    try:
        age = parse_number(r[target], csv_path, row, target)
    except DataFormatError as e:
        reason = str(e).removeprefix(f"{csv_path}, row {row}: ")
        raise DataFormatError(csv_path, row, f"{reason} ({path})") from None
    if age < 0:
        raise DataFormatError(csv_path, row, f"`{target}` must be a finite number >= 0, got {r[target]!r} ({path})")
    return age


def _assign_splits(items: list[dict[str, Any]], csv_path: Path, val: float, test: float, seed: int) -> None:
    by_subject: dict[str, list[dict[str, Any]]] = {}
    for it in items:
        by_subject.setdefault(it["subject"], []).append(it)
    for subject, group in by_subject.items():
        splits = {g["split"] for g in group if g["split"]}
        if len(splits) > 1:
            rows = ", ".join(f"row {g['row']} ({g['split']})" for g in group)
            raise DataFormatError(
                csv_path, group[-1]["row"], f"subject {subject!r} is in two splits: {rows} ({group[-1]['path']})"
            )
    if all(it["split"] for it in items):
        return
    if any(it["split"] for it in items):
        row = next(it for it in items if not it["split"])
        raise DataFormatError(csv_path, row["row"], f"empty `split` while other rows have one ({row['path']})")
    subjects = sorted(by_subject)
    perm = np.random.default_rng(seed).permutation(len(subjects))
    n_val, n_test = round(val * len(subjects)), round(test * len(subjects))
    for rank, k in enumerate(perm):
        split = "val" if rank < n_val else "test" if rank < n_val + n_test else "train"
        for it in by_subject[subjects[k]]:
            it["split"] = split


def _check_spacing(spacing: Any) -> float | tuple[float, ...] | None:
    """``spacing``: None, a positive finite number of mm, or three of them."""
    if spacing is None:
        return None
    vals = list(spacing) if isinstance(spacing, (list, tuple)) else [spacing]
    ok = len(vals) in (1, 3) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in vals
    )
    if not ok:
        raise ValueError(f"`spacing` must be a positive number of mm or three of them, got {spacing!r}")
    return float(vals[0]) if len(vals) == 1 else tuple(float(v) for v in vals)


def _check_grid(dims: tuple[int, ...], affine: np.ndarray, spacing: Any, where: tuple[Path, int], path: Path) -> None:
    """Refuse a resampling to ``spacing`` whose grid would exceed :data:`MAX_GRID_VOXELS`."""
    if spacing is None:
        return
    zooms = np.sqrt((affine[:3, :3] ** 2).sum(0))
    target = np.broadcast_to(np.asarray(spacing, dtype=np.float64), (3,))
    with np.errstate(over="ignore", invalid="ignore"):
        voxels = float(np.prod(np.asarray(dims[:3], dtype=np.float64) * zooms / target))
    if not math.isfinite(voxels) or voxels > MAX_GRID_VOXELS:
        raise DataFormatError(
            where[0],
            where[1],
            f"volume {path}: resampling its {dims} voxels of {np.round(zooms, 4).tolist()} mm "
            f"to `spacing` {spacing} gives more than {MAX_GRID_VOXELS:,} voxels",
        )


#: a centred crop that keeps less than this fraction of a volume's voxels > 0 is reported
CROP_KEEP_WARN = 0.9


def _store_entry(cached: Path, vol: np.ndarray, facts: dict[str, Any]) -> dict[str, Any]:
    """Write the cache entry ``cached`` (the ``.npy``) and its record (the ``.json`` beside it: ``facts`` and,
    under ``npy``, the file's SHA-256, size, shape and dtype); both appear only once both are written.
    Returns the record; an ``OSError`` leaves no file behind."""
    buf = io.BytesIO()
    arr = _cache_array(vol)
    np.save(buf, arr, allow_pickle=False)
    payload = buf.getvalue()
    record = facts | {
        "npy": {
            "sha256": hashlib.sha256(payload).hexdigest(),
            "bytes": len(payload),
            "shape": list(arr.shape),
            "dtype": str(arr.dtype),
        }
    }
    # both written before either replaces its file; the .npy is put in place first, then its record
    with atomic_path(cached.with_suffix(".json")) as tmp_json, atomic_path(cached) as tmp_npy:
        write_all(tmp_npy, payload)
        write_all(tmp_json, json.dumps(record).encode())
    return record


def _verified(cached: Path) -> tuple[dict[str, Any] | None, str]:
    """``(record, "")`` for a cache entry whose ``.npy`` matches the checksum, size, shape and dtype its
    ``.json`` records; else ``(None, what is wrong)``."""
    try:
        record = json.loads(cached.with_suffix(".json").read_text())
    except FileNotFoundError:
        return None, "has no record of its checksum"
    except (OSError, ValueError):
        return None, "has an unreadable record"
    npy = record.get("npy") if isinstance(record, dict) else None
    keys = {"sha256": str, "bytes": int, "shape": list, "dtype": str}
    if not isinstance(npy, dict) or not all(isinstance(npy.get(k), t) for k, t in keys.items()):
        return None, "has no record of its checksum"
    if not cached.exists():
        return None, "is missing (its record remains)"
    try:
        size = cached.stat().st_size
        if size != npy["bytes"]:
            return None, f"is {size:,} bytes where {npy['bytes']:,} were written (truncated or replaced)"
        if file_digest(cached) != npy["sha256"]:
            return None, "does not match its checksum (changed since it was written)"
        arr = np.load(cached, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        return None, f"cannot be read ({' '.join(str(e).split()) or type(e).__name__})"
    if list(arr.shape) != npy["shape"] or str(arr.dtype) != npy["dtype"] or arr.dtype not in _CACHE_DTYPES:
        return None, f"holds {arr.dtype} {list(arr.shape)} where {npy['dtype']} {npy['shape']} was written"
    return record, ""


#: the dtypes of the cached volumes (:func:`_cache_array`)
_CACHE_DTYPES = (np.dtype(np.float16), np.dtype(np.float32))


#: what the crop note advises for a training cohort
_CROP_ADVICE = (
    "resample them first with `data.options.spacing` (e.g. 2 for the 91 x 109 x 91 grid of MNI space at 2 mm) "
    "or set `data.options.resize` to resample"
)


def _crop_notes(items: list[dict[str, Any]], shape: Sequence[int] | None, advice: str = _CROP_ADVICE) -> list[str]:
    """One note when the centred crop to ``shape`` cut away more than a tenth of some volumes' voxels > 0
    (e.g. 1 mm volumes through a preset's 2 mm grid: a silent crop to the middle of the head), ending
    with ``advice``."""
    cut = [it for it in items if float(it["facts"].get("kept", 1.0)) < CROP_KEEP_WARN]
    if not cut or shape is None:
        return []
    worst = min(cut, key=lambda it: float(it["facts"]["kept"]))
    vox = worst["facts"].get("voxel_mm")
    size = f", voxel size {' x '.join(f'{v:g}' for v in vox)} mm" if isinstance(vox, list) else ""
    return [
        f"the centred crop to `data.options.shape` {list(shape)} keeps less than "
        f"{CROP_KEEP_WARN:.0%} of the voxels > 0 of {len(cut)} of {len(items)} volumes (row {worst['row']}, "
        f"{worst['path']}: {float(worst['facts']['kept']):.0%} kept{size}); {advice}"
    ]


def _rebuilt_notes(items: list[dict[str, Any]]) -> list[str]:
    """One note naming the volumes whose cache entries failed verification and were rebuilt."""
    bad = [it for it in items if it.get("rebuilt")]
    if not bad:
        return []
    shown = "; ".join(f"row {it['row']}, volume {it['path']}: {it['rebuilt']}" for it in bad[:3])
    more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
    return [f"{len(bad)} cache entr{'y' if len(bad) == 1 else 'ies'} rebuilt from the volumes ({shown}{more})"]


def _oblique_notes(items: list[dict[str, Any]]) -> list[str]:
    """One note when some volumes' affines are oblique (more than :data:`OBLIQUE_WARN_DEG`)."""
    tilted = [it for it in items if float(it["facts"].get("oblique_deg", 0.0)) > OBLIQUE_WARN_DEG]
    if not tilted:
        return []
    worst = max(tilted, key=lambda it: float(it["facts"]["oblique_deg"]))
    return [
        f"{len(tilted)} of {len(items)} volumes have an oblique affine (row {worst['row']}, {worst['path']}: voxel "
        f"axes {float(worst['facts']['oblique_deg']):.1f} degrees from the world axes); they are reoriented to "
        f"{''.join(CANONICAL)} by flipping and permuting their axes only, not resampled: register them to a "
        "template (e.g. MNI) first for grids aligned with the world axes"
    ]


def _cache_array(vol: np.ndarray) -> np.ndarray:
    """float16 when the largest ``|voxel|`` lies in [2**-4, 65504] (or all are 0): a relative precision of
    about 1e-3 for every voxel that matters; otherwise float32 (raw intensities beyond the float16 range
    became inf, tiny ones 0)."""
    amax = float(np.abs(vol).max()) if vol.size else 0.0
    if amax == 0.0 or 2.0**-4 <= amax <= float(np.finfo(np.float16).max):
        return vol.astype(np.float16)
    return vol.astype(np.float32)


def looks_like_nifti_csv(path: str | Path) -> bool:
    """Whether ``path`` is a CSV whose first row lists a NIfTI volume (a value ending in .nii / .nii.gz) in
    its ``path`` column or, when it has no ``path`` column, in any column (which the loader then asks to
    name ``path``)."""
    try:
        if not Path(path).is_file():  # a FIFO would block, a directory cannot be read
            return False
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            first = next(reader, None)
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    if first is None:
        return False
    values = dict(zip(header, first))
    if "path" in values:
        return _is_nifti_name(values["path"])
    return any(_is_nifti_name(v) for v in values.values())


def _default_cache() -> Path:
    base = os.environ.get("RANKWISE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rankwise")
    return Path(base) / "volumes"


def _check_target(target: Any) -> None:
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"`target` must be the name of the CSV's label column, got {target!r}")


@dataclass(frozen=True)
class NiftiPreprocessing:
    """How every volume of a NIfTI cohort is preprocessed, and where the result is cached.

    After the reorientation to RAS+ (:func:`to_canonical`), :func:`preprocess_volume` applies, in
    order: a resampling to ``spacing`` (mm, one number or three; ``None``: the volumes' own grid), a
    centred crop/pad (``resize="crop_or_pad"``) or a resample (``"resample"``) to ``shape`` ([D, H, W];
    ``None``: keep each volume's shape, which must then agree across the cohort), and the intensity
    rule ``normalize`` (``"brain_zscore"``: z-score over the voxels > 0; ``"none"``). Each result is
    cached once in ``cache_dir`` (``None``: ``$RANKWISE_CACHE/volumes`` or
    ``~/.cache/rankwise/volumes``), keyed by the file's content and these options.

    :func:`load_nifti_csv` stores it, as :meth:`to_dict`, in its data's ``meta["preprocessing"]``
    (and so in a run's ``data.json``); a prediction preprocesses new volumes with the run's one
    (:func:`load_nifti_cohort` ``preprocessing=``). A bad value raises a ValueError naming the field.

    Example:
        >>> prep = NiftiPreprocessing(shape=[96, 112, 96], spacing=2)
        >>> prep.shape, prep.spacing, prep.resize
        ((96, 112, 96), 2.0, 'crop_or_pad')
        >>> NiftiPreprocessing.from_dict(prep.to_dict()) == prep
        True
        >>> NiftiPreprocessing(normalize="minmax")
        Traceback (most recent call last):
        ...
        ValueError: `normalize` must be 'brain_zscore' or 'none', got 'minmax'
    """

    shape: tuple[int, ...] | None = None
    spacing: float | tuple[float, ...] | None = None
    resize: Literal["crop_or_pad", "resample"] = "crop_or_pad"
    normalize: Literal["brain_zscore", "none"] = "brain_zscore"
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        shape = self.shape
        if shape is not None and (
            isinstance(shape, (str, bytes))
            or not hasattr(shape, "__len__")
            or len(shape) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape)
        ):
            raise ValueError(f"`shape` must be three positive ints [D, H, W], got {shape!r}")
        if shape is not None and math.prod(shape) > MAX_GRID_VOXELS:
            raise ValueError(f"`shape` {list(shape)} has more than {MAX_GRID_VOXELS:,} voxels")
        if self.resize not in ("crop_or_pad", "resample"):
            raise ValueError(f"`resize` must be 'crop_or_pad' or 'resample', got {self.resize!r}")
        if self.normalize not in ("brain_zscore", "none"):
            raise ValueError(f"`normalize` must be 'brain_zscore' or 'none', got {self.normalize!r}")
        cache_dir = self.cache_dir
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise ValueError(f"`cache_dir` must be a folder path or None, got {cache_dir!r}")
        object.__setattr__(self, "shape", None if shape is None else tuple(int(v) for v in shape))
        object.__setattr__(self, "spacing", _check_spacing(self.spacing))
        object.__setattr__(self, "cache_dir", os.fspath(cache_dir) if cache_dir else None)

    @property
    def cache(self) -> Path:
        """The cache folder: ``cache_dir``, else the default (class doc)."""
        return Path(self.cache_dir) if self.cache_dir else _default_cache()

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (tuples as lists), as a run's ``data.json`` holds them."""
        spacing = list(self.spacing) if isinstance(self.spacing, tuple) else self.spacing
        return {
            "shape": None if self.shape is None else list(self.shape),
            "spacing": spacing,
            "resize": self.resize,
            "normalize": self.normalize,
            "cache_dir": self.cache_dir,
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> NiftiPreprocessing:
        """The preprocessing of :meth:`to_dict`'s ``values`` (a missing field: its default; an unknown
        one: a ValueError naming it)."""
        if not isinstance(values, Mapping):
            raise TypeError(f"`values` must be a mapping of NiftiPreprocessing fields, got {type(values).__name__}")
        unknown = sorted(set(values) - set(PREPROCESSING_OPTIONS))
        if unknown:
            raise ValueError(
                f"unknown NiftiPreprocessing field(s) {', '.join(map(repr, unknown))}; expected among "
                f"{', '.join(PREPROCESSING_OPTIONS)}"
            )
        return cls(**values)

    @classmethod
    def of(
        cls,
        preprocessing: NiftiPreprocessing | Mapping[str, Any] | None,
        **options: Any,
    ) -> NiftiPreprocessing:
        """``preprocessing`` (an object or its :meth:`to_dict`), else the one of the loader's separate
        keyword ``options`` (:data:`PREPROCESSING_OPTIONS`); both: a ValueError unless every option keeps
        its default."""
        if preprocessing is None:
            return cls(**options)
        defaults = cls()
        given = sorted(k for k, v in options.items() if v != getattr(defaults, k))
        if given:
            raise ValueError(
                f"pass the preprocessing either whole (`preprocessing`) or as options, not both (got "
                f"`preprocessing` and {', '.join(f'`{k}`' for k in given)})"
            )
        if isinstance(preprocessing, NiftiPreprocessing):
            return preprocessing
        if isinstance(preprocessing, Mapping):
            return cls.from_dict(preprocessing)
        raise TypeError(
            "`preprocessing` must be a NiftiPreprocessing or a mapping of its fields, got "
            f"{type(preprocessing).__name__}"
        )

    def cache_volumes(
        self,
        items: list[dict[str, Any]],
        csv_path: Path,
        *,
        grid: tuple[Sequence[int], str] | None = None,
        hint: str = "set `data.options.shape` to crop/pad every volume to one grid",
    ) -> tuple[int, ...]:
        """Check, preprocess and cache every item's volume (``it["cache"]``: the ``.npy``, ``it["facts"]``:
        what the preprocessing noted); every preprocessed volume must have the shape ``grid[0]``
        (described as ``grid[1]``; default: the first volume's), else a :class:`DataFormatError` ending
        with ``hint``. Returns the shape."""
        self.cache.mkdir(parents=True, exist_ok=True)
        shape = None if self.shape is None else list(self.shape)
        opts = json.dumps(
            {
                "v": _CACHE_VERSION,
                "shape": shape,
                "spacing": self.spacing,
                "resize": self.resize,
                "normalize": self.normalize,
                "orientation": "".join(CANONICAL),
            },
            sort_keys=True,
            default=list,
        )
        expected = None if grid is None else (tuple(int(g) for g in grid[0]), grid[1])
        steps = Steps(f"checking and caching the volumes of {csv_path.name}", len(items), "volumes")
        for it in items:
            cached, it["facts"] = self._cached(it, csv_path, opts)
            steps.advance()
            vshape = tuple(int(n) for n in it["facts"]["npy"]["shape"])
            if expected is None:
                expected = (vshape, f"the cohort {vshape} (row {it['row']})")
            elif vshape != expected[0]:
                raise DataFormatError(
                    csv_path,
                    it["row"],
                    f"volume {it['path']} has shape {vshape} after preprocessing, {expected[1]}; {hint}",
                )
            it["cache"] = str(cached)
        steps.close()
        assert expected is not None
        return expected[0]

    def _cached(self, it: dict[str, Any], csv_path: Path, opts: str) -> tuple[Path, dict[str, Any]]:
        """The cache entry of one item's volume and its record (what the preprocessing noted, the entry's
        checksum, shape and dtype). An entry that does not match its record is rebuilt
        (``it["rebuilt"]``: why); a missing one is written."""
        where = (csv_path, it["row"])
        size = _check_volume_file(it["path"], where).st_size
        if size > MAX_VOLUME_BYTES:
            raise DataFormatError(
                csv_path, it["row"], f"volume {it['path']} is {size:,} bytes, over the limit of {MAX_VOLUME_BYTES:,}"
            )
        key = hashlib.sha256((file_digest(it["path"]) + opts).encode()).hexdigest()[:40]
        cached = self.cache / f"{key}.npy"
        if cached.exists() or cached.with_suffix(".json").exists():
            record, problem = _verified(cached)
            if record is not None:
                return cached, record
            it["rebuilt"] = f"{cached} {problem}"
        data, affine = _read_volume(it["path"], where)
        _check_grid(data.shape, affine, self.spacing, where, it["path"])
        try:
            vol, kept = _preprocess(data, affine, self.spacing, self.shape, self.resize, self.normalize)
        except (ValueError, ArithmeticError, RuntimeError) as e:
            msg = " ".join(str(e).split()) or type(e).__name__
            raise DataFormatError(csv_path, it["row"], f"volume {it['path']} cannot be preprocessed: {msg}") from None
        facts: dict[str, Any] = {
            "kept": kept,
            "voxel_mm": [round(float(z), 3) for z in np.sqrt((affine[:3, :3] ** 2).sum(0))],
            "oblique_deg": round(obliquity_degrees(affine), 2),
        }
        try:
            return cached, _store_entry(cached, vol, facts)
        except OSError as e:
            why = os.strerror(e.errno) if e.errno else " ".join(str(e).split())
            raise OSError(
                e.errno, f"{csv_path}, row {it['row']}: cannot write volume {it['path']} to the cache {cached}: {why}"
            ) from None


#: the fields of :class:`NiftiPreprocessing`, which are also keyword options of the NIfTI loaders
PREPROCESSING_OPTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(NiftiPreprocessing))


@register_dataset(
    "nifti", modality="volumes", description="T1 MRI volumes (NIfTI) listed in a CSV with ages: brain-age estimation"
)
def load_nifti_csv(
    csv: str,
    *,
    target: str = "age",
    shape: Sequence[int] | None = None,
    spacing: float | Sequence[float] | None = None,
    resize: Literal["crop_or_pad", "resample"] = "crop_or_pad",
    normalize: Literal["brain_zscore", "none"] = "brain_zscore",
    cache_dir: str | None = None,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
    augment: bool = False,
    preprocessing: NiftiPreprocessing | Mapping[str, Any] | None = None,
) -> RegressionData:
    """Brain-age cohort: NIfTI volumes listed in ``csv`` (columns path, age[, sex, site, subject, split]).

    Every volume is first reoriented to RAS+ from its affine (:func:`to_canonical`; an oblique one is
    reordered, not resampled, and noted in ``meta["notes"]``), then preprocessed as the module
    describes. Options: ``target`` (the label column, default ``age``), ``shape`` ([D, H, W] grid, centred
    crop/pad or, with ``resize="resample"``, a resample), ``spacing`` (mm, resampled first),
    ``normalize`` ("brain_zscore": z-score over the voxels > 0 as the TSAN authors' loader; "none"),
    ``cache_dir`` (float16 preprocessed volumes,
    float32 where float16 cannot hold the intensities;
    default ``$RANKWISE_CACHE/volumes`` or ``~/.cache/rankwise/volumes``), ``val_fraction`` /
    ``test_fraction`` / ``seed`` (the seeded split by subject when the CSV has no ``split``
    column: no subject in two splits), ``augment`` (random left-right flips and small affine
    transforms of the training volumes, TorchIO); ``preprocessing``: the five preprocessing options
    whole, a :class:`NiftiPreprocessing` (or its :meth:`~NiftiPreprocessing.to_dict`), instead of
    ``shape`` / ``spacing`` / ``resize`` / ``normalize`` / ``cache_dir``. Items are ``({"volume": (1, D, H, W),
    "sex": (2,) one-hot}, age)``; ``meta`` holds the subject ids, sites, CSV rows and source paths
    of each split and, for a CSV that ``rankwise preprocess`` wrote (its :data:`PREPROCESS_COLUMNS` and
    records), ``preprocessed``: the ``template`` and ``registration`` of its scans.

    Raises :class:`~rankwise.data.DataFormatError` naming the CSV row and the volume for a missing,
    truncated or corrupt file, a volume that is not 3-D, NaN/inf voxels, a shape that differs
    from the cohort's without ``shape``, a negative or non-numeric age, an unknown sex value, a
    subject in two splits, a row with more fields than the header, a CSV beyond the limits of
    :mod:`rankwise.data._files` (size, columns, field length), a volume path that is a directory, FIFO
    or device, complex voxels, a header whose
    affine is not finite or not invertible, a file over :data:`MAX_VOLUME_BYTES` on disk or as
    declared by its header, a resampling beyond :data:`MAX_GRID_VOXELS`, or no training row.
    """
    csv_path = Path(csv)
    for name, frac in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"`{name}` must be in [0, 1), got {frac!r}")
    prep = NiftiPreprocessing.of(
        preprocessing, shape=shape, spacing=spacing, resize=resize, normalize=normalize, cache_dir=cache_dir
    )
    if not isinstance(augment, bool):
        raise TypeError(f"`augment` must be true or false, got {augment!r}")
    root = csv_path.resolve().parent
    _check_target(target)
    rows = _read_rows(csv_path, target)
    items = [_parse_row(r, csv_path, root, target) for r in rows]
    preprocessed = _preprocess_records(rows, csv_path)
    split_rule = "csv" if all(it["split"] for it in items) else "subject"
    _assign_splits(items, csv_path, val_fraction, test_fraction, seed)
    if not any(it["split"] == "train" for it in items):
        raise DataFormatError(csv_path, None, "no row is in the train split")
    grid = prep.cache_volumes(items, csv_path)
    transform = None
    if augment:
        _, tio = _mri_modules()
        transform = tio.Compose([tio.RandomFlip(axes=("LR",)), tio.RandomAffine(scales=0.05, degrees=5)])

    def part(split: str) -> list[dict[str, Any]]:
        return [it for it in items if it["split"] == split]

    def dataset(split: str) -> NiftiVolumeDataset:
        sel = part(split)
        return NiftiVolumeDataset(
            [it["cache"] for it in sel],
            np.array([it["age"] for it in sel], dtype=np.float32),
            np.array([it["sex"] for it in sel], dtype=np.int64),
            [it["subject"] for it in sel],
            transform if split == "train" else None,
        )

    labels = {s: np.array([it["age"] for it in part(s)], dtype=np.float64) for s in ("train", "val", "test")}
    meta: dict[str, Any] = {
        "notes": _crop_notes(items, prep.shape) + _oblique_notes(items) + _rebuilt_notes(items),
        "source": str(csv_path),
        "split": split_rule,
        "seed": seed,
        "shape": list(grid),
        "has_sex": all(it["sex"] >= 0 for it in items),
        "cache_dir": str(prep.cache),
        "preprocessing": prep.to_dict(),
    }
    if preprocessed is not None:
        meta["preprocessed"] = preprocessed
    for s in ("train", "val", "test"):
        meta[f"{s}_subjects"] = [it["subject"] for it in part(s)]
        meta[f"{s}_sites"] = [it["site"] for it in part(s)]
        meta[f"{s}_rows"] = [it["row"] for it in part(s)]
    return RegressionData(
        name=f"nifti:{csv_path.name}",
        train=dataset("train"),
        val=dataset("val"),
        test=dataset("test"),
        train_labels=labels["train"],
        val_labels=labels["val"],
        test_labels=labels["test"],
        modality="volumes",
        input_dim=None,
        bin_width=1.0,
        label_name=target,
        meta=meta,
        shot_thresholds=None,
        label_unit="years",
        label_description="age",
    )


@dataclass
class NiftiCohort:
    """A CSV of NIfTI volumes preprocessed as a training cohort was (:func:`load_nifti_cohort`).

    ``dataset`` yields the items of :class:`NiftiVolumeDataset` in the CSV's order (label NaN where the
    age is unknown); ``columns`` holds the CSV's columns as read (header order, stripped text),
    ``rows`` the 1-based CSV lines, ``ages`` the parsed ages (NaN where unknown), in that order;
    ``meta`` holds ``notes`` (a crop that cut into the brains, see :func:`load_nifti_csv`), ``source``,
    ``shape``, ``has_sex``, ``cache_dir``.
    """

    dataset: NiftiVolumeDataset
    columns: dict[str, list[str]]
    rows: list[int]
    ages: np.ndarray
    meta: dict[str, Any]


#: what the crop note advises for a cohort preprocessed on a trained run's grid
_COHORT_CROP_ADVICE = (
    "the run's grid holds only part of these heads: resample the volumes to the voxel size of the run's "
    "training volumes first"
)


def load_nifti_cohort(
    csv: str | Path,
    *,
    target: str = "age",
    shape: Sequence[int] | None = None,
    spacing: float | Sequence[float] | None = None,
    resize: Literal["crop_or_pad", "resample"] = "crop_or_pad",
    normalize: Literal["brain_zscore", "none"] = "brain_zscore",
    cache_dir: str | None = None,
    grid: Sequence[int] | None = None,
    require_sex: bool = False,
    preprocessing: NiftiPreprocessing | Mapping[str, Any] | None = None,
) -> NiftiCohort:
    """The volumes of a new cohort's CSV preprocessed exactly as :func:`load_nifti_csv` with the same
    options preprocesses a training cohort (same steps, same cache), to predict their ages.

    The CSV has the training CSV's columns, but the label column ``target`` is optional (missing
    column or empty value: the age is unknown, NaN) and ``split`` selects nothing (it is a column like
    any other). ``grid``: the shape the
    training volumes had after preprocessing; every volume must reach it. ``require_sex``: the network
    uses sex, so every row needs a ``sex`` value. ``preprocessing``: the options whole, as
    :func:`load_nifti_csv` takes them (a trained run's ``meta["preprocessing"]``).

    Raises :class:`~rankwise.data.DataFormatError` (or :class:`~rankwise.data.DataFileNotFoundError`)
    naming the CSV, the row and the volume, for everything :func:`load_nifti_csv` refuses in a row or a
    volume, a missing ``sex`` column or value with ``require_sex``, and a volume that does not reach
    ``grid``.

    Example:
        >>> import tempfile
        >>> from rankwise.data.synthetic_mri import make_brain_age_synthetic
        >>> folder = tempfile.mkdtemp()
        >>> csv_path = make_brain_age_synthetic(folder, n=2, spacing=8.0)
        >>> cohort = load_nifti_cohort(csv_path, cache_dir=folder + "/cache", shape=[20, 24, 20])
        >>> len(cohort.dataset), cohort.meta["shape"], cohort.dataset[0][0]["volume"].shape
        (2, [20, 24, 20], torch.Size([1, 20, 24, 20]))
    """
    csv_path = Path(csv)
    prep = NiftiPreprocessing.of(
        preprocessing, shape=shape, spacing=spacing, resize=resize, normalize=normalize, cache_dir=cache_dir
    )
    _check_target(target)
    rows = _read_rows(csv_path, None)
    columns = [k for k in rows[0] if k != "_row"]
    if require_sex and "sex" not in columns:
        raise DataFormatError(
            csv_path,
            1,
            f"missing column `sex`: the run's network uses sex (`model.options.use_sex`); the header is {columns}",
        )
    root = csv_path.resolve().parent
    items = []
    for r in rows:
        it = _parse_row({k: v for k, v in r.items() if k != "split"}, csv_path, root, target, age_optional=True)
        if require_sex and it["sex"] < 0:
            raise DataFormatError(
                csv_path,
                it["row"],
                f"empty `sex` ({it['path']}): the run's network uses sex (`model.options.use_sex`); "
                "give M/F, male/female or 1/0",
            )
        items.append(it)
    hint = "bring the volumes to the run's grid (the run has no `data.options.shape` that would crop/pad them)"
    expected = None if grid is None else (tuple(grid), f"the run's training volumes {tuple(grid)}")
    vshape = prep.cache_volumes(items, csv_path, grid=expected, hint=hint)
    ages = np.array([it["age"] for it in items], dtype=np.float64)
    dataset = NiftiVolumeDataset(
        [it["cache"] for it in items],
        ages.astype(np.float32),
        np.array([it["sex"] for it in items], dtype=np.int64),
        [it["subject"] for it in items],
    )
    meta: dict[str, Any] = {
        "notes": [
            f"{csv_path}: {note}"
            for note in _crop_notes(items, prep.shape, _COHORT_CROP_ADVICE)
            + _oblique_notes(items)
            + _rebuilt_notes(items)
        ],
        "source": str(csv_path),
        "shape": list(vshape),
        "has_sex": all(it["sex"] >= 0 for it in items),
        "cache_dir": str(prep.cache),
        "preprocessing": prep.to_dict(),
    }
    return NiftiCohort(
        dataset=dataset,
        columns={c: [r[c] for r in rows] for c in columns},
        rows=[it["row"] for it in items],
        ages=ages,
        meta=meta,
    )
