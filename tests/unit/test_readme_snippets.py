"""Every code block of the README and docs/ says whether a test runs it; what is not run is still read:
Python compiles and its imports resolve, YAML parses, an API config in it validates."""

from __future__ import annotations

import ast
import importlib

import pytest
import yaml

from predictors_runtime.config import parse_deployment
from tests.readme_snippets import all_snippets

ALL = all_snippets()


def test_the_readme_has_blocks_to_run() -> None:
    assert sum(s.runs for s in ALL) >= 4


@pytest.mark.parametrize("snippet", ALL, ids=lambda s: s.where)
def test_every_block_says_whether_it_is_run(snippet) -> None:
    assert snippet.marker is not None, (
        f"{snippet.where}: put `<!-- snippet: run -->` or `<!-- snippet: skip: <why> -->` "
        "on the line before the block")


@pytest.mark.parametrize("snippet", [s for s in ALL if s.language == "python"], ids=lambda s: s.where)
def test_python_blocks_compile_and_import_what_exists(snippet) -> None:
    tree = ast.parse(snippet.text, filename=snippet.where)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{snippet.where}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


@pytest.mark.parametrize("snippet", [s for s in ALL if s.language == "yaml"], ids=lambda s: s.where)
def test_yaml_blocks_parse_and_api_configs_validate(snippet) -> None:
    document = yaml.safe_load(snippet.text)
    if isinstance(document, list) and all(isinstance(api, dict) and "kind" in api for api in document):
        deployment = parse_deployment(snippet.text, snippet.where)  # as `sluice deploy` reads it
        assert deployment.apis or deployment.splitters
