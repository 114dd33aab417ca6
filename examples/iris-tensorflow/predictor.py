"""A TensorFlow batch predictor: classifies iris rows with the SavedModel in `models/iris/`."""

import numpy as np

FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
LABELS = ["setosa", "versicolor", "virginica"]


class TensorFlowPredictor:
    def __init__(self, tensorflow_client, config, job_spec):
        self.client = tensorflow_client

    def predict(self, payload, batch_id):
        rows = np.array([[item[name] for name in FEATURES] for item in payload], dtype=np.float32)
        outputs = self.client.predict(rows)  # output name -> values, as TensorFlow Serving answers
        return [
            {"batch_id": batch_id, **item, "label": LABELS[int(label)]}
            for item, label in zip(payload, outputs["label"], strict=False)
        ]
