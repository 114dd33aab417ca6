"""Where the public address's hop costs: one replica-like server, behind HAProxy configured as Sluice
renders it and with parts of that configuration taken away (`make bench` does not run it; run it
alone: `python bench/proxy_hop.py [--duration 5] [--concurrency 1,8,64]`).

The server is the baseline of `bench/realtime.py` (gunicorn, 2 sync workers, Flask calling
onnxruntime on the iris model), listening on a TCP port and a Unix socket as a replica does. Each
system is a haproxy of its own (one thread, as Sluice's) in front of it:
- `direct`: no proxy, wrk at the server's TCP port (the anchor of every ratio);
- `sluice`: the configuration `sluice/proxy_config.py` renders for one API with one replica, over
  its Unix socket, as on `sluice up`;
- `-counters`: without the refusals' stick-table tracking and the after-response counting;
- `-request-id`: without the request id (uuid, variable, header) and the error rewriting;
- `bare`: `mode http`, one frontend, one backend, the server with its maxconn: what any HTTP proxy costs;
- `bare tcp`: the same to the TCP port instead of the Unix socket;
- `... nice`: the same haproxy run at OS priority -10 (`nice -n -10`; needs root): how much of the
  cost is the one haproxy thread waiting for a core that the workers and wrk hold;
- `direct kept`, `... kept`: a second server whose workers keep connections alive
  (`sluice/keepalive_worker.py`, what a replica runs), and haproxy reusing them (`http-reuse always`,
  as Sluice renders it); `direct` and `sluice` are the first server's, whose sync workers close every
  connection after one answer (the replica before that worker); `x anchor`, `p50 +ms` and `+us` set
  each system against the direct run of its own server (`direct kept` for the `kept` ones).
`--only` runs some of the systems (and both anchors).
Runs are interleaved (each system once per round, `--rounds` rounds, the median kept) so that the
machine's drift hits all alike. Figures: requests/s and p50 from wrk, and the machine's busy CPU per
request (/proc/stat), and haproxy's own CPU per request (its process's, from /proc).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from onnx_batch import iris_model  # noqa: E402
from realtime import Figures, spawn, stop, wait_http, wrk  # noqa: E402

from foundation.api_registry import DeployedApi  # noqa: E402
from foundation.replica_directory import ReplicaRecord  # noqa: E402
from predictors_runtime.config import ApiConfig  # noqa: E402
from sluice.embedded import free_port  # noqa: E402
from sluice.proxy_config import plan_routes, render_config  # noqa: E402
from sluice.replica_process import KEEP_ALIVE_S, KEEP_ALIVE_WORKER  # noqa: E402


def sluice_config(port: int, socket: Path, management: int) -> str:
    """What the proxy controller renders for API `iris` with one replica reached over `socket`."""
    config = ApiConfig.from_dict({"name": "iris", "kind": "RealtimeAPI",
                                  "predictor": {"path": "p.py", "processes_per_replica": 2}})
    api = DeployedApi("iris", "RealtimeAPI", config.to_dict(), "b1", "cpu", 0.0, [])
    record = ReplicaRecord("iris-1", "iris", "b1", "127.0.0.1", 1, 2, True, False, time.time())
    routes = plan_routes([api], [record], local_socket=lambda _record: str(socket))
    return render_config(routes, bind="127.0.0.1", port=port, management=f"127.0.0.1:{management}")


def without(config: str, *markers: str) -> str:
    """`config` without the lines that contain any of `markers` (and a table left unused)."""
    return "\n".join(line for line in config.splitlines() if not any(m in line for m in markers)) + "\n"


def bare_config(port: int, server: str, maxconn: int | None = 2, reuse: bool = False) -> str:
    limit = f" maxconn {maxconn}" if maxconn else ""
    return (f"global\n    nbthread 1\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 120s\n"
            f"    timeout server 120s\nfrontend public\n    bind 127.0.0.1:{port}\n    default_backend rt\n"
            f"backend rt\n{'    http-reuse always' + chr(10) if reuse else ''}    server s {server}{limit}\n")


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has used (user and system)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated systems to run (the two anchors always run)")
    args = parser.parse_args()
    if shutil.which("wrk") is None or shutil.which("haproxy") is None:
        sys.exit("needs wrk and haproxy (apt-get install -y wrk haproxy)")
    tmp = Path(tempfile.mkdtemp(prefix="sluice-proxy-hop-"))
    processes: list[subprocess.Popen] = []
    haproxies: list[subprocess.Popen] = []
    proxy_pids: dict[str, int] = {}
    try:
        model, data = iris_model()
        (tmp / "iris.onnx").write_bytes(model)
        row = data[np.random.default_rng(0).integers(0, len(data))].round(1).tolist()
        body = json.dumps({f"f{i}": v for i, v in enumerate(row)})
        server_port, socket = free_port(), tmp / "replica.sock"
        env = {"BENCH_MODEL": str(tmp / "iris.onnx"), "BENCH_FEATURES": "4", "OMP_NUM_THREADS": "1"}
        processes.append(spawn([sys.executable, "-m", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{server_port}",
                                "-b", f"unix:{socket}", "--no-control-socket", "realtime_apps:baseline_app()"],
                               env, BENCH, tmp / "server.log"))
        kept_port, kept_socket = free_port(), tmp / "kept.sock"
        processes.append(spawn([sys.executable, "-m", "gunicorn", "-w", "2", "--worker-class", KEEP_ALIVE_WORKER,
                                "--keep-alive", str(KEEP_ALIVE_S), "--pythonpath", f"{ROOT},{BENCH}",
                                "-b", f"127.0.0.1:{kept_port}", "-b", f"unix:{kept_socket}", "--no-control-socket",
                                "realtime_apps:baseline_app()"], env, BENCH, tmp / "kept.log"))
        systems = {"direct": f"http://127.0.0.1:{server_port}/iris",
                   "direct kept": f"http://127.0.0.1:{kept_port}/iris"}
        management = free_port()  # nothing listens there: no request of the runs goes to it
        configs = {
            "sluice": lambda port: sluice_config(port, socket, management),
            "-counters": lambda port: without(sluice_config(port, socket, management),
                                              "track-sc0", "sc_inc_gpc", "stick-table"),
            "-request-id": lambda port: without(sluice_config(port, socket, management), "X-Request-ID",
                                                "txn.request_id", "http-error", "set-var(txn.deadline_ms)"),
            "sluice nice": lambda port: sluice_config(port, socket, management),
            "bare": lambda port: bare_config(port, f"unix@{socket}"),
            "bare nice": lambda port: bare_config(port, f"unix@{socket}"),
            "bare tcp": lambda port: bare_config(port, f"127.0.0.1:{server_port}"),
            "bare kept": lambda port: bare_config(port, f"unix@{kept_socket}", reuse=True),
            "sluice kept": lambda port: sluice_config(port, kept_socket, management),
            "bare kept nice": lambda port: bare_config(port, f"unix@{kept_socket}", reuse=True),
            "sluice kept nice": lambda port: sluice_config(port, kept_socket, management),
        }
        if args.only:
            wanted = {label.strip() for label in args.only.split(",")}
            unknown = wanted - set(configs) - set(systems)
            if unknown:
                sys.exit(f"unknown systems {sorted(unknown)}; known: {sorted([*systems, *configs])}")
            configs = {label: render for label, render in configs.items() if label in wanted}
            systems = {label: url for label, url in systems.items() if label in wanted | {"direct", "direct kept"}}
        for label, render in configs.items():
            port = free_port()
            text = render(port)
            (tmp / f"{label}.cfg").write_text(text)
            niced = ["nice", "-n", "-10"] if label.endswith(" nice") else []
            haproxies.append(subprocess.Popen([*niced, "haproxy", "-db", "-f", str(tmp / f"{label}.cfg")],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            proxy_pids[label] = haproxies[-1].pid
            systems[label] = f"http://127.0.0.1:{port}/iris"
        for url in systems.values():
            wait_http(url, body, tmp / "server.log")
        print(f"iris behind one haproxy thread, gunicorn 2 sync workers; wrk 1 thread, {args.duration:g} s, "
              f"median of {args.rounds} interleaved rounds\n")
        print(f"{'conc':>4} {'system':<16} {'req/s':>8} {'x direct':>9} {'x anchor':>9} {'p50 ms':>7} {'p50 +ms':>8} "
              f"{'cpu/req us':>10} {'+us':>5} {'haproxy us':>10}")
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            runs: dict[str, list[Figures]] = {label: [] for label in systems}
            proxy_cpu: dict[str, list[float]] = {label: [] for label in proxy_pids}
            for _ in range(args.rounds):
                for label, url in systems.items():
                    wrk(url, body, concurrency, min(1.0, args.duration), tmp)  # warm up
                    before = cpu_seconds(proxy_pids[label]) if label in proxy_pids else 0.0
                    runs[label].append(wrk(url, body, concurrency, args.duration, tmp))
                    if label in proxy_pids:
                        answered = runs[label][-1].rps * max(1, round(args.duration))
                        proxy_cpu[label].append((cpu_seconds(proxy_pids[label]) - before) / answered * 1e6)
            median = {label: Figures(statistics.median(f.rps for f in fs), statistics.median(f.p50_ms for f in fs),
                                     statistics.median(f.p99_ms for f in fs), sum(f.errors for f in fs),
                                     statistics.median(f.cpu_us for f in fs)) for label, fs in runs.items()}
            base = median["direct"]
            for label, f in median.items():
                anchor = median["direct kept" if "kept" in label else "direct"]  # the same server's workers alone
                print(f"{concurrency:>4} {label:<16} {f.rps:>8,.0f} {f.rps / base.rps:>9.2f} "
                      f"{f.rps / anchor.rps:>9.2f} {f.p50_ms:>7.2f} {f.p50_ms - anchor.p50_ms:>+8.2f} "
                      f"{f.cpu_us:>10,.0f} {f.cpu_us - anchor.cpu_us:>+5.0f} "
                      f"{statistics.median(proxy_cpu[label]) if label in proxy_cpu else 0:>10.0f}")
            sys.stdout.flush()
    finally:
        for haproxy in haproxies:
            haproxy.terminate()
            haproxy.wait(10)
        for process in processes:
            stop(process)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
