"""The embedded default models: a tiny Qwen3-architecture policy and responder, built deterministically.

Random init, ``head_dim`` 64 (so vLLM's CPU build can serve them), and a byte-level BPE tokenizer with a
ChatML chat template trained with ``tokenizers`` on text shipped in the package. They exercise every code
path; they know nothing. Re-running ``build_tiny_models`` gives byte-identical files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from memstate import prompts

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
VOCAB_SIZE = 1024

# ChatML, as Qwen uses it; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# name -> init seed. Same architecture; different weights so the responder is not a copy of the policy.
MODELS = {"policy": 0, "responder": 1}


def tokenizer_corpus() -> list[str]:
    """The shipped text the tokenizer is trained on: the corpus file plus every prompt string."""
    text = resources.files("memstate").joinpath("assets/tiny_corpus.txt").read_text(encoding="utf-8")
    prompt_text = [prompts.POLICY_SYSTEM, prompts.RESPONDER_SYSTEM, prompts.STATE_HEADER]
    return text.splitlines() + prompt_text


def build_tokenizer(extra_text: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """The byte-level BPE tokenizer, trained on ``tokenizer_corpus()`` plus ``extra_text`` (an experiment's world)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*tokenizer_corpus(), *extra_text], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<think>", "</think>"],
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(tokenizer: PreTrainedTokenizerFast) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build_tiny_models(out_dir: str | Path) -> dict[str, Path]:
    """Write ``out_dir/policy`` and ``out_dir/responder`` (weights + tokenizer each); return their paths."""
    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    config = tiny_config(tokenizer)
    paths = {}
    for name, seed in MODELS.items():
        torch.manual_seed(seed)
        # The policy stands in for Qwen3-4B-Instruct, whose context is far longer than the production budget (8192 +
        # 512): 32k positions let the production config's dry run, and serving at the trained budget, run with it.
        # RoPE has no weights per position, so this changes no weight.
        positions = {"max_position_embeddings": 32768} if name == "policy" else {}
        model = Qwen3ForCausalLM(Qwen3Config(**(config.to_dict() | positions)))
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        path = out_dir / name
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[name] = path
    return paths


def tree_sha256(path: str | Path) -> dict[str, str]:
    """sha256 of every file under ``path``, keyed by relative path (for determinism checks)."""
    root = Path(path)
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
