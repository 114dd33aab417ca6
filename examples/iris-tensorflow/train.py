"""Fit a tiny linear iris classifier and export it as a TensorFlow SavedModel, version 1.

The weights come from a least-squares fit in numpy (no training loop), then live in a `tf.Module`
whose `serving_default` signature takes float32 rows of the four features and returns `scores`
and `label`. Writes `models/iris/1/` (saved_model.pb + variables/) next to this file.

    python examples/iris-tensorflow/train.py
"""

from pathlib import Path

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_iris

HERE = Path(__file__).resolve().parent


class LinearIris(tf.Module):
    def __init__(self, weights: np.ndarray, bias: np.ndarray) -> None:
        super().__init__()
        self.weights = tf.Variable(weights, dtype=tf.float32)
        self.bias = tf.Variable(bias, dtype=tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="features")])
    def serve(self, features):
        scores = tf.matmul(features, self.weights) + self.bias
        return {"scores": scores, "label": tf.argmax(scores, axis=1)}


def main(version: int = 1) -> Path:
    iris = load_iris()  # shipped with scikit-learn: no download
    x = np.hstack([iris.data, np.ones((len(iris.data), 1))])
    one_hot = np.eye(3)[iris.target]
    solution, *_ = np.linalg.lstsq(x, one_hot, rcond=None)
    module = LinearIris(solution[:4].astype("float32"), solution[4].astype("float32"))
    accuracy = float(np.mean(np.argmax(x @ solution, axis=1) == iris.target))
    target = HERE / "models" / "iris" / str(version)
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})
    print(f"wrote {target} (training accuracy {accuracy:.3f})")
    return target


if __name__ == "__main__":
    main()
