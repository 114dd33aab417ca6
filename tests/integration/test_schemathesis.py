"""Schemathesis against a live Sluice: every request it generates from `GET /openapi.json` is answered
without a 5xx, with a documented status, content type, headers and a body that fits the schema.

The stack is the real one (redis-server, a Celery worker node, beat, the management API behind
the proxy, a realtime replica), started for this module alone: the stateful phase follows links
and deletes what it finds, which must not reach the APIs of other tests. A BatchAPI and a
RealtimeAPI are deployed, and the operations on `/batch/{api_name}`, `/{api_name}` and
`GET /apis/{name}` are pointed at them so generated requests get past the name lookup;
`DELETE /apis/{name}` at a name never deployed, so both stay until the stateful phase deletes what
it finds; every other operation gets generated names.

Schemathesis runs as its CLI in a child process, with a fixed seed and a bounded number of
examples per operation, so a failure replays the same way; its report (with a curl line per
failing case) is the assertion message.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import requests
import yaml

from sluice.embedded import Stack, free_port

from .conftest import FAST_LOOPS, ROOM, closing_client

pytestmark = pytest.mark.integration

SEED = 20_240_610
MAX_EXAMPLES = 20
BATCH_API = "st-rows"
REALTIME_API = "st-echo"
NEVER_DEPLOYED = "st-never-deployed"

# Every check schemathesis has, but two whose premise Sluice's API does not share:
# - positive_data_acceptance: a submission and a deploy are also checked against the world (the
#   input files exist, a local path lies under SLUICE_LOCAL_INPUT_ROOTS, the YAML config parses and
#   names a predictor file of the project), which no schema can say, so a schema-valid body may
#   rightly get a 400;
# - use_after_free: `DELETE /batch/{api}?jobID=` stops a job (Cortex's API), and a stopped job's
#   status and failed batches stay readable by design.
EXCLUDED_CHECKS = ("positive_data_acceptance", "use_after_free")

# Well-behaved for any payload: it answers what it received, never an object that cannot be sent
# (a predictor that returns one gets a 500 predictor_error, rightly, which is not what is tested here).
PREDICTOR = """
class PythonPredictor:
    def __init__(self, config, job_spec=None):
        pass

    def predict(self, payload, batch_id=None):
        return {"received": type(payload).__name__}
"""

# Schemathesis's default unexpected methods, but OPTIONS (see CONFIG).
UNEXPECTED_BUT_OPTIONS = '["GET", "PUT", "POST", "DELETE", "PATCH", "TRACE", "QUERY"]'

CONFIG = f"""
# Every check schemathesis has (all are on unless a line turns one off), but EXCLUDED_CHECKS.
{chr(10).join(f"checks.{name}.enabled = false" for name in EXCLUDED_CHECKS)}

# Each block names one filter: schemathesis applies a block to every operation that any of its
# filters matches (a path *or* a method), and the first block naming `parameters` decides them.
[[operations]]
include-path-regex = "^/batch/"
parameters = {{ "path.api_name" = "{BATCH_API}" }}

# One path serves two kinds of API: a RealtimeAPI's replicas answer GET and POST, a BatchAPI's job
# endpoint DELETE too. GET and POST go to the realtime API, DELETE (stop a job) to the batch API.
# The document lists the union of methods, while a replica's `Allow` rightly lists its own, so
# OPTIONS is left out of this path's unexpected methods.
[[operations]]
include-operation-id = "getAtApiPath"
parameters = {{ "path.api_name" = "{REALTIME_API}" }}
phases.coverage.unexpected-methods = {UNEXPECTED_BUT_OPTIONS}

# A prediction's body and query are the predictor's to judge: the replica hands it any of them
# (bytes for an unknown type), so no generated value is invalid for the API itself.
[[operations]]
include-operation-id = "predictOrSubmitJob"
parameters = {{ "path.api_name" = "{REALTIME_API}" }}
phases.coverage.unexpected-methods = {UNEXPECTED_BUT_OPTIONS}
checks.negative_data_rejection.enabled = false

[[operations]]
include-operation-id = "stopJobAtApiPath"
parameters = {{ "path.api_name" = "{BATCH_API}" }}
phases.coverage.unexpected-methods = {UNEXPECTED_BUT_OPTIONS}

[[operations]]
include-operation-id = "getApi"
parameters = {{ "path.name" = "{REALTIME_API}" }}

# Deleting an API is generated on a name never deployed, so that the run's two APIs stay for every
# phase; the stateful phase still deletes what it deployed through the links.
[[operations]]
include-operation-id = "deleteApi"
parameters = {{ "path.name" = "{NEVER_DEPLOYED}" }}
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    """A stack of its own with a BatchAPI and a ready RealtimeAPI deployed; yields its public URL."""
    data_dir = tmp_path_factory.mktemp("schemathesis-stack")
    env = {**FAST_LOOPS, "SLUICE_LOCAL_INPUT_ROOTS": str(data_dir / "inputs")}
    with Stack(port=free_port(), offers=ROOM, workers=1, data_dir=data_dir, env=env) as running:
        project = data_dir / "project"
        project.mkdir()
        (project / "predictor.py").write_text(PREDICTOR)
        apis = [{"name": name, "kind": kind, "predictor": {"type": "python", "path": "predictor.py"}}
                for name, kind in ((BATCH_API, "BatchAPI"), (REALTIME_API, "RealtimeAPI"))]
        (project / "cortex.yaml").write_text(yaml.safe_dump(apis))
        client = closing_client(running.url, timeout=30)
        client.deploy(project / "cortex.yaml")
        client.wait_ready(REALTIME_API, timeout=120)
        yield running.url
        print(running.logs())


def test_no_generated_request_gets_a_server_error_or_an_answer_the_document_does_not_describe(live, tmp_path):
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "--no-color",
        "run", f"{live}/openapi.json",
        "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "1",
        "--request-timeout", "30", "--report-dir", str(tmp_path / "report"),
    ]

    # Run from the test's folder: schemathesis keeps its state in `./.schemathesis` (and Hypothesis's
    # database, see tests/conftest.py, is kept out of the checkout too).
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)

    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    # Every operation of the document was exercised, none skipped for want of a way to call it.
    operations = sum(len(item) for item in requests.get(f"{live}/openapi.json", timeout=30).json()["paths"].values())
    tested = re.search(r"Tested:\s+(\d+)", report)
    loaded = re.search(r"Operations:\s+\d+ selected / (\d+) total", report)
    assert tested is not None and loaded is not None, report
    assert int(tested.group(1)) == int(loaded.group(1)), report
    # Schemathesis may leave out `GET /openapi.json`, the very document it loaded from that address.
    assert int(loaded.group(1)) in (operations, operations - 1), report
