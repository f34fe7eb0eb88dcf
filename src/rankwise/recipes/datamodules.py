"""The data of a training stage as a ``lightning.LightningDataModule``.

Every recipe hands its stages their data as a :class:`LoaderData`: the recipe's own
``DataLoader``s (its datasets, samplers, collate functions and the worker options of
:func:`rankwise.recipes.common.loader_workers`), each given as a loader or as a function that
builds it when Lightning first asks for it (e.g. a test split read only by the rank that tests). A
split left out is not defined: Lightning then runs no loop over it (no validation without ``val``).
The same object serves ``Trainer.fit`` and ``Trainer.test`` / ``Trainer.predict``.

It holds no state of its own: checkpoints, seeds and batches are those of the loaders it wraps.
"""

from __future__ import annotations

from typing import Any

import lightning as L

__all__ = ["SPLITS", "LoaderData"]

#: the splits of a :class:`LoaderData`, named as Lightning's ``<split>_dataloader`` hooks
SPLITS = ("train", "val", "test", "predict")


class LoaderData(L.LightningDataModule):
    """A LightningDataModule over a recipe's loaders (each a ``DataLoader`` or a function returning one).

    Args:
        train: the training loader.
        val: the validation loader (None: no validation).
        test: the test loader (None: the stage is not tested).
        predict: the prediction loader(s) (None: none).

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> ds = TensorDataset(torch.arange(6.0))
        >>> dm = LoaderData(train=DataLoader(ds, batch_size=4), test=lambda: DataLoader(ds, batch_size=6))
        >>> len(dm.train_dataloader()), len(dm.test_dataloader()), dm.val_dataloader
        (2, 1, None)
    """

    def __init__(self, train: Any = None, val: Any = None, test: Any = None, predict: Any = None) -> None:
        super().__init__()
        self._loaders: dict[str, Any] = {"train": train, "val": val, "test": test, "predict": predict}
        for split, loader in self._loaders.items():
            if loader is None:  # Lightning treats a hook that is not defined as "no such split"
                setattr(self, f"{split}_dataloader", None)

    def has(self, split: str) -> bool:
        """Whether the split ``split`` (one of :data:`SPLITS`) has a loader."""
        if split not in SPLITS:
            raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}")
        return self._loaders[split] is not None

    def _get(self, split: str) -> Any:
        loader = self._loaders[split]
        if callable(loader):
            loader = self._loaders[split] = loader()  # built once, when first asked for
        return loader

    def train_dataloader(self) -> Any:
        return self._get("train")

    def val_dataloader(self) -> Any:
        return self._get("val")

    def test_dataloader(self) -> Any:
        return self._get("test")

    def predict_dataloader(self) -> Any:
        return self._get("predict")
