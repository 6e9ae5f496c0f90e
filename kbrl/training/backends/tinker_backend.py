"""The Tinker service as a `Backend`: LoRA training and sampling run remotely, this process only sends data.

Flow (the SDK's, see /work/shared/notes/tinker.md): `ServiceClient` → `create_lora_training_client(base_model,
rank)` → `forward_backward([Datum], loss_fn="importance_sampling")` → `optim_step(AdamParams)`; sampling goes
through a sampling client made by `save_weights_and_get_sampling_client()`, which `refresh_sampler` replaces
after each update. Checkpoints are `save_state(name)` (weights + optimizer) and resume with
`create_training_client_from_state_with_optimizer(path)`. Every SDK call returns a future; this backend
resolves them with `.result()` so the trainer sees plain values.

Named `tinker_backend` so that `import tinker` still finds the SDK.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kbrl.settings import load_dotenv
from kbrl.training.backends.base import (
    AdamParams,
    Backend,
    LossName,
    PromptLike,
    SampledSequence,
    kl_sample_train,
)
from kbrl.training.datums import TrainDatum

if TYPE_CHECKING:
    import tinker

API_KEY_ENV = "TINKER_API_KEY"


class MissingTinkerAPIKey(RuntimeError):
    """The Tinker backend was chosen but no API key is configured."""


def tinker_api_key(explicit: str | None = None) -> str:
    """The API key: `explicit`, else `TINKER_API_KEY` from the environment or `./.env`; a clear error if none."""
    if explicit:
        return explicit
    load_dotenv()
    key = os.environ.get(API_KEY_ENV, "").strip()
    if not key:
        raise MissingTinkerAPIKey(
            f"{API_KEY_ENV} is not set: export {API_KEY_ENV}=... or put it in ./.env "
            "(get a key from the Tinker console), or choose the local backend"
        )
    return key


def to_tinker_datum(datum: TrainDatum) -> tinker.types.Datum:
    """A `TrainDatum` as the SDK's `Datum` for `importance_sampling`: ints as int64, floats as float32.

    `mask` stays behind: the built-in losses take only target_tokens, logprobs and advantages.
    """
    from tinker import types

    return types.Datum(
        model_input=types.ModelInput.from_ints(list(datum.model_input)),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray(datum.target_tokens, dtype=np.int64)),
            "logprobs": types.TensorData.from_numpy(np.asarray(datum.logprobs, dtype=np.float32)),
            "advantages": types.TensorData.from_numpy(np.asarray(datum.advantages, dtype=np.float32)),
        },
    )


def to_tinker_adam(params: AdamParams) -> tinker.types.AdamParams:
    """Our `AdamParams` as the SDK's, every field passed explicitly (the SDK's own eps default is 1e-12)."""
    from tinker import types

    return types.AdamParams(
        learning_rate=params.learning_rate,
        beta1=params.beta1,
        beta2=params.beta2,
        eps=params.eps,
        weight_decay=params.weight_decay,
        grad_clip_norm=params.grad_clip_norm,
    )


class TinkerBackend(Backend):
    """A LoRA of `base_model` trained and sampled on the Tinker service."""

    name = "tinker"

    def __init__(
        self,
        base_model: str,
        *,
        lora_rank: int = 32,
        seed: int | None = None,
        train_attn: bool = True,
        train_mlp: bool = True,
        train_unembed: bool = True,
        api_key: str | None = None,
        base_url: str | None = None,
        resume_from: str | None = None,
        tokenizer: Any = None,
    ) -> None:
        """Open a session and create the training client (or resume one from a `save_checkpoint` path).

        `tokenizer` overrides the one the SDK would fetch for `base_model` from Hugging Face on first use.
        """
        super().__init__()
        import tinker

        self.base_model = base_model
        self._service = tinker.ServiceClient(api_key=tinker_api_key(api_key), base_url=base_url)
        if resume_from:
            self._training = self._service.create_training_client_from_state_with_optimizer(
                resume_from
            ).result()
        else:
            self._training = self._service.create_lora_training_client(
                base_model=base_model,
                rank=lora_rank,
                seed=seed,
                train_mlp=train_mlp,
                train_attn=train_attn,
                train_unembed=train_unembed,
            ).result()
        self._sampler: Any = None
        self._tokenizer = tokenizer

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = self._training.get_tokenizer()
        return self._tokenizer

    # -- sampling ------------------------------------------------------------------------------------------

    def refresh_sampler(self) -> None:
        """Publish the current weights to a new sampling client (Tinker samples only from saved weights)."""
        self._sampler = self._training.save_weights_and_get_sampling_client().result()
        self._sampler_version = self._policy_version

    def sample(
        self,
        prompts: Sequence[PromptLike],
        n: int,
        max_tokens: int,
        temperature: float = 1.0,
        stop: Sequence[str] | Sequence[int] | None = None,
    ) -> list[list[SampledSequence]]:
        """All prompts are submitted before any result is awaited, so the service samples them concurrently."""
        from tinker import types

        self._check_sample_args(n, max_tokens, temperature)
        if self._sampler is None:
            self.refresh_sampler()
        params = types.SamplingParams(
            max_tokens=max_tokens, temperature=temperature, stop=list(stop) if stop is not None else None
        )
        futures = [
            self._sampler.sample(
                prompt=types.ModelInput.from_ints(self._prompt_ids(p)), num_samples=n, sampling_params=params
            )
            for p in prompts
        ]
        results: list[list[SampledSequence]] = []
        for future in futures:
            response = future.result()
            group = []
            for seq in response.sequences:
                if seq.logprobs is None:
                    raise RuntimeError("Tinker returned a sample without logprobs; the IS loss needs them")
                tokens = [int(t) for t in seq.tokens]
                group.append(
                    SampledSequence(
                        tokens=tuple(tokens),
                        logprobs=tuple(float(x) for x in seq.logprobs),
                        text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                        stop_reason=seq.stop_reason,
                    )
                )
            results.append(group)
        return results

    # -- training ------------------------------------------------------------------------------------------

    def forward_backward(
        self, datums: Sequence[TrainDatum], loss: LossName = "importance_sampling"
    ) -> dict[str, float]:
        """Send the datums; metrics are the server's (`loss:sum`, …) plus `loss` and sampler/learner drift."""
        if not datums:
            raise ValueError("forward_backward needs at least one datum")
        output = self._training.forward_backward([to_tinker_datum(d) for d in datums], loss_fn=loss).result()
        metrics = {k: float(v) for k, v in output.metrics.items()}
        metrics["loss"] = metrics.get("loss:sum", float("nan"))
        metrics["n_datums"] = float(len(datums))
        metrics["n_tokens"] = float(sum(d.n_action_tokens for d in datums))
        learner = [out["logprobs"].to_numpy().tolist() for out in output.loss_fn_outputs if "logprobs" in out]
        if len(learner) == len(datums):
            metrics.update(kl_sample_train(datums, learner))
        return metrics

    def optim_step(self, params: AdamParams) -> dict[str, float]:
        response = self._training.optim_step(to_tinker_adam(params)).result()
        self._policy_version += 1
        metrics = {k: float(v) for k, v in (response.metrics or {}).items()}
        metrics["learning_rate"] = params.learning_rate
        return metrics

    # -- checkpoints ---------------------------------------------------------------------------------------

    def save_checkpoint(self, name: str) -> str:
        """`save_state(name)`: weights and optimizer state on the service; returns its `tinker://` path."""
        return self._training.save_state(name).result().path

    def load_checkpoint(self, path: str) -> None:
        """Continue from a `save_state` path: a new training client with its weights and optimizer state."""
        self._training = self._service.create_training_client_from_state_with_optimizer(path).result()
        self._sampler = None

    def close(self) -> None:
        """End the Tinker session (stops its heartbeats); further calls fail."""
        self._service.close("success").result()
