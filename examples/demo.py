"""The end-to-end demo behind `make demo`: `python examples/demo.py [examples/<project>]`.

Trains the example's model (its `train.py`), starts the embedded stack (a private redis-server
unless SLUICE_REDIS_URL is set), deploys the project (`examples/iris-batch` by default, or
`examples/iris-onnx`, `examples/iris-tensorflow`), submits its 150 sample rows as a batch
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

DEFAULT_PROJECT = HERE / "iris-batch"


def main(project: Path) -> int:
    print(f"1/5 training the example model ({project.name}/train.py)")
    subprocess.run([sys.executable, str(project / "train.py")], check=True)
    results_dir = Path(tempfile.mkdtemp(prefix="sluice-demo-results-"))
    port = int(os.environ.get("SLUICE_DEMO_PORT") or free_port())
    print("2/5 starting Redis, the API, beat and 2 worker nodes")
    stack = Stack(port=port, workers=2, redis_url=os.environ.get("SLUICE_REDIS_URL") or None,
                  env={"SLUICE_LOCAL_INPUT_ROOTS": str(results_dir)})
    with stack:
        client = Client(stack.url)
        print(f"    Sluice is at {stack.url}")
        print("3/5 deploying", project / "cortex.yaml")
        api_name = client.deploy(project / "cortex.yaml")[0]["name"]
        print(f"    deployed {api_name}")
        items = json.loads((project / "sample.json").read_text())
        print(f"4/5 submitting {len(items)} items in batches of 10 on 2 workers")
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
        print("5/5 final job status:")
        print(json.dumps(final, indent=2))
        job_folder = results_dir / spec["job_id"]
        print(f"results: {job_folder}")
        for name in ("summary.json", "_manifest.json"):
            if (job_folder / name).exists():
                print(f"{name}: {(job_folder / name).read_text()}")
        print("stopping the stack")
    return 0 if final["status"] == "status_succeeded" else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else DEFAULT_PROJECT))
