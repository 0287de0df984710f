"""The frozen responder in process: the Hugging Face ``transformers`` backend of the ``Responder`` protocol
(``memstate.responders.protocol``).

The reward needs two things from a responder: greedy answers (exact mode) and the log-probability of
given answer continuations (likelihood mode). ``memstate.responders.remote.OpenAIResponder`` implements the same
protocol for a ``vllm serve`` of the responder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers.integrations.deepspeed as hf_deepspeed
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import cached_file

from memstate.prompts import Message
from memstate.responders.protocol import ContinuationLogprob


@contextmanager
def outside_zero3() -> Iterator[None]:
    """Load models whole, even when a DeepSpeed ZeRO-3 training config is active in this process.

    Under ``accelerate launch`` with ZeRO-3, ``GRPOConfig`` registers its DeepSpeed config globally and every later
    ``from_pretrained`` builds the model inside ``deepspeed.zero.Init``: its weights become empty placeholders owned
    by the training engine, and the frozen responder's first forward fails ("'weight' must be 2-D"). transformers
    has no public switch for this, so its module-level reference is cleared for the duration of the load.
    """
    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved


_READ_LIMIT = 16 * 2**20  # files up to this size are hashed by content; larger ones (weights) by size and mtime


def model_fingerprint(model_dir: str | Path) -> str:
    """A cheap fingerprint of a model directory: the revision of a Hugging Face cache snapshot
    (``.../snapshots/<sha>/``), else a sha256 of the small files (config, tokenizer, chat template) and of the
    large files' names, sizes and mtimes — multi-GB weights are never read.

    >>> model_fingerprint("/hf/hub/models--org--m/snapshots/0123abcd")
    'rev:0123abcd'
    """
    model_dir = Path(model_dir)
    if model_dir.parent.name == "snapshots":
        return f"rev:{model_dir.name}"
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        stat = path.stat()
        body = path.read_bytes() if stat.st_size <= _READ_LIMIT else f"{stat.st_size}:{stat.st_mtime_ns}".encode()
        digest.update(f"{path.name}\0{len(body)}\0".encode() + body)
    return "sha256:" + digest.hexdigest()[:16]


class TransformersResponder:
    """In-process responder for CPU tests and tiny runs: batched forward passes, no decoding for scoring."""

    def __init__(self, model_path: str, *, batch_size: int = 16, device: str = "cpu", dtype: str = "float32"):
        self.name = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.padding_side = "left"
        with outside_zero3():
            self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device)
        self.model.eval()
        # A hub id resolves to its local snapshot (just downloaded by from_pretrained), a local path to itself.
        model_dir = Path(cached_file(model_path, "config.json")).parent
        self.identity = f"{model_path}|{dtype}|{model_fingerprint(model_dir)}"
        self.batch_size = batch_size
        self.device = device
        self.forward_passes = 0
        # The positions the model was built for: a longer prompt would run past them (reward/fit.py fits to it).
        self.context_length: int | None = getattr(self.model.config, "max_position_embeddings", None)

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The chat-templated prompt as token ids (what the responder reads)."""
        # enable_thinking=False: Qwen3 responders answer directly; templates without the flag ignore it.
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, enable_thinking=False, return_dict=False
        )

    def count_prompt_tokens(self, prompts: list[list[Message]]) -> list[int | None]:
        """Each chat prompt's length in tokens, templated as scoring templates it (``prompt_ids``)."""
        return [len(self.prompt_ids(m)) for m in prompts]

    def _batches(self, rows: list[list[int]]):
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            width = max(len(r) for r in chunk)
            ids = torch.tensor([[pad] * (width - len(r)) + r for r in chunk], device=self.device)
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in chunk], device=self.device)
            yield start, ids, mask

    @torch.no_grad()
    def _logprobs(self, rows: list[list[int]], n_last: list[int]) -> list[torch.Tensor]:
        """Log-softmax over the vocabulary at the last ``n_last[i]`` next-token positions of each row."""
        out: list[torch.Tensor] = []
        for start, ids, mask in self._batches(rows):
            self.forward_passes += 1
            k = max(n_last[start : start + len(ids)])
            # Explicit positions so a left-padded row scores exactly as it would alone.
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=k).logits
            logits = logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            for j in range(len(ids)):
                out.append(logp[j, k - n_last[start + j] :])
        return out

    def answer_logprob(
        self, prompts: list[list[Message]], continuations: list[list[str]]
    ) -> list[list[ContinuationLogprob]]:
        prompt_ids = [self.prompt_ids(m) for m in prompts]
        cont_ids = [[self.tokenizer.encode(c, add_special_tokens=False) for c in conts] for conts in continuations]
        results: list[list[ContinuationLogprob]] = [[] for _ in prompts]
        # Single-token candidates (option letters): one row per prompt, read every candidate at the last position.
        single = [i for i, conts in enumerate(cont_ids) if all(len(c) == 1 for c in conts)]
        for i, logp in zip(single, self._logprobs([prompt_ids[i] for i in single], [1] * len(single)), strict=True):
            results[i] = [ContinuationLogprob(float(logp[-1, c[0]]), 1) for c in cont_ids[i]]
        # Multi-token continuations: one row per (prompt, continuation), teacher-forced.
        multi = [(i, c) for i, conts in enumerate(cont_ids) if i not in set(single) for c in conts]
        rows = [prompt_ids[i] + c for i, c in multi]
        for (i, c), logp in zip(multi, self._logprobs(rows, [len(c) + 1 for _, c in multi]), strict=True):
            # Position t predicts token t+1: the continuation's tokens are read from positions -len(c)-1 … -2.
            lp = sum(float(logp[t, tok]) for t, tok in enumerate(c))
            results[i].append(ContinuationLogprob(lp, len(c)))
        return results

    @torch.no_grad()
    def answer(self, prompts: list[list[Message]], max_new_tokens: int = 32) -> list[str]:
        rows = [self.prompt_ids(m) for m in prompts]
        answers: list[str] = []
        for _, ids, mask in self._batches(rows):
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
            )
            answers += self.tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
        return answers
