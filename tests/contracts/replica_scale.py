"""The replica-count book's contract (`foundation.replica_scale.ScaleBook`).

Fixtures a subclass provides: `book` (empty).
"""

from __future__ import annotations

from foundation.replica_scale import ReplicaScale, ScaleBook

NOW = 1_700_000_000.0


class ScaleBookContract:
    def test_an_api_never_decided_has_no_record(self, book: ScaleBook) -> None:
        assert book.get("iris") is None
        assert book.all() == {}

    def test_a_decision_reads_back_whole(self, book: ScaleBook) -> None:
        book.set("iris", ReplicaScale(desired=3, in_flight=7.5, decided_at=NOW))

        assert book.get("iris") == ReplicaScale(3, 7.5, NOW)
        assert book.all() == {"iris": ReplicaScale(3, 7.5, NOW)}

    def test_the_latest_decision_replaces_the_last(self, book: ScaleBook) -> None:
        book.set("iris", ReplicaScale(3, 7.5, NOW))
        book.set("iris", ReplicaScale(1, 0.5, NOW + 10))

        assert book.get("iris") == ReplicaScale(1, 0.5, NOW + 10)

    def test_a_deleted_api_is_forgotten_and_others_stay(self, book: ScaleBook) -> None:
        book.set("iris", ReplicaScale(3, 7.5, NOW))
        book.set("mlp", ReplicaScale(2, 4.0, NOW))

        book.forget("iris")
        book.forget("never-deployed")

        assert book.all() == {"mlp": ReplicaScale(2, 4.0, NOW)}
