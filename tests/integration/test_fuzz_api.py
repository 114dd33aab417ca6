"""Hostile requests against the management API: every one is answered, none with a 5xx.

A seeded generator builds bodies of the kinds that once answered 500 (deep nesting, huge
integers, lone surrogates, NUL bytes, huge query numbers, YAML bombs, odd archives) among
plain wrong ones, and sends them through Flask's test client to an app on a real Redis. A
failure lists the cases that answered 5xx, so a found bug can be replayed by its seed.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import random
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from api.app import create_app
from foundation.settings import Settings
from predictors_runtime.project import pack_project
from tests.hostile import bundle_declaring

pytestmark = pytest.mark.integration

SEED = 20_240_610
CASES_PER_ENDPOINT = 150

SUBMISSION_FIELDS = ("workers", "timeout", "config", "item_list", "file_path_lister", "delimited_files",
                     "sqs_dead_letter_queue", "output", "retry_failed_of")
NUMERIC_PATHS = (("workers",), ("timeout",), ("item_list", "batch_size"),
                 ("sqs_dead_letter_queue", "max_receive_count"))
TEXT_PATHS = (("delimited_files", "s3_paths", 0), ("file_path_lister", "s3_paths", 0),
              ("file_path_lister", "includes", 0), ("output", "path"), ("retry_failed_of",))


@pytest.fixture(scope="module")
def app_client(redis_server: str, tmp_path_factory: pytest.TempPathFactory):
    """A management app on database 2 of the session's Redis, with one BatchAPI deployed."""
    url = redis_server.rsplit("/", 1)[0] + "/2"
    redis.Redis.from_url(url).flushdb()
    folder = tmp_path_factory.mktemp("fuzz")
    inputs = folder / "inputs"
    inputs.mkdir()
    (inputs / "rows.jsonl").write_text("".join(f"{i}\n" for i in range(10)))
    settings = Settings(redis_url=url, storage=str(folder / "storage"), cache_dir=str(folder / "cache"),
                        local_input_roots=(str(inputs),))
    app = create_app(settings)
    client = app.test_client()
    response = _deploy(client, _config_text("fuzz-target"), _project_bundle(folder / "project"))
    assert response.status_code == 201, response.get_data(as_text=True)
    yield client, inputs
    redis.Redis.from_url(url).flushdb()


def _config_text(name: str, **predictor: Any) -> str:
    spec = {"type": "python", "path": "predictor.py", **predictor}
    return yaml.safe_dump([{"name": name, "kind": "BatchAPI", "predictor": spec}])


def _project_bundle(folder: Path) -> bytes:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text("class PythonPredictor:\n    def __init__(self, config, job_spec):\n"
                                         "        pass\n\n    def predict(self, payload, batch_id):\n"
                                         "        return None\n")
    return pack_project(folder)


def _deploy(client: Any, config: str | bytes, project: bytes) -> Any:
    data = {
        "config": (io.BytesIO(config.encode("utf-8", "surrogatepass") if isinstance(config, str) else config),
                   "cortex.yaml"),
        "project": (io.BytesIO(project), "project.tar.gz"),
    }
    return client.post("/apis", data=data, content_type="multipart/form-data")


# -- hostile values -----------------------------------------------------------------------------

def _deep(rng: random.Random, depth: int) -> str:
    """A JSON text nested `depth` levels, of lists or of objects."""
    if rng.random() < 0.5:
        return "[" * depth + "1" + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def _huge_int(rng: random.Random) -> str:
    return str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(rng.choice(
        [20, 400, 4299, 4301, 100_000])))


def _hostile_text(rng: random.Random, inputs: Path) -> str:
    """A JSON string literal (already quoted and escaped) of the kinds that used to answer 500."""
    root = json.dumps(str(inputs))[1:-1]
    return rng.choice([
        r'"\ud800"', r'"/x/\udfff.jsonl"', r'"a\u0000b"', r'"/data/\u0000"', r'"s3://b/\ud83d"',
        f'"{root}/\\u0000"', f'"{root}/\\udc80.jsonl"', f'"{root}\\u0000/rows.jsonl"',
        json.dumps("x" * rng.choice([1, 10_000, 200_000])), json.dumps("\u202e\u0000\uffff"),
        '""', "null", "12", "[]", "{}", "true", json.dumps("file:///etc/passwd"), json.dumps("../../etc"),
        json.dumps("s3:/" + "a" * 300), json.dumps("gs://"), json.dumps("s3://"),
    ])


def _hostile_number(rng: random.Random) -> str:
    return rng.choice([
        _huge_int(rng), "-" + _huge_int(rng), "0", "-1", "1e308", "1e999", "-1e999", "NaN", "Infinity",
        "1.5", "2.0", "true", "null", '"7"', "[]", "{}", str(2**63), str(2**64 + 1), "-0",
    ])


def _valid_body(rng: random.Random, inputs: Path, kind: str | None = None) -> dict[str, Any]:
    kind = kind or rng.choice(["item_list", "delimited_files", "file_path_lister"])
    if kind == "item_list":
        body: dict[str, Any] = {"item_list": {"items": list(range(rng.randint(1, 20))), "batch_size": 3}}
    else:
        body = {kind: {"s3_paths": [str(inputs)], "batch_size": 2}}
    if rng.random() < 0.5:
        body["workers"] = rng.randint(1, 3)
    if rng.random() < 0.3:
        body["config"] = {"k": rng.random()}
    return body


def _set(body: dict[str, Any], path: tuple[Any, ...], marker: str) -> None:
    """Put `marker` at `path`, making the containers on the way."""
    node: Any = body
    for part, following in itertools.pairwise(path):
        if isinstance(node, list):
            while len(node) <= part:
                node.append(None)
            if not isinstance(node[part], (dict, list)):
                node[part] = [] if isinstance(following, int) else {}
            node = node[part]
        else:
            if not isinstance(node.get(part), (dict, list)):
                node[part] = [] if isinstance(following, int) else {}
            node = node[part]
    last = path[-1]
    if isinstance(node, list):
        while len(node) <= last:
            node.append(None)
    node[last] = marker


def _with_raw(body: dict[str, Any], path: tuple[Any, ...], raw: str) -> str:
    """The JSON text of `body` with the raw JSON `raw` at `path` (raw may be invalid Python-side)."""
    marker = "@@hostile@@"
    _set(body, path, marker)
    return json.dumps(body).replace(json.dumps(marker), raw)


def submission_cases(rng: random.Random, inputs: Path) -> Iterator[tuple[str, str, str, bytes]]:
    """(label, method, query string, body) for /batch/<api>."""
    for n in range(CASES_PER_ENDPOINT):
        # Kinds: 0-1 deep nesting, 2 numbers, 3-4 text, 5 wrong types, 6-7 broken bodies,
        # 8 odd keys, 9 `?limit=`, 10 `?jobID=`, 11 a plain valid body.
        choice = rng.choices(range(12), weights=[2, 2, 2, 4, 1, 1, 1, 1, 1, 1, 1, 1])[0]
        query = "dryRun=true" if rng.random() < 0.8 else ""
        body = _valid_body(rng, inputs)
        if choice == 0:
            text = _deep(rng, rng.choice([65, 200, 990, 1000, 1100, 3000, 50_000]))
        elif choice == 1:
            text = _with_raw(body, rng.choice([("item_list", "items", 0), ("config", "x")]),
                             _deep(rng, rng.choice([65, 500, 985, 995, 1030, 5000])))
        elif choice == 2:
            text = _with_raw(body, rng.choice(NUMERIC_PATHS), _hostile_number(rng))
        elif choice == 3:
            path = rng.choice(TEXT_PATHS)
            if path[0] in ("delimited_files", "file_path_lister"):
                body = _valid_body(rng, inputs, path[0])
            elif path[0] == "retry_failed_of":
                body = {}
            text = _with_raw(body, path, _hostile_text(rng, inputs))
        elif choice == 4:
            text = _with_raw(body, rng.choice([("config", "k"), ("item_list", "items", 0)]),
                             rng.choice([_hostile_text(rng, inputs), _hostile_number(rng)]))
        elif choice == 5:
            text = _with_raw(body, (rng.choice(SUBMISSION_FIELDS),),
                             rng.choice(["[]", "{}", "1", '"x"', "true", "[[[]]]", '{"":{}}', _hostile_number(rng)]))
        elif choice == 6:
            raw = json.dumps(body).encode()
            cut = rng.randrange(len(raw))
            yield f"{n}:truncated", "POST", query, raw[:cut]
            continue
        elif choice == 7:
            yield f"{n}:bytes", "POST", query, bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
            continue
        elif choice == 8:
            text = _with_raw(body, (rng.choice(["\u0000", "\ud800", "x" * 5000, "é"]),), "1")
        elif choice == 9:
            limit = rng.choice(["100000000000000000000", "9" * 30, "-1", "0", "abc", "1e3", "", "%205", "%D9%A3",
                                "9" * 5000,
                                "%ED%A0%80", "%00"])
            yield f"{n}:limit={limit[:30]}", "GET", f"limit={limit}", b""
            continue
        elif choice == 10:
            # Already escaped for the query string: NUL, a lone surrogate's UTF-8, invalid UTF-8 ...
            job_id = rng.choice(["%00", "%ED%A0%80", "%FF%FE", "a" * 10_000, "..%2F..%2Fx", "*", "0", "%25"])
            yield f"{n}:jobID={job_id[:20]}", rng.choice(["GET", "DELETE"]), f"jobID={job_id}", b""
            continue
        else:
            text = json.dumps(body)
        yield f"{n}:kind{choice}", "POST", query, text.encode("utf-8", "surrogatepass")


def _api_yaml(rng: random.Random, name: str) -> str:
    choice = rng.randrange(10)
    head = f"- name: {name}\n  kind: BatchAPI\n  predictor:\n    type: python\n    path: predictor.py\n"
    if choice == 0:
        depth = rng.choice([65, 300, 1000, 5000])
        return head + "    config:\n      deep: " + "[" * depth + "]" * depth + "\n"
    if choice == 1:
        depth = rng.choice([65, 400, 1000])
        nested = "".join("  " * (i + 3) + f"k{i}:\n" for i in range(depth))
        return head + "    config:\n" + nested + "  " * (depth + 3) + "v\n"
    if choice == 2:
        levels, width = rng.choice([(4, 4), (6, 5), (7, 6)])
        anchors = ["      l0: &l0 [x, y]\n"] + [
            f"      l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]\n" for i in range(1, levels)
        ]
        return head + "    config:\n" + "".join(anchors)
    if choice == 3:
        return head + f"    config:\n      n: {_huge_int(rng)}\n"
    if choice == 4:
        when = rng.choice(["2001-02-30", "2001-13-01 00:00:00", "9999-99-99"])
        return head + "    config:\n      when: " + when + "\n"
    if choice == 5:
        return head + "    config:\n      x: " + rng.choice(["!!python/object:os.system x", "!!binary '%%%'",
                                                            "&a [*a]", "!!set {a, b}", "!!omap [a: 1]"]) + "\n"
    if choice == 6:
        # Folders of the API host (small ones: a deploy lists what it names), and unusable paths.
        return head + "    models:\n      " + rng.choice(["dir", "path"]) + ": " + rng.choice([
            "/etc", "/etc/passwd", "/dev/null", "/nonexistent", "s3://", "gs://x/\ud800", "\x00", '"\\0"',
            '"/etc/\\0x"', '"\\ud800"', '"/tmp/\\udc80"', "file:///etc", "s3:/x", "relative/../../x"]) + "\n"
    if choice == 7:
        return "".join(rng.choice("-: []{}&*!|>'\"#%@`,?\n\t x1") for _ in range(rng.randint(1, 300)))
    if choice == 8:
        return head + f"    processes_per_replica: {_huge_int(rng)}\n    threads_per_process: -1\n"
    return head


@functools.cache
def _gibibyte_bomb() -> bytes:
    return bundle_declaring("predictor.py", (1 << 30) + (1 << 20))


def _hostile_project(rng: random.Random, good: bytes) -> bytes:
    choice = rng.randrange(7)
    if choice == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
    if choice == 1:
        return good[: rng.randrange(1, len(good))]
    if choice == 2:  # a header claiming a large file (the archive carries only its zeros, compressed)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            info = tarfile.TarInfo("predictor.py")
            data = b"class PythonPredictor:\n    pass\n"
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            blob = tarfile.TarInfo("zeros.bin")
            blob.size = rng.choice([1, 10]) * 1024 * 1024
            tar.addfile(blob, io.BytesIO(bytes(blob.size)))
        return buffer.getvalue()
    if choice == 3:
        return _gibibyte_bomb()
    if choice == 4:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            link = tarfile.TarInfo(rng.choice(["predictor.py", "../escape", "/abs"]))
            link.type = rng.choice([tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE])
            link.linkname = "/etc/passwd"
            tar.addfile(link)
        return buffer.getvalue()
    return good


def deploy_cases(rng: random.Random, good: bytes) -> Iterator[tuple[str, str | bytes, bytes]]:
    for n in range(CASES_PER_ENDPOINT):
        name = f"fz-{n}"
        config: str | bytes = _api_yaml(rng, name)
        if rng.random() < 0.05:
            config = bytes(rng.randrange(256) for _ in range(rng.randint(1, 100)))
        project = _hostile_project(rng, good) if rng.random() < 0.4 else good
        yield f"{n}", config, project


def _record_server_error(send: Callable[[], Any], label: str, found: list[str]) -> None:
    """Send one case; a 5xx is recorded in `found`, and any other error must have Sluice's body."""
    response = send()
    if response.status_code >= 500:
        found.append(f"{label}: {response.status_code} {response.get_data(as_text=True)[:200]}")
    else:
        body = response.get_json(silent=True)
        if response.status_code >= 400:
            assert body is not None and set(body) >= {"kind", "message"}, (label, response.get_data()[:200])


def test_hostile_job_submissions_never_answer_a_server_error(app_client, tmp_path):
    client, inputs = app_client
    rng = random.Random(SEED)
    found: list[str] = []
    cases = list(submission_cases(rng, inputs))
    for label, method, query, body in cases:
        def submit(method: str = method, query: object = query, body: object = body) -> object:
            return client.open("/batch/fuzz-target", method=method, query_string=query, data=body,
                               content_type="application/json")

        _record_server_error(submit, label, found)

    assert found == [], f"{len(found)} of {len(cases)} answered 5xx:\n" + "\n".join(found)


def test_hostile_deploys_never_answer_a_server_error(app_client, tmp_path):
    client, _ = app_client
    rng = random.Random(SEED + 1)
    good = _project_bundle(tmp_path / "good")
    found: list[str] = []
    cases = list(deploy_cases(rng, good))
    for label, config, project in cases:
        _record_server_error(lambda config=config, project=project: _deploy(client, config, project), label, found)

    assert found == [], f"{len(found)} of {len(cases)} answered 5xx:\n" + "\n".join(found)
