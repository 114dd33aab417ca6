"""Train the iris classifier used by the iris-batch example.

Writes ``model.pkl`` next to this file. Safe to run repeatedly, from any
working directory: the split and the solver are deterministic, and the file is
replaced atomically, so a worker never reads a half-written pickle.

    python examples/iris-batch/train.py
"""

import os
import pickle
import tempfile

from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_PATH = os.path.join(HERE, "model.pkl")

# The order the predictor feeds features in; it must match the training data.
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def main():
    iris = load_iris()  # bundled with scikit-learn, no download
    x_train, x_test, y_train, y_test = train_test_split(
        iris.data, iris.target, test_size=0.3, random_state=42, stratify=iris.target
    )

    model = LogisticRegression(max_iter=1000)
    model.fit(x_train, y_train)
    accuracy = model.score(x_test, y_test)
    print(f"held-out accuracy: {accuracy:.3f} ({len(y_test)} rows)")

    # Keep the label names with the model so the predictor does not need to
    # know how the classes were encoded.
    bundle = {
        "model": model,
        "features": FEATURES,
        "labels": [str(name) for name in iris.target_names],
    }
    fd, tmp_path = tempfile.mkstemp(dir=HERE, prefix=".model-", suffix=".pkl")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(bundle, f)
        os.chmod(tmp_path, 0o644)  # mkstemp makes it private; workers may run as another user
        os.replace(tmp_path, MODEL_PATH)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise
    print(f"wrote {MODEL_PATH}")


if __name__ == "__main__":
    main()
