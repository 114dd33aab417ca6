"""The shipped iris example runs end to end, driven through the `sluice` command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sluice.cli import main

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "iris-batch"


@pytest.fixture(scope="module")
def trained_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the example, trained there (train.py writes model.pkl next to itself), so that the
    test leaves nothing in the checkout."""
    example = tmp_path_factory.mktemp("examples") / EXAMPLE.name
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("model.pkl", "__pycache__"))
    subprocess.run([sys.executable, str(example / "train.py")], check=True, capture_output=True)
    return example


def test_the_iris_example_deploys_and_classifies_every_sample_through_the_cli(stack, trained_example, tmp_path):
    runner = CliRunner()
    deployed = runner.invoke(main, ["--url", stack.url, "deploy", str(trained_example / "cortex.yaml")])
    assert deployed.exit_code == 0, deployed.output
    assert "deployed iris-batch" in deployed.output

    submitted = runner.invoke(main, [
        "--url", stack.url, "submit", "iris-batch", "--items", str(trained_example / "sample.json"),
        "--batch-size", "10", "--workers", "2", "--config", json.dumps({"results_dir": str(tmp_path)}), "--wait",
    ])

    assert submitted.exit_code == 0, submitted.output
    final = json.loads(submitted.stdout)  # one document: the final job_status
    job_id = final["job_id"]
    assert final["status"] == "status_succeeded"
    summary = json.loads((tmp_path / job_id / "summary.json").read_text())
    assert (summary["job_id"], summary["batches"], summary["items"]) == (job_id, 15, 150)
    assert set(summary["labels"]) == {"setosa", "versicolor", "virginica"}
    assert sum(summary["labels"].values()) == 150
    assert min(summary["labels"].values()) >= 40  # a trained model, not a constant
    status = runner.invoke(main, ["--url", stack.url, "status", "iris-batch", job_id])
    assert json.loads(status.output)["status"] == "status_succeeded"
    listed = runner.invoke(main, ["--url", stack.url, "jobs", "iris-batch"])
    assert job_id in listed.output


def test_the_cli_reports_server_errors_plainly(stack):
    result = CliRunner().invoke(main, ["--url", stack.url, "status", "no-such-api", "123"])

    assert result.exit_code != 0
    assert "api no-such-api is not deployed" in str(result.exception) + result.output
