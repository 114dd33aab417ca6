"""Counting the realtime requests the proxy answers itself (refusals, timeouts), by API and reason.

Replicas count what they answer; what haproxy answers for them (every replica busy and the
queue full, no replica ready, the wait or the run past `request_timeout`, a replica that broke
the connection, a missing key) never reaches a replica. haproxy counts those itself, in a stick
table keyed by API name with one general-purpose counter per reason (`gpc(N)`): each realtime
backend tracks its requests in the table, its own answers carry the reason in `X-Sluice-Error`,
and the frontend increments the reason's counter as the answer leaves (`sluice/proxy_config.py`;
2.6 has no counter action in `http-after-response`, so the increment is the side effect of the
`sc_inc_gpc` sample fetch in a `set-var`).

The proxy controller reads the table of every haproxy worker each turn and adds what grew to
the figures (`foundation/figures.py`). Counters start at zero in the worker a reload starts, and an
old worker keeps its own until it leaves, so each worker's counters are followed by its pid; a
worker's last increments between the controller's last read and its exit are lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TABLE = "sluice_rejected"
# In gpc order; each with the status the client gets.
REASONS: tuple[tuple[str, int], ...] = (
    ("overloaded", 503),
    ("not_ready", 503),
    ("request_timeout", 504),
    ("bad_gateway", 502),
    ("unauthorized", 401),
)
REASON_INDEX = {reason: i for i, (reason, _) in enumerate(REASONS)}

_ROW = re.compile(r"\bkey=(\S+)")
_GPC = re.compile(r"\bgpc(\d+)=(\d+)")


def parse_table(text: str) -> dict[str, list[int]]:
    """`show table sluice_rejected` -> API name -> counters in REASONS order."""
    rows: dict[str, list[int]] = {}
    for line in text.splitlines():
        key = _ROW.search(line)
        if key is None:
            continue
        counts = [0] * len(REASONS)
        for index, value in _GPC.findall(line):
            if int(index) < len(counts):
                counts[int(index)] = int(value)
        rows[key.group(1)] = counts
    return rows


@dataclass
class RejectionTally:
    """What each haproxy worker's counters said last time, so that only growth is counted."""

    _last: dict[int, dict[str, list[int]]] = field(default_factory=dict)

    def update(self, readings: dict[int, dict[str, list[int]]]) -> dict[tuple[str, str], int]:
        """Worker pid -> its table; returns (api, reason) -> new refusals since the last update.

        A pid seen for the first time counts from zero (a worker a reload just started); pids not
        in `readings` are forgotten only when the caller says they left (`forget_except`)."""
        grown: dict[tuple[str, str], int] = {}
        for pid, table in readings.items():
            before = self._last.get(pid, {})
            for api, counts in table.items():
                old = before.get(api, [0] * len(counts))
                for i, (reason, _) in enumerate(REASONS):
                    delta = counts[i] - (old[i] if i < len(old) else 0)
                    if delta > 0:
                        grown[(api, reason)] = grown.get((api, reason), 0) + delta
            self._last[pid] = {api: list(counts) for api, counts in table.items()}
        return grown

    def forget_except(self, pids: set[int]) -> None:
        """Workers that left: their counters are gone with them."""
        for pid in list(self._last):
            if pid not in pids:
                del self._last[pid]
