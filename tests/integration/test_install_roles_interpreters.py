"""Dependencies by role, in a fresh interpreter: a client-only install works, and what needs an
extra fails naming it.

The client-only install is simulated in a fresh interpreter whose imports of every package outside
the client's dependencies fail, as they would where the package is not installed. What each role
declares is checked fast in tests/unit/test_install_roles.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# Importable names a client-only install does not have: the heavy packages, then the
# rest of the `server` extra (and what those bring along).
HEAVY_MODULES = ("onnxruntime", "tensorflow", "pyarrow", "pandas", "gevent", "boto3", "botocore", "google.cloud")
SERVER_MODULES = ("celery", "kombu", "redis", "hiredis", "flask", "werkzeug", "gunicorn", "pydantic",
                  "prometheus_client", "orjson", "wcmatch", "numpy", "simdjson", "google.api_core", "google.auth")


# Installed in front of everything else in the fresh interpreter (`BLOCKED` is set before it).
BLOCKER = """
import importlib.abc
import sys


class Blocked(importlib.abc.MetaPathFinder):
    \"\"\"Imports of the blocked packages fail as they do where the package is not installed.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if any(name == blocked or name.startswith(blocked + ".") for blocked in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


sys.meta_path.insert(0, Blocked())
for name in list(sys.modules):
    if any(name == blocked or name.startswith(blocked + ".") for blocked in BLOCKED):
        del sys.modules[name]
"""


def run_without(blocked: tuple[str, ...], code: str) -> str:
    """Run `code` in a fresh interpreter (the repository importable) where `blocked` cannot be
    imported; its stdout. The code fails the test by raising."""
    script = f"BLOCKED = {blocked!r}\n{BLOCKER}\n{textwrap.dedent(code)}"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


CLIENT_ONLY = HEAVY_MODULES + SERVER_MODULES


def test_the_cli_and_the_client_import_and_run_their_commands_without_the_server_or_any_runtime():
    out = run_without(CLIENT_ONLY, r'''
        import json
        import tarfile
        import io
        import tempfile
        import threading
        import time
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from pathlib import Path

        import cortex
        import sluice
        import sluice.client
        from click.testing import CliRunner
        from predictors_runtime.project import pack_project
        from sluice.cli import main

        uploads = []

        class FakeSluice(BaseHTTPRequestHandler):
            """Just enough of Sluice's API for `deploy` and `get`."""

            def answer(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/apis":
                    self.answer({"apis": [{"name": "iris", "kind": "BatchAPI", "deployed_at": time.time() - 90}]})
                elif self.path.startswith("/batch/iris?"):
                    self.answer({"jobs": [{"job_id": "j1", "status": "status_running"}]})
                else:
                    self.send_error(404)

            def do_POST(self):
                uploads.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.answer({"apis": [{"name": "iris", "kind": "BatchAPI", "queue": "cpu",
                                       "bundle": "0123456789abcdef", "ignored_fields": []}]})

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSluice)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"

        runner = CliRunner()
        for args in (["--help"], ["get", "--help"], ["deploy", "--help"], ["submit", "--help"], ["wait", "--help"],
                     ["logs", "--help"], ["predict", "--help"], ["stop", "--help"], ["delete", "--help"]):
            result = runner.invoke(main, args)
            assert result.exit_code == 0, (args, result.output, result.exception)
            assert "Usage:" in result.output

        project = Path(tempfile.mkdtemp())
        (project / "cortex.yaml").write_text("- name: iris\n  kind: BatchAPI\n"
                                             "  predictor:\n    type: python\n    path: predictor.py\n")
        (project / "predictor.py").write_text("class PythonPredictor:\n    pass\n")
        (project / ".cortexignore").write_text("data/\n")
        (project / "data").mkdir()
        (project / "data" / "big.bin").write_bytes(b"x" * 1000)
        with tarfile.open(fileobj=io.BytesIO(pack_project(project, project / "cortex.yaml")), mode="r:gz") as tar:
            members = sorted(tar.getnames())

        deployed = runner.invoke(main, ["--url", url, "deploy", str(project / "cortex.yaml")])
        listed = runner.invoke(main, ["--url", url, "get"])
        print(json.dumps({"members": members, "uploaded": len(uploads[0]) if uploads else 0,
                          "deploy": [deployed.exit_code, deployed.output],
                          "get": [listed.exit_code, listed.output],
                          "client": [sluice.Client.__name__, cortex.client(url).url == url]}))
    ''')
    report = json.loads(out.strip().splitlines()[-1])

    assert report["members"] == ["predictor.py"]  # data/ left out by .cortexignore; the config goes apart
    assert report["deploy"][0] == 0, report["deploy"][1]
    assert "deployed iris (BatchAPI, queue cpu, bundle 0123456789ab)" in report["deploy"][1]
    assert report["uploaded"] > 0
    assert report["get"][0] == 0, report["get"][1]
    assert "iris" in report["get"][1] and "1 running" in report["get"][1]
    assert report["client"] == ["Client", True]


@pytest.mark.parametrize("command", [["up"], ["serve", "iris"], ["replicas"], ["proxy", "--management", "127.0.0.1:1"]])
def test_a_server_command_without_the_server_extra_fails_naming_it(command):
    out = run_without(CLIENT_ONLY, f'''
        from click.testing import CliRunner
        from sluice.cli import main

        result = CliRunner().invoke(main, {command!r})
        print(result.exit_code)
        print(result.output)
    ''')

    code, _, output = out.partition("\n")
    assert code == "1"
    assert re.search(rf"error: `sluice {command[0]}` needs \w+, which is not installed: pip install 'sluice\[server\]'",
                     output), output
    assert "Traceback" not in output


def test_cloud_storage_and_tabular_outputs_without_their_extras_fail_naming_them():
    out = run_without(CLIENT_ONLY, '''
        import json

        from jobs.batch.outputs import encode_rows
        from foundation.errors import MissingExtra
        from predictors_runtime.storage import storage_for

        messages = {}
        for name, attempt in {
            "s3": lambda: storage_for("s3://bucket/key"),
            "gs": lambda: storage_for("gs://bucket/key"),
            "csv": lambda: encode_rows([{"a": 1}], "csv"),
            "parquet": lambda: encode_rows([{"a": 1}], "parquet"),
        }.items():
            try:
                attempt()
            except MissingExtra as e:
                messages[name] = e.message
        messages["local"] = type(storage_for("/tmp")).__name__  # what needs no extra still works
        messages["jsonl"] = encode_rows([{"a": 1}], "jsonl").decode()
        print(json.dumps(messages))
    ''')
    messages = json.loads(out)

    assert messages["s3"] == "s3:// storage needs boto3, which is not installed: pip install 'sluice[s3]'"
    assert messages["gs"] == ("gs:// storage needs google-cloud-storage, which is not installed: "
                              "pip install 'sluice[gcs]'")
    assert messages["csv"] == ("writing csv job outputs needs pyarrow, which is not installed: "
                               "pip install 'sluice[server]'")
    assert "pip install 'sluice[server]'" in messages["parquet"]
    assert messages["local"] == "LocalStorage"
    assert messages["jsonl"] == '{"a": 1}\n'


def test_a_predictor_whose_runtime_is_missing_fails_to_build_naming_the_extra():
    out = run_without(("onnxruntime", "tensorflow"), '''
        import json

        from foundation.errors import MissingExtra
        from predictors_runtime.extras import require_predictor_runtime

        messages = {}
        for predictor_type in ("python", "onnx", "tensorflow"):
            try:
                require_predictor_runtime(predictor_type)
                messages[predictor_type] = None
            except MissingExtra as e:
                messages[predictor_type] = e.message
        print(json.dumps(messages))
    ''')
    messages = json.loads(out)

    assert messages["python"] is None
    assert messages["onnx"] == ("the onnx predictor type needs onnxruntime, which is not installed: "
                                "pip install 'sluice[onnx]'")
    assert "pip install 'sluice[tensorflow]'" in messages["tensorflow"]
    assert "sluice[tensorflow-cpu]" in messages["tensorflow"]


def test_an_onnx_predictor_on_a_host_without_onnxruntime_fails_to_build_naming_the_extra(tmp_path: Path):
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "predictor.py").write_text("class ONNXPredictor:\n    def __init__(self, onnx_client, config):\n"
                                         "        self.client = onnx_client\n\n    def predict(self, payload):\n"
                                         "        return self.client.predict(payload)\n")
    (folder / "model.onnx").write_bytes(b"never loaded")
    config = ("- name: iris\n  kind: RealtimeAPI\n"
              "  predictor: {type: onnx, path: predictor.py, models: {path: model.onnx}}\n")

    out = run_without(("onnxruntime",), f'''
        from pathlib import Path

        from predictors_runtime.builder import build_predictor
        from predictors_runtime.config import parse_api_configs
        from foundation.errors import PredictorError

        [api] = parse_api_configs({config!r})
        try:
            build_predictor(Path({str(folder)!r}), api, {{}}, model_cache_dir=Path({str(tmp_path / "models")!r}),
                            poll_interval_s=10.0)
        except PredictorError as e:
            print(e.message)
    ''')

    assert out.strip() == ("preparing the model client failed: the onnx predictor type needs onnxruntime, which is not "
                           "installed: pip install 'sluice[onnx]'")


def test_a_folder_named_sluice_beside_a_script_does_not_shadow_the_installed_package(tmp_path):
    # A clone of the repository called `sluice`, and a script in the folder that holds it.
    (tmp_path / "sluice" / "docs").mkdir(parents=True)
    (tmp_path / "sluice" / "README.md").write_text("a clone\n")
    script = tmp_path / "use_sluice.py"
    script.write_text("import sluice\nprint(sluice.__file__)\nprint(callable(sluice.client))\n")

    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=60)

    assert ran.returncode == 0, ran.stderr
    where, callable_client = ran.stdout.split()
    assert where.endswith("sluice/__init__.py") and not where.startswith(str(tmp_path)) and callable_client == "True"
