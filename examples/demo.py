"""The end-to-end demo behind `make demo`: `python examples/demo.py [examples/<project>]`.

Trains the examples' models (their `train.py`), starts the embedded stack (a private
redis-server unless SLUICE_REDIS_URL is set, and the proxy on Sluice's public port), deploys
the batch project (`examples/iris-batch` by default, or `examples/iris-onnx`,
`examples/iris-tensorflow`), submits its 150 sample rows as a batch job, shows its progress and
where the results went; then deploys the realtime API `examples/iris-realtime`, waits until it
is ready, prints its answers to a JSON body, an url-encoded form and a multipart form, and stops
everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sluice.cli import progress_line  # noqa: E402
from sluice.client import Client  # noqa: E402
from sluice.embedded import Stack, free_port  # noqa: E402

DEFAULT_PROJECT = HERE / "iris-batch"
REALTIME_PROJECT = HERE / "iris-realtime"
STEPS = 7

# One flower per request; the curl line each request stands for is printed with its answer.
FLOWERS = {
    "json": {"sepal_length": 5.2, "sepal_width": 3.6, "petal_length": 1.4, "petal_width": 0.3},
    "form": {"sepal_length": 6.4, "sepal_width": 3.2, "petal_length": 4.5, "petal_width": 1.5},
    "multipart": {"sepal_length": 6.3, "sepal_width": 3.3, "petal_length": 6.0, "petal_width": 2.5},
}


def step(number: int, text: str) -> None:
    print(f"{number}/{STEPS} {text}", flush=True)


def run_batch_job(client: Client, project: Path, results_dir: Path) -> bool:
    """Deploy the batch project, run its sample through it; True when the job succeeded."""
    step(3, f"deploying {project / 'cortex.yaml'}")
    api_name = client.deploy(project / "cortex.yaml")[0]["name"]
    print(f"    deployed {api_name}")
    items = json.loads((project / "sample.json").read_text())
    step(4, f"submitting {len(items)} items in batches of 10 on 2 workers")
    spec = client.submit_raw(api_name, {
        "workers": 2,
        "item_list": {"items": items, "batch_size": 10},
        "config": {"results_dir": str(results_dir)},  # where iris-batch writes its own files
        "output": {"path": str(results_dir), "format": "jsonl"},  # where returned rows go
    })
    final = client.wait(
        api_name, spec["job_id"], timeout=300,
        on_progress=lambda s: print("\r    " + progress_line(s), end="", flush=True),
    )
    print()
    step(5, "final job status:")
    print(json.dumps(final, indent=2))
    job_folder = results_dir / spec["job_id"]
    print(f"results: {job_folder}")
    summary, manifest = job_folder / "summary.json", job_folder / "_manifest.json"
    if summary.exists():  # what the predictor wrote itself (iris-batch)
        print(f"summary.json: {summary.read_text()}")
    if manifest.exists() and json.loads(manifest.read_text()).get("rows"):  # the rows its predict returned
        print(f"_manifest.json: {manifest.read_text()}")
    return final["status"] == "status_succeeded"


def ask_realtime_api(client: Client, url: str) -> bool:
    """Deploy examples/iris-realtime and send it three requests; True when all three answered 200."""
    step(6, f"deploying {REALTIME_PROJECT / 'cortex.yaml'} and waiting until it is ready")
    api_name = client.deploy(REALTIME_PROJECT / "cortex.yaml")[0]["name"]
    readiness = client.wait_ready(api_name, timeout=180)
    print(f"    GET {url}/{api_name} -> {json.dumps(readiness)}")
    endpoint = f"{url}/{api_name}"
    step(7, f"asking {endpoint}")
    json_flower, form_flower, multipart_flower = FLOWERS["json"], FLOWERS["form"], FLOWERS["multipart"]
    form_body = "&".join(f"{name}={value}" for name, value in form_flower.items())
    requests_to_send = [
        (f"curl {endpoint} -X POST -H 'Content-Type: application/json' -d '{json.dumps(json_flower)}'",
         lambda: requests.post(endpoint, json=json_flower, timeout=60)),
        (f"curl {endpoint} -X POST -d '{form_body}'",
         lambda: requests.post(endpoint, data=form_body, timeout=60,
                               headers={"Content-Type": "application/x-www-form-urlencoded"})),
        (f"curl {endpoint} -X POST " + " ".join(f"-F {name}={value}" for name, value in multipart_flower.items()),
         lambda: requests.post(endpoint, files={name: (None, str(value)) for name, value in multipart_flower.items()},
                               timeout=60)),
    ]
    answered = 0
    for curl_line, send in requests_to_send:
        answer = send()
        print(f"    $ {curl_line}")
        print(f"    {answer.status_code} {answer.text}")
        answered += answer.status_code == 200
    return answered == len(requests_to_send)


def main(project: Path) -> int:
    step(1, f"training the example models ({project.name}/train.py, {REALTIME_PROJECT.name}/train.py)")
    subprocess.run([sys.executable, str(project / "train.py")], check=True)
    subprocess.run([sys.executable, str(REALTIME_PROJECT / "train.py")], check=True)
    results_dir = Path(tempfile.mkdtemp(prefix="sluice-demo-results-"))
    port = int(os.environ.get("SLUICE_DEMO_PORT") or free_port())
    step(2, "starting Redis, the API, the proxy, beat and 2 worker nodes")
    stack = Stack(port=port, workers=2, redis_url=os.environ.get("SLUICE_REDIS_URL") or None,
                  env={"SLUICE_LOCAL_INPUT_ROOTS": str(results_dir)})
    with stack:
        client = Client(stack.url)
        print(f"    Sluice is at {stack.url}")
        batch_ok = run_batch_job(client, project, results_dir)
        realtime_ok = ask_realtime_api(client, stack.url)
        print("stopping the stack")
    return 0 if batch_ok and realtime_ok else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else DEFAULT_PROJECT))
