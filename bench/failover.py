"""What a Redis Sentinel failover costs a running batch job (`make bench`).

A primary, a replica and three sentinels on loopback (`testbed/sentinel_cluster.py`:
`down-after-milliseconds 2000`, quorum 2), the embedded stack with 2 worker nodes and beat finding
Redis through the sentinels, and one job of `--items` (20,000) small items in batches of
`--batch-size` on a trivial python predictor. Once `--kill-at` (half) of its batches are recorded,
the primary is SIGKILLed. Printed, from one run:
- seconds from the kill until the sentinels' promoted replica answers as the primary, and until the
  first batch is recorded there (the job's count of succeeded batches, read on the new primary every
  20 ms, first grows);
- items/s recorded before the kill (from the first recorded batch) and after it (from the first
  batch recorded on the new primary to the job's end), and the job's end state.
It only prints: no threshold. Run: `python bench/failover.py [--items N] [--batch-size B]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from contextlib import suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import yaml  # noqa: E402

from foundation.redis_clients import connect  # noqa: E402
from jobs.store import JobStore  # noqa: E402
from sluice.client import Client  # noqa: E402
from sluice.embedded import Stack, free_port  # noqa: E402
from testbed.sentinel_cluster import SentinelCluster  # noqa: E402

PREDICTOR = '''
class PythonPredictor:
    def __init__(self, config, job_spec):
        pass

    def predict(self, payload, batch_id):
        return None
'''
POLL_S = 0.02


def deploy(client: Client, folder: Path) -> str:
    name = f"failover-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(PREDICTOR)
    api = {"name": name, "kind": "BatchAPI", "predictor": {"type": "python", "path": "predictor.py"},
           "compute": {"cpu": 1}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    client.deploy(folder / "cortex.yaml")
    return name


def promoted(cluster: SentinelCluster, old: int) -> int | None:
    """The server a sentinel names as primary, once it is not the killed one and answers as a primary."""
    with suppress(redis.RedisError):
        port = int(redis.Redis(port=next(iter(cluster.sentinels)), socket_timeout=1)
                   .sentinel_get_master_addr_by_name("sluice")[1])
        if port != old and redis.Redis(port=port, socket_timeout=1).info("replication")["role"] == "master":
            return port
    return None


def succeeded_on(port: int, job_id: str) -> int:
    """Batches of the job recorded as succeeded, read on one server."""
    return JobStore(redis.Redis(port=port, socket_timeout=1)).state(job_id).succeeded


def run(items: int, batch_size: int, kill_at: float, folder: Path) -> None:
    cluster = SentinelCluster(folder / "redis").start()
    try:
        env = {**cluster.env(), "SLUICE_BEAT_INTERVAL": "1", "SLUICE_HEARTBEAT_INTERVAL": "0.5"}
        with Stack(port=free_port(), workers=2, data_dir=folder / "stack", env=env, proxy=False,
                   realtime=False) as stack:
            client = Client(stack.url, timeout=120)
            api = deploy(client, folder / "project")
            store = JobStore(connect(cluster.address(), retry_s=30))
            spec = client.submit(api, list(range(items)), batch_size=batch_size, workers=2)
            job_id = spec["job_id"]

            batches = -(-items // batch_size)
            first_at, first_count = None, 0
            while True:  # until `kill_at` of the batches are recorded
                count = store.state(job_id).succeeded
                if first_at is None and count > 0:
                    first_at, first_count = time.monotonic(), count
                if count >= batches * kill_at:
                    break
                if count >= batches:
                    raise SystemExit("the job ended before the kill: give it more --items")
                time.sleep(POLL_S)
            old = cluster.primary_port()
            count_at_kill = store.state(job_id).succeeded
            killed = time.monotonic()
            cluster.servers[old].kill()
            cluster.servers[old].wait()

            new = None
            while new is None:
                new = promoted(cluster, old)
                if new is None:
                    time.sleep(POLL_S)
            promoted_at = time.monotonic()
            baseline = succeeded_on(new, job_id)
            while succeeded_on(new, job_id) <= baseline:
                time.sleep(POLL_S)
            resumed_at = time.monotonic()
            resumed_count = succeeded_on(new, job_id)
            while (state := client.job(api, job_id))["status"] in ("status_enqueuing", "status_running"):
                time.sleep(0.1)
            ended = time.monotonic()

            assert first_at is not None
            before = (count_at_kill - first_count) * batch_size / max(killed - first_at, 1e-9)
            after = (batches - resumed_count) * batch_size / max(ended - resumed_at, 1e-9)
            print(f"{items} items in {batches} batches of {batch_size}, 2 worker nodes; primary SIGKILLed with "
                  f"{count_at_kill} batches recorded")
            print(f"  replica promoted after        {promoted_at - killed:6.2f} s")
            print(f"  first batch recorded there at {resumed_at - killed:6.2f} s after the kill")
            print(f"  items/s before the kill       {before:8.0f}")
            print(f"  items/s after the first batch {after:8.0f}")
            print(f"  job: {state['status']}, {state['batch_metrics']['succeeded']} of {batches} batches "
                  f"recorded, {ended - killed:.1f} s after the kill")
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--kill-at", type=float, default=0.5, help="share of items recorded at the kill")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-failover-") as folder:
        run(args.items, args.batch_size, args.kill_at, Path(folder))


if __name__ == "__main__":
    main()
