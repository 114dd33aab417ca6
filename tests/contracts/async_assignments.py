"""The AsyncAPI placement record's contract (`jobs.placement.asyncapi.AsyncAssignments`).

Fixtures a subclass provides: `assignments` (empty).
"""

from __future__ import annotations

from jobs.placement.asyncapi import AsyncAssignments, Placed


class AsyncAssignmentsContract:
    def test_nothing_placed_reads_as_nothing(self, assignments: AsyncAssignments) -> None:
        assert assignments.all() == {} and assignments.placed() == {}

    def test_nodes_read_back_with_the_count_wanted_as_many_unless_given(self, assignments: AsyncAssignments) -> None:
        assignments.set("summarise", ["celery@a", "celery@b"])
        assignments.set("translate", ["celery@a"], desired=3, in_flight=7.5)

        assert assignments.all() == {"summarise": ["celery@a", "celery@b"], "translate": ["celery@a"]}
        assert assignments.placed() == {"summarise": Placed(["celery@a", "celery@b"], 2, 0.0),
                                        "translate": Placed(["celery@a"], 3, 7.5)}

    def test_a_placement_replaces_the_last_and_a_forgotten_api_is_gone(self, assignments: AsyncAssignments) -> None:
        assignments.set("summarise", ["celery@a"])
        assignments.set("summarise", [], desired=0)
        assignments.set("translate", ["celery@b"])

        assignments.forget("translate")
        assignments.forget("never-deployed")

        assert assignments.placed() == {"summarise": Placed([], 0, 0.0)}
