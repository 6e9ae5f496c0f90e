"""Backend-neutral training datums, laid out exactly as Tinker's `Datum` for the importance-sampling loss.

One `TrainDatum` is one sampled sequence ready for `Backend.forward_backward`. Its four arrays share the
next-token alignment of Tinker (and of every causal LM): position i of `model_input` predicts
`target_tokens[i]`. With `ob_len = len(prompt) - 1`, positions `< ob_len` predict prompt tokens (nothing to
learn: advantage 0, sampling logprob 0) and positions `>= ob_len` predict the completion tokens:

    model_input   = prompt + completion[:-1]
    target_tokens = [0] * ob_len   + completion
    logprobs      = [0.0] * ob_len + sampling_logprobs
    advantages    = [0.0] * ob_len + [A] * len(completion)

This is the layout of the Tinker cookbook's minimal RL loop (`tinker_cookbook/recipes/rl_loop.py`), so the
Tinker backend converts a `TrainDatum` field by field, and the local backend computes the same loss on it.
Plain lists of Python numbers keep it JSON-able and free of torch/numpy, so the updater and replay can build
and compare datums without a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


class DatumError(ValueError):
    """A datum whose parts do not line up (lengths, empty prompt or completion, non-finite numbers)."""


@dataclass(frozen=True)
class TrainDatum:
    """One sequence for the policy-gradient loss; all four lists have the same length.

    `mask` marks the positions whose target is a sampled (action) token: 1.0 there, 0.0 on prompt
    positions. Backends use it for metrics only (token counts, sampler/learner drift); it is not part of the
    loss and is not sent to Tinker (the cookbook strips it too).
    """

    model_input: tuple[int, ...]
    target_tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    mask: tuple[float, ...]

    def __post_init__(self) -> None:
        lengths = {
            "model_input": len(self.model_input),
            "target_tokens": len(self.target_tokens),
            "logprobs": len(self.logprobs),
            "advantages": len(self.advantages),
            "mask": len(self.mask),
        }
        if len(set(lengths.values())) != 1:
            raise DatumError(f"datum parts must all have the same length, got {lengths}")
        if lengths["model_input"] == 0:
            raise DatumError("datum is empty")
        for name in ("logprobs", "advantages"):
            bad = [i for i, v in enumerate(getattr(self, name)) if not math.isfinite(v)]
            if bad:
                raise DatumError(f"{name} has non-finite values at positions {bad[:5]}")

    def __len__(self) -> int:
        return len(self.model_input)

    @property
    def n_action_tokens(self) -> int:
        """How many positions predict a sampled token (the completion length for a single turn)."""
        return int(sum(self.mask))


def build_datum(
    prompt_tokens: Sequence[int],
    completion_tokens: Sequence[int],
    sampling_logprobs: Sequence[float],
    advantage: float | Sequence[float],
) -> TrainDatum:
    """The cookbook's datum for one (prompt, completion) pair; `advantage` is one number or one per token.

    `sampling_logprobs[i]` is the sampler's logprob of `completion_tokens[i]` (what `Backend.sample`
    returned). A per-token advantage list is accepted for credit assignment schemes that vary inside a
    completion; GRPO passes one number.
    """
    prompt = [int(t) for t in prompt_tokens]
    completion = [int(t) for t in completion_tokens]
    logprobs = [float(x) for x in sampling_logprobs]
    if len(prompt) < 1:
        raise DatumError("prompt must have at least one token (the first target is predicted from it)")
    if len(completion) < 1:
        raise DatumError("completion is empty: nothing to train on")
    if len(logprobs) != len(completion):
        raise DatumError(
            f"got {len(logprobs)} sampling logprobs for {len(completion)} completion tokens; "
            "they must match one to one"
        )
    if isinstance(advantage, Sequence):
        per_token = [float(a) for a in advantage]
        if len(per_token) != len(completion):
            raise DatumError(
                f"got {len(per_token)} per-token advantages for {len(completion)} completion tokens"
            )
    else:
        per_token = [float(advantage)] * len(completion)
    ob_len = len(prompt) - 1
    return TrainDatum(
        model_input=tuple(prompt + completion[:-1]),
        target_tokens=tuple([0] * ob_len + completion),
        logprobs=tuple([0.0] * ob_len + logprobs),
        advantages=tuple([0.0] * ob_len + per_token),
        mask=tuple([0.0] * ob_len + [1.0] * len(completion)),
    )
