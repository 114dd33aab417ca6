"""The end-to-end demo behind `make demo`.

Starts the embedded stack (a private redis-server unless SLUICE_REDIS_URL is set), trains the
iris example's model, deploys `examples/iris-batch`, submits the 150 sample rows as a batch
job, shows its progress, prints the final status and where the results went, and stops.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sluice.cli import progress_line  # noqa: E402
from sluice.client import Client  # noqa: E402
from sluice.embedded import Stack, free_port  # noqa: E402

PROJECT = HERE / "iris-batch"


def main() -> int:
    print("1/5 training the example model (scikit-learn iris)")
    subprocess.run([sys.executable, str(PROJECT / "train.py")], check=True)
    results_dir = Path(tempfile.mkdtemp(prefix="sluice-demo-results-"))
    port = int(os.environ.get("SLUICE_DEMO_PORT") or free_port())
    print("2/5 starting Redis, the API, beat and 2 worker nodes")
    with Stack(port=port, workers=2, redis_url=os.environ.get("SLUICE_REDIS_URL") or None) as stack:
        client = Client(stack.url)
        print(f"    Sluice is at {stack.url}")
        print("3/5 deploying", PROJECT / "cortex.yaml")
        for api in client.deploy(PROJECT / "cortex.yaml"):
            print(f"    deployed {api['name']} on queue {api['queue']}")
        items = json.loads((PROJECT / "sample.json").read_text())
        print(f"4/5 submitting {len(items)} items in batches of 10 on 2 workers")
        spec = client.submit("iris-batch", items, batch_size=10, workers=2, config={"results_dir": str(results_dir)})
        final = client.wait(
            "iris-batch", spec["job_id"], timeout=300,
            on_progress=lambda s: print("\r    " + progress_line(s), end="", flush=True),
        )
        print()
        print("5/5 final job status:")
        print(json.dumps(final, indent=2))
        job_folder = results_dir / spec["job_id"]
        summary = job_folder / "summary.json"
        print(f"results: {job_folder} (one JSON file per batch)")
        if summary.exists():
            print(f"summary: {summary}: {summary.read_text()}")
        print("stopping the stack")
    return 0 if final["status"] == "status_succeeded" and summary.exists() else 1


if __name__ == "__main__":
    sys.exit(main())
