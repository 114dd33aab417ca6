"""Beat's look for AsyncAPI requests whose task message went missing (`beat/lost_requests.py`): a request
is sent again only once it has been found unstarted on every look for the grace period."""

from __future__ import annotations

from beat.lost_requests import LostRequestWatch

GRACE = 10.0


class Looks:
    """What the store answers on each look, and what the watch sent."""

    def __init__(self) -> None:
        self.unstarted: dict[str, list[str]] = {}
        self.sent: list[tuple[str, str]] = []

    def look(self, watch: LostRequestWatch, now: float, apis: tuple[str, ...] = ("echo", "shout")) -> list[str]:
        return watch.look(list(apis), lambda api: self.unstarted.get(api, []),
                          lambda api, request_id: self.sent.append((api, request_id)), now)


def test_a_request_unstarted_on_every_look_for_the_grace_is_sent_again_then_again_each_grace() -> None:
    looks, watch = Looks(), LostRequestWatch(GRACE)
    looks.unstarted = {"echo": ["r1"], "shout": ["r9"]}
    assert looks.look(watch, 0.0) == []
    assert looks.look(watch, 9.9) == []
    assert looks.look(watch, 10.0) == ["echo/r1", "shout/r9"]
    assert looks.look(watch, 15.0) == []
    assert looks.look(watch, 20.0) == ["echo/r1", "shout/r9"]
    assert looks.sent == [("echo", "r1"), ("shout", "r9")] * 2


def test_a_request_missing_from_one_look_starts_its_grace_afresh() -> None:
    looks, watch = Looks(), LostRequestWatch(GRACE)
    looks.unstarted = {"echo": ["r1"]}
    looks.look(watch, 0.0)
    looks.unstarted = {}  # a node took it meanwhile, or its message was counted on the queue
    looks.look(watch, 5.0)
    looks.unstarted = {"echo": ["r1"]}
    assert looks.look(watch, 10.0) == [] and looks.look(watch, 14.0) == []
    assert looks.look(watch, 20.0) == ["echo/r1"]


def test_only_the_apis_given_are_looked_at() -> None:
    looks, watch = Looks(), LostRequestWatch(GRACE)
    looks.unstarted = {"echo": ["r1"], "gone": ["r2"]}
    looks.look(watch, 0.0)
    assert looks.look(watch, GRACE) == ["echo/r1"]
