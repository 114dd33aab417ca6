"""Counting what each TrafficSplitter sent to each of its APIs, from haproxy's own counters.

The frontend tracks every request to a splitter's path in a stick table (`SPLIT_TABLE`) twice:
under the splitter's name, whose gpc0 is the draw counter that shares the requests and whose gpc1
counts the copies sent to its shadow, and under `<splitter>/<api>` for the API it was given to,
whose `http_req_cnt` counts them (`sluice/proxy_config.py`). The proxy controller reads the table
of every haproxy worker each turn and adds what grew to `SPLIT_REQUESTS`, which `GET /apis/<name>`
reads back as each API's share. Like the refusal counters (`sluice/proxy_rejections.py`), each
worker's counters start at zero and are followed by its pid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SPLIT_TABLE = "sluice_split"

_KEY = re.compile(r"\bkey=(\S+)")
_SENT = re.compile(r"\bhttp_req_cnt=(\d+)")
_SHADOWED = re.compile(r"\bgpc1=(\d+)")


def split_key(splitter: str, api: str) -> str:
    """The table key counting what `splitter` sent to `api` (both plain API names: no '/' in them)."""
    return f"{splitter}/{api}"


def parse_split_table(text: str) -> dict[tuple[str, str], int]:
    """`show table sluice_split` -> (splitter, api) -> requests sent; a splitter's shadow copies
    are under (splitter, "") until `SplitTally` names the shadow."""
    sent: dict[tuple[str, str], int] = {}
    for line in text.splitlines():
        key = _KEY.search(line)
        if key is None:
            continue
        splitter, _, api = key.group(1).partition("/")
        counter = _SENT.search(line) if api else _SHADOWED.search(line)
        if counter is not None:
            sent[(splitter, api)] = int(counter.group(1))
    return sent


@dataclass
class SplitTally:
    """What each haproxy worker's split counters said last time, so that only growth is counted."""

    _last: dict[int, dict[tuple[str, str], int]] = field(default_factory=dict)

    def update(self, readings: dict[int, dict[tuple[str, str], int]],
               shadows: dict[str, str]) -> dict[tuple[str, str], int]:
        """Worker pid -> its table; `shadows`: splitter -> its shadow API. Returns (splitter, api) ->
        requests sent since the last update (a shadow's copies under its own name)."""
        grown: dict[tuple[str, str], int] = {}
        for pid, table in readings.items():
            before = self._last.get(pid, {})
            for (splitter, api), count in table.items():
                delta = count - before.get((splitter, api), 0)
                name = api or shadows.get(splitter, "")
                if delta > 0 and name:
                    grown[(splitter, name)] = grown.get((splitter, name), 0) + delta
            self._last[pid] = dict(table)
        return grown

    @property
    def following(self) -> bool:
        """Whether some worker's counters are still followed (a splitter deleted since: its last
        requests are still counted)."""
        return any(self._last.values())

    def forget_except(self, pids: set[int]) -> None:
        """Workers that left: their counters are gone with them."""
        for pid in list(self._last):
            if pid not in pids:
                del self._last[pid]
