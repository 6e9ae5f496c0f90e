"""Local LoRA training on transformers + peft (CPU or one GPU), with Tinker's importance-sampling loss.

The point of this backend is that the whole RL loop (sample → reward → advantages → datums → update) runs
without the Tinker service: on a workstation GPU for small models, and on CPU with the tiny model of
`kbrl.training.tiny` in tests. It follows the same semantics as `TinkerBackend`:

* LoRA on every linear layer of attention and MLP, and on the unembedding (Tinker's `train_attn`,
  `train_mlp`, `train_unembed`, all on by default); the base weights stay frozen.
* `sample` draws from softmax(logits / T) and returns, per token, its logprob under that same tempered
  distribution: the sampler's q. (T = 0 is greedy; the logprob is then taken at T = 1.)
* `forward_backward` computes the learner's logprobs at T = 1 (p_θ, what is being trained) and the loss
  of Tinker's `importance_sampling`, loss = -Σ exp(log p_θ - log q) · A, summed over tokens and datums.
  On-policy at T = 1 the ratio is 1 and the gradient is REINFORCE's, -A ∇log p_θ; at T ≠ 1 the ratio
  p_θ/q_T is exactly the correction that makes E_q[ratio · A] = E_{p_θ}[A].
* `optim_step` is `torch.optim.AdamW` (Tinker documents its Adam as identical to AdamW).
* The sampler is the model being trained, so `refresh_sampler` only records the version.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kbrl.training.backends.base import (
    AdamParams,
    Backend,
    LossName,
    PromptLike,
    SampledSequence,
    StopReason,
    kl_sample_train,
)
from kbrl.training.datums import TrainDatum

if TYPE_CHECKING:
    from torch import nn

TRAINER_STATE = "trainer_state.pt"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def importance_sampling_loss(
    target_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, advantages: torch.Tensor
) -> torch.Tensor:
    """Tinker's `importance_sampling` loss: -(exp(target_logprobs - sampling_logprobs) · advantages).sum().

    As documented at https://tinker-docs.thinkingmachines.ai/tinker/losses/importance-sampling (the SDK
    only names the loss; the server computes it). The ratio is not detached: its gradient is
    -ratio · A · ∇log p_θ. Positions with advantage 0 (prompt tokens, padding) contribute nothing.
    """
    ratio = torch.exp(target_logprobs - sampling_logprobs)
    return -(ratio * advantages).sum()


def detect_lora_targets(
    model: nn.Module, *, train_attn: bool = True, train_mlp: bool = True, train_unembed: bool = True
) -> list[str]:
    """Full names of the linear layers a LoRA should wrap, by role, like Tinker's LoRA flags.

    The unembedding is `model.get_output_embeddings()`; layers under a module whose name mentions
    attention are attention; every other linear layer is MLP. Full names (not leaf names such as `c_proj`,
    which GPT-2 uses in both attention and MLP) keep the selection exact.
    """
    from torch import nn

    try:
        from transformers.pytorch_utils import Conv1D

        linear_types: tuple[type, ...] = (nn.Linear, Conv1D)
    except ImportError:  # pragma: no cover - transformers always ships Conv1D today
        linear_types = (nn.Linear,)
    unembed = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    targets: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, linear_types):
            continue
        if module is unembed:
            wanted = train_unembed
        elif any(part in name.lower() for part in ("attn", "attention")):
            wanted = train_attn
        else:
            wanted = train_mlp
        if wanted:
            targets.append(name)
    if not targets:
        raise ValueError("no linear layers selected for LoRA: enable train_attn, train_mlp or train_unembed")
    return targets


def _padded(
    chunk: Sequence[TrainDatum], field: str, fill: float, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """One datum field for a micro-batch, right-padded with `fill` to the longest datum."""
    width = max(len(d) for d in chunk)
    rows = [list(getattr(d, field)) + [fill] * (width - len(d)) for d in chunk]
    return torch.tensor(rows, dtype=dtype, device=device)


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class LocalBackend(Backend):
    """A LoRA policy on a Hugging Face causal LM (hub id or local directory), trained in this process."""

    name = "local"

    def __init__(
        self,
        model: str | Path,
        *,
        lora_rank: int = 32,
        lora_alpha: float | None = None,
        target_modules: Sequence[str] | None = None,
        train_attn: bool = True,
        train_mlp: bool = True,
        train_unembed: bool = True,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        seed: int = 0,
        checkpoint_dir: str | Path = "checkpoints",
        micro_batch_size: int = 4,
    ) -> None:
        """Load tokenizer and model with `from_pretrained(model)` and wrap the model in a fresh LoRA.

        `lora_alpha` defaults to `lora_rank` (scale 1). `dtype` defaults to float32 on CPU and bfloat16 on a
        GPU that supports it. `micro_batch_size` bounds how many datums share one forward pass (memory).
        `seed` fixes the LoRA initialisation and the sampling generator.
        """
        super().__init__()
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if lora_rank < 1:
            raise ValueError(f"lora_rank must be >= 1, got {lora_rank}")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.device = torch.device(device) if device is not None else _default_device()
        if dtype is None:
            bf16 = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
            dtype = torch.bfloat16 if bf16 else torch.float32
        self.model_name = str(model)
        self.checkpoint_dir = Path(checkpoint_dir)
        self.micro_batch_size = micro_batch_size
        self._tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        base = AutoModelForCausalLM.from_pretrained(self.model_name, dtype=dtype)
        targets = (
            list(target_modules)
            if target_modules
            else detect_lora_targets(
                base, train_attn=train_attn, train_mlp=train_mlp, train_unembed=train_unembed
            )
        )
        config = LoraConfig(
            r=lora_rank,
            lora_alpha=lora_alpha if lora_alpha is not None else lora_rank,
            lora_dropout=0.0,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = get_peft_model(base, config)
        self.model.to(self.device)
        self.model.eval()  # no dropout anywhere: sampling and training see the same function
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._optimizer: torch.optim.Optimizer | None = None
        self._pad_id = 0

    # -- sampling ------------------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @torch.no_grad()
    def sample(
        self,
        prompts: Sequence[PromptLike],
        n: int,
        max_tokens: int,
        temperature: float = 1.0,
        stop: Sequence[str] | Sequence[int] | None = None,
    ) -> list[list[SampledSequence]]:
        """`n` completions per prompt with a KV cache; the `n` copies of one prompt decode as one batch.

        Stops at EOS (or at `stop` token ids / strings when given) and includes the stop token, whose logprob
        the policy also learns from. Completions are decoded with special tokens skipped.
        """
        self._check_sample_args(n, max_tokens, temperature)
        if stop is None:
            eos = self._tokenizer.eos_token_id
            stop_ids = {int(eos)} if eos is not None else set()
            stop_strs: list[str] = []
        else:
            stop_ids = {int(s) for s in stop if not isinstance(s, str)}
            stop_strs = [s for s in stop if isinstance(s, str)]
        return [
            self._sample_prompt(self._prompt_ids(p), n, max_tokens, temperature, stop_ids, stop_strs)
            for p in prompts
        ]

    def _sample_prompt(
        self,
        prompt: list[int],
        n: int,
        max_tokens: int,
        temperature: float,
        stop_ids: set[int],
        stop_strs: list[str],
    ) -> list[SampledSequence]:
        input_ids = torch.tensor([prompt] * n, dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, use_cache=True)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        reasons: list[StopReason] = ["length"] * n
        done = [False] * n
        for step in range(max_tokens):
            logits = out.logits[:, -1, :].float()
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, dim=-1)
                chosen = torch.multinomial(logp.exp(), 1, generator=self._generator).squeeze(1)
            else:
                logp = torch.log_softmax(logits, dim=-1)
                chosen = logits.argmax(dim=-1)
            chosen_logp = logp.gather(1, chosen[:, None]).squeeze(1)
            for i, (tok, lp) in enumerate(zip(chosen.tolist(), chosen_logp.tolist(), strict=True)):
                if done[i]:
                    continue
                tokens[i].append(tok)
                logprobs[i].append(lp)
                if tok in stop_ids or (
                    stop_strs and any(s in self._tokenizer.decode(tokens[i]) for s in stop_strs)
                ):
                    done[i], reasons[i] = True, "stop"
            if all(done) or step == max_tokens - 1:
                break
            out = self.model(input_ids=chosen[:, None], past_key_values=out.past_key_values, use_cache=True)
        return [
            SampledSequence(
                tokens=tuple(tokens[i]),
                logprobs=tuple(logprobs[i]),
                text=self._tokenizer.decode(tokens[i], skip_special_tokens=True),
                stop_reason=reasons[i],
            )
            for i in range(n)
        ]

    def refresh_sampler(self) -> None:
        """Sampling uses the trained model itself: nothing to copy, only the version to record."""
        self._sampler_version = self._policy_version

    # -- training ------------------------------------------------------------------------------------------

    def forward_backward(
        self, datums: Sequence[TrainDatum], loss: LossName = "importance_sampling"
    ) -> dict[str, float]:
        """Add the gradients of the importance-sampling loss over `datums` (in micro-batches).

        Datums of one micro-batch are right-padded: under causal attention padding after a sequence cannot
        change its logits, and padded positions have advantage 0, so they add neither loss nor gradient.
        """
        if loss != "importance_sampling":
            raise NotImplementedError(f"the local backend implements only importance_sampling, not {loss!r}")
        if not datums:
            raise ValueError("forward_backward needs at least one datum")
        total = 0.0
        learner: list[list[float]] = []
        ratios: list[float] = []
        for start in range(0, len(datums), self.micro_batch_size):
            chunk = datums[start : start + self.micro_batch_size]
            input_ids = _padded(chunk, "model_input", self._pad_id, torch.long, self.device)
            targets = _padded(chunk, "target_tokens", 0, torch.long, self.device)
            sampling = _padded(chunk, "logprobs", 0.0, torch.float32, self.device)
            advantages = _padded(chunk, "advantages", 0.0, torch.float32, self.device)
            logits = self.model(input_ids=input_ids).logits.float()
            target_logprobs = -F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
            ).reshape(targets.shape)
            chunk_loss = importance_sampling_loss(target_logprobs, sampling, advantages)
            chunk_loss.backward()
            total += float(chunk_loss.detach())
            with torch.no_grad():
                ratio = torch.exp(target_logprobs - sampling)
                for row, d in enumerate(chunk):
                    learner.append(target_logprobs[row, : len(d)].tolist())
                    ratios.extend(
                        r for r, m in zip(ratio[row, : len(d)].tolist(), d.mask, strict=True) if m > 0
                    )
        metrics = {
            "loss": total,
            "loss:sum": total,
            "n_datums": float(len(datums)),
            "n_tokens": float(sum(d.n_action_tokens for d in datums)),
        }
        if ratios:
            metrics["ratio_mean"] = math.fsum(ratios) / len(ratios)
            metrics["ratio_max"] = max(ratios)
        metrics.update(kl_sample_train(datums, learner))
        return metrics

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _ensure_optimizer(self, params: AdamParams) -> torch.optim.Optimizer:
        if self._optimizer is None:
            self._optimizer = torch.optim.AdamW(
                self._trainable(),
                lr=params.learning_rate,
                betas=(params.beta1, params.beta2),
                eps=params.eps,
                weight_decay=params.weight_decay,
            )
        return self._optimizer

    def optim_step(self, params: AdamParams) -> dict[str, float]:
        """One AdamW step with this call's hyper-parameters (they may change between steps, e.g. a schedule)."""
        optimizer = self._ensure_optimizer(params)
        for group in optimizer.param_groups:
            group.update(
                lr=params.learning_rate,
                betas=(params.beta1, params.beta2),
                eps=params.eps,
                weight_decay=params.weight_decay,
            )
        max_norm = params.grad_clip_norm if params.grad_clip_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self._trainable(), max_norm=max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._policy_version += 1
        self._sampler_version = self._policy_version
        return {"grad_norm": float(grad_norm), "learning_rate": params.learning_rate}

    # -- checkpoints ---------------------------------------------------------------------------------------

    def save_checkpoint(self, name: str) -> str:
        """The LoRA adapter (peft format, loadable with `PeftModel.from_pretrained`) plus optimizer state."""
        path = self.checkpoint_dir / name
        path.mkdir(parents=True, exist_ok=True)
        # The frozen base weights of a LoRA'd lm_head stay out: they come with the base model, and peft's
        # default ("auto") would copy the whole unembedding into every adapter.
        self.model.save_pretrained(path, save_embedding_layers=False)
        torch.save(
            {
                "optimizer": self._optimizer.state_dict() if self._optimizer is not None else None,
                "policy_version": self._policy_version,
            },
            path / TRAINER_STATE,
        )
        return str(path)

    def load_checkpoint(self, path: str) -> None:
        """Load an adapter saved by `save_checkpoint` into the current LoRA, and its optimizer state."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = Path(path)
        weights = folder / ADAPTER_WEIGHTS
        if not weights.is_file():
            raise FileNotFoundError(f"no LoRA adapter at {weights}")
        result = set_peft_model_state_dict(self.model, load_file(weights, device=str(self.device)))
        if result.unexpected_keys:
            raise ValueError(
                f"checkpoint {path} does not match this model: unexpected {result.unexpected_keys[:5]}"
            )
        state_file = folder / TRAINER_STATE
        if state_file.is_file():
            state = torch.load(state_file, map_location=self.device, weights_only=True)
            if state.get("optimizer") is not None:
                self._ensure_optimizer(AdamParams(learning_rate=0.0)).load_state_dict(state["optimizer"])
            else:
                self._optimizer = None
            self._policy_version = int(state.get("policy_version", 0))
        self._sampler_version = self._policy_version
