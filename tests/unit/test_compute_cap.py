"""A worker node's own memory limit and CPU weight follow the job whose batch it runs (jobs/nodes/compute_cap.py)."""

from __future__ import annotations

from foundation.memory_limits import NODE_MARGIN_BYTES
from jobs.nodes.compute_cap import ComputeCap

MIB = 1024 * 1024


def test_the_limit_becomes_each_jobs_compute_mem_and_sluices_part_then_what_the_node_started_with(tmp_path):
    limit_file = tmp_path / "memory.limit_in_bytes"
    limit_file.write_text(str(8192 * MIB))
    cap = ComputeCap.from_env({"SLUICE_MEMORY_LIMIT_FILE": str(limit_file)})

    cap.require("300Mi")
    assert int(limit_file.read_text()) == 300 * MIB + NODE_MARGIN_BYTES == cap.current
    cap.require("2G")
    assert int(limit_file.read_text()) == 2 * 10**9 + NODE_MARGIN_BYTES
    cap.require(None)  # a job that sets no compute.mem: the host's memory again
    assert int(limit_file.read_text()) == 8192 * MIB


def test_a_limit_that_cannot_be_written_keeps_the_one_in_place(tmp_path):
    limit_file = tmp_path / "limit"
    limit_file.write_text(str(1024 * MIB))
    cap = ComputeCap(limit_file)
    limit_file.unlink()
    limit_file.mkdir()  # any write now fails, as cgroup v1 refuses a limit below what the node holds
    cap.require("100Mi")
    assert cap.current == 1024 * MIB


def test_a_node_started_without_a_limit_file_has_no_limit():
    cap = ComputeCap.from_env({})
    cap.require("100Mi")
    assert cap.current is None


def test_the_cpu_weight_becomes_each_jobs_compute_cpu_in_the_groups_own_units(tmp_path):
    v1, v2 = tmp_path / "cpu.shares", tmp_path / "cpu.weight"
    for path in (v1, v2):
        path.write_text("1024")
    for weight_file, units in ((v1, {"3": 3072, "500m": 512, None: 1024}), (v2, {"3": 300, "500m": 50, None: 100})):
        cap = ComputeCap(None, weight_file)
        for cpu, written in units.items():
            cap.require_compute({"cpu": cpu} if cpu is not None else {})
            assert int(weight_file.read_text()) == written, (weight_file.name, cpu)
