"""`sluice up --verbose` shows each process's new log lines: what a file gained since the last look,
whole lines only, files that appear later included, old lines of a restarted stack not repeated."""

from __future__ import annotations

from pathlib import Path

from sluice.log_follow import LogFollower


def test_new_lines_of_each_file_are_shown_once_and_old_ones_never(tmp_path: Path) -> None:
    (tmp_path / "api.log").write_text("from the last run\n")
    follower = LogFollower(tmp_path)
    assert follower.new_lines() == []

    with open(tmp_path / "api.log", "a") as f:
        f.write("listening\nhalf a li")
    (tmp_path / "worker1.log").write_text("ready\n\n")
    assert follower.new_lines() == [("api", "listening"), ("worker1", "ready")]
    assert follower.new_lines() == []

    with open(tmp_path / "api.log", "a") as f:
        f.write("ne\n")
    assert follower.new_lines() == [("api", "half a line")]


def test_a_file_that_was_emptied_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "replicas" / "replica-iris.log"
    log.parent.mkdir()
    log.write_text("a long first run of lines\n")
    follower = LogFollower(tmp_path)
    log.write_text("new\n")
    assert follower.new_lines() == [("replicas/replica-iris", "new")]


def test_a_missing_folder_has_no_lines_until_it_exists(tmp_path: Path) -> None:
    follower = LogFollower(tmp_path / "logs")
    assert follower.new_lines() == []
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "redis.log").write_text("Ready to accept connections\n")
    assert follower.new_lines() == [("redis", "Ready to accept connections")]
