"""A user submits item lists to a deployed Batch API and every item is processed exactly once."""

from __future__ import annotations

from collections import Counter

import pytest

pytestmark = pytest.mark.integration


def test_a_thousand_items_in_batches_of_ten_run_each_batch_once_and_complete_once(
    client, deploy_project, events_file, events
):
    api = deploy_project({"events": str(events_file)})
    spec = client.submit(api, list(range(1000)), batch_size=10, workers=2)
    assert spec["total_batch_count"] == 100
    assert spec["api_name"] == api and spec["workers"] == 2

    final = client.wait(api, spec["job_id"], timeout=180)

    assert final["status"] == "status_succeeded", final
    assert final["batch_metrics"]["succeeded"] == 100
    assert final["batch_metrics"]["failed"] == 0
    assert final["batches_in_queue"] == 0
    assert final["end_time"] is not None
    seen = events(events_file)
    predicts = [e for e in seen if e["event"] == "predict"]
    batch_ids = Counter(e["batch_id"] for e in predicts)
    assert len(batch_ids) == 100 and set(batch_ids.values()) == {1}
    assert sorted(item for e in predicts for item in e["items"]) == list(range(1000))
    assert [e["event"] for e in seen].count("complete") == 1
    instances = {e["instance"] for e in predicts}
    assert 1 <= len(instances) <= 2


def test_with_one_worker_a_single_instance_sees_every_item_in_on_job_complete(
    client, deploy_project, events_file, events
):
    api = deploy_project({"events": str(events_file)})
    spec = client.submit(api, list(range(1000)), batch_size=10, workers=1)

    final = client.wait(api, spec["job_id"], timeout=180)

    assert final["status"] == "status_succeeded", final
    seen = events(events_file)
    inits = [e for e in seen if e["event"] == "init"]
    completes = [e for e in seen if e["event"] == "complete"]
    assert len(inits) == 1, "one predictor instance for the whole job"
    assert len(completes) == 1
    assert completes[0]["instance"] == inits[0]["instance"]
    assert completes[0]["seen"] == list(range(1000))


def test_two_jobs_at_once_each_keep_their_own_predictor_instances(client, deploy_project, tmp_path, events):
    first_events, second_events = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    api = deploy_project({"sleep": 0.02})
    first = client.submit(api, list(range(200)), batch_size=10, workers=1, config={"events": str(first_events)})
    second = client.submit(api, list(range(200, 400)), batch_size=10, workers=1, config={"events": str(second_events)})

    for spec in (first, second):
        assert client.wait(api, spec["job_id"], timeout=180)["status"] == "status_succeeded"

    first_seen, second_seen = events(first_events), events(second_events)
    first_instances = {e["instance"] for e in first_seen}
    second_instances = {e["instance"] for e in second_seen}
    assert len(first_instances) == 1 and len(second_instances) == 1
    assert first_instances != second_instances
    assert {e["job_id"] for e in first_seen} == {first["job_id"]}
    assert next(e for e in first_seen if e["event"] == "complete")["seen"] == list(range(200))
    assert next(e for e in second_seen if e["event"] == "complete")["seen"] == list(range(200, 400))


def test_the_job_config_deep_merges_over_the_api_config_and_the_job_wins(client, deploy_project, events_file, events):
    api = deploy_project({"events": str(events_file), "threshold": 0.5, "model": {"name": "iris", "size": "small"}})
    spec = client.submit(
        api, [1, 2, 3], batch_size=3, config={"model": {"size": "large"}, "extra": True}
    )

    assert client.wait(api, spec["job_id"], timeout=120)["status"] == "status_succeeded"

    init = next(e for e in events(events_file) if e["event"] == "init")
    assert init["config"] == {
        "events": str(events_file), "threshold": 0.5, "model": {"name": "iris", "size": "large"}, "extra": True,
    }
    assert init["job_spec"]["config"] == {"model": {"size": "large"}, "extra": True}
    assert init["job_spec"]["job_id"] == spec["job_id"]
    assert init["job_spec"]["total_batch_count"] == 1
    assert init["job_spec"]["workers"] == 1
    assert init["global"] == "global scope ran"


def test_a_handler_class_with_handle_batch_works_like_a_python_predictor(client, deploy_project, events_file, events):
    api = deploy_project({"events": str(events_file)}, class_name="Handler", predict_name="handle_batch")
    spec = client.submit(api, list(range(30)), batch_size=7)

    final = client.wait(api, spec["job_id"], timeout=120)

    assert final["status"] == "status_succeeded"
    assert final["total_batch_count"] == 5
    assert next(e for e in events(events_file) if e["event"] == "complete")["seen"] == list(range(30))


def test_the_predictor_runs_in_its_project_folder_with_its_env(client, deploy_project, events_file, events):
    api = deploy_project(
        {"events": str(events_file)},
        predictor_extra={"env": {"GREETING": "from cortex.yaml"}},
        files={".env": "GREETING=from dotenv\n"},
    )
    spec = client.submit(api, [1], batch_size=1)

    assert client.wait(api, spec["job_id"], timeout=120)["status"] == "status_succeeded"

    init = next(e for e in events(events_file) if e["event"] == "init")
    assert init["greeting"] == "from cortex.yaml"  # the API's env wins over .env
    assert (init["cwd"] + "/predictor.py").endswith("/predictor.py")
    from pathlib import Path

    assert (Path(init["cwd"]) / "predictor.py").is_file()
    assert not (Path(init["cwd"]) / "cortex.yaml").exists()


def test_jobs_are_listed_newest_first(client, deploy_project, events_file):
    api = deploy_project({"events": str(events_file)})
    ids = [client.submit(api, [i], batch_size=1)["job_id"] for i in range(3)]
    for job_id in ids:
        client.wait(api, job_id, timeout=120)

    listed = [job["job_id"] for job in client.jobs(api)]

    assert listed == list(reversed(ids))


LOGGING_PREDICTOR = """
from foundation.json_logs import logger


class PythonPredictor:
    def __init__(self, config):
        pass

    def predict(self, payload, batch_id):
        logger.info("scored a batch", extra={"items_seen": len(payload), "first": payload[0]})
"""


def test_a_predictor_logs_json_lines_with_its_fields_and_the_jobs_labels(client, stack, deploy_project):
    import json

    api = deploy_project(source=LOGGING_PREDICTOR)
    spec = client.submit(api, ["a", "b", "c"], batch_size=3)
    assert client.wait(api, spec["job_id"], timeout=120)["status"] == "status_succeeded"

    lines = []
    for child in stack.children:
        if child.is_worker:
            for text in child.log_path.read_text(errors="replace").splitlines():
                if text.startswith("{") and '"scored a batch"' in text:
                    lines.append(json.loads(text))
    (line,) = [line for line in lines if line.get("labels", {}).get("job_id") == spec["job_id"]]
    assert line["items_seen"] == 3 and line["first"] == "a"
    assert line["levelname"] == "INFO" and line["labels"]["batch_index"] == "0"
