"""Which ``pip install 'rankwise[EXTRA]'`` brings a missing optional dependency.

The optional dependencies are imported where they are used (lazily); when one is missing the
import fails with :class:`ModuleNotFoundError` naming the module. :func:`missing_dependency`
finds that module in an error (or in the error it was raised from) and names the extra that
installs it, so the command line prints one line instead of an unexpected error. The table is
the ``[project.optional-dependencies]`` of ``pyproject.toml`` (a test keeps them equal).
"""

from __future__ import annotations

#: extra -> the distributions it installs (``pyproject.toml``, ``[project.optional-dependencies]``)
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": (
        "lightning",
        "torchvision",
        "pandas",
        "matplotlib",
        "scikit-learn",
        "scikit-lego",
        "mlxtend",
        "pyyaml",
        "pydantic",
        "tensorboard",
        "timm",
        "rich",
        "typer",
        "torchmetrics",
    ),
    "mri": ("matplotlib", "nibabel", "nilearn", "SimpleITK", "torchio"),
    "syn": ("antspyx",),
    "parity": ("diffsort",),
}

#: distribution -> its import name, where they differ
_IMPORT_NAME = {"scikit-learn": "sklearn", "scikit-lego": "sklego", "pyyaml": "yaml", "antspyx": "ants"}

#: modules that an extra brings as a dependency of one of its distributions (scipy: of scikit-learn)
_BROUGHT = {"scipy": "train", "pytorch_lightning": "train", "tensorboardX": "train"}


def extra_of(module: str) -> str | None:
    """The extra whose installation brings the top-level package of ``module`` (``None``: no extra does)."""
    top = module.split(".")[0]
    for extra, dists in EXTRAS.items():
        if any(_IMPORT_NAME.get(d, d) == top for d in dists):
            return extra
    return _BROUGHT.get(top)


def _dist(extra: str) -> str:
    return f"rankwise[{extra}]"


def missing_dependency(error: BaseException) -> str | None:
    """One line naming the optional dependency that ``error`` (or an error it was raised from) did
    not find and the ``pip install 'rankwise[EXTRA]'`` that installs it; ``None`` when it is no
    missing optional dependency.

    Example:
        >>> missing_dependency(ModuleNotFoundError("No module named 'nibabel'", name="nibabel"))
        "the optional dependency nibabel is not installed; install it with: pip install 'rankwise[mri]'"
    """
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        name = getattr(e, "name", None)
        if isinstance(e, ModuleNotFoundError) and isinstance(name, str) and name:
            extra = extra_of(name)
            if extra is not None:
                top = name.split(".")[0]
                return f"the optional dependency {top} is not installed; install it with: pip install '{_dist(extra)}'"
        e = e.__cause__ or e.__context__
    return None
