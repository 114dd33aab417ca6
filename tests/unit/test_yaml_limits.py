"""Reading a cortex.yaml within limits: alias expansion, nesting depth, size, and odd values."""

from __future__ import annotations

import pytest

from foundation.errors import ConfigError
from predictors_runtime.config import parse_api_configs
from predictors_runtime.config_yaml import MAX_CONFIG_BYTES, MAX_YAML_ALIAS_EXPANSION, MAX_YAML_DEPTH
from tests.hostile import billion_laughs

HEAD = "- name: api\n  kind: BatchAPI\n  predictor:\n    type: python\n    path: predictor.py\n    config:\n"


def refusal(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_api_configs(text)
    assert info.value.http_status == 400
    return info.value.message


def laughs(levels: int, width: int) -> str:
    return billion_laughs(HEAD, levels, width)


@pytest.mark.timeout(60)
def test_a_billion_laughs_is_refused_at_once_naming_the_alias_limit():
    message = refusal(laughs(levels=9, width=9))  # 9**9 = 387 million strings once expanded

    assert f"aliases expand the document by more than the limit of {MAX_YAML_ALIAS_EXPANSION} nodes" in message
    assert message.startswith("cortex.yaml: line 1, column 1: invalid YAML: ")


def test_a_smaller_alias_bomb_is_refused_too():
    assert "aliases expand" in refusal(laughs(levels=7, width=7))  # 7**7 = 823,543 strings


def test_an_alias_inside_its_own_anchor_is_refused():
    assert "recursive structure" in refusal(HEAD + "      loop: &loop [*loop]\n")


@pytest.mark.parametrize("style", ["flow", "block"])
def test_yaml_nested_5000_deep_is_refused_naming_the_depth_limit(style):
    if style == "flow":
        text = HEAD + "      deep: " + "[" * 5000 + "]" * 5000 + "\n"
    else:  # indentation: 1,000 levels already make a 1 MB file
        text = HEAD + "".join("  " * (i + 3) + f"k{i}:\n" for i in range(900)) + "  " * 903 + "v\n"

    assert f"nested deeper than the limit of {MAX_YAML_DEPTH} levels" in refusal(text)


def test_aliases_that_nest_past_the_depth_limit_are_refused():
    chain = "      a0: &a0 " + "[" * 40 + "x" + "]" * 40 + "\n"
    chain += "".join(f"      a{i}: &a{i} " + "[" * 40 + f"*a{i - 1}" + "]" * 40 + "\n" for i in range(1, 4))

    assert "aliases nest the document deeper than the limit" in refusal(HEAD + chain)


def test_nesting_up_to_the_limit_is_read():
    # Levels counted: the list of APIs, the API, predictor, config, then `deep`'s lists and the 1.
    depth = MAX_YAML_DEPTH - 5
    (api,) = parse_api_configs(HEAD + "      deep: " + "[" * depth + "1" + "]" * depth + "\n")

    value, levels = api.predictor.config["deep"], 0
    while isinstance(value, list):
        value, levels = value[0], levels + 1
    assert (levels, value) == (depth, 1)
    assert "nested deeper" in refusal(HEAD + "      deep: " + "[" * (depth + 1) + "1" + "]" * (depth + 1) + "\n")


def test_anchors_aliases_and_merge_keys_of_ordinary_size_still_work():
    text = (
        "- &base\n  name: first\n  kind: BatchAPI\n  predictor: &predictor\n    type: python\n"
        "    path: predictor.py\n    config: {shared: [1, 2, 3]}\n"
        "- name: second\n  kind: BatchAPI\n  predictor: *predictor\n"
        "- <<: *base\n  name: third\n"
    )

    configs = parse_api_configs(text)

    assert [c.name for c in configs] == ["first", "second", "third"]
    assert all(c.predictor.config == {"shared": [1, 2, 3]} for c in configs)


def test_a_config_over_one_mebibyte_is_refused_naming_the_limit():
    text = HEAD + "      blob: '" + "x" * MAX_CONFIG_BYTES + "'\n"

    assert f"over the limit of {MAX_CONFIG_BYTES} bytes" in refusal(text)


@pytest.mark.parametrize("number", ["1" + "0" * 100_000, "0x" + "f" * 5000, "1" + ":0" * 5000])
def test_an_enormous_integer_is_refused_naming_the_limit(number):
    assert "an integer longer than the limit of 100 characters" in refusal(HEAD + f"      n: {number}\n")


@pytest.mark.parametrize("value", ["2001-02-30", "2001-13-01 10:00:00"])
def test_an_impossible_date_is_a_config_error_with_its_line(value):
    assert refusal(HEAD + f"      when: {value}\n").startswith(
        "cortex.yaml: line 7, column 13: invalid YAML: invalid value")


@pytest.mark.parametrize("path", ['"/models/\\0"', '"\\ud800"'])
def test_a_models_path_with_a_nul_or_a_lone_surrogate_is_refused(path):
    text = "- name: api\n  kind: BatchAPI\n  predictor:\n    type: python\n    path: p.py\n    models:\n"
    message = refusal(text + f"      dir: {path}\n")

    assert "predictor.models.dir: " in message
