"""The config schema: the pydantic sections, the ``task`` options bases and :class:`Config`."""

from __future__ import annotations

import copy
import re
import types
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator

#: a plain decimal number written as a string (a quoted "1e-4", a value set in Python); no "1_000", "nan"
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


#: the sections every recipe reads; a recipe lists any other section it reads in ``Recipe.uses``
UNIVERSAL_SECTIONS = ("data", "model", "optimizer", "schedule", "trainer", "run", "report")
#: sections that only some recipes read
OPTIONAL_SECTIONS = ("loss", "study")

# --------------------------------------------------------------------------------------------------
# schema: pydantic models (types, ranges via Field, unknown keys refused)


def accepts(tp: Any, kind: type) -> bool:
    """Whether the annotation ``tp`` (a union included) takes values of ``kind`` and not of ``str``."""
    args = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)
    return kind in args and str not in args


def unwrap(tp: Any) -> Any:
    """``X`` of ``Annotated[X, ...]`` and of ``X | None``."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
            continue
        if get_origin(tp) in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp


def is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


class Section(BaseModel):
    """Base of every config section and of every recipe's ``task`` options.

    Unknown keys are refused (``extra="forbid"``); types are strict (an integer field takes no
    ``1.5``, ``"1"`` or ``true``; a boolean no ``"yes"``), numbers are finite, and every range is a
    :func:`pydantic.Field` bound. Two YAML conveniences: a float field takes a decimal string
    (a quoted ``"1e-4"``), a field of string choices takes an integer spelling one
    (``precision: 16``); an empty YAML value (``null``) of a section, mapping or list is its default.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _yaml_scalars(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None:  # pragma: no cover - pydantic validates declared fields only
            return value
        tp = field.annotation
        inner = unwrap(tp)
        if value is None and (is_model(inner) or get_origin(inner) in (dict, list)) and inner is tp:
            return {} if is_model(inner) or get_origin(inner) is dict else []
        if isinstance(value, dict) and get_origin(inner) is dict:
            return {str(k): v for k, v in value.items()}  # YAML may read a key as a number: options take names
        if isinstance(value, str) and accepts(tp, float) and _DECIMAL.fullmatch(value.strip()):
            return float(value)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and get_origin(inner) is Literal
            and str(value) in get_args(inner)
        ):
            return str(value)  # e.g. precision: 16 -> "16"
        return value


class Options(Section):
    """Base of a recipe's ``task`` options (the recipe registers the model as ``Recipe.options``)."""


class StepBudget(Options):
    """A recipe's ``task`` options with a training budget of steps: ``task.steps`` in epochs of at most
    ``task.steps_per_epoch`` (:func:`rankwise.recipes.common.epochs_and_batches`).

    A recipe's options subclass it and name what a step is and after which of their own fields the
    two keys are listed (the config reference, ``rankwise config``, the dumped config)::

        class DKNNOptions(StepBudget, unit="episodes", after="n_samples"): ...

    A subclass of such options (``MedianOptions(SortOptions)``) keeps its parent's ``unit`` and place.
    """

    steps: int = Field(300, description="training {unit}, in epochs of at most steps_per_epoch", ge=1)
    steps_per_epoch: int = Field(100, description="{unit} per epoch (a checkpoint after each)", ge=1)

    _step_unit: ClassVar[str] = "steps"
    _steps_after: ClassVar[str | None] = None

    def __init_subclass__(cls, *, unit: str | None = None, after: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if unit is not None:
            cls._step_unit = unit
        if after is not None:
            cls._steps_after = after

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        fields = dict(cls.__pydantic_fields__)
        budget = {}
        for name in ("steps", "steps_per_epoch"):
            field = copy.copy(fields.pop(name))
            field.description = str(StepBudget.model_fields[name].description).format(unit=cls._step_unit)
            budget[name] = field
        if cls._steps_after is not None and cls._steps_after not in fields:
            raise TypeError(f"{cls.__name__}: `after` must name one of its fields, got {cls._steps_after!r}")
        ordered: dict[str, Any] = {} if cls._steps_after is not None else dict(budget)
        for name, field in fields.items():
            ordered[name] = field
            if name == cls._steps_after:
                ordered.update(budget)
        cls.__pydantic_fields__ = ordered
        cls.model_rebuild(force=True)


#: a list element that is an integer >= 1 (``schedule.milestones``)
_Epoch = Annotated[int, Field(ge=1)]
_Kernel = Literal["gaussian", "triang", "laplace"]


class DataConfig(Section):
    """Which dataset to load and how to batch it."""

    name: str = Field("abalone", description="registered dataset (`rankwise data list`)")
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of the dataset loader (`rankwise data show`)"
    )
    batch_size: int = Field(64, description="training batch size (per process under DDP)", ge=1)
    eval_batch_size: int = Field(512, description="batch size of validation, test and prediction", ge=1)
    num_workers: int = Field(0, description="DataLoader worker processes", ge=0)


class ModelConfig(Section):
    """Backbone (``rankwise.models.build_backbone(backbone, **options)``); the recipe adds its heads."""

    backbone: str = Field("mlp", description="registered backbone (`rankwise.models.list_backbones()`)")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options of the backbone factory")
    weights: str | None = Field(
        None, description="local weights file loaded into the backbone (weights_only=True); never downloaded"
    )


class LDSConfig(Section):
    """Label-distribution reweighting / smoothing (Yang et al. 2021): ``task.lds`` of the recipes that read it."""

    reweight: Literal["none", "sqrt_inv", "inverse"] = Field(
        "none", description="per-sample weights from label frequencies"
    )
    lds: bool = Field(False, description="smooth the label histogram with the kernel before reweighting")
    kernel: _Kernel = Field("gaussian", description="LDS smoothing kernel")
    ks: int = Field(5, description="LDS kernel size in bins (odd)", ge=1)
    sigma: float = Field(2.0, description="LDS kernel width", gt=0)


class FDSConfig(Section):
    """Feature-distribution smoothing on the backbone features (Yang et al. 2021): ``task.fds`` of its recipes."""

    enabled: bool = Field(False, description="smooth the features with FDS")
    kernel: _Kernel = Field("gaussian", description="FDS smoothing kernel")
    ks: int = Field(5, description="FDS kernel size in bins (odd)", ge=1)
    sigma: float = Field(2.0, description="FDS kernel width", gt=0)
    momentum: float = Field(0.9, description="momentum of the running per-bin feature statistics", ge=0, le=1)
    start_update: int = Field(0, description="first epoch whose features update the statistics", ge=0)
    start_smooth: int = Field(1, description="first epoch whose features are smoothed", ge=0)


class RegularizerConfig(Section):
    """One weighted term ``weight * loss(...)`` added to the task loss; ``name`` is a registered loss."""

    name: str = Field(description="registered loss whose registry entry declares its inputs (`rankwise.list_losses()`)")
    weight: float = Field(1.0, description="multiplier of the term (0 = computed nowhere)", ge=0)
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of the loss (checked against its signature)"
    )


class LossConfig(Section):
    """The regression recipes' loss: the task loss + registry regularizers (LDS/FDS: the recipe's ``task``)."""

    kind: Literal["l1", "mse", "huber", "focal_l1", "focal_mse"] = Field(
        "l1", description="shorthand for `loss.name: regression_<kind>` (used unless `loss.name` is set)"
    )
    name: str | None = Field(
        None,
        description="a registered loss used as the task loss instead of `kind` (inputs predictions/targets, "
        "learnable parameters trained)",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="keyword options of the task loss")
    lr: float | None = Field(
        None, description="learning rate of the task loss's own parameters (default optimizer.lr)", gt=0
    )
    regularizers: list[RegularizerConfig] = Field(
        default_factory=list, description="weighted losses from the loss registry added to the task loss"
    )


class OptimizerConfig(Section):
    """The optimizer of every recipe (``rankwise.recipes.optim.configure``)."""

    name: Literal["adam", "adamw", "sgd", "lars"] = Field("adam", description="optimizer (lars: timm.optim.Lars)")
    lr: float = Field(1e-3, description="learning rate", gt=0)
    weight_decay: float = Field(0.0, description="weight decay", ge=0)
    momentum: float = Field(0.9, description="momentum (sgd, lars)", ge=0, lt=1)
    eps: float = Field(1e-8, description="term added to Adam's denominator (adam, adamw)", gt=0)


class ScheduleConfig(Section):
    """Learning-rate schedule over the recipe's actual number of epochs/steps."""

    kind: Literal["none", "multistep", "cosine"] = Field("none", description="lr schedule after the warm-up")
    milestones: list[_Epoch] = Field(
        default_factory=list, description="multistep: epochs at which lr is multiplied by gamma"
    )
    gamma: float = Field(0.1, description="multistep decay factor", gt=0, le=1)
    warmup_epochs: int = Field(0, description="epochs of linear warm-up (per optimizer step)", ge=0)
    interval: Literal["epoch", "step"] = Field("epoch", description="granularity of the cosine/multistep decay")


class TrainerConfig(Section):
    """Options forwarded to ``lightning.Trainer``."""

    max_epochs: int = Field(
        10, description="training epochs (recipes with `task.steps` derive their own and refuse another value)", ge=1
    )
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu"] = Field(
        "auto", description="Lightning accelerator"
    )
    devices: Any = Field("auto", description="Lightning devices: auto, a count, -1 (all) or a list of indices")
    strategy: str = Field("auto", description="Lightning strategy, e.g. ddp")
    num_nodes: int = Field(1, description="number of nodes", ge=1)
    precision: Literal[
        "32-true", "32", "64-true", "64", "16-true", "16-mixed", "16", "bf16-true", "bf16-mixed", "bf16"
    ] = Field("32-true", description="Lightning precision")
    deterministic: Any = Field("warn", description="torch deterministic algorithms: true, false or warn")
    gradient_clip_val: float | None = Field(None, description="clip gradients to this norm", ge=0)
    log_every_n_steps: int = Field(10, description="logging interval in steps", ge=1)
    limit_train_batches: Any = Field(None, description="batches per training epoch: a count or a fraction in (0, 1]")
    limit_val_batches: Any = Field(None, description="validation batches: a count or a fraction in [0, 1]")
    enable_progress_bar: bool = Field(True, description="show the progress bar (with --progress)")
    num_threads: int | None = Field(None, description="torch.set_num_threads for the run (None: torch's default)", ge=1)
    memory_check: bool = Field(
        True,
        description="refuse, before training, a run whose measured training step needs more memory than is "
        "available (brain_age); false: train anyway",
    )


class RunConfig(Section):
    """Run directory and seed."""

    name: str = Field("run", description="run directory name under out_dir (one path component)")
    seed: int = Field(0, description="seed of initialisation, sampling and augmentation", ge=0, lt=2**32)
    out_dir: str = Field("runs", description="parent folder of the run directory")


class ReportConfig(Section):
    """What is reported after training: plots, the t-SNE and the shot groups of the regression metrics."""

    plots: bool = Field(True, description="write plots/ after training")
    tsne: bool = Field(True, description="include the t-SNE plot")
    plot_samples: int = Field(400, description="test examples in the similarity heatmap / t-SNE", ge=1)
    many_shot: float | None = Field(
        None,
        description="a label bin with more training examples is many-shot (null: the dataset's own threshold)",
        ge=0,
    )
    few_shot: float | None = Field(
        None,
        description="a label bin with fewer training examples is few-shot (null: the dataset's own threshold)",
        ge=0,
    )


class StudyConfig(Section):
    """What a brain-age study reports beside the metrics: the test gap per site and per group."""

    site_column: str | None = Field(
        "site",
        description="the cohort CSV's column of scanner sites; the report gives the bias-corrected "
        "test gap per site (skipped when the CSV has no such column or it is empty; null: never)",
    )
    group_column: str | None = Field(
        None,
        description="the cohort CSV's column of diagnostic groups; the report compares the test gap "
        "of each group with `study.reference_group` (Cohen's d, Welch and Mann-Whitney p, AUC)",
    )
    reference_group: str | None = Field(
        None, description="the group the others are compared with (null: the first in sorted order)"
    )
    harmonize: Literal["none", "combat"] = Field(
        "none",
        description="`combat` harmonises the brain-age gap across `study.site_column` sites with "
        "ComBat fitted on the training split (covariates: age, sex, group) and applied to val/test before the "
        "bias correction of the site and group tables",
    )


#: the origin of the values of a config: dotted key -> (kind, where)
Provenance = dict[str, tuple[str, str]]


@dataclass(frozen=True)
class DatasetSwitch:
    """A preset or file switched to another dataset by ``--set data.name=...`` (:func:`load_config`).

    The config keeps nothing of the old dataset (its ``data.options`` and ``expected_time`` are
    dropped); what the run derives from the new data (:mod:`rankwise.recipes.own_data`) reads this
    record once the data are loaded.
    """

    #: the dataset the file named (``abalone`` when it named none) and the one ``--set`` named
    old: str
    new: str
    #: the file's ``data.options`` (dropped), ``None`` when it had none
    options: dict[str, Any] | None
    #: the raw config of the file(s), before ``--set`` (the preset's values the data may replace)
    base: dict[str, Any]
    #: the dotted keys that ``--set`` gave, in order
    given: tuple[str, ...]


class Config(Section):
    """A whole run. ``task`` is the options model of ``recipe`` (see ``rankwise.recipes.registry``)."""

    recipe: str = Field("dir", description="training recipe (`rankwise.recipes.list_recipes()`)")
    description: str = Field("", description="one line shown by `rankwise presets`")
    expected_time: str = Field(
        "", description="expected wall time of the run on 2 CPU cores, shown by `rankwise presets`"
    )
    data: DataConfig = Field(default_factory=DataConfig, description="dataset and batching")
    model: ModelConfig = Field(default_factory=ModelConfig, description="backbone")
    loss: LossConfig = Field(default_factory=LossConfig, description="losses of the recipes that read them")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="optimizer")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="learning-rate schedule")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Lightning Trainer options")
    run: RunConfig = Field(default_factory=RunConfig, description="run directory and seed")
    report: ReportConfig = Field(default_factory=ReportConfig, description="plots, t-SNE and shot groups")
    study: StudyConfig = Field(
        default_factory=StudyConfig, description="the brain-age gap per site and per group (recipe brain_age)"
    )
    task: Any = Field(None, description="the recipe's own options (its options model)")
    #: where each value came from: dotted key -> ``("preset", name)``, ``("file", path)`` or
    #: ``("--set", "key=value")``, set by ``load_config`` (empty for a config built from a mapping)
    _provenance: Provenance = PrivateAttr(default_factory=dict)
    #: set by ``load_config`` when ``--set data.name`` switched the file's dataset (else ``None``)
    _switch: DatasetSwitch | None = PrivateAttr(default=None)
    #: the optional sections its recipe reads (``Recipe.uses``), set by ``config_from_dict`` (else ``None``)
    _uses: frozenset[str] | None = PrivateAttr(default=None)

    @field_validator("task", mode="before")
    @classmethod
    def _task_of_the_recipe(cls, value: Any, info: ValidationInfo) -> Any:
        """``task`` as the options model of the recipe in the validation context (``{"recipe": Recipe}``,
        :func:`~rankwise.recipes.config.config_from_dict`): one validation builds the whole config."""
        recipe = (info.context or {}).get("recipe")
        if recipe is None:
            return value
        return recipe.options.model_validate({} if value is None else value, context=info.context)

    def __eq__(self, other: object) -> bool:
        """Equal configs hold equal values, wherever the values came from."""
        if not isinstance(other, Config):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]
