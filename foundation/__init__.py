"""What every Sluice process stands on, and nothing above it: settings, Redis key names and
clients (`redis_clients`: one policy per kind of client), the error tree, figures (metrics) and
the store they are summed in, JSON logs and log streams, API keys, and the registries of deployed
APIs and of realtime replicas.

It knows neither Flask nor Celery (pyproject.toml's import-linter contracts hold it to that), so
a worker node, beat, the proxy controller and a replica launcher load only what they use.

Each collaborator that lives in Redis is a Protocol that callers type against, with its Redis
implementation beside it and an in-memory fake in `memory` for fast tests of any layer:
`api_registry.ApiRegistry`, `replica_directory.ReplicaDirectory`, `log_streams.LogStreams`,
`figure_store.FigureStore` (under `figures.Recorder`). Both pass the same contract tests
(tests/contracts/).
"""
