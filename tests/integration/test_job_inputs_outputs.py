"""Jobs read their input from local folders, S3 and GCS, and write their outputs there."""

from __future__ import annotations

import io
import json
import os
import uuid

import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import requests

from predictors_runtime.storage import join_uri, storage_for
from sluice.client import ClientError

pytestmark = pytest.mark.integration


def put(uri: str, text: str) -> str:
    storage_for(uri).write_bytes(uri, text.encode())
    return uri


def jsonl(rows) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_file_path_lister_hands_each_matched_file_path_to_the_predictor(
        client, deploy_project, events_file, events, root):
    kept = [put(join_uri(root, "in", f"{d}/f{i}.txt"), "x") for d in ("a", "b/c") for i in range(5)]
    put(join_uri(root, "in", "a/notes.md"), "x")
    put(join_uri(root, "in", "skip/f9.txt"), "x")
    put(join_uri(root + "2", "in", "a/f0.txt"), "x")  # a sibling prefix is not under `root`
    api = deploy_project({"events": str(events_file)})

    spec = client.submit_raw(api, {"workers": 2, "file_path_lister": {
        "s3_paths": [join_uri(root, "in")], "includes": ["**/*.txt"], "excludes": ["**/skip/**"], "batch_size": 3,
    }})

    assert spec["total_batch_count"] == 4
    assert client.wait(api, spec["job_id"], timeout=120)["status"] == "status_succeeded"
    received = [item for e in events(events_file) if e["event"] == "predict" for item in e["items"]]
    assert sorted(received) == sorted(kept)


def test_delimited_files_give_each_line_as_an_item_exactly_once(client, deploy_project, events_file, events, root):
    put(join_uri(root, "lines", "part-1.jsonl"), jsonl({"n": i} for i in range(130)))
    put(join_uri(root, "lines", "part-2.jsonl"), jsonl({"n": i} for i in range(130, 250)) + "\n")
    api = deploy_project({"events": str(events_file)})

    spec = client.submit_raw(api, {"workers": 2, "delimited_files": {
        "s3_paths": [join_uri(root, "lines")], "includes": ["**/*.jsonl"], "batch_size": 20,
    }})

    final = client.wait(api, spec["job_id"], timeout=120)
    assert final["status"] == "status_succeeded", final
    assert final["total_batch_count"] == 13  # 7 + 6: a batch never spans two files
    predicts = [e for e in events(events_file) if e["event"] == "predict"]
    assert sorted(item["n"] for e in predicts for item in e["items"]) == list(range(250))
    assert max(len(e["items"]) for e in predicts) == 20


def test_a_malformed_line_fails_the_enqueue_naming_file_and_line_and_runs_nothing(
    client, deploy_project, events_file, events, root
):
    bad = put(join_uri(root, "bad.jsonl"), jsonl({"n": i} for i in range(10)) + "{oops\n" + jsonl([{"n": 11}]))
    api = deploy_project({"events": str(events_file)})

    spec = client.submit_raw(api, {"delimited_files": {"s3_paths": [bad], "batch_size": 2}})

    final = client.wait(api, spec["job_id"], timeout=60)
    assert final["status"] == "status_enqueue_failed"
    assert f"{bad}: line 11" in final["message"]
    assert events(events_file) == []


def test_a_large_file_parsed_beside_its_cutting_runs_each_line_once_and_a_bad_line_in_it_runs_nothing(
    client, deploy_project, events_file, events, tmp_path
):
    """Over 4 MiB on local disk: the API's helper processes parse its blocks (`jobs/batch/line_checks.py`)."""
    folder = tmp_path / "data"
    rows = [{"n": i, "pad": "x" * 40} for i in range(90_000)]
    good = put(str(folder / "good.jsonl"), jsonl(rows))
    bad = put(str(folder / "bad.jsonl"), jsonl(rows[:80_000]) + '{"n": \n' + jsonl(rows[80_000:]))
    assert os.path.getsize(good) > 4 << 20
    api = deploy_project({"events": str(events_file)})

    failed = client.submit_raw(api, {"delimited_files": {"s3_paths": [bad], "batch_size": 5000}})
    final = client.wait(api, failed["job_id"], timeout=60)
    assert final["status"] == "status_enqueue_failed"
    assert f"{bad}: line 80001: not valid JSON" in final["message"]
    assert events(events_file) == []

    spec = client.submit_raw(api, {"workers": 2, "delimited_files": {"s3_paths": [good], "batch_size": 5000}})
    final = client.wait(api, spec["job_id"], timeout=120)
    assert final["status"] == "status_succeeded", final
    assert final["total_batch_count"] == 18
    received = [item["n"] for e in events(events_file) if e["event"] == "predict" for item in e["items"]]
    assert sorted(received) == list(range(90_000))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_returned_rows_are_written_per_batch_with_a_manifest(client, deploy_project, events_file, root, fmt):
    api = deploy_project({"events": str(events_file), "return_rows": True, "poison": 7})
    out = join_uri(root, "out")

    spec = client.submit_raw(api, {
        "item_list": {"items": list(range(10)), "batch_size": 4}, "output": {"path": out, "format": fmt},
    })

    final = client.wait(api, spec["job_id"], timeout=120)
    assert final["status"] == "status_completed_with_failures"  # the batch holding 7 failed
    storage = storage_for(out)
    manifest = json.loads(storage.read_bytes(join_uri(out, spec["job_id"], "_manifest.json")))
    assert [p["batch"] for p in manifest["parts"]] == [0, 2]
    assert manifest["rows"] == 6
    assert [f["batch"] for f in manifest["failed_batches"]] == [1]
    rows = []
    for part in manifest["parts"]:
        assert part["path"] == join_uri(out, spec["job_id"], f"part-{part['batch']:05d}.{fmt}")
        data = storage.read_bytes(part["path"])
        if fmt == "jsonl":
            part_rows = [json.loads(line) for line in data.decode().splitlines()]
        elif fmt == "parquet":
            part_rows = pq.read_table(io.BytesIO(data)).to_pylist()
        else:
            part_rows = pa_csv.read_csv(io.BytesIO(data)).to_pylist()
        assert len(part_rows) == part["rows"]
        rows.extend(part_rows)
    assert [row["item"] for row in rows] == [0, 1, 2, 3, 8, 9]
    assert all(isinstance(row["batch"], str) and len(row["batch"]) == 36 for row in rows)


def test_a_dry_run_lists_the_matched_files_without_creating_a_job(client, deploy_project, events_file, root):
    files = [put(join_uri(root, f"d/{i}.jsonl"), jsonl([{"n": i}])) for i in range(3)]
    api = deploy_project({"events": str(events_file)})

    submission = {"delimited_files": {"s3_paths": [join_uri(root, "d")], "batch_size": 5}}
    answer = client.submit_raw(api, submission, dry_run=True)

    assert answer["validation"] == "passed"
    assert answer["files"] == sorted(files)
    assert client.jobs(api) == []


def test_no_matching_file_is_a_400_that_says_so(client, deploy_project, events_file, root):
    put(join_uri(root, "x/a.csv"), "1")
    api = deploy_project({"events": str(events_file)})

    with pytest.raises(ClientError) as refused:
        client.submit_raw(api, {"file_path_lister": {
            "s3_paths": [join_uri(root, "x")], "includes": ["**/*.json"], "batch_size": 1}})

    assert refused.value.http_status == 400
    assert "no files matched" in refused.value.server_message
    assert client.jobs(api) == []


def test_failed_batches_are_listed_and_can_be_resubmitted_alone(client, deploy_project, events_file, tmp_path, events):
    api = deploy_project({"events": str(events_file), "poison": 13})
    first = client.submit(api, list(range(30)), batch_size=10, tries=2)
    assert client.wait(api, first["job_id"], timeout=120)["status"] == "status_completed_with_failures"
    failed = client.failed_batches(api, first["job_id"])
    assert [(f["index"], f["tries"]) for f in failed] == [(1, 2)]

    retry_events = tmp_path / "retry.jsonl"
    retry = client.submit_raw(api, {"retry_failed_of": first["job_id"],
                                    "config": {"events": str(retry_events), "poison": None}})

    assert retry["total_batch_count"] == 1
    assert retry["retry_failed_of"] == first["job_id"]
    assert client.wait(api, retry["job_id"], timeout=120)["status"] == "status_succeeded"
    assert [e["items"] for e in events(retry_events) if e["event"] == "predict"] == [list(range(10, 20))]


def test_retrying_a_running_job_or_one_without_failures_is_refused(client, deploy_project, events_file):
    api = deploy_project({"events": str(events_file)})
    done = client.submit(api, [1, 2], batch_size=1)
    client.wait(api, done["job_id"], timeout=60)

    with pytest.raises(ClientError) as nothing_failed:
        client.submit_raw(api, {"retry_failed_of": done["job_id"]})
    assert nothing_failed.value.http_status == 400
    with pytest.raises(ClientError) as unknown:
        client.submit_raw(api, {"retry_failed_of": "0000000000deadbeef"})
    assert unknown.value.http_status == 404


def test_on_job_complete_receives_the_final_batch_metrics_when_it_asks(client, deploy_project, events_file, events):
    api = deploy_project({"events": str(events_file), "poison": 5})
    spec = client.submit(api, list(range(20)), batch_size=5)

    client.wait(api, spec["job_id"], timeout=60)

    complete = next(e for e in events(events_file) if e["event"] == "complete")
    assert complete["job_status"]["batch_metrics"]["succeeded"] == 3
    assert complete["job_status"]["batch_metrics"]["failed"] == 1
    assert complete["job_status"]["job_id"] == spec["job_id"]


class TestLocalPathsAreConfined:
    def test_a_local_path_outside_the_allowed_roots_is_refused(self, client, deploy_project, events_file):
        api = deploy_project({"events": str(events_file)})

        for path in ("/etc", "/etc/passwd"):
            with pytest.raises(ClientError) as refused:
                client.submit_raw(api, {"file_path_lister": {"s3_paths": [path], "batch_size": 1}})
            assert refused.value.http_status == 400
            assert "outside the allowed local roots" in refused.value.server_message

    def test_dot_dot_tricks_are_resolved_before_checking(self, client, deploy_project, events_file, tmp_path):
        api = deploy_project({"events": str(events_file)})
        sneaky = str(tmp_path / ".." / ".." / ".." / ".." / ".." / "etc")

        with pytest.raises(ClientError) as refused:
            client.submit_raw(api, {"file_path_lister": {"s3_paths": [sneaky], "batch_size": 1}})

        assert refused.value.http_status == 400

    def test_a_symlink_out_of_a_root_is_refused(self, client, deploy_project, events_file, tmp_path):
        api = deploy_project({"events": str(events_file)})
        folder = tmp_path / "inputs"
        folder.mkdir()
        (folder / "ok.txt").write_text("fine")
        os.symlink("/etc/hostname", folder / "escape.txt")

        with pytest.raises(ClientError) as refused:
            client.submit_raw(api, {"file_path_lister": {"s3_paths": [str(folder)], "batch_size": 1}})

        assert refused.value.http_status == 400
        assert "escape.txt" in refused.value.server_message

    def test_an_output_path_outside_the_roots_is_refused(self, client, deploy_project, events_file):
        api = deploy_project({"events": str(events_file)})

        with pytest.raises(ClientError) as refused:
            client.submit_raw(api, {"item_list": {"items": [1], "batch_size": 1},
                                    "output": {"path": f"/tmp/elsewhere-{uuid.uuid4().hex}"}})

        assert refused.value.http_status == 400


def test_a_missing_bucket_is_a_404_naming_it(client, deploy_project, events_file, s3_server):
    api = deploy_project({"events": str(events_file)})
    bucket = f"missing-{uuid.uuid4().hex[:8]}"

    response = requests.post(f"{client.url}/batch/{api}", json={
        "delimited_files": {"s3_paths": [f"s3://{bucket}/x"], "batch_size": 1}}, timeout=30)

    assert response.status_code == 404
    assert bucket in response.json()["message"]
