"""`kbrl replay RUN --advantages [--reward-weights …]`: the run's rewards and advantages, recomputed by replay.

With the run's own weights the recomputed numbers must equal, bit for bit, the ones each `PolicyUpdated`
recorded (same events, same code): the command says so per step and exits 1 on any difference. With other
weights it shows what the run's samples would have earned ("what-if"), next to what they did earn.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from kbrl.events.store import EventStore
from kbrl.training.rewards import RewardWeights, from_config, preset


def parse_weights(spec: str, base: RewardWeights) -> RewardWeights:
    """A preset name ('stage3') or comma-separated `reward_*_weight=value` pairs applied on `base`."""
    spec = spec.strip()
    if "=" not in spec:
        return preset(spec)
    pairs: dict[str, Any] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--reward-weights: {item!r} is not key=value")
        pairs[key.strip()] = value.strip()
    return from_config(pairs, base=base)


def print_advantages(url: str, run_id: str, weights_spec: str | None, as_json: bool,
                     gamma: float | None = None) -> int:  # fmt: skip
    from rich.console import Console
    from rich.table import Table

    from kbrl.training.replay import advantages_of, replay_run, run_config

    state = replay_run(EventStore(url), run_id)
    own = run_config(state).reward_weights()
    weights = parse_weights(weights_spec, own) if weights_spec else None
    if gamma is not None and not 0.0 <= gamma <= 1.0:
        raise ValueError(f"--gamma must be in [0, 1], got {gamma}")
    steps = advantages_of(state, weights, gamma)
    what_if = weights is not None or gamma is not None
    mismatches = 0
    rows = []
    for number, (scores, update) in steps.items():
        logged_adv = (update or {}).get("advantages", {})
        logged_rew = (update or {}).get("rewards", {})
        same = update is not None and logged_adv == scores.advantages and logged_rew == scores.rewards
        if not what_if and update is not None and not same:
            mismatches += 1
        rows.append({
            "step": number, "samples": len(scores.rewards),
            "mean_reward": sum(scores.rewards.values()) / max(1, len(scores.rewards)),
            "logged_mean_reward": (sum(logged_rew.values()) / len(logged_rew)) if logged_rew else None,
            "updated": update is not None, "matches_logged": same if update is not None else None,
            "rewards": scores.rewards, "advantages": scores.advantages,
        })  # fmt: skip
    if as_json:
        for row in rows:
            print(json.dumps(row))
    else:
        title = f"{run_id}: " + ("replayed with the run's own settings" if not what_if
                                 else f"what-if weights={weights or 'own'} gamma={gamma if gamma is not None else 'own'}")
        last = "advantages = logged" if not what_if else "what-if = logged"
        table = Table("step", "samples", "mean reward", "logged mean reward", last, title=title)
        for row in rows:
            logged = row["logged_mean_reward"]
            differs = "[red]NO[/]" if not what_if else "differs"
            match = {True: "[green]yes[/]", False: differs, None: "- (not updated yet)"}[row["matches_logged"]]
            table.add_row(str(row["step"]), str(row["samples"]), f"{row['mean_reward']:.4f}",
                          "-" if logged is None else f"{logged:.4f}", match)  # fmt: skip
        Console().print(table)
    return 1 if mismatches else 0


def _run_tokenizer(state_config: dict[str, Any], model: str | None, run_id: str, explicit: str | None) -> Any:
    """The tokenizer that encoded a run's prompts: `explicit`, else the run's model (its tiny model's
    directory for `model_name=tiny`); None when it cannot be loaded (then only token counts are shown)."""
    from pathlib import Path

    source = explicit
    if source is None and state_config.get("model_name") == "tiny":
        source = str(Path(str(state_config.get("log_path", "runs/{run_id}")).format(run_id=run_id)) / "tiny-model")
    source = source or model
    if not source or source == "tiny":
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source)
    except Exception:  # noqa: BLE001 - no tokenizer (offline, a Tinker-only id): show the rest
        return None


def print_samples(url: str, run_id: str, tokenizer: str | None, as_json: bool) -> int:
    """`kbrl replay RUN --samples`: every sample's prompt (decoded when the tokenizer loads), the RA-ICL
    examples it showed and how many the leakage guard withheld. Exit code 1 for an unknown run."""
    from kbrl.events.payloads import EvalRunStarted, RunStarted, SampleGenerated
    from kbrl.training.replay import decode_numbers

    store = EventStore(url)
    if not store.has_run(run_id):
        print(f"error: no run {run_id!r} in the store (see `kbrl runs`)", file=sys.stderr)
        return 1
    started = next(iter(store.read(run_id=run_id, types=[RunStarted, EvalRunStarted])), None)
    payload = started.payload if started is not None else {}
    tok = _run_tokenizer(payload.get("config") or {}, payload.get("model"), run_id, tokenizer)
    for event in store.read(run_id=run_id, types=[SampleGenerated]):
        p = event.payload
        prompt = None
        if tok is not None and p.get("prompt_ref"):
            prompt = tok.decode(decode_numbers(store.get_blob(p["prompt_ref"])))
        row = {"sample_id": event.key, "problem_id": p["problem_id"], "step": p["step"], "turn": p.get("turn", 0),
               "n_prompt_tokens": p.get("n_prompt_tokens"), "rag_examples": p.get("rag_examples") or [],
               "rag_removed_same_task": p.get("rag_removed_same_task"),
               "rag_dropped_for_budget": p.get("rag_dropped_for_budget"), "prompt": prompt}  # fmt: skip
        if as_json:
            print(json.dumps(row, ensure_ascii=False))
            continue
        rag = ("RA-ICL: none" if row["rag_removed_same_task"] is None else
               f"RA-ICL examples: {', '.join(row['rag_examples']) or '-'}; withheld as same task: "
               f"{row['rag_removed_same_task']}; dropped for the token budget: {row['rag_dropped_for_budget']}")  # fmt: skip
        print(f"=== {row['sample_id']}  problem {row['problem_id']}  step {row['step']}  turn {row['turn']}  "
              f"{row['n_prompt_tokens']} prompt tokens\n{rag}")  # fmt: skip
        print(prompt if prompt is not None else "(prompt text not shown: no tokenizer; pass --tokenizer)")
    return 0
