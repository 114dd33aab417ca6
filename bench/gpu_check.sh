#!/usr/bin/env bash
# The GPU check in one command, from the checkout's root on a GPU host: `bash bench/gpu_check.sh`.
#
# The host needs python3 (3.12) with numpy, onnx and onnxruntime (onnxruntime-gpu for the GPU
# path), and no internet: what Sluice needs besides comes from .gpucheck/ (not in git; copy it
# along): whl/ holds CPython 3.12 manylinux x86_64 wheels of Celery, Flask, gunicorn, pydantic,
# redis-py and the rest, installed here into a folder of their own (first on PYTHONPATH, so the
# host's Python stays as it is), and redis/ a redis-server with its libraries, run through its
# wrapper bin/redis-server, which sets LD_LIBRARY_PATH for that process only (exported here, it
# would also reach onnxruntime and the CUDA libraries it loads). Then bench/gpu_check.py runs,
# for at most GPU_CHECK_TIMEOUT_S seconds (270), with any arguments given here; the log goes to
# stdout and, when the OUT environment variable names an output folder, to $OUT/gpu_check.log.
set -u
cd "$(dirname "$0")/.."
SITE=${GPU_CHECK_SITE:-/tmp/site}
REDIS_DIR=${GPU_CHECK_REDIS_DIR:-/tmp/sluice-gpu-check-redis}
PYTHON=${PYTHON:-python3}
LOG=/dev/null
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    LOG=$OUT/gpu_check.log
fi

install_wheels() {
    local wheels=(.gpucheck/whl/*.whl)
    if [ ! -e "${wheels[0]}" ]; then
        echo "SKIP wheels: no .gpucheck/whl/*.whl here; Sluice's dependencies must already be importable"
        return
    fi
    echo "installing ${#wheels[@]} wheels into $SITE"
    if ! "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade \
            --target "$SITE" "${wheels[@]}"; then
        # Without pip, a wheel is a zip of what goes into site-packages (console scripts aside,
        # which the check does not use: it runs `python -m celery` and `python -m gunicorn`).
        echo "pip failed; unpacking the wheels with zipfile instead"
        "$PYTHON" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
            "$SITE" "${wheels[@]}"
    fi
}

place_redis() {
    if [ ! -x .gpucheck/redis/libexec/redis-server ] && [ ! -f .gpucheck/redis/libexec/redis-server ]; then
        echo "no .gpucheck/redis here: using the redis-server on PATH, if any"
        return
    fi
    # A copy outside the checkout, so that its files can be made executable whatever the copy kept.
    rm -rf "$REDIS_DIR" && cp -r .gpucheck/redis "$REDIS_DIR" && chmod +x "$REDIS_DIR"/bin/* "$REDIS_DIR"/libexec/*
    export PATH="$REDIS_DIR/bin:$PATH"
    echo "redis-server: $(command -v redis-server) ($(redis-server --version 2>&1 | head -1))"
}

{
    echo "gpu_check.sh on $(hostname) at $(date -u +%FT%TZ); $("$PYTHON" --version 2>&1) at $(command -v "$PYTHON")"
    install_wheels
    place_redis
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$SITE/bin:$PATH"
    timeout -k 20 "${GPU_CHECK_TIMEOUT_S:-270}" "$PYTHON" bench/gpu_check.py "$@"
    status=$?
    [ "$status" = 124 ] && echo "gpu_check.py ran past ${GPU_CHECK_TIMEOUT_S:-270} s and was stopped"
    echo "gpu_check.py exit status: $status"
    exit "$status"
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
