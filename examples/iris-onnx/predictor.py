"""An ONNX batch predictor: classifies iris rows with the model in `models/iris/`."""

import numpy as np

FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
LABELS = ["setosa", "versicolor", "virginica"]


class ONNXPredictor:
    def __init__(self, onnx_client, config, job_spec):
        self.client = onnx_client
        self.job_id = job_spec["job_id"]

    def predict(self, payload, batch_id):
        rows = np.array([[item[name] for name in FEATURES] for item in payload], dtype=np.float32)
        labels, probabilities = self.client.predict(rows)
        # Returned rows are written to the job's output, when the job asks for one.
        return [
            {"batch_id": batch_id, **item, "label": LABELS[int(label)], "confidence": float(p.max())}
            for item, label, p in zip(payload, labels, probabilities, strict=False)
        ]
