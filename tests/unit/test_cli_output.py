"""The `sluice` command's surface without a Sluice: which commands take `-o json`, usage errors, and
`predict -o json` against a tiny local HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import click
import pytest
from click.testing import CliRunner

from sluice.cli import main

# Commands that run a server until stopped, printing only where it runs: no document to shape.
SERVERS = {"up", "serve", "replicas", "proxy", "workers"}
# A group's commands are listed as "group command" (`sluice env ls`).
PRINTING = sorted(
    [f"{name} {sub}" for name, command in main.commands.items() if isinstance(command, click.Group)
     for sub in command.commands]
    + [name for name, command in main.commands.items() if not isinstance(command, click.Group) and name not in SERVERS])


def test_the_servers_are_the_only_commands_left_out():
    assert set(main.commands) >= SERVERS
    assert {"version", "deploy", "get", "submit", "wait", "stop", "predict", "delete", "logs"} <= set(PRINTING)


@pytest.mark.parametrize("name", PRINTING)
def test_every_printing_command_takes_output_json(name):
    group, _, sub = name.partition(" ")
    command = main.commands[group]
    if sub:
        assert isinstance(command, click.Group)
        command = command.commands[sub]
    [option] = [p for p in command.params if isinstance(p, click.Option) and "-o" in p.opts]

    assert "--output" in option.opts
    assert isinstance(option.type, click.Choice) and "json" in option.type.choices


def test_delete_with_a_job_id_and_force_is_a_usage_error_before_anything_is_sent():
    # Nothing listens on port 1: a request would fail as unreachable, not as a usage error.
    result = CliRunner().invoke(main, ["--url", "http://127.0.0.1:1", "delete", "ap", "0123abcd", "--force"])

    assert result.exit_code == 2, result.output
    assert "--force" in result.output and "job" in result.output


class _Answering(BaseHTTPRequestHandler):
    """Answers `POST /text` with text/plain and `POST /binary` with bytes that are not UTF-8;
    `GET /apis/<name>` says `batchy` is a BatchAPI and any other name a RealtimeAPI."""

    posted: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        body = json.dumps({"name": name, "kind": "BatchAPI" if name == "batchy" else "RealtimeAPI",
                           "endpoint": f"/{name}"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        _Answering.posted.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        kind, data = ("text/plain", b"hello") if self.path == "/text" else ("application/octet-stream", b"\xff\xfe")
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answering)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_predict_with_output_json_prints_a_text_answer_as_a_json_string(answering):
    runner = CliRunner()

    as_json = runner.invoke(main, ["--url", answering, "predict", "text", "--data", "x", "-o", "json"])
    as_is = runner.invoke(main, ["--url", answering, "predict", "text", "--data", "x"])

    assert as_json.exit_code == 0 and json.loads(as_json.stdout) == "hello"
    assert as_is.exit_code == 0 and as_is.stdout == "hello\n"


def test_predict_with_output_json_refuses_a_binary_answer_in_one_line(answering):
    result = CliRunner().invoke(main, ["--url", answering, "predict", "binary", "--data", "x", "-o", "json"])

    assert result.exit_code == 1 and result.stdout == ""
    assert "2 bytes of binary data" in result.stderr and "leave out -o json" in result.stderr


def test_predict_on_a_batch_api_is_refused_naming_the_verb_that_submits_a_job_and_sends_nothing(answering):
    _Answering.posted.clear()
    result = CliRunner().invoke(main, ["--url", answering, "predict", "batchy", "--data", "{}"])

    assert result.exit_code == 1
    assert "api batchy is a BatchAPI, not a RealtimeAPI: submit a job: sluice submit batchy" in result.stderr
    assert _Answering.posted == []


def test_sluice_dash_dash_version_prints_the_version_as_the_version_command_does():
    runner = CliRunner()
    flag, command = runner.invoke(main, ["--version"]), runner.invoke(main, ["version"])

    assert flag.exit_code == command.exit_code == 0
    assert flag.stdout == command.stdout and flag.stdout.startswith("sluice ")


def test_a_progress_line_says_what_a_job_does_until_its_first_batch_ends():
    from sluice.cli.render import progress_line

    building = {"status": "status_running", "total_batch_count": 15, "phase": "building the predictor on n1",
                "batch_metrics": {"succeeded": 0, "failed": 0}}
    running = {"status": "status_running", "total_batch_count": 15, "batch_metrics": {"succeeded": 3, "failed": 1}}

    assert progress_line(building).endswith("0/15 batches (0 failed) building the predictor on n1")
    assert progress_line(running).endswith("4/15 batches (1 failed) running")


def test_a_server_message_in_a_table_is_printed_as_it_is_brackets_and_all(capsys):
    from sluice.cli.render import print_table

    message = "KeyError: ['sepal_length'] missing [/bold] from item [3]"
    print_table(None, ["batch", "error"], [["3", message]])  # rich markup would eat [...], or raise on [/bold]

    assert message in capsys.readouterr().out


def test_a_job_ended_out_of_memory_is_said_in_words_beside_cortexs_status():
    from sluice.cli.render import status_word

    assert status_word("status_worker_oom") == "worker_oom: out of memory"
    assert status_word("status_succeeded") == "succeeded"
