"""`kbrl replay RUN --advantages [--reward-weights …]`: the run's rewards and advantages, recomputed by replay.

With the run's own weights the recomputed numbers must equal, bit for bit, the ones each `PolicyUpdated`
recorded (same events, same code): the command says so per step and exits 1 on any difference. With other
weights it shows what the run's samples would have earned ("what-if"), next to what they did earn.
"""

from __future__ import annotations

import json
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
