"""The requests in flight at the proxies: each proxy adds samples to running totals, beat takes the
difference of two readings as each proxy's mean and sums the live proxies'."""

from __future__ import annotations

from foundation.proxy_load import InFlightMeter, LoadTally, ProxyLoad
from sluice.proxy_config import in_flight_by_api

T0 = 1_700_000_000.0


class Proxy:
    """A proxy's side, as the controller runs it: samples, then publishes its totals."""

    def __init__(self, proxy_id: str) -> None:
        self.proxy_id, self.tally = proxy_id, LoadTally()

    def samples(self, *in_flight: dict[str, int]) -> Proxy:
        for sample in in_flight:
            self.tally.add(sample)
        return self

    def published(self, at: float) -> ProxyLoad:
        return self.tally.record(self.proxy_id, at)


def test_beat_sees_each_proxys_mean_since_its_last_reading_and_the_proxies_add_up() -> None:
    meter, a, b = InFlightMeter(), Proxy("edge-a"), Proxy("edge-b")
    a.samples({"iris": 9}), b.samples({"iris": 9})  # before beat's first reading: not counted

    assert meter.read([a.published(T0), b.published(T0)], T0) is None  # baselines only

    a.samples({"iris": 2}, {"iris": 4}, {"iris": 6}, {"iris": 0})       # mean 3
    b.samples({"iris": 1, "mlp": 5}, {"iris": 1, "mlp": 7})              # means 1 and 6
    assert meter.read([a.published(T0 + 5), b.published(T0 + 5)], T0 + 5) == {"iris": 4.0, "mlp": 6.0}


def test_a_proxy_that_went_silent_stops_counting() -> None:
    meter, a, b = InFlightMeter(ttl_s=5), Proxy("edge-a"), Proxy("edge-b")
    meter.read([a.published(T0), b.published(T0)], T0)
    a.samples({"iris": 2}), b.samples({"iris": 3})
    last_of_b = b.published(T0 + 1)
    assert meter.read([a.published(T0 + 1), last_of_b], T0 + 1) == {"iris": 5.0}

    a.samples({"iris": 2})
    assert meter.read([a.published(T0 + 10), last_of_b], T0 + 10) == {"iris": 2.0}
    assert meter.read([last_of_b], T0 + 20) is None  # no proxy left: nothing can be said


def test_between_two_publications_a_proxy_counts_as_it_did() -> None:
    meter, a = InFlightMeter(), Proxy("edge-a")
    meter.read([a.published(T0)], T0)
    a.samples({"iris": 4})
    published = a.published(T0 + 1)
    assert meter.read([published], T0 + 1) == {"iris": 4.0}

    assert meter.read([published], T0 + 1.5) == {"iris": 4.0}  # beat read again before it published


def test_a_restarted_proxy_starts_from_a_new_baseline_not_a_negative_figure() -> None:
    meter, old = InFlightMeter(), Proxy("edge-a")
    meter.read([old.published(T0)], T0)
    old.samples({"iris": 8}, {"iris": 8})
    meter.read([old.published(T0 + 1)], T0 + 1)

    restarted = Proxy("edge-a").samples({"iris": 1})  # same id, totals from zero, a new boot
    assert meter.read([restarted.published(T0 + 2)], T0 + 2) is None  # its baseline only
    restarted.samples({"iris": 3})
    assert meter.read([restarted.published(T0 + 3)], T0 + 3) == {"iris": 3.0}


def test_an_api_a_proxy_no_longer_routes_adds_nothing_there() -> None:
    meter, a = InFlightMeter(), Proxy("edge-a")
    meter.read([a.published(T0)], T0)
    a.samples({"iris": 2, "mlp": 6})
    assert meter.read([a.published(T0 + 1)], T0 + 1) == {"iris": 2.0, "mlp": 6.0}

    a.samples({"iris": 2})  # mlp deleted: no longer sampled
    assert meter.read([a.published(T0 + 2)], T0 + 2) == {"iris": 2.0}


def test_an_apis_in_flight_at_haproxy_is_its_backends_sessions_queued_ones_included() -> None:
    rows = [
        {"pxname": "public", "svname": "FRONTEND", "qcur": "", "scur": "12"},
        {"pxname": "management", "svname": "BACKEND", "qcur": "0", "scur": "1"},
        {"pxname": "rt_iris", "svname": "r1", "qcur": "0", "scur": "2"},
        {"pxname": "rt_iris", "svname": "r2", "qcur": "1", "scur": "1"},
        {"pxname": "rt_iris", "svname": "BACKEND", "qcur": "7", "scur": "11"},  # 3 running, 8 waiting
        {"pxname": "rt_mlp-2", "svname": "BACKEND", "qcur": "0", "scur": "0"},
    ]
    assert in_flight_by_api(rows) == {"iris": 11, "mlp-2": 0}


def test_a_proxy_read_again_before_it_published_anything_new_says_nothing_yet() -> None:
    meter, a = InFlightMeter(), Proxy("edge-a").samples({"iris": 6})
    baseline = a.published(T0)
    meter.read([baseline], T0)

    assert meter.read([baseline], T0 + 0.2) is None  # not a sample of 0
