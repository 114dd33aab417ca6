"""Where this process's figures go: nowhere until its entry point installs a recorder.

Code deep inside a predictor's runtime (the model manager, loading a model on a live-reload
thread) has figures to report but no connection to hand them to, and threading one through
every constructor between a worker or replica and the model manager would couple them all to
metrics. So, as with logging, a process installs one sink at start-up (`install`), and code
reports to it by figure name; with none installed (unit tests, tools) reports are dropped.

The sink is `foundation.figures.Recorder` in every Sluice process; it keeps counts in memory and
sends them to Redis in the background, so a report never waits on the network.
"""

from __future__ import annotations

from typing import Protocol


class FigureSink(Protocol):
    """What receives a process's figures (see `foundation.figures.Recorder`)."""

    def count(self, name: str, labels: tuple[str, ...], amount: int = 1) -> None: ...

    def observe(self, name: str, labels: tuple[str, ...], value: float) -> None: ...


_sink: FigureSink | None = None


def install(sink: FigureSink | None) -> None:
    """Make `sink` receive this process's figures (None: drop them again)."""
    global _sink
    _sink = sink


def installed() -> FigureSink | None:
    return _sink


def count(name: str, labels: tuple[str, ...], amount: int = 1) -> None:
    """Add `amount` to counter `name` for `labels` (label values in the figure's label order)."""
    sink = _sink
    if sink is not None:
        sink.count(name, labels, amount)


def observe(name: str, labels: tuple[str, ...], value: float) -> None:
    """Record one observation of histogram `name` for `labels`."""
    sink = _sink
    if sink is not None:
        sink.observe(name, labels, value)
