"""Sluice's distribution: the packages, and the dependencies of each role.

`pip install sluice` is a client-only install: the `sluice` command and the Python client
(`import sluice`, `import cortex`), which deploy project folders to a Sluice elsewhere and
submit, watch and stop its jobs. Running Sluice itself, its model runtimes and its cloud
storage come as extras, so that a laptop talking to a cluster does not install Celery,
onnxruntime or TensorFlow:

    pip install 'sluice[server]'                  the API, workers, beat, proxy and replicas
    pip install 'sluice[server,onnx,s3]'          ... with ONNX predictors and s3:// storage
    pip install 'sluice[all]'                     every role, predictor type and storage, on CPUs

This file is the one list of them: the Docker image installs `.[server,onnx,s3,gcs]` from it
(docker/Dockerfile), and requirements-dev.txt `-e .[all]`. Code that needs an extra imports it
where it is used, inside `predictors_runtime.extras.needs_extra`, so a missing one is an error
that names the extra to install (tests/unit/test_install_roles.py checks both).
"""

from setuptools import find_packages, setup

# The `sluice` command and the client: HTTP, YAML configs, tables and progress bars, and
# packing a project folder for deploy (predictors_runtime/project.py: .gitignore-style
# .cortexignore patterns, the project's .env).
CLIENT = [
    "click>=8.1",
    "rich>=13",
    "requests>=2.31",
    "PyYAML>=6",
    "pathspec>=0.12",
    "python-dotenv>=1.0",
]

# Running Sluice: the management API (Flask under gunicorn), Celery workers and beat on Redis,
# the proxy's controller, and realtime replicas. No model runtime and no cloud storage client:
# those are extras of their own.
SERVER = [
    "celery[redis]>=5.4,<6",
    "kombu>=5.7,<6",
    "redis[hiredis]>=6.1",
    "Flask>=3.1,<4",
    "gunicorn>=22",
    # The event-loop worker of replicas with server-side batching (sluice/replica_process.py).
    "gevent>=24.2",
    # Validating API configurations and submissions; the OpenAPI document.
    "pydantic>=2.6,<3",
    "prometheus-client>=0.20",
    # Swagger UI's built files, served at /docs (api/browser.py): no CDN needed.
    "swagger-ui-py>=25",
    # Request and response bodies, and every line of a JSON-lines input (jobs/inputs.py).
    "orjson>=3.9",
    # Matching input files against includes/excludes globs (jobs/inputs.py).
    "wcmatch>=8.5",
    # Parquet and CSV job outputs (jobs/outputs.py).
    "pyarrow>=15",
    # The model clients handed to predictors (predictors_runtime/clients) hold arrays in numpy,
    # whatever the predictor type.
    "numpy>=1.26",
    # Per-API environments (predictors_runtime/environments): uv resolves a project's requirements
    # at deploy and installs them on each host; packaging reads requirement lines.
    "uv>=0.5",
    "packaging>=23",
]

ONNX = ["onnxruntime>=1.17"]
S3 = ["boto3>=1.34"]
GCS = ["google-cloud-storage>=2.16"]

EXTRAS = {
    "server": SERVER,
    "onnx": ONNX,
    # TensorFlow predictors; the CPU build is enough without a GPU (and much smaller).
    "tensorflow": ["tensorflow>=2.15"],
    "tensorflow-cpu": ["tensorflow-cpu>=2.15"],
    "s3": S3,
    "gcs": GCS,
    # A CPU deployment running every predictor type against every storage: what the tests
    # need. A GPU host installs `server,onnx,s3,gcs` and then the CUDA builds of onnxruntime
    # and TensorFlow instead, as the image's gpu target does: tensorflow-cpu and tensorflow
    # are two distributions of one package and must not be installed together.
    "all": SERVER + ONNX + ["tensorflow-cpu>=2.15"] + S3 + GCS,
}

setup(
    name="sluice",
    version="0.1.0",
    description="Batch-first ML inference jobs for Cortex-style projects on Celery and Redis",
    python_requires=">=3.11",
    packages=find_packages(include=[
        "foundation", "foundation.*", "jobs", "jobs.*", "api", "api.*", "predictors_runtime", "predictors_runtime.*",
        "beat", "beat.*", "sluice", "sluice.*", "cortex_internal", "cortex_internal.*", "cortex",
    ]),
    # The job store's Lua scripts are files of their own (jobs/store/scripts.py reads them at run time);
    # every package ships its type hints (py.typed, PEP 561).
    package_data={"jobs.store": ["lua/*.lua"], "": ["py.typed"]},
    install_requires=CLIENT,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["sluice=sluice.cli:run"]},
)
