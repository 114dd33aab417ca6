"""Regenerate ``sample.json``: the 150 iris rows as job items.

    python examples/iris-batch/make_sample.py
"""

import json
import os

from sklearn.datasets import load_iris

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE_PATH = os.path.join(HERE, "sample.json")
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def main():
    iris = load_iris()
    items = [
        {name: round(float(value), 2) for name, value in zip(FEATURES, row, strict=False)}
        for row in iris.data
    ]
    # one item per line: valid JSON that still diffs nicely
    lines = ",\n".join("  " + json.dumps(item) for item in items)
    with open(SAMPLE_PATH, "w") as f:
        f.write("[\n" + lines + "\n]\n")
    print(f"wrote {len(items)} items to {SAMPLE_PATH}")


if __name__ == "__main__":
    main()
