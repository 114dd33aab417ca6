"""Train the iris classifier of the iris-realtime example and export it to ONNX.

Writes a versioned model folder next to this file:

    python examples/iris-realtime/train.py               # models/iris/1/model.onnx (logistic regression)
    python examples/iris-realtime/train.py --version 2   # models/iris/2/model.onnx (a decision tree)

A running API notices a new version within the reload interval and serves it as "latest";
`?version=1` keeps asking the first one. The file is written to a temporary name and renamed,
so the poller never sees half a model.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from skl2onnx import to_onnx
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier

HERE = Path(__file__).resolve().parent

# Version 1 and version 2 are different kinds of model, so `?version=` visibly matters.
MODELS = {
    1: lambda: LogisticRegression(max_iter=1000),
    2: lambda: DecisionTreeClassifier(max_depth=3, random_state=0),
}


def main(version: int = 1, root: Path = HERE) -> Path:
    iris = load_iris()  # shipped with scikit-learn: no download
    features = iris.data.astype("float32")
    model = MODELS[version]().fit(features, iris.target)
    # Plain label and probability tensors: the default ZipMap output is several times slower.
    onnx_model = to_onnx(model, features[:1], options={id(model): {"zipmap": False}})
    target = root / "models" / "iris" / str(version) / "model.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".model-", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(onnx_model.SerializeToString())
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    print(f"wrote {target} ({type(model).__name__}, training accuracy {model.score(features, iris.target):.3f})")
    return target


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", type=int, choices=sorted(MODELS), default=1)
    main(parser.parse_args().version)
