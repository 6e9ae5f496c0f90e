#!/usr/bin/env bash
# The GPU half in one device call: environment facts, the evaluator benchmark (cold caches), then the
# GPU-marked tests (reusing the benchmark's CUDA builds). Everything lands in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kbrl-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 KBRL_CACHE_DIR=/tmp/kbrl-cache
{
  nvidia-smi -L
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  if unshare --net --pid --fork --mount-proc --kill-child true; then echo "namespaces: yes"; else echo "namespaces: no"; fi
  nproc
} 2>&1 | tee "$OUT/env.txt"
case "${1:-all}" in
  bench) python3 bench/gpu_eval.py --out "$OUT/gpu_eval.json" --jobs 8 2>&1 | tee "$OUT/gpu_eval.log" ;;
  # The queue's GPU path (prebuild → evaluation finds the build) and the local training backend on a GPU.
  # Needs the store's packages, carried as wheels in .whl (see the device tool's README).
  queue)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=$PWD:/tmp/site
    python3 -m pytest -p no:cacheprovider -o addopts="" -m gpu tests/test_evaluator_gpu.py -k prebuild -v -rA -s 2>&1 | tee "$OUT/gpu_queue_tests.log"
    python3 -m pytest -p no:cacheprovider -o addopts="" -m gpu tests/training/test_backend_local.py --confcutdir=tests/training -v -rA 2>&1 | tee "$OUT/gpu_training_tests.log" ;;
  tests) python3 -m pytest -p no:cacheprovider --noconftest -m gpu tests/test_evaluator_gpu.py -v -rA 2>&1 | tee "$OUT/gpu_tests.log" ;;
  *) "$0" bench; "$0" tests ;;
esac
