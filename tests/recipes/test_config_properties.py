"""Property-based tests of the config loader: YAML aliases, depth and value types (hypothesis).

Every generated document or value either loads to exactly what an independent reading gives,
or is refused with a :class:`ConfigError`; no other exception, no hang.
"""

from __future__ import annotations

import math
import re
import signal

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rankwise.recipes import load_config
from rankwise.recipes.config import (
    MAX_YAML_DEPTH,
    MAX_YAML_VALUES,
    ConfigError,
    parse_yaml,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _TimeLimit(BaseException):
    pass


def _limited(fn, seconds=20):
    def on_alarm(signum, frame):
        raise _TimeLimit(f"ran for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _alias_doc(width: int, levels: int) -> str:
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _expanded_values(width: int, levels: int) -> int:
    """Values of ``_alias_doc`` with every alias expanded, counted independently.

    The top mapping, one key scalar per level and the lists: ``l0`` holds ``width`` scalars, ``l_i``
    holds ``width`` copies of ``l_{i-1}``.
    """
    sizes = [1 + width]
    for _ in range(1, levels):
        sizes.append(1 + width * sizes[-1])
    return 1 + levels + sum(sizes)


@FAST
@given(st.integers(1, 12), st.integers(1, 9))
@example(10, 4)  # 11,115 values
@example(10, 5)  # 111,116 values: over the limit
@example(2, 9)
def test_alias_expansion_is_refused_exactly_beyond_the_limit(width, levels):
    text = _alias_doc(width, levels)
    total = _expanded_values(width, levels)
    if total <= MAX_YAML_VALUES:
        out = _limited(lambda: parse_yaml(text, "doc"))
        assert out == yaml.safe_load(text)
        assert len(out[f"l{levels - 1}"]) == width
    else:
        with pytest.raises(ConfigError, match="alias"):
            _limited(lambda: parse_yaml(text, "doc"))


@FAST
@given(st.integers(1, 3 * MAX_YAML_DEPTH), st.sampled_from(["flow_list", "flow_map", "block_map"]))
@example(MAX_YAML_DEPTH, "flow_list")
@example(MAX_YAML_DEPTH + 1, "flow_list")
@example(MAX_YAML_DEPTH + 1, "block_map")
def test_depth_is_refused_exactly_beyond_the_limit(depth, style):
    if style == "flow_list":
        text = "[" * depth + "1" + "]" * depth
    elif style == "flow_map":
        text = "{a: " * depth + "1" + "}" * depth
    else:
        text = "".join("  " * i + "a:\n" for i in range(depth - 1)) + "  " * (depth - 1) + "a: 1\n"
    if depth <= MAX_YAML_DEPTH:
        assert _limited(lambda: parse_yaml(text, "doc")) == yaml.safe_load(text)
    else:
        with pytest.raises(ConfigError, match="nested deeper"):
            _limited(lambda: parse_yaml(text, "doc"))


#: strings that YAML 1.1 (the safe dumper, which leaves them unquoted) reads as strings but the YAML 1.2
#: core schema reads as numbers (``0E0``, ``1e5``, ``0o17``): the two schemas differ there by design
_NUMBER_IN_1_2_ONLY = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|0o[0-7]+")

yaml_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=8).filter(lambda s: not _NUMBER_IN_1_2_ONLY.fullmatch(s)),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text("abc", min_size=1, max_size=3), inner, max_size=4)
    ),
    max_leaves=30,
)


@FAST
@given(yaml_values)
def test_plain_documents_load_as_the_safe_loader_reads_them(value):
    text = yaml.safe_dump(value)
    out = parse_yaml(text, "doc")
    assert out == yaml.safe_load(text)


@FAST
@given(st.text(max_size=60))
def test_any_text_loads_or_is_refused_with_a_config_error(text):
    try:
        expected = yaml.safe_load(text)
    except yaml.constructor.ConstructorError as e:
        if "tag:yaml.org,2002:value" in str(e):
            return  # a lone `=`: YAML 1.1's value key, which the YAML 1.2 core schema reads as the string "="
        expected = ConfigError
    except (yaml.YAMLError, RecursionError):
        expected = ConfigError
    if expected is ConfigError:
        with pytest.raises(ConfigError):
            parse_yaml(text, "doc")
        return
    try:
        out = parse_yaml(text, "doc")
    except ConfigError:  # e.g. a YAML 1.1 tag or form that the YAML 1.2 core schema does not have
        return
    if not _READ_ALIKE_IN_1_1_AND_1_2.fullmatch(text):
        return  # a plain scalar YAML 1.1 and 1.2 may type differently: tests/recipes/test_config_yaml_rules.py
    assert repr(out) == repr(expected)  # repr: a NaN equals itself


#: texts without digits, ``.``, ``:``, ``_``, ``=``, ``!`` or a letter that starts a YAML 1.1-only boolean,
#: so that the safe loader (YAML 1.1) is an oracle of the YAML 1.2 core schema for them
_READ_ALIKE_IN_1_1_AND_1_2 = re.compile(r"[^0-9.:_=!yYnNoOtTfF~]*")


_DECIMAL = re.compile(r"\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*")


def _expected_lr(value):
    """``optimizer.lr`` (a float > 0) read independently: a finite positive number or a decimal string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            return None
        value = float(value)
    if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
        return float(value)
    return None


@FAST
@given(
    yaml_values
    | st.from_regex(r"[+-]?[0-9_]{1,4}(\.[0-9]{0,2})?(e-?[0-9])?", fullmatch=True)
    | st.sampled_from(["nan", "inf", "1_0", " 1e-3", "0x10", "abc", "1e999", "-1", "0"])
)
def test_a_float_field_takes_finite_numbers_and_decimal_strings_only(value):
    expected = _expected_lr(value)
    raw = {"recipe": "dir", "optimizer": {"lr": value}}
    if expected is None:
        with pytest.raises(ConfigError, match=r"optimizer\.lr"):
            load_config(raw)
    else:
        assert load_config(raw).optimizer.lr == pytest.approx(expected)


@FAST
@given(yaml_values)
def test_an_int_field_takes_integers_in_range_only(value):
    raw = {"recipe": "dir", "trainer": {"max_epochs": value}}
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if ok:
        assert load_config(raw).trainer.max_epochs == value
    else:
        with pytest.raises(ConfigError, match=r"trainer\.max_epochs"):
            load_config(raw)


@FAST
@given(st.text(min_size=1, max_size=12).filter(lambda k: "=" not in k and "." not in k), yaml_values)
def test_set_overrides_of_unknown_keys_are_config_errors(key, value):
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    try:
        cfg = load_config("abalone_vanilla", [f"run.{key.strip()}={text}"])
    except ConfigError:
        return
    # only a real field of `run` with a fitting value may pass
    assert key.strip() in {"name", "seed", "out_dir", "plots", "tsne", "plot_samples", "many_shot", "few_shot"}
    assert cfg.run is not None
