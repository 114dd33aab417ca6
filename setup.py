from pathlib import Path

from setuptools import find_packages, setup

requirements = [
    line.strip()
    for line in Path(__file__).with_name("requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="sluice",
    version="0.1.0",
    description="Batch-first ML inference jobs for Cortex-style projects on Celery and Redis",
    python_requires=">=3.11",
    packages=find_packages(include=["foundation", "foundation.*", "jobs", "jobs.*", "api", "api.*", "predictors_runtime", "predictors_runtime.*", "beat", "beat.*", "sluice", "sluice.*", "cortex_internal", "cortex_internal.*", "cortex"]),
    install_requires=requirements,
    # TensorFlow predictors need TensorFlow; the CPU build is enough without a GPU.
    extras_require={"tensorflow": ["tensorflow>=2.15"], "tensorflow-cpu": ["tensorflow-cpu>=2.15"]},
    entry_points={"console_scripts": ["sluice=sluice.cli:run"]},
)
