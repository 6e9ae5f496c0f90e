"""One GPU run that builds, checks and times kbrl's built-in candidates, and measures timing spread.

Usage (on a CUDA host, from the repo root):
    PYTHONPATH=. python bench/gpu_eval.py --out bench/results/gpu_eval.json

Prints, per candidate, the category, per-stage seconds (compile/build, first call, correctness,
timing) and speedups vs eager and torch.compile; then re-evaluates one kernel N times from scratch
(fresh baselines each time) and reports the coefficient of variation of its speedup and runtime.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from kbrl import settings
from kbrl.evalrun import builtin_candidates
from kbrl.kernels.evaluator import EvalConfig, Evaluator, result_summary


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu_eval.json"))
    parser.add_argument("--jobs", type=int, default=4, help="candidates in flight (timing stays serial)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--repeat-samples", default="builtin/L1/5/triton,builtin/L1/1/cuda,builtin/L1/4/cuda")
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args()

    import torch

    gpu = torch.cuda.get_device_name()
    cache = args.cache_dir or settings.cache_dir()
    cold = not any(cache.iterdir())
    candidates = builtin_candidates()
    print(f"device: {gpu}  torch {torch.__version__}  candidates: {len(candidates)}  cache: {cache} "
          f"({'empty' if cold else 'warm'})", flush=True)  # fmt: skip

    ev = Evaluator(EvalConfig(device="cuda"), cache_dir=cache)
    started = time.perf_counter()
    rows = []
    results = {}
    for i, r in ev.evaluate_many([(c.problem, c.text) for c in candidates], jobs=args.jobs):
        c = candidates[i]
        results[c.sample_id] = r
        s = r.stage_seconds
        row = {
            "sample": c.sample_id, "category": str(r.category), "n_correct": r.n_correct,
            "runtime_ms": r.runtime.median_ms if r.runtime else None,
            "eager_ms": r.ref_eager.median_ms if r.ref_eager else None,
            "compile_ms": r.ref_compile.median_ms if r.ref_compile else None,
            "speedup_eager": r.speedup_eager, "speedup_compile": r.speedup_compile,
            "max_abs_err": r.max_abs_err, "build_cache_hit": r.build_cache_hit,
            "timing_method": r.runtime.method if r.runtime else None,
            "stages": {k: round(v, 3) for k, v in s.items()}, "error": r.error[:500],
        }  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    first_pass_s = time.perf_counter() - started

    # Same candidates again with the same evaluator: references and baselines cached, CUDA builds cached.
    started = time.perf_counter()
    second = dict(ev.evaluate_many([(c.problem, c.text) for c in candidates], jobs=args.jobs))
    second_pass_s = time.perf_counter() - started
    cuda_hits = [r.build_cache_hit for i, r in second.items() if candidates[i].sample_id.endswith("/cuda")]

    by_id = {c.sample_id: c for c in candidates}
    spread = {}
    for sample in args.repeat_samples.split(","):
        target = by_id[sample]
        repeats = []
        for k in range(args.repeats):
            # A fresh evaluator and no cached baselines: the reference and the kernel are both re-timed, as two
            # independent evaluations would be (CUDA and Triton builds stay cached).
            (cache / "baselines.json").unlink(missing_ok=True)
            fresh = Evaluator(EvalConfig(device="cuda", baseline_compile=False), cache_dir=cache)
            r = fresh.evaluate(target.problem, target.text)
            repeats.append({"speedup_eager": r.speedup_eager, "runtime_ms": r.runtime.median_ms if r.runtime else None,
                            "eager_ms": r.ref_eager.median_ms if r.ref_eager else None,
                            "method": r.runtime.method if r.runtime else None, "interval": r.speedup_eager_ci,
                            "pairs": r.runtime.n_trials if r.runtime else None,
                            "flags": [f.name for f in r.cheat_flags]})  # fmt: skip
            print(f"repeat {sample} {k}: {repeats[-1]}", flush=True)
        speedups = [x["speedup_eager"] for x in repeats if x["speedup_eager"]]
        runtimes = [x["runtime_ms"] for x in repeats if x["runtime_ms"]]
        spread[sample] = {"repeats": repeats, "speedup_cv": cv(speedups), "runtime_cv": cv(runtimes)}

    report = {
        "device": gpu,
        "torch": torch.__version__,
        "n_candidates": len(candidates),
        "cache_was_empty": cold,
        "summary": result_summary(list(results.values())),
        "first_pass_s": first_pass_s,
        "second_pass_s": second_pass_s,
        "second_pass_cuda_build_cache_hits": f"{sum(bool(h) for h in cuda_hits)}/{len(cuda_hits)}",
        "candidates": rows,
        "timing_method": EvalConfig().timing_method,
        "spread": spread,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "candidates"}, indent=1))


if __name__ == "__main__":
    main()
