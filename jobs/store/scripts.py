"""The store's Lua scripts, one file each in `jobs/store/lua/` (shipped as package data: pyproject.toml).

Each script is one round trip that must not be split: counting a batch once, moving a status only
from an allowed one, telling exactly one caller that a job completed. They are registered with
redis-py's `register_script`, which sends the script again on `NOSCRIPT` (a promoted replica's
script cache is empty after a failover): never cache their SHAs by hand.
"""

from __future__ import annotations

import redis
from redis.commands.core import Script

from jobs.lua_scripts import lua_source

SCRIPTS = ("transition", "begin_batch", "record_batch", "seal", "claim_completion", "note_predictor")


def source(name: str) -> str:
    """The text of `lua/<name>.lua`, read once per process."""
    if name not in SCRIPTS:
        raise ValueError(f"no store script named {name!r}")
    return lua_source("jobs.store", name)


def register(client: redis.Redis, name: str) -> Script:
    """The script `name`, registered on `client` (nothing is sent to Redis until it first runs)."""
    return client.register_script(source(name))
