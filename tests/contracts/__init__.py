"""Contract tests of Sluice's collaborators, each written once and run against every implementation.

Each module holds one class of tests, `<Collaborator>Contract`, whose tests ask for the
collaborator by fixture (the module's docstring names the fixtures). A tier runs a contract by
subclassing it and providing those fixtures: tests/unit/ against the in-memory fakes, and
tests/integration/ against the Redis implementations on a real redis-server. The foundation's
(API registry, replica directory, log streams, figure store) run in
tests/unit/test_foundation_fakes.py and tests/integration/test_foundation_redis.py.

A fake may stand in for Redis in fast tests only because it passes these. What only one
implementation has (Redis's expiry, a fake's `unreachable` switch) is tested beside the subclass.

pytest collects neither this package (its modules are not `test_*.py`) nor the contract classes
(their names do not start with `Test`): only the subclasses run.
"""
