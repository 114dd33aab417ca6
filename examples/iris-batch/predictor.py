"""Batch predictor for the iris example.

Each batch is a list of flower measurements. The predictor classifies them,
writes one JSON file per batch under ``<results_dir>/<job_id>/``, and when the
job is done aggregates those files into ``summary.json``. Reading the files back
(rather than trusting the in-memory counts) keeps the summary right when the
job ran on several workers, each seeing only part of the batches.
"""

import json
import logging
import os
import pickle
import re
import tempfile
from collections import Counter

logger = logging.getLogger(__name__)

# Global scope runs once per process, before the class is instantiated.
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
DEFAULT_LABELS = ["setosa", "versicolor", "virginica"]
SUMMARY_FILE = "summary.json"


def _resolve(path):
    """Resolve a path from the config: relative paths are taken from the project
    folder, which is the working directory the predictor runs in. Fall back to
    the folder of this file, so the class also works when imported elsewhere."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), path)


def _safe_name(name):
    # batch ids are uuids, but never let one escape the results folder
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(name))


def _write_json(path, data):
    """Write through a temporary file so readers never see a partial file."""
    folder = os.path.dirname(path)
    fd, tmp_path = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.chmod(tmp_path, 0o644)  # mkstemp files are owner-only
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise


class PythonPredictor:
    def __init__(self, config, job_spec):
        model_path = _resolve(config["model"])
        with open(model_path, "rb") as f:
            bundle = pickle.load(f)
        if isinstance(bundle, dict):
            self.model = bundle["model"]
            self.labels = list(bundle.get("labels") or DEFAULT_LABELS)
        else:  # a bare estimator pickled by some other script
            self.model = bundle
            self.labels = DEFAULT_LABELS

        self.job_spec = job_spec
        self.job_id = job_spec["job_id"]
        self.results_dir = os.path.join(config["results_dir"], _safe_name(self.job_id))
        os.makedirs(self.results_dir, exist_ok=True)

        # What this instance has seen; with several workers each holds a share.
        self.label_counts = Counter()
        self.batches_seen = 0

        logger.info(
            "iris predictor ready",
            extra={"job_id": self.job_id, "model": model_path, "results_dir": self.results_dir},
        )

    def predict(self, payload, batch_id):
        rows = []
        for index, item in enumerate(payload):
            missing = [name for name in FEATURES if name not in item]
            if missing:
                raise ValueError(f"item {index} of batch {batch_id} lacks {', '.join(missing)}")
            rows.append([float(item[name]) for name in FEATURES])

        predicted = self.model.predict(rows) if rows else []
        results = []
        for item, class_index in zip(payload, predicted, strict=False):
            label = self.labels[int(class_index)]
            results.append({"input": item, "label": label})
            self.label_counts[label] += 1
        self.batches_seen += 1

        # A retried batch overwrites its own file, so the summary never counts it twice.
        _write_json(os.path.join(self.results_dir, f"{_safe_name(batch_id)}.json"), results)
        logger.info(
            "classified batch",
            extra={"job_id": self.job_id, "batch_id": batch_id, "items": len(results)},
        )

    def on_job_complete(self):
        labels = Counter()
        batches = 0
        items = 0
        for name in sorted(os.listdir(self.results_dir)):
            if not name.endswith(".json") or name == SUMMARY_FILE or name.startswith("."):
                continue
            with open(os.path.join(self.results_dir, name)) as f:
                results = json.load(f)
            batches += 1
            items += len(results)
            labels.update(result["label"] for result in results)

        summary = {
            "job_id": self.job_id,
            "batches": batches,
            "items": items,
            "labels": dict(sorted(labels.items())),
        }
        _write_json(os.path.join(self.results_dir, SUMMARY_FILE), summary)
        logger.info(
            "job summary written",
            extra={
                "job_id": self.job_id,
                "batches": batches,
                "items": items,
                # this instance's own share, handy to compare across workers
                "seen_here": dict(self.label_counts),
            },
        )
