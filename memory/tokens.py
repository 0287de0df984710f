"""Token counts of memory text, for budgets: by default the all-MiniLM-L6-v2 WordPiece tokenizer (bert-base-uncased
vocabulary, no special tokens), read offline from the packaged MiniLM — the unit of the paper's retrieval budget (565
tokens). A responder's own tokenizer counts differently (Qwen's BPE ~0.9× as many on English): give its directory
(``token_counter(path)``; ``--tokenizer`` of ``memstate memory ask`` and ``eval retrieval``) to budget in its
tokens."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")

MAX_CACHED = 1_000_000  # texts whose counts are kept (a long-lived process forgets them all past this)
TOKENIZER = "all-MiniLM-L6-v2 WordPiece (bert-base-uncased vocabulary, no special tokens)"


class TokenCounter:
    """Counts ``TOKENIZER`` tokens, or those of the (fast) tokenizer saved at ``path``; each text is counted once
    (and cached). A newline-joined block counts as the sum of its texts plus ``newline`` per line break (0 for
    WordPiece, which splits on whitespace first; usually 1 for a BPE)."""

    def __init__(self, path: str | None = None) -> None:
        from transformers import AutoTokenizer

        from memstate.embedding import default_model_path
        from memstate.errors import ConfigError

        self.name = TOKENIZER if path is None else f"{path} (no special tokens)"
        try:
            tok = AutoTokenizer.from_pretrained(path or default_model_path(), local_files_only=True)
        except (OSError, ValueError) as e:
            raise ConfigError(f"--tokenizer {path}: no tokenizer can be loaded from it ({e})") from e
        if not getattr(tok, "is_fast", False):
            raise ConfigError(f"--tokenizer {path}: a fast tokenizer (tokenizer.json) is needed")
        self._tok = tok.backend_tokenizer
        # The model's tokenizer.json pads and truncates to 128 tokens for encoding; a count does neither.
        self._tok.no_padding()
        self._tok.no_truncation()
        self._cache: dict[str, int] = {}
        self.newline = self.count_text("a\nb") - self.count_text("a") - self.count_text("b")

    def count_text(self, text: str) -> int:
        size = self._cache.get(text)
        if size is None:
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
            size = self._cache[text] = len(self._tok.encode(text, add_special_tokens=False).ids)
        return size

    def counts(self, texts: Sequence[str]) -> list[int]:
        new = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if len(self._cache) + len(new) > MAX_CACHED:
            self._cache.clear()
            new = list(dict.fromkeys(texts))
        for text, enc in zip(new, self._tok.encode_batch(new, add_special_tokens=False), strict=True):
            self._cache[text] = len(enc.ids)
        return [self._cache[t] for t in texts]

    def __call__(self, texts: Sequence[str]) -> int:
        """Tokens of ``texts`` joined by newlines."""
        return sum(self.counts(texts)) + self.newline * max(0, len(texts) - 1)


@functools.cache
def token_counter(path: str | None = None) -> TokenCounter:
    """The process's one counter per tokenizer (its cache shared by every caller); MiniLM's when ``path`` is None."""
    return TokenCounter(path)


def within_budget(items: Iterable[T], size: Callable[[T, int], int], budget: int) -> list[T]:
    """The items taken in order while they fit in ``budget``: ``size(item, n)`` is an item's cost as the ``n``-th
    taken (a prompt numbers what it shows); one that does not fit is passed over and the next ones are still tried (a
    long fact does not end the block while shorter ones fit).

    >>> within_budget([300, 200, 100, 50], lambda size, n: size, 400)
    [300, 100]
    """
    out: list[T] = []
    used = 0
    for item in items:
        cost = size(item, len(out) + 1)
        if used + cost <= budget:
            out.append(item)
            used += cost
    return out
