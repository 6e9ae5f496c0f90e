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
  # kbrl's evaluator vs KernelBench's own harness (bench/eval_throughput.py), ~8 min on an H100. Needs .kb/
  # (bench/prepare_kernelbench.sh: KernelBench's source and the wheels its eval imports), carried as `.kb`.
  # The limits are explicit: --budget-s stops starting KernelBench evaluations and fresh repeats after 420 s
  # (what is running finishes: at most one CUDA build, ~60 s); --kb-timeout-s / --kbrl-timeout-s per candidate.
  throughput)
    test -d .kb/KernelBench/src/kernelbench || { echo "no .kb/KernelBench: run bench/prepare_kernelbench.sh and carry .kb"; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/kb-site .kb/wheels/*.whl || exit 2
    export KB_SITE=/tmp/kb-site KERNELBENCH_ROOT=$PWD/.kb/KernelBench
    python3 bench/eval_throughput.py --out "$OUT/eval_throughput.json" --harness kbrl,kernelbench \
      --candidates builtin --backends triton,cuda --jobs 8 \
      --only 'triton$|builtin/L1/[1-8]/cuda$' --kb-only 'builtin/L1/.*triton$|builtin/L1/[15]/cuda$' \
      --repeat-samples builtin/L1/5/triton,builtin/L1/1/cuda --repeats 5 --kb-cuda-repeats 1 \
      --baselines eager --kbrl-tolerance upstream --budget-s 420 --kb-timeout-s 150 --kbrl-timeout-s 180 \
      "${@:2}" 2>&1 | tee "$OUT/eval_throughput.log" ;;
  tests) python3 -m pytest -p no:cacheprovider --noconftest -m gpu tests/test_evaluator_gpu.py -v -rA 2>&1 | tee "$OUT/gpu_tests.log" ;;
  *) "$0" bench; "$0" tests ;;
esac
