r"""An offline synthetic brain-age cohort built from the MNI152 templates shipped in the nilearn wheel.

``make_brain_age_synthetic(out, n=400)`` writes ``out/sub-XXXX.nii.gz`` and ``out/participants.csv``
(``path, age, sex, site, subject``); the ``nifti`` dataset reads it. Every number obtained on it is
synthetic: it checks that a pipeline runs and learns an age signal, nothing about real brains.

Age model (``k = (age - 20) / 70``, so 0 at 20 and 1 at 90 years), on the ICBM 2009a T1, grey-
(GM) and white-matter (WM) probability maps resampled to ``spacing`` mm (TorchIO):

* grey-matter loss: GM probability times ``1 - 0.3 k``, the lost tissue becomes CSF;
* white matter: probability times ``1 - 0.12 k`` and intensity ``1 - 0.12 k`` (hypo-intensity);
* ventricle / central CSF enlargement: a radial warp around the centre of the central CSF whose
  strength grows as ``0.35 k``;
* sex-dependent head size: a global scale 1.06 (male) or 1.0 (female), times ``1 + N(0, 0.02)``;
* per subject: a smooth random displacement (a 4x5x4 control grid, SD 2 % of the field of view,
  trilinearly upsampled), a TorchIO random bias field (order 3, coefficients 0.2) and Gaussian noise;
  ``sites`` sites with intensity gains ``1 + 0.1 s`` and noise SD ``0.02 (1 + 0.5 s)``;
* intensities ``0.65 GM + level_WM WM + 0.15 CSF`` modulated by the template T1 texture; skull
  stripped (background 0), stored as int16 NIfTI in MNI orientation.

Ages are uniform over ``age_range`` (default 20-90), sex is male with probability 0.5.

``patients`` (a fraction) of the subjects, drawn at random, form a ``patient`` group whose brains follow
the age model at ``age + patient_shift`` years (they look older than they are); the CSV then has a
``group`` column (``control`` / ``patient``), so that a brain-age gap test has a known answer: the
patients' gap is ``patient_shift`` years larger and separates them from the controls (AUC above 0.5).
"""

from __future__ import annotations

import csv
import errno
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rankwise._fileio import atomic_open, atomic_path, atomic_write

__all__ = ["GROUPS", "GROUP_COLUMN", "SYNTHETIC_COLUMNS", "make_brain_age_synthetic", "mni_templates"]

SYNTHETIC_COLUMNS = ("path", "age", "sex", "site", "subject")
#: the column added with ``patients > 0``, its values and the reference group
GROUP_COLUMN, GROUPS = "group", ("control", "patient")
_TEMPLATES = {
    "t1": "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
    "gm": "mni_icbm152_gm_tal_nlin_sym_09a_converted.nii.gz",
    "wm": "mni_icbm152_wm_tal_nlin_sym_09a_converted.nii.gz",
}


def mni_templates(spacing: float = 2.0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``({"t1", "gm", "wm", "mask"}: float32 maps in [0, 1], affine)`` of the nilearn MNI152 templates at
    ``spacing`` mm, cropped/padded to the FSL MNI grid (91x109x91 at 2 mm)."""
    try:
        import nibabel as nib
        import nilearn
        import torchio as tio
        from scipy import ndimage
    except ImportError as e:  # pragma: no cover - the mri extra is missing
        raise ImportError(
            f"the synthetic cohort needs nilearn, nibabel and torchio: pip install 'rankwise[mri]' ({e})"
        ) from None
    root = Path(nilearn.__file__).parent / "datasets" / "data"
    grid = tuple(round(s * 2.0 / spacing) for s in (91, 109, 91))
    maps: dict[str, np.ndarray] = {}
    affine = np.eye(4)
    for key, name in _TEMPLATES.items():
        img: Any = nib.load(str(root / name))
        data = torch.from_numpy(np.asarray(img.get_fdata(dtype=np.float32)))[None]
        sub = tio.ScalarImage(tensor=data, affine=img.affine)
        sub = tio.CropOrPad(grid)(tio.Resample(float(spacing))(sub))
        vol = sub.data[0].numpy().astype(np.float32)
        maps[key] = vol / max(float(vol.max()), 1e-6)
        affine = np.asarray(sub.affine)
    tissue = maps["gm"] + maps["wm"]
    mask = ndimage.binary_fill_holes(ndimage.binary_closing(tissue > 0.15, iterations=2))
    maps["mask"] = mask.astype(np.float32)
    maps["csf"] = np.clip(maps["mask"] - tissue, 0.0, 1.0)
    t1 = maps["t1"] * maps["mask"]
    maps["t1"] = t1 / max(float(t1.max()), 1e-6)
    return maps, affine


def _identity_grid(shape: tuple[int, int, int]) -> torch.Tensor:
    axes = [torch.linspace(-1, 1, s) for s in shape]
    d, h, w = torch.meshgrid(*axes, indexing="ij")
    return torch.stack([w, h, d], dim=-1)  # grid_sample wants (x=W, y=H, z=D)


def _subject(
    maps: dict[str, torch.Tensor], center: torch.Tensor, age: float, male: int, site: int, rng: np.random.Generator
) -> tuple[np.ndarray, float]:
    """A subject's MNI-space int16 volume and its global head scale."""
    import torchio as tio

    shape = tuple(maps["gm"].shape)
    k = (age - 20.0) / 70.0
    grid = _identity_grid(shape)  # type: ignore[arg-type]
    scale = (1.06 if male else 1.0) * (1.0 + 0.02 * float(rng.standard_normal()))
    coords = grid / scale
    rel = coords - center
    pull = 0.35 * k * torch.exp(-(rel**2).sum(-1, keepdim=True) / (2 * 0.25**2))
    coords = coords - pull * rel
    field = torch.from_numpy(rng.standard_normal((1, 3, 4, 5, 4)).astype(np.float32)) * 0.02
    field = F.interpolate(field, size=shape, mode="trilinear", align_corners=True)[0].permute(1, 2, 3, 0)
    coords = (coords + field)[None]
    stack = torch.stack([maps[m] for m in ("gm", "wm", "csf", "t1", "mask")])[None]
    gm, wm, csf, t1, mask = F.grid_sample(stack, coords, mode="bilinear", align_corners=True)[0]
    gm_kept = gm * (1 - 0.3 * k)
    wm_kept = wm * (1 - 0.12 * k)
    csf = csf + (gm - gm_kept) + (wm - wm_kept)
    img = 0.65 * gm_kept + (1 - 0.12 * k) * wm_kept + 0.15 * csf
    img = img * (0.85 + 0.3 * t1) * (1 + 0.1 * site)
    brain = mask > 0.5
    seed = int(rng.integers(2**31 - 1))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        t = tio.Compose([tio.RandomBiasField(coefficients=0.2, order=3), tio.RandomNoise(std=0.02 * (1 + 0.5 * site))])
        img = t(img[None])[0]
    img = torch.where(brain, img.clamp_min(1e-3), torch.zeros_like(img))
    return (img * 1000).round().clamp(0, 32767).numpy().astype(np.int16), scale


#: the raw scans' field of view (mm) and its centre in MNI space: the head, the skull and the neck
_RAW_FOV = np.array([256.0, 256.0, 256.0])
_RAW_CENTRE = np.array([0.0, -16.0, 10.0])


def _rotation(angles: np.ndarray) -> np.ndarray:
    out = np.eye(3)
    for axis, angle in enumerate(angles):
        c, s = np.cos(angle), np.sin(angle)
        r = np.eye(3)
        i, j = [(1, 2), (0, 2), (0, 1)][axis]
        r[i, i], r[j, j], r[i, j], r[j, i] = c, c, -s, s
        out = out @ r
    return out


def _with_head(vol: np.ndarray, affine: np.ndarray, spacing: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The brain ``vol`` with CSF, skull (bone with a bright marrow layer), scalp and a neck around
    it, on a grid padded by 40 mm (90 mm below): ``(head, brain mask, affine of the padded grid)``."""
    from scipy import ndimage

    pad = [round(40 / spacing)] * 2 + [round(90 / spacing)]
    widths = ((pad[0], pad[0]), (pad[1], pad[1]), (pad[2], round(30 / spacing)))
    brain = np.pad(vol > 0, widths)
    out = np.pad(vol.astype(np.float32), widths)
    padded = affine.copy()
    padded[:3, 3] -= affine[:3, :3] @ np.array([w[0] for w in widths], dtype=float)
    d = ndimage.distance_transform_edt(~brain, sampling=spacing)
    head = np.zeros_like(out)
    for lo, hi, value in ((0, 3, 150), (3, 9, 100), (5, 7, 800), (9, 14, 700)):  # CSF, bone, marrow, scalp
        head[(d > lo) & (d <= hi)] = value
    i, j, k = np.ogrid[: out.shape[0], : out.shape[1], : out.shape[2]]
    ci, cj = (out.shape[0] - 1) / 2, (out.shape[1] - 1) / 2 + 5 / spacing
    bottom = int(np.nonzero(brain.any((0, 1)))[0].min())
    neck = ((i - ci) ** 2 / (44 / spacing) ** 2 + (j - cj) ** 2 / (50 / spacing) ** 2 < 1) & (k < bottom + 24 / spacing)
    head[neck & (head == 0)] = 500
    return np.where(brain, out, head), brain, padded


def _raw_scan(
    vol: np.ndarray,
    affine: np.ndarray,
    spacing: float,
    scale: float,
    rng: np.random.Generator,
    voxel_mm: tuple[float, float],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """A "raw" T1 scan of the MNI-space subject ``vol``: ``(int16 scan, its affine, the brain mask on the
    scan's grid, the ground truth)``. The head moves by a random affine ``M`` (MNI mm -> scanner mm:
    rotations up to 15 degrees, translations up to 20 mm, scales 0.9-1.1), the scan's voxels are
    ``voxel_mm`` (a random size in that range) in RAS or LPS order, and a smooth bias field multiplies it."""
    from scipy import ndimage

    head, brain, padded = _with_head(vol, affine, spacing)
    m = np.eye(4)
    m[:3, :3] = _rotation(np.deg2rad(rng.uniform(-15, 15, 3))) @ np.diag(rng.uniform(0.9, 1.1, 3))
    m[:3, 3] = rng.uniform(-20, 20, 3)
    size = float(rng.uniform(*voxel_mm))
    orientation = "LPS" if rng.random() < 0.5 else "RAS"
    n = np.ceil(_RAW_FOV / size).astype(int)
    start = _RAW_CENTRE - _RAW_FOV / 2
    scan = np.diag([size, size, size, 1.0])
    scan[:3, 3] = start
    if orientation == "LPS":  # the first two voxel axes run right-to-left and anterior-to-posterior
        scan[0, 0] = scan[1, 1] = -size
        scan[:2, 3] = start[:2] + _RAW_FOV[:2]
    pull = np.linalg.inv(padded) @ np.linalg.inv(m) @ scan  # scan voxel -> padded MNI voxel
    raw = ndimage.affine_transform(head, pull[:3, :3], pull[:3, 3], output_shape=tuple(n), order=1)
    mask = ndimage.affine_transform(brain.astype(np.float32), pull[:3, :3], pull[:3, 3], output_shape=tuple(n), order=1)
    axes = [np.linspace(-1, 1, int(s), dtype=np.float32) for s in n]
    x, y, z = axes[0][:, None, None], axes[1][None, :, None], axes[2][None, None, :]
    c = rng.normal(0.0, 0.2, 6).astype(np.float32)
    bias = np.exp(c[0] * x + c[1] * y + c[2] * z + c[3] * x * y + c[4] * z**2 + c[5] * y**2)
    raw = raw * bias + rng.normal(0.0, 10.0, raw.shape).astype(np.float32)
    truth = {"mni_to_scanner": m.tolist(), "head_scale": scale, "voxel_mm": size, "orientation": orientation}
    return np.clip(raw, 0, 32767).round().astype(np.int16), scan, (mask > 0.5).astype(np.uint8), truth


def make_brain_age_synthetic(
    out: str | Path,
    *,
    n: int = 400,
    seed: int = 0,
    spacing: float = 2.0,
    age_range: tuple[float, float] = (20.0, 90.0),
    sites: int = 2,
    raw: bool = False,
    raw_voxel_mm: tuple[float, float] = (1.0, 1.5),
    patients: float = 0.0,
    patient_shift: float = 5.0,
) -> Path:
    """Write a synthetic cohort of ``n`` NIfTI volumes + ``participants.csv`` into ``out``; returns the CSV path.

    See the module docstring for the age model. ``spacing`` (mm) sets the grid (2 mm: 91x109x91,
    4 mm: 46x55x46). Refuses (``FileExistsError``) a folder that already holds a
    ``participants.csv``; nothing else in ``out`` is touched.

    With ``raw=True`` the CSV's ``path`` names "raw" scans, as a scanner gives them, for
    :func:`rankwise.data.preprocess_t1`: the same subjects (same ``seed``: the same MNI-space volumes as
    ``raw=False``) with a CSF gap, skull, scalp and neck around the brain, moved by a random affine
    (rotations up to 15 degrees, translations up to 20 mm, scales 0.9-1.1), resampled to a random voxel
    size in ``raw_voxel_mm`` in LPS or RAS voxel order, times a smooth bias field, plus noise. The ground
    truth goes to ``out/truth/``: ``sub-XXXX.json`` (``mni_to_scanner``, the 4x4 affine from MNI mm to
    scanner mm; ``head_scale``; ``voxel_mm``; ``orientation``), ``sub-XXXX_brainmask.nii.gz`` (the brain on
    the scan's grid), ``sub-XXXX_mni.nii.gz`` (the aligned volume) and ``aligned.csv`` (the aligned
    cohort, for a comparison with training on the preprocessed scans).

    ``patients`` in [0, 1): the fraction of subjects (rounded, drawn at random from their own stream, so the
    other draws stay those of ``patients=0``) whose brains are made ``patient_shift`` years older (the age
    model at ``age + patient_shift``); with ``patients > 0`` the CSV gets a ``group`` column (``control`` /
    ``patient``).

    Example:
        >>> import tempfile
        >>> csv_path = make_brain_age_synthetic(tempfile.mkdtemp(), n=2, spacing=6.0)
        >>> csv_path.read_text().splitlines()[0]
        'path,age,sex,site,subject'
    """
    import nibabel as nib

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be a positive int, got {n!r}")
    if not (isinstance(spacing, (int, float)) and 1.0 <= float(spacing) <= 8.0):
        raise ValueError(f"`spacing` must be a number of mm in [1, 8], got {spacing!r}")
    lo, hi = (float(a) for a in age_range)
    if not 0 <= lo < hi:
        raise ValueError(f"`age_range` must be (low, high) with 0 <= low < high, got {age_range!r}")
    if isinstance(sites, bool) or not isinstance(sites, int) or sites < 1:
        raise ValueError(f"`sites` must be a positive int, got {sites!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"`seed` must be an int >= 0, got {seed!r}")
    if not isinstance(raw, bool):
        raise TypeError(f"`raw` must be a bool, got {raw!r}")
    if isinstance(patients, bool) or not isinstance(patients, (int, float)) or not 0.0 <= float(patients) < 1.0:
        raise ValueError(f"`patients` must be a fraction in [0, 1), got {patients!r}")
    if isinstance(patient_shift, bool) or not isinstance(patient_shift, (int, float)) or not -30 <= patient_shift <= 30:
        raise ValueError(f"`patient_shift` must be a number of years in [-30, 30], got {patient_shift!r}")
    vlo, vhi = (float(v) for v in raw_voxel_mm)
    if not 0.5 <= vlo <= vhi <= 8.0:
        raise ValueError(f"`raw_voxel_mm` must be (low, high) mm with 0.5 <= low <= high <= 8, got {raw_voxel_mm!r}")
    out = Path(out)
    csv_path = out / "participants.csv"
    if csv_path.exists():
        raise FileExistsError(errno.EEXIST, "a cohort already exists there; choose another --out", str(csv_path))
    out.mkdir(parents=True, exist_ok=True)
    np_maps, affine = mni_templates(float(spacing))
    maps = {k: torch.from_numpy(v) for k, v in np_maps.items()}
    # centre of the central CSF (ventricles): CSF voxels in the middle third of the field of view
    grid = _identity_grid(tuple(maps["csf"].shape))  # type: ignore[arg-type]
    central = (maps["csf"] > 0.5) & (grid.abs() < 0.33).all(-1)
    center = grid[central].mean(0) if bool(central.any()) else torch.zeros(3)
    rng = np.random.default_rng(seed)
    ages = rng.uniform(lo, hi, n).round(1)
    males = rng.integers(0, 2, n)
    site_of = rng.integers(0, sites, n)
    patient = np.zeros(n, dtype=bool)
    patient[np.random.default_rng([seed, 2]).permutation(n)[: round(float(patients) * n)]] = True
    columns = list(SYNTHETIC_COLUMNS) + ([GROUP_COLUMN] if patients > 0 else [])
    rows: list[dict[str, Any]] = []
    aligned: list[dict[str, Any]] = []

    def save(img: Any, path: Path) -> None:
        with atomic_path(path, suffix=".nii.gz") as tmp:  # nibabel reads the format from it
            nib.save(img, str(tmp))

    if raw:
        (out / "truth").mkdir(exist_ok=True)
    for i in range(n):
        name = f"sub-{i + 1:04d}"
        brain_age = float(ages[i]) + (float(patient_shift) if patient[i] else 0.0)
        vol, scale = _subject(maps, center, brain_age, int(males[i]), int(site_of[i]), np.random.default_rng([seed, i]))
        if raw:
            scan, scan_affine, brain, truth = _raw_scan(
                vol, affine, float(spacing), scale, np.random.default_rng([seed, i, 1]), (vlo, vhi)
            )
            save(nib.Nifti1Image(scan, scan_affine), out / f"{name}_T1w.nii.gz")
            save(nib.Nifti1Image(brain, scan_affine), out / "truth" / f"{name}_brainmask.nii.gz")
            save(nib.Nifti1Image(vol, affine), out / "truth" / f"{name}_mni.nii.gz")
            atomic_write(out / "truth" / f"{name}.json", json.dumps(truth, indent=1))
            path = f"{name}_T1w.nii.gz"
        else:
            save(nib.Nifti1Image(vol, affine), out / f"{name}.nii.gz")
            path = f"{name}.nii.gz"
        rows.append(
            {
                "path": path,
                "age": f"{ages[i]:.1f}",
                "sex": "M" if males[i] else "F",
                "site": f"site{int(site_of[i])}",
                "subject": name,
            }
            | ({GROUP_COLUMN: GROUPS[int(patient[i])]} if patients > 0 else {})
        )
        aligned.append(rows[-1] | {"path": f"{name}_mni.nii.gz"})

    def write_csv(path: Path, table: list[dict[str, Any]]) -> None:
        with atomic_open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(table)

    if raw:
        write_csv(out / "truth" / "aligned.csv", aligned)
    write_csv(csv_path, rows)
    return csv_path
