"""Config files, presets, ``extends:``, ``--set`` overrides and :func:`load_config` (one pass)."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import TypeAdapter, ValidationError

from rankwise._suggest import suggestion
from rankwise.recipes.config._checks import config_from_dict, walk
from rankwise.recipes.config._lookup import RecipeLookup, check_lookup, default_recipe
from rankwise.recipes.config._parsing import MAX_CONFIG_BYTES, ConfigError, deep_merge, parse_yaml, short
from rankwise.recipes.config._sections import Config, DatasetSwitch, Provenance, is_model, unwrap

PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"
# --------------------------------------------------------------------------------------------------
# files, presets, overrides


def list_presets() -> dict[str, str]:
    """Preset name -> one-line description, for every YAML under ``rankwise/recipes/presets``."""
    out = {}
    for p in sorted(PRESET_DIR.glob("*.yaml")):
        raw = parse_yaml(p.read_text(encoding="utf-8"), f"preset {p.stem}") or {}
        out[p.stem] = str(raw.get("description", "")).strip().splitlines()[0] if raw.get("description") else ""
    return out


def preset_path(name: str) -> Path:
    """The YAML file of the bundled preset ``name`` (only names listed by :func:`list_presets`)."""
    names = sorted(q.stem for q in PRESET_DIR.glob("*.yaml"))
    if name not in names:
        hint = f"{close} " if (close := suggestion(name, names)) else ""
        raise ConfigError(f"`{name}` is neither a config file nor a preset; {hint}see `rankwise presets`")
    return PRESET_DIR / f"{name}.yaml"


def _looks_like_path(source: str) -> bool:
    return any(c in source for c in "/\\") or source.endswith((".yaml", ".yml")) or source.startswith(".")


def _check_regular_file(path: Path) -> Path:
    """``path`` if it is a regular file (a symlink to one counts); else a :class:`ConfigError` saying what it is."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"config file {path} is a directory, expected a YAML file")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"config file {path} is not a regular file (a device, FIFO or socket), expected a YAML file")
    return path


def _resolve_source(source: str | Path, base_dir: Path | None = None) -> Path:
    """An explicit path is a path (relative to ``base_dir`` for ``extends``); a bare name is a preset."""
    if isinstance(source, Path):
        return _check_regular_file(source)
    cand = (base_dir / source) if base_dir is not None else Path(source)
    if os.path.lexists(cand) or _looks_like_path(source):
        return _check_regular_file(cand)
    return preset_path(source)


def _read_config_text(path: Path) -> str:
    """The UTF-8 text of a config file, its size checked before it is read (errors name the file, never its text)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_CONFIG_BYTES:
                raise ConfigError(f"config file {path} is {size:,} bytes; the limit is {MAX_CONFIG_BYTES:,}")
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES:,} bytes")
    if data[:4] == b"PK\x03\x04" or b"\0" in data:
        raise ConfigError(f"config file {path} is a binary file, expected YAML text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"config file {path} is not UTF-8 text (byte 0x{data[e.start]:02x} on line {line})") from None


def load_raw(source: str | Path) -> dict[str, Any]:
    """Read a YAML file or preset into a raw dict, resolving ``extends:`` (path or preset name).

    A file must be a regular UTF-8 file of at most :data:`MAX_CONFIG_BYTES` holding a non-empty
    mapping, within the limits of :func:`parse_yaml`.
    """
    return _load_chain(source, (), None)[0]


def _load_chain(source: str | Path, seen: tuple[str, ...], base: Path | None) -> tuple[dict[str, Any], Provenance]:
    """The raw config of ``source`` with its ``extends:`` chain merged, and the origin of every value.

    Each file of the chain is read and parsed once. The origin maps a dotted key (a leaf of a file)
    to ``("preset", name)`` for a bundled preset's file, ``("file", path)`` for any other file.
    """
    path = _resolve_source(source, base)
    key = str(path.resolve())
    if key in seen:
        raise ConfigError(f"`extends` cycle through {path}")
    raw = parse_yaml(_read_config_text(path), f"config file {path}")
    if raw is None or raw == {}:
        raise ConfigError(
            f"config file {path} is empty; write at least `extends:` or `recipe:` (see `rankwise presets`)"
        )
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must contain a mapping, got {type(raw).__name__}")
    parent = raw.pop("extends", None)
    origin: Provenance = {}
    label = ("preset", path.stem) if path.resolve().parent == PRESET_DIR else ("file", str(path))
    leaves = _leaves(raw)
    if parent is not None:
        if not isinstance(parent, str) or not parent:
            raise ConfigError(f"`extends` in {path} must be a preset name or a file path, got {short(parent)}")
        below, origin = _load_chain(parent, (*seen, key), path.parent)
        raw = deep_merge(below, raw)
    for leaf in leaves:
        _set_origin(origin, leaf, label)
    return raw, origin


def _leaves(d: Any, prefix: str = "") -> list[str]:
    """The dotted keys that a nested mapping sets: its lists and scalars (an empty mapping sets nothing:
    merged, it keeps the values below it)."""
    if not isinstance(d, dict):
        return [prefix.rstrip(".")] if prefix else []
    return [leaf for k, v in d.items() for leaf in _leaves(v, f"{prefix}{k}.")]


def _set_origin(origin: Provenance, key: str, label: tuple[str, str]) -> None:
    """``key`` (and everything under it) now comes from ``label``."""
    for k in [k for k in origin if k == key or k.startswith(key + ".")]:
        del origin[k]
    origin[key] = label


def _select(node: list[Any], part: str, item: str) -> dict[str, Any]:
    """The list entry ``part`` of ``node``: an index, or the mapping whose ``name`` is ``part`` (appended if absent)."""
    if part.isdigit():
        i = int(part)
        if i >= len(node) or not isinstance(node[i], dict):
            raise ConfigError(f"--set {item}: no entry {i} (the list has {len(node)})")
        return node[i]
    for entry in node:
        if isinstance(entry, dict) and entry.get("name") == part:
            return entry
    node.append({"name": part})
    return node[-1]


def _is_list_field(parts: list[str]) -> bool:
    """Whether the dotted path ``parts`` of a :class:`Config` is a list field (e.g. ``loss.regularizers``)."""
    tp = walk(Config, tuple(parts))
    return tp is not None and get_origin(unwrap(tp)) is list


def _field_type(raw: dict[str, Any], key: str, recipes: RecipeLookup) -> Any:
    """The annotation of the config field at the dotted ``key`` (``task.*``: of ``raw``'s recipe, looked up
    in ``recipes``); ``None`` when the key names no field (an unknown key, a recipe that does not exist)."""
    parts = key.split(".")
    tp: Any = Config
    if parts[0] == "task":
        try:
            tp = recipes(str(raw.get("recipe", default_recipe()))).options
        except ValueError:
            return None
        parts = parts[1:]
    for part in parts:
        tp = unwrap(tp)
        if get_origin(tp) is list:  # a list entry, by its name or index
            tp = get_args(tp)[0]
        elif is_model(tp) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            return None
    return tp


def _takes(tp: Any, value: Any) -> bool:
    try:
        TypeAdapter(tp).validate_python(value, strict=True)
    except ValidationError:
        return False
    except Exception:  # pragma: no cover - an annotation pydantic cannot build alone
        return True
    return True


def override_value(raw: dict[str, Any], key: str, text: str, *, recipes: RecipeLookup) -> Any:
    """The value of ``--set key=text`` on the config ``raw``: ``text`` read as YAML (:func:`parse_yaml`).

    Where the field at ``key`` takes a string and not the YAML value (``run.name=2024``,
    ``run.name=null``), the value is the text as typed (stripped): the field's type decides (a
    ``task.*`` field's: of the recipe that ``recipes``, the look-up ``name -> Recipe``, gives). An
    empty ``text`` is the empty string.
    """
    check_lookup(recipes)
    if not text.strip():
        return ""
    value = parse_yaml(text, f"--set {key}")
    if isinstance(value, (str, dict, list)):
        return value
    tp = _field_type(raw, key, recipes)
    if tp is None or _takes(tp, value) or not _takes(tp, text.strip()):
        return value
    return text.strip()


def apply_overrides(raw: dict[str, Any], overrides: list[str] | None, *, recipes: RecipeLookup) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings (value parsed as YAML) to a raw dict (copied); ``recipes``: the recipe
    look-up ``name -> Recipe`` (:func:`override_value`).

    In a list of named entries (``loss.regularizers``) a key part selects the entry by ``name``
    (adding it if absent) or by index: ``loss.regularizers.ranksim.weight=1``. Values are read by
    :func:`override_value`: YAML 1.2 (:func:`parse_yaml`, its limits apply to each value), except
    that a string field keeps the text typed (``run.name=2024`` is the name ``"2024"``).
    """
    out = copy.deepcopy(raw)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        key = key.strip()
        if not key or any(not p for p in key.split(".")):
            raise ConfigError(f"--set expects key=value, got {item!r}")
        value = override_value(out, key, text, recipes=recipes)
        node: Any = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list):
                node = _select(node, part, item)
                continue
            if node.get(part) is not None and not isinstance(node[part], (dict, list)):
                where = ".".join(parts[: i + 1])
                raise ConfigError(
                    f"--set {item}: `{where}` is {type(node[part]).__name__} {short(node[part])} in the config, "
                    "not a mapping"
                )
            if not isinstance(node.get(part), (dict, list)):
                node[part] = [] if _is_list_field(parts[: i + 1]) else {}
            node = node[part]
        if isinstance(node, list):
            raise ConfigError(f"--set {item}: `{key}` names a list entry, set one of its fields")
        node[parts[-1]] = value
    return out


def load_config(
    source: str | Path | dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    *,
    recipes: RecipeLookup,
) -> Config:
    """Load a config file / preset name / raw dict, apply ``--set`` overrides, build it (one pass).

    ``recipes``: the recipe look-up ``name -> Recipe`` that resolves ``recipe:``
    (``rankwise.recipes.get_recipe``); :func:`rankwise.recipes.load_config` passes it.

    The files of an ``extends:`` chain are each read once; the origin of every value (the file or
    preset, or ``--set``) is kept on the config (:func:`inherited_options` reads it).
    """
    check_lookup(recipes)
    raw: dict[str, Any]
    origin: Provenance = {}
    if source is None:
        raw = {}
    elif isinstance(source, dict):
        raw = copy.deepcopy(source)
    else:
        raw, origin = _load_chain(source, (), None)
    switch = _switch_dataset(raw, overrides or [], recipes)
    if switch is not None:  # nothing of the old dataset stays (its options, its expected time)
        raw = copy.deepcopy(raw)
        raw.setdefault("data", {}).pop("options", None)
        raw.pop("expected_time", None)
        origin = {k: v for k, v in origin.items() if not (k == "expected_time" or k.startswith("data.options"))}
    cfg = config_from_dict(apply_overrides(raw, overrides, recipes=recipes), recipes=recipes)
    for item in overrides or []:
        _set_origin(origin, item.split("=", 1)[0].strip(), ("--set", item))
    cfg._provenance = origin
    cfg._switch = switch
    return cfg


def _switch_dataset(raw: dict[str, Any], overrides: list[str], recipes: RecipeLookup) -> DatasetSwitch | None:
    """The switch of ``raw``'s dataset to another registered one by ``--set data.name=...``, else ``None``
    (an unknown name, a value that is no name: the config's own check names it)."""
    given = tuple(item.partition("=")[0].strip() for item in overrides)
    if "data.name" not in given:
        return None
    text = [item.partition("=")[2] for item in overrides if item.partition("=")[0].strip() == "data.name"][-1]
    found = raw.get("data")
    data: dict[str, Any] = found if isinstance(found, dict) else {}
    old = data.get("name", "abalone")
    try:
        new = override_value(raw, "data.name", text, recipes=recipes)
    except ConfigError:
        return None
    from rankwise.data import list_datasets

    if new == old or not isinstance(new, str) or new not in list_datasets():
        return None
    options = data.get("options")
    return DatasetSwitch(str(old), new, copy.deepcopy(options) if options else None, copy.deepcopy(raw), given)


def dataset_switch(cfg: Config, *, pop: bool = False) -> DatasetSwitch | None:
    """How ``--set data.name=...`` switched ``cfg``'s file to another dataset (``None``: it did not);
    ``pop=True``: the run has fitted ``cfg`` to the new data, ``cfg`` forgets the switch."""
    switch = cfg._switch
    if pop:
        cfg._switch = None
    return switch


def inherited_options(cfg: Config) -> frozenset[str]:
    """The ``data.options`` keys of ``cfg`` whose value only a bundled preset gave.

    A key set by the user -- in their own config file (anywhere in its ``extends:`` chain above the
    preset) or by a ``--set`` of the key or of a mapping holding it -- is not inherited; nor is any
    key of a config built from a mapping (a run directory's saved ``config.yaml``, a config made in
    Python). Loaders use it to tell a preset's facts about its own dataset (e.g. MSLR-WEB10K's
    136 features) from the user's choices.

    Example:
        >>> from rankwise.recipes import load_config
        >>> cfg = load_config("mslr_web10k_listnet", ["data.options.path=mine"])
        >>> sorted(inherited_options(cfg))
        ['fold', 'num_features']
    """
    origin = cfg._provenance
    return frozenset(k for k in cfg.data.options if _only_from_preset(origin, f"data.options.{k}"))


def _only_from_preset(origin: Provenance, key: str) -> bool:
    """Whether every value at or under the dotted ``key`` came from a bundled preset."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):  # the key itself, else the nearest mapping set whole
        found = origin.get(".".join(parts[:i]))
        if found is not None:
            return found[0] == "preset"
    under = [v for k, v in origin.items() if k.startswith(key + ".")]
    return bool(under) and all(v[0] == "preset" for v in under)
