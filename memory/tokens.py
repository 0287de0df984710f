"""Token counts of memory text, for budgets: the all-MiniLM-L6-v2 WordPiece tokenizer (bert-base-uncased vocabulary,
no special tokens), read offline from the packaged MiniLM — the unit of the paper's retrieval budget (565 tokens).
A responder's own tokenizer counts differently (Qwen's BPE ~0.9× as many on English); the budget is a retrieval
setting, not a prompt limit."""

from __future__ import annotations

import functools
from collections.abc import Sequence

TOKENIZER = "all-MiniLM-L6-v2 WordPiece (bert-base-uncased vocabulary, no special tokens)"


class TokenCounter:
    """Counts ``TOKENIZER`` tokens. WordPiece splits on whitespace first, so a newline-joined block counts as the sum
    of its texts: each text is counted once (and cached)."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        from memstate.embedding import default_model_path

        self._tok = AutoTokenizer.from_pretrained(default_model_path(), local_files_only=True).backend_tokenizer
        # The model's tokenizer.json pads and truncates to 128 tokens for encoding; a count does neither.
        self._tok.no_padding()
        self._tok.no_truncation()
        self._cache: dict[str, int] = {}

    def count_text(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def counts(self, texts: Sequence[str]) -> list[int]:
        new = [t for t in dict.fromkeys(texts) if t not in self._cache]
        for text, enc in zip(new, self._tok.encode_batch(new, add_special_tokens=False), strict=True):
            self._cache[text] = len(enc.ids)
        return [self._cache[t] for t in texts]

    def __call__(self, texts: Sequence[str]) -> int:
        return sum(self.counts(texts))


@functools.cache
def token_counter() -> TokenCounter:
    """The process's one counter (its cache shared by every caller)."""
    return TokenCounter()


def within_budget(sizes: Sequence[int], budget: int) -> list[int]:
    """Indices of the items taken in order while they fit in ``budget``: one that does not fit is passed over and
    the next ones are still tried (a long fact does not end the block while shorter ones fit).

    >>> within_budget([300, 200, 100, 50], 400)
    [0, 2]
    """
    out, used = [], 0
    for i, size in enumerate(sizes):
        if used + size <= budget:
            out.append(i)
            used += size
    return out
