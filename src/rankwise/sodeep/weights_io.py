"""Saving and loading sorter weights: a plain ``state_dict`` plus small metadata.

A weights file is ``torch.save({"format": "rankwise.sodeep/1", "model": ..., "hparams": {...},
"state_dict": {...}, "metrics": {...}, "train": {...}})``: only tensors, strings, numbers, lists and
dicts, so ``torch.load(path, weights_only=True)`` reads it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import torch

from rankwise._fileio import UnreadableWeightsError, atomic_path, load_weights_only
from rankwise.sodeep.models import Sorter, build_sorter

__all__ = ["BUNDLED_SEQ_LENS", "bundled_path", "load_sorter", "save_sorter"]

FORMAT = "rankwise.sodeep/1"
#: sequence lengths of the sorters shipped in ``rankwise/sodeep/weights``.
BUNDLED_SEQ_LENS = (32, 64, 128)


def save_sorter(
    sorter: Sorter, path: str | Path, *, metrics: dict[str, Any] | None = None, train: dict[str, Any] | None = None
) -> Path:
    """Write ``sorter`` (float32 CPU tensors) with its hyperparameters and optional metadata (atomically:
    :func:`rankwise._fileio.atomic_path`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float32).clone() for k, v in sorter.state_dict().items()}
    payload = {
        "format": FORMAT,
        "model": sorter.model_name,
        "hparams": sorter.hparams(),
        "state_dict": state,
        "metrics": metrics or {},
        "train": train or {},
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return path


def load_sorter(path: str | Path, *, map_location: str | torch.device = "cpu") -> Sorter:
    """Rebuild a sorter from a file written by :func:`save_sorter` (``weights_only=True`` load)."""
    try:
        payload = load_weights_only(path, map_location=map_location)
    except UnreadableWeightsError as e:  # any byte sequence: truncated zip, text, a pickle it refuses
        raise ValueError(
            f"`path` {str(path)!r} is not a sorter file written by rankwise.sodeep.save_sorter "
            f"(unreadable by the weights-only loader: {type(e.cause).__name__})"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"`path` must be a sorter file written by rankwise.sodeep.save_sorter, got {str(path)!r}")
    try:
        sorter = build_sorter(payload["model"], **payload["hparams"])
        sorter.load_state_dict(payload["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"`path` {str(path)!r} holds an invalid sorter: {first}") from None
    sorter.metadata = {"metrics": payload.get("metrics", {}), "train": payload.get("train", {})}  # type: ignore[assignment]
    return sorter.eval()


def bundled_path(seq_len: int, model: str = "gru") -> Path:
    """Path of the bundled weights file for ``seq_len`` / ``model`` (may not exist)."""
    ref = resources.files("rankwise.sodeep").joinpath("weights").joinpath(f"{model}_{seq_len}.pt")
    return Path(str(ref))
