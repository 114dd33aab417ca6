"""Train an iris classifier with scikit-learn and export it to ONNX as model version 1.

Writes `models/iris/1/model.onnx` next to this file (a versioned model folder: add
`models/iris/2/model.onnx` and running jobs pick it up through live reloading).

    python examples/iris-onnx/train.py
"""

from pathlib import Path

from skl2onnx import to_onnx
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

HERE = Path(__file__).resolve().parent


def main(version: int = 1) -> Path:
    iris = load_iris()  # shipped with scikit-learn: no download
    features = iris.data.astype("float32")
    model = LogisticRegression(max_iter=1000).fit(features, iris.target)
    # Plain label and probability tensors: the default ZipMap output is several times slower.
    onnx_model = to_onnx(model, features[:1], options={id(model): {"zipmap": False}})
    target = HERE / "models" / "iris" / str(version) / "model.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(onnx_model.SerializeToString())
    print(f"wrote {target} (training accuracy {model.score(features, iris.target):.3f})")
    return target


if __name__ == "__main__":
    main()
