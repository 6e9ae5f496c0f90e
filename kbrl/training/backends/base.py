"""The policy/training backend interface shared by the Tinker service and local transformers+peft training.

The trainer only talks to a `Backend`: sample G completions per prompt (tokens, per-token sampling logprobs,
text), accumulate the importance-sampling policy-gradient loss over `TrainDatum`s, apply one Adam step,
save/load checkpoints, and point the sampler at the newest weights. Keeping both backends behind this one
interface is what lets the CPU tests exercise the same training loop that runs against Tinker.

Semantics both backends follow (Tinker's):
* `sample` returns, per token, the logprob under the distribution the token was drawn from (the sampler's
  q), so `TrainDatum.logprobs` is the denominator of the importance ratio.
* `forward_backward` adds gradients of loss = -Σ_datums Σ_t exp(logp_θ(t) - q(t)) · A(t) (a sum, not a mean:
  scale the learning rate, not the loss) and may be called several times before one `optim_step`.
* `optim_step` applies AdamW (decoupled weight decay) and clears the gradients.
* After `optim_step`, `refresh_sampler()` makes later samples come from the new weights.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Literal, Protocol, Self

from kbrl.training.datums import TrainDatum

StopReason = Literal["stop", "length"]
"""Why a completion ended: a stop token/string (EOS included) or `max_tokens`."""

LossName = Literal["importance_sampling", "ppo", "cispo"]
"""Policy-gradient losses a datum of our layout can feed; the local backend implements importance_sampling."""

PromptLike = Sequence[int] | str
"""A prompt as token ids (what the prompter produces) or as text (encoded with the backend's tokenizer)."""


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the training code uses (both backends hand out an HF tokenizer)."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


@dataclass(frozen=True)
class SampledSequence:
    """One completion: its tokens, the sampler's logprob of each, the decoded text, and why it stopped."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    stop_reason: StopReason

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.logprobs):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.logprobs)} logprobs")


@dataclass(frozen=True)
class AdamParams:
    """Hyper-parameters of one AdamW step (Tinker's `AdamParams`; `grad_clip_norm` 0 means no clipping)."""

    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def __post_init__(self) -> None:
        for name in ("learning_rate", "eps", "weight_decay", "grad_clip_norm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"AdamParams.{name} must be a finite number >= 0, got {value!r}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not (0.0 <= value < 1.0):
                raise ValueError(f"AdamParams.{name} must be in [0, 1), got {value!r}")


class Backend(ABC):
    """A trainable policy: sampling, loss accumulation, optimizer steps and checkpoints.

    `policy_version` counts applied optimizer steps (what `SampleGenerated.policy_version` records);
    `sampler_version` is the policy version the sampler currently serves.
    """

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self._policy_version = 0
        self._sampler_version = 0

    # -- the interface -------------------------------------------------------------------------------------

    @property
    @abstractmethod
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (`encode`, `decode`, `apply_chat_template` when it has one)."""

    @abstractmethod
    def sample(
        self,
        prompts: Sequence[PromptLike],
        n: int,
        max_tokens: int,
        temperature: float = 1.0,
        stop: Sequence[str] | Sequence[int] | None = None,
    ) -> list[list[SampledSequence]]:
        """`n` completions for each prompt, in prompt order. `stop`: strings or token ids; None means EOS."""

    @abstractmethod
    def forward_backward(
        self, datums: Sequence[TrainDatum], loss: LossName = "importance_sampling"
    ) -> dict[str, float]:
        """Accumulate gradients of `loss` over `datums`; returns metrics, always with `loss` (the sum)."""

    @abstractmethod
    def optim_step(self, params: AdamParams) -> dict[str, float]:
        """Apply one AdamW step with the accumulated gradients, then clear them; returns metrics."""

    @abstractmethod
    def save_checkpoint(self, name: str) -> str:
        """Save weights and optimizer state under `name`; returns the path/URI `load_checkpoint` takes."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore weights and optimizer state saved by `save_checkpoint` (the sampler follows)."""

    @abstractmethod
    def refresh_sampler(self) -> None:
        """Make `sample` use the current weights (after `optim_step` or `load_checkpoint`)."""

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing to release
        """Release remote sessions or other resources; the backend is unusable afterwards."""

    # -- shared helpers ------------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """Number of optimizer steps applied to the weights being trained."""
        return self._policy_version

    @property
    def sampler_version(self) -> int:
        """The `policy_version` whose weights `sample` draws from."""
        return self._sampler_version

    def restore_version(self, version: int) -> None:
        """Set the policy (and sampler) version after a resume, from the run's `CheckpointSaved` event:
        the event log, not the backend's own state, is the record of how many updates were applied."""
        self._policy_version = self._sampler_version = int(version)

    def encode_prompt(self, prompt: str | Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids for a user message (or a chat), through the chat template when the tokenizer has one.

        Without a template the message contents are joined with newlines and encoded as plain text, which
        is what a base model (or the tiny test model) expects.
        """
        return encode_chat(self.tokenizer, prompt)

    def _prompt_ids(self, prompt: PromptLike) -> list[int]:
        """A prompt as a non-empty list of ids (text is encoded without a chat template)."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ValueError("empty prompt: a completion needs at least one token of context")
        return ids

    @staticmethod
    def _check_sample_args(n: int, max_tokens: int, temperature: float) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def encode_chat(tokenizer: Any, prompt: str | Sequence[Mapping[str, str]]) -> list[int]:
    """`Backend.encode_prompt` for any HF tokenizer (also used before a backend exists, e.g. a warm start)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # transformers >= 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer.encode("\n".join(m["content"] for m in messages))]


def kl_sample_train(
    datums: Sequence[TrainDatum], learner_logprobs: Sequence[Sequence[float]]
) -> dict[str, float]:
    """Drift between sampler and learner on the action tokens, as the Tinker cookbook reports it.

    v1 = mean(q - logp), v2 = 0.5 · mean((q - logp)²). Near zero when sampling is on-policy; a growing
    value means the sampler's logprobs (the IS denominator) no longer describe the weights being trained.
    """
    diffs: list[float] = []
    for datum, learner in zip(datums, learner_logprobs, strict=True):
        for q, p, m in zip(datum.logprobs, learner, datum.mask, strict=True):
            if m > 0:
                diffs.append(q - p)
    if not diffs:
        return {}
    return {
        "kl_sample_train_v1": math.fsum(diffs) / len(diffs),
        "kl_sample_train_v2": 0.5 * math.fsum(d * d for d in diffs) / len(diffs),
    }
