"""What an operator reads about a RealtimeAPI's replicas: the scaler's count and figure, placement's
hosts and pending reason, and the replicas that serve, counted on the host whose agent started them."""

from __future__ import annotations

from api.replica_counts import HostReplicas, realtime_counts
from foundation.replica_directory import ReplicaRecord
from foundation.replica_placement import PlacedReplicas
from foundation.replica_scale import ReplicaScale


def replica(replica_id: str, placement_host: str, *, ready: bool = True, draining: bool = False) -> ReplicaRecord:
    return ReplicaRecord(replica_id=replica_id, api="iris", bundle="b1", host="10.0.0.1", port=9000, processes=1,
                         ready=ready, draining=draining, seen=100.0, placement_host=placement_host)


def test_ready_replicas_are_counted_on_the_placement_host_that_started_them_even_on_one_address() -> None:
    # Two agents on one machine (a --cpu and a --gpu one) share an address: the host id tells them apart.
    placed = PlacedReplicas({"box/10.0.0.1/cpu": 2, "box/10.0.0.1/gpu": 1}, desired=4, pending=1,
                            reason="no host has 1 gpu free")
    live = [replica("a", "box/10.0.0.1/cpu"), replica("b", "box/10.0.0.1/cpu", ready=False),
            replica("c", "box/10.0.0.1/gpu"), replica("d", "box/10.0.0.1/gpu", draining=True)]
    counts = realtime_counts(placed, ReplicaScale(4, 7.5, 50.0), live, init_replicas=1)
    assert counts.hosts == {"box/10.0.0.1/cpu": HostReplicas(2, 1), "box/10.0.0.1/gpu": HostReplicas(1, 1)}
    assert (counts.desired, counts.ready, counts.starting, counts.pending) == (4, 2, 1, 1)
    assert counts.states() == {"ready": 2, "starting": 1, "pending": 1}
    assert counts.to_dict() == {
        "desired": 4, "ready": 2, "starting": 1, "pending": 1, "in_flight": 7.5,
        "hosts": {"box/10.0.0.1/cpu": {"desired": 2, "ready": 1}, "box/10.0.0.1/gpu": {"desired": 1, "ready": 1}},
        "pending_reason": "no host has 1 gpu free",
    }


def test_before_any_placement_or_decision_the_api_wants_its_init_replicas_and_saw_nothing() -> None:
    counts = realtime_counts(None, None, [], init_replicas=2)
    assert counts.to_dict() == {"desired": 2, "ready": 0, "starting": 0, "pending": 0, "in_flight": 0.0, "hosts": {}}


def test_a_replica_started_by_hand_counts_in_the_total_but_on_no_host() -> None:
    counts = realtime_counts(PlacedReplicas({"h1": 1}, desired=1), ReplicaScale(1, 0.5, 1.0),
                             [replica("a", "h1"), replica("manual", "")], init_replicas=1)
    assert (counts.ready, counts.hosts) == (2, {"h1": HostReplicas(1, 1)})
    assert "pending_reason" not in counts.to_dict()  # nothing is pending
