"""The replica placement record's contract (`foundation.replica_placement.ReplicaAssignments`).

Fixtures a subclass provides: `assignments` (empty).
"""

from __future__ import annotations

from foundation.replica_placement import PlacedReplicas, ReplicaAssignments, on_host


class ReplicaAssignmentsContract:
    def test_nothing_placed_reads_as_nothing(self, assignments: ReplicaAssignments) -> None:
        assert assignments.all() == {}

    def test_a_placement_reads_back_whole_with_what_did_not_fit(self, assignments: ReplicaAssignments) -> None:
        placed = PlacedReplicas({"box-b": 1, "box-a": 2}, desired=4, pending=1, reason="no host has 1 gpu free")
        assignments.set("iris", placed)

        assert assignments.all() == {"iris": placed}
        assert on_host(assignments.all(), "box-a") == {"iris": 2}
        assert on_host(assignments.all(), "box-c") == {}

    def test_the_latest_placement_replaces_the_last(self, assignments: ReplicaAssignments) -> None:
        assignments.set("iris", PlacedReplicas({"box-a": 2}, desired=2))
        assignments.set("iris", PlacedReplicas({"box-b": 1}, desired=1))

        assert assignments.all() == {"iris": PlacedReplicas({"box-b": 1}, desired=1)}

    def test_a_deleted_api_is_forgotten_and_others_stay(self, assignments: ReplicaAssignments) -> None:
        assignments.set("iris", PlacedReplicas({"box-a": 1}, desired=1))
        assignments.set("mlp", PlacedReplicas({"box-b": 2}, desired=2))

        assignments.forget("iris")
        assignments.forget("never-deployed")

        assert assignments.all() == {"mlp": PlacedReplicas({"box-b": 2}, desired=2)}
