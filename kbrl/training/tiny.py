"""A tiny random-init causal LM with a locally trained tokenizer, saved like a Hugging Face checkpoint.

No weights can be downloaded on CI or air-gapped hosts, yet the local backend, the trainer and an end-to-end
`kbrl train` demo should run there. `build_tiny_model(path)` trains a byte-level BPE tokenizer on generated
kernel-like text (Python/PyTorch, CUDA C++, Triton, markdown code fences), wraps it as a
`PreTrainedTokenizerFast` with a chat template, builds a small Llama with random weights, and saves both to
`path`, so the checkpoint is loaded by the same `from_pretrained(path)` code as a real model id.
Everything is seeded: the same arguments give the same tokenizer and weights.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

EOS = "<|endoftext|>"
PAD = "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Role markers as single special tokens; the generation prompt ends with `<|assistant|>` and a newline."""

_OPS = "relu gelu softmax matmul add mul conv2d layernorm sigmoid tanh sum max".split()
_DTYPES = "float half float32 bfloat16 int64".split()
_NAMES = "x y out a b c acc idx row col mask offs n size stride".split()


def kernel_corpus(n_snippets: int = 300, seed: int = 0) -> list[str]:
    """Generated snippets that look like the prompts and kernels the policy reads and writes.

    Enough variety (identifiers, numbers, CUDA/Triton keywords, code fences) for BPE merges that resemble a
    code tokenizer's; content is nonsense on purpose, only the character statistics matter.
    """
    rng = random.Random(seed)
    snippets: list[str] = []
    for _ in range(n_snippets):
        op, dtype = rng.choice(_OPS), rng.choice(_DTYPES)
        a, b, c = rng.sample(_NAMES, 3)
        block = rng.choice([32, 64, 128, 256, 512, 1024])
        kind = rng.randrange(4)
        if kind == 0:
            body = (
                f"__global__ void {op}_kernel(const {dtype}* {a}, {dtype}* {b}, int {c}) {{\n"
                f"    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                f"    if (i < {c}) {{ {b}[i] = {op}f({a}[i]); }}\n}}\n"
                f"{op}_kernel<<<({c} + {block - 1}) / {block}, {block}>>>({a}, {b}, {c});\n"
            )
            snippets.append(f"```cpp\n{body}```\n")
        elif kind == 1:
            body = (
                "@triton.jit\n"
                f"def {op}_kernel({a}_ptr, {b}_ptr, {c}, BLOCK_SIZE: tl.constexpr):\n"
                "    pid = tl.program_id(axis=0)\n"
                "    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)\n"
                f"    mask = offs < {c}\n"
                f"    {a} = tl.load({a}_ptr + offs, mask=mask)\n"
                f"    tl.store({b}_ptr + offs, tl.{op}({a}), mask=mask)\n"
            )
            snippets.append(f"```python\n{body}```\n")
        elif kind == 2:
            body = (
                "class ModelNew(nn.Module):\n"
                "    def __init__(self):\n"
                "        super().__init__()\n\n"
                f"    def forward(self, {a}: torch.Tensor) -> torch.Tensor:\n"
                f"        return torch.{op}({a}, dim={rng.randrange(-1, 3)})\n"
            )
            snippets.append(f"```python\n{body}```\n")
        else:
            snippets.append(
                f"Write a fast CUDA or Triton kernel for `torch.{op}` on a {dtype} tensor of shape "
                f"({block}, {rng.randrange(1, 4096)}). Return the code in a ```python block.\n"
            )
    return snippets


def train_tokenizer(corpus: list[str], vocab_size: int = 384) -> Any:
    """A byte-level BPE tokenizer (GPT-2 style) trained on `corpus`, as a `PreTrainedTokenizerFast`.

    Byte-level means any text round-trips (no unknown token); `vocab_size` above 256 + specials buys merges.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [EOS, PAD, *ROLE_TOKENS]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, additional_special_tokens=list(ROLE_TOKENS)
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_tiny_model(
    path: str | Path,
    *,
    vocab_size: int = 384,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 512,
    initializer_range: float = 0.02,
    seed: int = 0,
) -> Path:
    """Train the tokenizer, build a random Llama and save both to `path` (returned); ~1 s on one CPU core.

    Untied input/output embeddings, so a LoRA on `lm_head` (Tinker's `train_unembed`) is a separate matrix.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(kernel_corpus(seed=seed), vocab_size=vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_positions,
        initializer_range=initializer_range,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


WARM_START_ANSWER = '''```python
import torch
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.maximum(tl.load(x_ptr + i, mask=m), 0.0), mask=m)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y
```'''
"""A short, correct Triton answer for the ReLU problem (and a wrong one for the others)."""


def warm_start(path: str | Path, prompts: list[list[dict[str, str]]], answer: str = WARM_START_ANSWER, steps: int = 200,
               learning_rate: float = 3e-3, seed: int = 0) -> float:  # fmt: skip
    """Fine-tune the tiny model at `path` (in place) to answer the chat `prompts` with `answer`; returns the
    last loss.

    A random model writes no code at all, so every sample of a CPU smoke run would score the same and no
    update would ever happen. After this brief supervised warm start, sampling at temperature 1 gives a mix
    of exact copies (correct on ReLU, wrong elsewhere) and corrupted ones (format or compile errors): the
    reward varies within groups and the whole loop, update included, runs for real. A few seconds on CPU.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kbrl.training.backends.base import encode_chat

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    prompt_ids = [encode_chat(tokenizer, messages) for messages in prompts]
    answer_ids = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    rng = random.Random(seed)
    loss_value = float("nan")
    model.train()
    for _ in range(steps):
        prompt = rng.choice(prompt_ids)
        ids = torch.tensor([prompt + answer_ids])
        labels = ids.clone()
        labels[0, : len(prompt)] = -100  # learn the answer, not the prompt
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss_value = float(loss.detach())
    model.save_pretrained(path)
    return loss_value
