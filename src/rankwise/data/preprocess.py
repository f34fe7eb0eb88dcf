r"""Raw T1 scans to the brain-age system's input: bias-field correction, registration to MNI152, brain
extraction, resampling, quality control. Offline, with SimpleITK and the MNI152 templates inside the
nilearn wheel.

For each scan, in order:

1. read (NIfTI; one error line for a corrupt file, a 2-D image, NaN voxels) and reorient to RAS+;
2. N4 bias-field correction (Tustison et al., IEEE TMI 2010), fitted on the scan shrunk to about 4 mm
   inside an Otsu head mask, applied at full resolution;
3. registration to the MNI152 (ICBM 2009a) T1 template: a rigid (Euler) stage from the images'
   centres of mass, then a 12-parameter affine stage, both by Mattes mutual information sampled inside
   the template's brain mask dilated by 6 mm, on a multi-resolution pyramid (``registration="affine"``);
   with ``registration="syn"``, then a symmetric diffeomorphic (SyN, Avants et al., Medical Image
   Analysis 2008) stage by ANTs from that affine: Mattes mutual information between the template and
   the scan restricted to the affinely mapped brain plus 4 mm, on a pyramid of the template grid shrunk
   4, 2 and 1 times (gradient step 0.2, Gaussian regularisation of the update field and of the total
   field, variances 3 and 2 voxels²);
4. brain extraction by the template's brain mask mapped through the registration;
5. resampling of the corrected scan onto the template grid (``mni152_2mm``: 91 x 109 x 91 voxels of
   2 mm, the grid of :func:`rankwise.data.make_brain_age_synthetic`), masked to the brain, and intensity
   normalisation (the brain's median set to 1000);
6. quality control: the normalised cross-correlation of the result with the template inside the brain
   mask (``similarity``), the brain volume in the scan's space (mL), the fraction of the template's
   brain that falls inside the scan's field of view (``in_view``), and a picture of three orthogonal
   slices with the template's brain outline.

A scan whose brain lies outside its field of view (``in_view`` < 0.9) or whose result does not look like
a brain (``similarity`` < 0.3) is a failure, not an output. The cohort page flags scans whose similarity
or brain volume is an outlier (more than 3.5 robust standard deviations from the cohort's median, or a
similarity under 0.6).

Spaces: the transform file (ITK text format, ``.tfm``) maps a point of the template (physical LPS mm, ITK's
convention) to the same anatomical point of the scan; :func:`map_to_scan` applies it to a template-grid
volume (a prediction's saliency map, the brain mask) to bring it onto the scan's grid. With ``syn`` the
full map is ``A(W(x))``: ``W`` the displacement field ``NAME_warp.nii.gz`` (template -> template, on the
template grid, LPS mm vectors), then the affine ``A`` of the ``.tfm``; ``NAME_inverse_warp.nii.gz`` beside
it holds ``W``'s inverse, which :func:`map_to_scan` uses (:func:`read_transform` reads either direction).
"""

from __future__ import annotations

import contextlib
import csv
import html
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rankwise._fileio import atomic_open, atomic_path, atomic_write
from rankwise.data._base import DataFormatError
from rankwise.data._files import file_digest
from rankwise.data.nifti import PREPROCESS_COLUMNS, read_cohort_rows, read_volume, to_canonical

__all__ = [
    "PreprocessResult",
    "map_to_scan",
    "preprocess_cohort",
    "preprocess_t1",
    "read_transform",
    "template_grid",
]

#: the registrations offered
REGISTRATIONS = ("affine", "syn")
#: below this similarity to the template a result is not a brain: the scan fails
MIN_SIMILARITY = 0.3
#: below this fraction of the template's brain inside the scan's field of view the scan fails
MIN_IN_VIEW = 0.9
#: the cohort page flags a similarity under this value
FLAG_SIMILARITY = 0.6
#: the seed of the metric's random sampling (SimpleITK's seed 0 means "the wall clock": not reproducible)
_SEED = 1
#: the file that marks a folder as an output of :func:`preprocess_cohort`
MARKER = "preprocess.json"
#: the folders of an output directory
FOLDERS = ("volumes", "masks", "transforms", "qc", "records")


def _modules() -> tuple[Any, Any]:
    try:
        import nibabel as nib
        import SimpleITK as sitk
    except ImportError as e:
        raise ImportError(f"preprocessing needs SimpleITK and nibabel: pip install 'rankwise[mri]' ({e})") from None
    return nib, sitk


def template_grid(template: str = "mni152_2mm") -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``({"t1", "mask"}, affine)`` of a template name ``mni152_<spacing>mm`` (1 to 8 mm): the nilearn
    MNI152 T1 (brain, scaled to [0, 1]) and its brain mask on the grid of
    :func:`rankwise.data.synthetic_mri.mni_templates`."""
    from rankwise.data.synthetic_mri import mni_templates

    found = re.fullmatch(r"mni152_(\d+(?:\.\d+)?)mm", str(template))
    if not found or not 1.0 <= float(found.group(1)) <= 8.0:
        raise ValueError(f"`template` must be mni152_<spacing>mm with a spacing of 1 to 8 mm, got {template!r}")
    maps, affine = mni_templates(float(found.group(1)))
    return {"t1": maps["t1"], "mask": maps["mask"]}, affine


_LPS = np.diag([-1.0, -1.0, 1.0])


def _to_sitk(data: np.ndarray, affine: np.ndarray) -> Any:
    """A SimpleITK float32 image of a RAS+ (nibabel) array and affine (ITK's physical space is LPS)."""
    _, sitk = _modules()
    img = sitk.GetImageFromArray(np.ascontiguousarray(np.asarray(data, dtype=np.float32).transpose(2, 1, 0)))
    linear = _LPS @ affine[:3, :3]
    spacing = np.linalg.norm(linear, axis=0)
    img.SetSpacing(tuple(float(s) for s in spacing))
    img.SetDirection(tuple(float(v) for v in (linear / spacing).ravel()))
    img.SetOrigin(tuple(float(v) for v in _LPS @ affine[:3, 3]))
    return img


def _array(img: Any) -> np.ndarray:
    _, sitk = _modules()
    return np.asarray(sitk.GetArrayFromImage(img)).transpose(2, 1, 0)


def _n4(img: Any) -> Any:
    """N4 bias-field correction fitted on the scan shrunk to about 4 mm, applied at full resolution."""
    _, sitk = _modules()
    shrink = [max(1, round(4.0 / s)) for s in img.GetSpacing()]
    small = sitk.Shrink(img, shrink)
    head = sitk.OtsuThreshold(small, 0, 1, 200)
    n4 = sitk.N4BiasFieldCorrectionImageFilter()
    n4.SetMaximumNumberOfIterations([30, 20, 10])
    n4.Execute(small, head)
    log_bias = n4.GetLogBiasFieldAsImage(img)
    return sitk.Cast(img / sitk.Exp(log_bias), sitk.sitkFloat32)


#: how many of the best :data:`RESTARTS` a poor registration is redone from (until one fits)
RESTART_TRIES = 3
#: the starts of the registration retry (see :func:`_starts`): rotations (degrees) about the left-right,
#: front-back and up-down axes and a shift (mm, up) of the scan's centre of mass, from the centred start
RESTARTS = (
    *(
        (rx, 0.0, rz, dz)
        for rx in (-30.0, -15.0, 0.0, 15.0, 30.0)
        for rz in (-15.0, 0.0, 15.0)
        for dz in (-20.0, 0.0, 20.0)
    ),
    (0.0, -15.0, 0.0, 0.0),
    (0.0, 15.0, 0.0, 0.0),
)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """ITK's default thread count set to one meanwhile: a registration on several threads sums its metric
    in a varying order, so that the same scan would not give the same transform twice."""
    _, sitk = _modules()
    before = sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()
    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(1)
    try:
        yield
    finally:
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(before)


def _method(fixed_mask: Any, shrink: Sequence[int], sigmas: Sequence[float], iterations: int) -> Any:
    """The registration method of both stages: Mattes mutual information inside ``fixed_mask``."""
    _, sitk = _modules()
    reg = sitk.ImageRegistrationMethod()
    reg.SetMetricAsMattesMutualInformation(32)
    reg.SetMetricSamplingStrategy(reg.RANDOM)
    reg.SetMetricSamplingPercentage(0.2, seed=_SEED)
    reg.SetMetricFixedMask(fixed_mask)
    reg.SetInterpolator(sitk.sitkLinear)
    reg.SetOptimizerAsRegularStepGradientDescent(2.0, 1e-4, iterations, relaxationFactor=0.7)
    reg.SetOptimizerScalesFromPhysicalShift()
    reg.SetShrinkFactorsPerLevel(list(shrink))
    reg.SetSmoothingSigmasPerLevel(list(sigmas))
    reg.SmoothingSigmasAreSpecifiedInPhysicalUnitsOn()
    return reg


def _centred(fixed: Any, moving: Any) -> Any:
    """The rigid start that puts the scan's centre of mass on the template's."""
    _, sitk = _modules()
    return sitk.Euler3DTransform(
        sitk.CenteredTransformInitializer(
            fixed, moving, sitk.Euler3DTransform(), sitk.CenteredTransformInitializerFilter.MOMENTS
        )
    )


def _starts(fixed: Any, fixed_mask: Any, moving: Any, count: int) -> list[Any]:
    """The ``count`` best rigid starts of :data:`RESTARTS` (rotations and shifts of the centred start),
    each scored by the metric after a short rigid run on one coarse level (about 8 mm voxels, smoothed by
    2 mm, made once): the retry for a scan whose centred start falls into a wrong optimum (a long neck
    pulls its centre of mass down, a large tilt)."""
    _, sitk = _modules()
    centred = _centred(fixed, moving)
    small = [
        sitk.Shrink(sitk.SmoothingRecursiveGaussian(img, 2.0), [max(1, round(8.0 / v)) for v in img.GetSpacing()])
        for img in (fixed, moving)
    ]
    small_mask = sitk.Resample(fixed_mask, small[0], sitk.Transform(), sitk.sitkNearestNeighbor, 0)
    scored: list[tuple[float, int, Any]] = []
    for rx, ry, rz, dz in RESTARTS:
        t = sitk.Euler3DTransform(centred)
        t.SetRotation(math.radians(rx), math.radians(ry), math.radians(rz))
        # LPS: up is +z; the transform maps template -> scan, so shifting it moves the scan's start
        t.SetTranslation(tuple(a + b for a, b in zip(centred.GetTranslation(), (0.0, 0.0, dz))))
        reg = _method(small_mask, (1,), (0.0,), 40)
        reg.SetInitialTransform(t, inPlace=True)
        reg.Execute(small[0], small[1])
        scored.append((reg.GetMetricValue(), len(scored), t))
    return [t for _, _, t in sorted(scored, key=lambda v: (v[0], v[1]))[:count]]  # Mattes MI: lower is better


def _register(fixed: Any, fixed_mask: Any, moving: Any, *, start: Any = None) -> Any:
    """The affine transform (template -> scan, physical LPS) by a rigid then an affine stage, the rigid
    one from ``start`` (an Euler transform; default: the images' centres of mass)."""
    _, sitk = _modules()

    def stage(initial: Any, shrink: Sequence[int], sigmas: Sequence[float]) -> Any:
        reg = _method(fixed_mask, shrink, sigmas, 200)
        reg.SetInitialTransform(initial, inPlace=False)
        out = reg.Execute(fixed, moving)
        return sitk.CompositeTransform(out).GetNthTransform(0) if out.GetName() == "CompositeTransform" else out

    start = _centred(fixed, moving) if start is None else start
    rigid = sitk.Euler3DTransform(stage(start, (4, 2, 1), (2.0, 1.0, 0.0)))
    affine = sitk.AffineTransform(3)
    affine.SetCenter(rigid.GetCenter())
    affine.SetMatrix(rigid.GetMatrix())
    affine.SetTranslation(rigid.GetTranslation())
    return sitk.AffineTransform(stage(affine, (2, 1), (1.0, 0.0)))


def _ants() -> Any:
    try:
        import ants
    except ImportError as e:
        raise ImportError(f"registration='syn' needs ANTsPy (antspyx): pip install 'rankwise[syn]' ({e})") from e
    return ants


#: the SyN stage's iterations per level (shrink factors 4, 2, 1 of the 2 mm template grid)
SYN_ITERATIONS = (40, 20, 10)


def _syn(
    fixed: Any, moving: Any, tx: Any, brain: np.ndarray, grid_affine: np.ndarray, folder: Path
) -> tuple[Path, Path]:
    """The SyN stage (ANTs) from the affine ``tx`` (template -> scan): the files (in ``folder``) of the
    ``(forward, inverse)`` displacement fields on the template grid (NIfTI, LPS mm vectors), the forward ``W``
    such that ``tx(W(x))`` maps a template point ``x`` to the scan. The scan is restricted to the
    template's ``brain`` dilated by 4 mm and mapped by ``tx`` (the template has no skull)."""
    ants = _ants()
    _, sitk = _modules()
    from scipy import ndimage

    spacing = float(np.linalg.norm(grid_affine[:3, 0]))
    grown = ndimage.binary_dilation(brain, iterations=max(1, round(4.0 / spacing)))
    region = sitk.Resample(
        _to_sitk(grown.astype(np.float32), grid_affine), moving, tx.GetInverse(), sitk.sitkNearestNeighbor, 0.0
    )
    restricted = sitk.Cast(moving * sitk.Cast(region, sitk.sitkFloat32), sitk.sitkFloat32)

    def to_ants(img: Any) -> Any:
        direction = np.asarray(img.GetDirection(), dtype=np.float64).reshape(3, 3)
        return ants.from_numpy(
            _array(img).astype(np.float32), origin=img.GetOrigin(), spacing=img.GetSpacing(), direction=direction
        )

    start = folder / "affine.tfm"
    sitk.WriteTransform(tx, str(start))
    out = ants.registration(
        to_ants(fixed),
        to_ants(restricted),
        type_of_transform="SyNOnly",
        initial_transform=[str(start)],
        outprefix=str(folder / "syn"),
        reg_iterations=SYN_ITERATIONS,
        flow_sigma=3.0,
        total_sigma=2.0,
    )
    forward = [f for f in out["fwdtransforms"] if f.endswith("Warp.nii.gz")]
    inverse = [f for f in out["invtransforms"] if f.endswith("InverseWarp.nii.gz")]
    if len(forward) != 1 or len(inverse) != 1:
        raise RuntimeError(f"ANTs wrote no displacement field ({out['fwdtransforms']}, {out['invtransforms']})")
    return Path(forward[0]), Path(inverse[0])


def _field(image: Any) -> Any:
    _, sitk = _modules()
    return sitk.DisplacementFieldTransform(sitk.Cast(image, sitk.sitkVectorFloat64))


def read_transform(transform: str | Path, *, warp: str | Path | None = None, inverse: bool = False) -> Any:
    """The SimpleITK transform of a scan from its ``.tfm`` (``transform``) and, for
    ``registration="syn"``, its ``warp`` (``NAME_warp.nii.gz``; the inverse is read from
    ``NAME_inverse_warp.nii.gz`` beside it): template -> scan (physical LPS mm), or scan -> template
    with ``inverse`` (the transform :func:`SimpleITK.Resample` takes to bring a template-grid volume
    onto the scan's grid).

    Example:
        >>> import tempfile, SimpleITK as sitk
        >>> path = tempfile.mkdtemp() + "/a.tfm"
        >>> sitk.WriteTransform(sitk.TranslationTransform(3, (1.0, 2.0, 3.0)), path)
        >>> read_transform(path, inverse=True).TransformPoint((0.0, 0.0, 0.0))
        (-1.0, -2.0, -3.0)
    """
    _, sitk = _modules()
    tx = sitk.ReadTransform(str(transform))
    if warp is None:
        return tx.GetInverse() if inverse else tx
    warp = Path(warp)
    if inverse:
        back = warp.with_name(re.sub(r"_warp\.nii\.gz$", "_inverse_warp.nii.gz", warp.name))
        if back == warp:
            raise ValueError(f"`warp` must be a NAME_warp.nii.gz of preprocess, got {str(warp)!r}")
        # sitk applies the last transform of the list first: A^-1, then W^-1
        return sitk.CompositeTransform([_field(sitk.ReadImage(str(back))), tx.GetInverse()])
    return sitk.CompositeTransform([tx, _field(sitk.ReadImage(str(warp)))])


def _jacobian_mean(field: Any, mask: np.ndarray, grid_affine: np.ndarray) -> float:
    """The mean Jacobian determinant of ``x -> x + u(x)`` over ``mask`` for a displacement-field image
    ``u`` on the template grid (LPS vectors; derivatives by central differences in physical mm)."""
    _, sitk = _modules()
    u = np.asarray(sitk.GetArrayFromImage(field)).transpose(2, 1, 0, 3)  # (x, y, z, 3)
    grads = np.stack(np.gradient(u, axis=(0, 1, 2)), axis=-1)  # (x, y, z, component, voxel axis)
    to_voxel = np.linalg.inv(_LPS @ grid_affine[:3, :3])  # d(voxel index) / d(LPS mm)
    jac = np.eye(3) + grads[mask] @ to_voxel
    return float(np.linalg.det(jac).mean()) if mask.any() else 1.0


def _in_view(mask: np.ndarray, grid_affine: np.ndarray, tx: Any, affine: np.ndarray, shape: Sequence[int]) -> float:
    """The fraction of the template's brain voxels that the affine ``tx`` (template -> scan, LPS) maps
    inside the scan's field of view (voxel centres within half a voxel of the grid)."""
    ijk = np.argwhere(mask).astype(np.float64)
    lps = _LPS @ (ijk @ grid_affine[:3, :3].T + grid_affine[:3, 3]).T
    matrix = np.asarray(tx.GetMatrix(), dtype=np.float64).reshape(3, 3)
    centre = np.asarray(tx.GetCenter(), dtype=np.float64)[:, None]
    moved = matrix @ (lps - centre) + centre + np.asarray(tx.GetTranslation(), dtype=np.float64)[:, None]
    to_voxel = np.linalg.inv(affine)
    vox = to_voxel[:3, :3] @ (_LPS @ moved) + to_voxel[:3, 3:4]
    inside = np.all((vox >= -0.5) & (vox <= np.asarray(shape[:3], dtype=np.float64)[:, None] - 0.5), axis=0)
    return float(inside.mean()) if inside.size else 0.0


def _similarity(vol: np.ndarray, t1: np.ndarray, mask: np.ndarray) -> float:
    a, b = vol[mask].astype(np.float64), t1[mask].astype(np.float64)
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else 0.0


def map_to_scan(
    volume: np.ndarray,
    template: str,
    transform: str | Path,
    scan: str | Path,
    *,
    warp: str | Path | None = None,
    order: int = 0,
) -> Any:
    """A template-grid ``volume`` (e.g. a brain mask) on the grid of ``scan`` through ``transform`` (a
    ``.tfm`` of :func:`preprocess_t1`) and, for ``registration="syn"``, its ``warp`` (the record's
    ``warp``, the ``warp`` column of ``participants.csv``): a nibabel image with the scan's affine
    (nearest neighbour, ``order=0``, or linear, ``order=1``)."""
    nib, sitk = _modules()
    _, affine = template_grid(template)
    ref = nib.as_closest_canonical(nib.load(str(scan)))
    ref_img = _to_sitk(np.zeros(ref.shape[:3], np.float32), ref.affine)
    back = read_transform(transform, warp=warp, inverse=True)
    interp = sitk.sitkNearestNeighbor if order == 0 else sitk.sitkLinear
    moved = sitk.Resample(_to_sitk(volume, affine), ref_img, back, interp, 0.0)
    return nib.Nifti1Image(_array(moved).astype(np.float32), ref.affine)


def _qc_picture(vol: np.ndarray, mask: np.ndarray, path: Path, title: str) -> None:
    """Three orthogonal slices of ``vol`` through the centre of the template's brain, with its outline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    centre = [round(float(c)) for c in np.argwhere(mask).mean(0)]
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.2))
    top = float(np.percentile(vol[mask], 99.5)) if mask.any() else 1.0
    views = (vol[centre[0]].T, vol[:, centre[1]].T, vol[:, :, centre[2]].T)
    outlines = (mask[centre[0]].T, mask[:, centre[1]].T, mask[:, :, centre[2]].T)
    for ax, v, m, name in zip(axes, views, outlines, ("sagittal", "coronal", "axial")):
        ax.imshow(v, cmap="gray", origin="lower", vmin=0, vmax=top)
        ax.contour(m.astype(float), levels=[0.5], colors="red", linewidths=0.7)
        ax.set_title(name, fontsize=9)
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=80)
    plt.close(fig)


def _save_nifti(img: Any, path: Path) -> None:
    nib, _ = _modules()
    with atomic_path(path, suffix=".nii.gz") as tmp:  # nibabel reads the format from the name
        nib.save(img, str(tmp))


def preprocess_t1(
    scan: str | Path,
    out: str | Path,
    *,
    name: str | None = None,
    template: str = "mni152_2mm",
    registration: str = "affine",
    where: tuple[Path, int] | None = None,
) -> dict[str, Any]:
    """Preprocess one raw T1 scan into ``out`` (see the module docstring); returns its record.

    Writes ``out/volumes/NAME.nii.gz`` (the brain on the template grid, float32, brain median 1000),
    ``out/masks/NAME_mask.nii.gz`` (the brain mask on the template grid), ``out/transforms/NAME.tfm``
    (template -> scan; with ``registration="syn"`` its affine part, and ``NAME_warp.nii.gz``,
    ``NAME_inverse_warp.nii.gz`` the displacement fields, recorded as ``warp`` and ``inverse_warp``),
    ``out/qc/NAME.png`` and ``out/records/NAME.json`` (the record, written last:
    a scan with a record is finished). ``name`` defaults to the scan's file name without ``.nii[.gz]``.
    Raises :class:`~rankwise.data.DataFormatError` (one line naming the scan) for a scan that cannot be
    read or preprocessed; ``where`` (the cohort CSV and its row) goes into that message.

    Example:
        >>> import tempfile
        >>> from rankwise.data import make_brain_age_synthetic
        >>> cohort = make_brain_age_synthetic(tempfile.mkdtemp(), n=1, spacing=6.0, raw=True, raw_voxel_mm=(4, 5))
        >>> record = preprocess_t1(cohort.parent / "sub-0001_T1w.nii.gz", tempfile.mkdtemp(), template="mni152_6mm")
        >>> record["similarity"] > 0.5
        True
    """
    nib, sitk = _modules()
    if registration not in REGISTRATIONS:
        raise ValueError(f"`registration` must be one of {list(REGISTRATIONS)}, got {registration!r}")
    if registration == "syn":
        _ants()
    maps, grid_affine = template_grid(template)
    scan = Path(scan)
    out = Path(out)
    where = where or (scan, 0)
    name = name or re.sub(r"\.nii(\.gz)?$", "", scan.name)
    started = time.perf_counter()
    data, affine = read_volume(scan, where)
    data, affine = to_canonical(data, affine)
    if min(data.shape) < 8:
        raise DataFormatError(*where, f"scan {scan} has shape {tuple(data.shape)}: too thin to be a 3-D head scan")
    if float(data.max()) <= float(data.min()):
        raise DataFormatError(*where, f"scan {scan} is constant ({float(data.min())}): nothing to register")

    def fail(message: str) -> DataFormatError:
        return DataFormatError(*where, f"scan {scan}: {message}")

    try:
        moving = _n4(_to_sitk(np.clip(data, 0, None), affine))
        mask = maps["mask"] > 0.5
        fixed = _to_sitk(maps["t1"], grid_affine)
        from scipy import ndimage

        spacing = float(np.linalg.norm(grid_affine[:3, 0]))
        grown = ndimage.binary_dilation(mask, iterations=max(1, round(6.0 / spacing)))
        fixed_mask = sitk.Cast(_to_sitk(grown.astype(np.float32), grid_affine), sitk.sitkUInt8)
        with _one_thread():
            tx = _register(fixed, fixed_mask, moving)
        moved = _array(sitk.Resample(moving, fixed, tx, sitk.sitkLinear, 0.0))
        best = _similarity(moved, maps["t1"], mask)
        restarted = best < FLAG_SIMILARITY
        if restarted:  # a wrong optimum: register again from the best other starts, keep the best result
            with _one_thread():
                starts = _starts(fixed, fixed_mask, moving, RESTART_TRIES)
            for start in starts:
                with _one_thread():
                    tx2 = _register(fixed, fixed_mask, moving, start=start)
                moved2 = _array(sitk.Resample(moving, fixed, tx2, sitk.sitkLinear, 0.0))
                sim2 = _similarity(moved2, maps["t1"], mask)
                if sim2 > best:
                    tx, moved, best = tx2, moved2, sim2
                if best >= FLAG_SIMILARITY:
                    break
    except RuntimeError as e:  # an ITK exception: the registration diverged or the images are degenerate
        raise fail(f"registration failed ({' '.join(str(e).split())[-200:]})") from None
    in_view = _in_view(mask, grid_affine, tx, affine, data.shape)
    if in_view < MIN_IN_VIEW:
        raise fail(f"only {in_view:.0%} of the template's brain lies in the field of view after registration")
    for sub in FOLDERS:
        (out / sub).mkdir(parents=True, exist_ok=True)
    warp = out / "transforms" / f"{name}_warp.nii.gz"
    inverse_warp = out / "transforms" / f"{name}_inverse_warp.nii.gz"
    jacobian = 1.0
    if registration == "syn":
        import tempfile

        try:
            with tempfile.TemporaryDirectory(prefix=f".{name}_syn_", dir=out / "transforms") as scratch:
                forward, backward = _syn(fixed, moving, tx, mask, grid_affine, Path(scratch))
                for made, final in ((forward, warp), (backward, inverse_warp)):
                    with atomic_path(final, suffix=".nii.gz") as tmp:  # fsynced and moved into place
                        shutil.move(str(made), str(tmp))
            field = sitk.ReadImage(str(warp), sitk.sitkVectorFloat64)
            full = sitk.CompositeTransform([tx, _field(field)])
            moved = _array(sitk.Resample(moving, fixed, full, sitk.sitkLinear, 0.0))
        except RuntimeError as e:
            raise fail(f"SyN registration failed ({' '.join(str(e).split())[-200:]})") from None
        jacobian = _jacobian_mean(field, mask, grid_affine)
    brain = moved * mask
    level = float(np.median(brain[mask])) if mask.any() else 0.0
    if not level > 0:
        raise fail("no brain found in the field of view (the registered brain is empty)")
    brain = (brain * (1000.0 / level)).astype(np.float32)
    similarity = _similarity(brain, maps["t1"], mask)
    if similarity < MIN_SIMILARITY:
        raise fail(f"no brain found in the field of view (similarity {similarity:.2f} to the template)")
    linear = np.asarray(tx.GetMatrix(), dtype=float).reshape(3, 3)
    brain_ml = float(mask.sum()) * abs(float(np.linalg.det(grid_affine[:3, :3]))) * abs(float(np.linalg.det(linear)))
    brain_ml *= jacobian
    volume = out / "volumes" / f"{name}.nii.gz"
    mask_path = out / "masks" / f"{name}_mask.nii.gz"
    transform = out / "transforms" / f"{name}.tfm"
    _save_nifti(nib.Nifti1Image(brain, grid_affine), volume)
    _save_nifti(nib.Nifti1Image(mask.astype(np.uint8), grid_affine), mask_path)
    with atomic_path(transform, suffix=".tfm") as tmp:  # ITK reads the format from the name
        sitk.WriteTransform(tx, str(tmp))
    # the registered scan before brain extraction: the outline shows how well it fits the template
    _qc_picture(moved * (1000.0 / level), mask, out / "qc" / f"{name}.png", f"{name}: similarity {similarity:.3f}")
    record = {
        "name": name,
        "scan": str(scan.resolve()),
        "scan_bytes": scan.stat().st_size,
        "scan_sha256": file_digest(scan),
        "template": template,
        "registration": registration,
        "volume": str(volume.relative_to(out)),
        "mask": str(mask_path.relative_to(out)),
        "transform": str(transform.relative_to(out)),
        "warp": str(warp.relative_to(out)) if registration == "syn" else None,
        "inverse_warp": str(inverse_warp.relative_to(out)) if registration == "syn" else None,
        "qc": f"qc/{name}.png",
        "similarity": similarity,
        "brain_ml": brain_ml / 1000.0,
        "in_view": in_view,
        "restarted": restarted,
        "seconds": time.perf_counter() - started,
    }
    atomic_write(out / "records" / f"{name}.json", json.dumps(record, indent=1))
    return record


@dataclass
class PreprocessResult:
    """What :func:`preprocess_cohort` did: the records of the finished scans (in the CSV's order),
    the failures (``(row, scan, message)``), the scans it skipped as already done, and the CSV it wrote."""

    records: list[dict[str, Any]] = field(default_factory=list)
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    reused: int = 0
    csv: Path | None = None
    page: Path | None = None


def _finished(out: Path, name: str, scan: Path, template: str, registration: str) -> dict[str, Any] | None:
    """The record of a scan preprocessed before with the same settings from the same bytes, else None."""
    rec = out / "records" / f"{name}.json"
    try:
        record = json.loads(rec.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or (record.get("template"), record.get("registration")) != (template, registration):
        return None
    if not all((out / str(record.get(k, ""))).is_file() for k in ("volume", "mask", "transform")):
        return None
    if registration == "syn" and not all((out / str(record.get(k) or "")).is_file() for k in ("warp", "inverse_warp")):
        return None
    try:
        if record.get("scan_bytes") != scan.stat().st_size or record.get("scan_sha256") != file_digest(scan):
            return None
    except OSError:
        return None
    return record


def _names(rows: list[dict[str, Any]]) -> list[str]:
    """One file name per row: the ``subject`` column where it is a plain name, else the scan's stem;
    a repeated name gets the row number."""
    out: list[str] = []
    for r in rows:
        stem = re.sub(r"\.nii(\.gz)?$", "", Path(r["path"]).name)
        base = r.get("subject") if re.fullmatch(r"[A-Za-z0-9._-]{1,100}", str(r.get("subject") or "")) else stem
        base = re.sub(r"[^A-Za-z0-9._-]", "_", str(base))[:100] or f"row{r['_row']}"
        out.append(base if base not in out else f"{base}_row{r['_row']}")
    return out


def _worker_start() -> None:
    """A worker ignores Ctrl-C (the main process stops it) and ends when the main process dies (a killed
    ``rankwise preprocess`` leaves no worker writing into ``out``): a thread watches its parent."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.25)
        os._exit(1)

    threading.Thread(target=watch, name="rankwise-parent-watch", daemon=True).start()


def _work(args: tuple[str, str, str, str, str, str, int, int]) -> tuple[int, dict[str, Any] | None, str]:
    scan, out, name, template, registration, csv_path, row, threads = args
    _, sitk = _modules()
    sitk.ProcessObject_SetGlobalDefaultNumberOfThreads(threads)
    try:
        where = (Path(csv_path), row)
        rec = preprocess_t1(scan, out, name=name, template=template, registration=registration, where=where)
        return row, rec, ""
    except DataFormatError as e:  # names the CSV, its row and the scan
        return row, None, " ".join(str(e).split())
    except (OSError, ValueError, MemoryError) as e:
        return row, None, f"{csv_path}, row {row}: scan {scan}: " + (" ".join(str(e).split()) or type(e).__name__)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _robust_flags(values: list[float]) -> list[bool]:
    if len(values) < 5:
        return [False] * len(values)
    arr = np.asarray(values, dtype=float)
    med = float(np.median(arr))
    mad = float(np.median(np.abs(arr - med))) * 1.4826
    return [bool(mad > 0 and abs(v - med) / mad > 3.5) for v in arr]


def _write_page(out: Path, records: list[dict[str, Any]], failures: list[tuple[int, str, str]]) -> Path:
    """``out/qc/index.html``: one row per scan (picture, similarity, brain volume, flags), the failures."""
    sim = _robust_flags([r["similarity"] for r in records])
    vol = _robust_flags([r["brain_ml"] for r in records])
    rows = []
    flagged = 0
    for r, fs, fv in zip(records, sim, vol):
        flags = [
            *(["low similarity"] if r["similarity"] < FLAG_SIMILARITY else []),
            *(["similarity outlier"] if fs else []),
            *(["mapped brain outlier"] if fv else []),
        ]
        flagged += bool(flags)
        name = html.escape(r["name"])
        rows.append(
            f"<tr{' class=flag' if flags else ''}><td>{name}</td><td>{r['similarity']:.3f}</td>"
            f"<td>{r['brain_ml']:.0f}</td><td>{r['in_view']:.2f}</td><td>{html.escape(', '.join(flags)) or '-'}</td>"
            f"<td><a href='{html.escape(Path(r['qc']).name)}'><img src='{html.escape(Path(r['qc']).name)}' "
            f"height=120 alt='{name}'></a></td></tr>"
        )
    failed = "".join(f"<li>{html.escape(msg)}</li>" for _, _, msg in failures)  # each names its CSV row
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>rankwise preprocess: quality control</title>
<style>body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} tr.flag{{background:#fde2e2}}</style></head>
<body><h1>Quality control: {_count(len(records), "scan")} preprocessed, {flagged} flagged, {len(failures)} failed</h1>
<p>Similarity: normalised cross-correlation with the MNI152 template inside its brain mask (1 = identical).
Mapped brain: the volume of the template's brain mask mapped into the scan by the registration (mL;
the registration's scaling times the mask's volume, an estimate, not a segmentation of the scan).
In view: the fraction of the template's brain inside the scan's field of view.
Flags: a similarity under {FLAG_SIMILARITY}, or a similarity or mapped brain more than 3.5 robust standard
deviations from the cohort's median. The red outline is the template's brain.</p>
<table><tr><th>scan</th><th>similarity</th><th>mapped brain (mL)</th><th>in view</th><th>flags</th><th>slices</th></tr>
{"".join(rows)}
</table>
{"<h2>Failed</h2><ul>" + failed + "</ul>" if failures else ""}
</body></html>
"""
    path = out / "qc" / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, page)


def preprocess_cohort(
    csv_path: str | Path,
    out: str | Path,
    *,
    template: str = "mni152_2mm",
    registration: str = "affine",
    workers: int = 1,
    on_scan: Callable[[int, int, str, str, float], None] | None = None,
) -> PreprocessResult:
    """Preprocess every scan of a cohort CSV (a ``path`` column, relative paths from the CSV's folder)
    into ``out`` with :func:`preprocess_t1`, ``workers`` scans at a time; write ``out/participants.csv``
    and the quality-control page ``out/qc/index.html``.

    Resumable: a scan whose record exists (same template, registration and scan bytes) is not redone.
    A scan that fails is reported (``failures``) and left out of the CSV; the others go on. Nothing is
    written outside ``out``. ``participants.csv`` holds the input's columns with ``path`` replaced by the
    preprocessed volume (relative to ``out``) and ``raw_path`` (the scan), ``mask`` (the brain mask on the
    template grid), ``transform`` (template -> scan) and, with ``registration="syn"``, ``warp`` (its
    displacement field, see :func:`map_to_scan`) added: ``rankwise train --data`` reads it.
    ``on_scan(done, total, name, status, seconds)`` is called after each scan (status ``"done"``,
    ``"reused"`` or ``"failed: <message>"``).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"`workers` must be a positive int, got {workers!r}")
    if registration not in REGISTRATIONS:
        raise ValueError(f"`registration` must be one of {list(REGISTRATIONS)}, got {registration!r}")
    if registration == "syn":
        _ants()  # a missing ANTsPy fails before any work
    template_grid(template)  # a bad name fails before any work
    csv_path = Path(csv_path)
    out = Path(out)
    rows = read_cohort_rows(csv_path, None)
    for r in rows:
        if not r["path"]:
            raise DataFormatError(csv_path, r["_row"], "empty `path`")
    extra = [*PREPROCESS_COLUMNS, *(["warp"] if registration == "syn" else [])]
    reserved = [c for c in extra if c in rows[0]]
    if reserved:
        raise DataFormatError(csv_path, 1, f"column(s) {reserved} are written by preprocess; rename them")
    names = _names(rows)
    scans = [(csv_path.parent / r["path"]).resolve() for r in rows]
    if out.exists() and not out.is_dir():
        raise ValueError(f"`out` {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise ValueError(
            f"`out` {out} holds files that `rankwise preprocess` did not write (it has no {MARKER}): "
            "name a new or empty folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).is_file():
        atomic_write(out / MARKER, json.dumps({"written_by": "rankwise preprocess", "csv": str(csv_path.resolve())}))
    result = PreprocessResult()
    by_row: dict[int, dict[str, Any]] = {}
    todo = []
    started = time.perf_counter()
    for r, name, scan in zip(rows, names, scans):
        record = _finished(out, name, scan, template, registration)
        if record is not None:
            by_row[r["_row"]] = record
            result.reused += 1
            if on_scan:
                on_scan(len(by_row), len(rows), name, "reused", time.perf_counter() - started)
        else:
            todo.append((str(scan), str(out), name, template, registration, str(csv_path), r["_row"]))
    threads = max(1, (os.cpu_count() or 1) // workers)
    jobs = [(*t, threads) for t in todo]
    job_of = {j[6]: j for j in jobs}
    done = len(by_row)

    def finished(row: int, rec: dict[str, Any] | None, message: str) -> None:
        nonlocal done
        done += 1
        scan, _, name = job_of[row][:3]
        if rec is None:
            result.failures.append((row, scan, message))
        else:
            by_row[row] = rec
        if on_scan:
            status = "done" if rec is not None else f"failed: {message}"
            on_scan(done, len(rows), name, status, time.perf_counter() - started)

    if workers == 1 or len(jobs) <= 1:
        for job in jobs:
            finished(*_work(job))
    else:
        import multiprocessing

        # a Pool's exit terminates its workers: Ctrl-C (or any error) stops every scan at once
        with multiprocessing.get_context("spawn").Pool(workers, initializer=_worker_start) as pool:
            for res in pool.imap_unordered(_work, jobs):
                finished(*res)
    result.failures.sort()
    columns = [c for c in rows[0] if c != "_row"]
    table = []
    for r, scan in zip(rows, scans):
        rec = by_row.get(r["_row"])
        if rec is None:
            continue
        result.records.append(rec)
        values = {c: r[c] for c in columns}
        values["path"] = rec["volume"]
        added = {"raw_path": str(scan), "mask": rec["mask"], "transform": rec["transform"], "warp": rec.get("warp")}
        table.append(values | {k: added[k] for k in extra})
    target = out / "participants.csv"
    with atomic_open(target, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*columns, *extra])
        writer.writeheader()
        writer.writerows(table)
    result.csv = target
    result.page = _write_page(out, result.records, result.failures)
    return result
