"""Sentence embedders for the memory store: MiniLM (embedded default), any sentence-transformers model (bge-m3 in
production), and a hashing embedder that needs no model (fast tests, the synthetic benchmark's bulk).

Every embedder is a ``memstate.embedding.Embedder``: it returns L2-normalized float32 rows, so cosine similarity is a
dot product. A store records its embedder's ``name`` and reopens with the same one (``embedder_from_name``): vectors
of two models never mix.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import re
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from memstate.embedding import DEFAULT_MODEL, Embedder, encode_normalized, load_sentence_transformer
from memstate.errors import MemstateError

if TYPE_CHECKING:
    from memstate.memory.onnx_encoder import OnnxSentenceEncoder

logger = logging.getLogger(__name__)

PRODUCTION_MODEL = "BAAI/bge-m3"
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_SMALL_BATCH = 8
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def normalize(vecs: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (all-zero rows stay zero).

    >>> normalize(np.array([[3.0, 4.0], [0.0, 0.0]])).astype(float).round(3).tolist()
    [[0.6, 0.8], [0.0, 0.0]]
    """
    vecs = np.asarray(vecs, dtype=np.float32)
    return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)


RUNTIMES = ("auto", "onnx", "torch")


class EmbedderUnavailable(MemstateError, RuntimeError):
    """A sentence-transformers model that cannot be loaded: a hub id not there (or offline), a directory that is no
    model. The message is ``LABEL: cannot load 'NAME' (reason)``."""

    hint = "check the model name (and HF_HUB_OFFLINE / the network for a hub id)"


class SentenceTransformerEmbedder:
    """A sentence-transformers model, loaded on first use (opening a store to read it never loads a model).

    ``model`` is ``DEFAULT_MODEL`` (the packaged MiniLM, loaded offline), a local path, or a hub id (bge-m3); it is
    loaded by ``memstate.embedding.load_sentence_transformer``, so embedders (and ``data_build``) of the same model on
    the same device share one copy.
    ``runtime``: ``"onnx"`` runs the model under ONNX Runtime — exported once with ``torch.onnx`` into
    ``cache_dir()`` — whose CPU kernels prepack the weights: a MiniLM query takes ~5 ms instead of ~14 ms in PyTorch
    eager on a 2-core machine (eager re-packs every weight matrix on every call), with the same vectors (cosine
    1 − 1e-7). ``"torch"``: sentence-transformers' own ``encode`` (the GPU path). ``"auto"`` (default): torch when
    ``device`` or the machine has a GPU, else onnx, falling back to torch with a warning if the export fails."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        batch_size: int = 64,
        device: str | None = None,
        runtime: str = "auto",
        label: str = "embedder",
    ) -> None:
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime {runtime!r} is not one of {list(RUNTIMES)}")
        self.name = model
        self.label = label
        self.batch_size = batch_size
        self.device = device
        self.runtime = runtime
        self._model = None
        self._onnx: OnnxSentenceEncoder | None = None
        self._lock = threading.Lock()

    def _load(self):
        with self._lock:
            if self._model is None:
                device = "cpu" if self.runtime == "onnx" else self.device
                try:
                    self._model = load_sentence_transformer(self.name, device=device)
                except Exception as e:  # a hub id that is not there, offline, not a model: the user's to fix
                    if self.name == DEFAULT_MODEL:  # the packaged weights: a broken install, keep the traceback
                        raise
                    reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                    raise EmbedderUnavailable(f"{self.label}: cannot load {self.name!r} ({reason})") from e
                if self.runtime == "onnx" or (self.runtime == "auto" and self._model.device.type == "cpu"):
                    from memstate.memory.onnx_encoder import OnnxSentenceEncoder  # imports torch: only when embedding

                    try:
                        self._onnx = OnnxSentenceEncoder(self._model)
                    except Exception as e:  # an architecture torch.onnx cannot export: still embed, only slower
                        if self.runtime == "onnx":
                            raise
                        logger.warning("ONNX export of %s failed (%s); embedding with PyTorch", self.name, e)
        return self._model

    @property
    def active_runtime(self) -> str:
        """What ``encode`` runs on: ``onnx`` or ``torch`` (loads the model)."""
        self._load()
        return "onnx" if self._onnx is not None else "torch"

    @property
    def dim(self) -> int:
        return int(self._load().get_sentence_embedding_dimension())

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        model = self._load()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._onnx is not None:
            return normalize(self._onnx.encode(texts, self.batch_size))
        # A query or a short session is a few tokens: thread hand-offs cost more than they save, and on a
        # busy 2-core machine one thread is ~3x faster (15 ms instead of 40 ms for a MiniLM query).
        with _torch_threads(1) if len(texts) <= _SMALL_BATCH else contextlib.nullcontext():
            vecs = encode_normalized(model, texts, self.batch_size)
        return normalize(vecs)  # again: a model that ignores normalize_embeddings must still give cosines


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


MAX_HASH_DIM = 1 << 16  # real embedders stop at a few thousand (MiniLM 384, bge-m3 1024)


class HashEmbedder:
    """Signed feature hashing of lowercased words and word bigrams: deterministic, no model, ~50k texts/s.

    Texts sharing words get similar vectors, which is all the tests and the synthetic benchmark need; it knows
    no synonyms, so it is not for real retrieval.

    >>> e = HashEmbedder(64)
    >>> v = e.encode(["I love green tea", "I love green tea!", "the stock market fell"])
    >>> v.shape, round(float(v[0] @ v[1]), 3), bool(v[0] @ v[2] < 0.5)
    ((3, 64), 1.0, True)
    """

    def __init__(self, dim: int = 384) -> None:
        if not 1 <= dim <= MAX_HASH_DIM:  # 0 divides by zero; a huge one allocates len(texts) × dim floats
            raise ValueError(f"hash embedder dimension must be 1 to {MAX_HASH_DIM}, got {dim}")
        self.dim = dim
        self.name = f"hash-{dim}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            words = _WORD.findall(text.lower().replace("’", "'"))
            for feature in (*words, *(f"{a} {b}" for a, b in zip(words, words[1:], strict=False))):
                slot, sign = _hash(feature, self.dim)
                out[i, slot] += sign
            if not words:
                out[i, 0] = 1.0  # still a unit vector
        return normalize(out)


@functools.lru_cache(maxsize=1 << 16)
def _hash(feature: str, dim: int) -> tuple[int, float]:
    h = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
    return h % dim, 1.0 if (h >> 40) & 1 else -1.0


@functools.cache
def default_embedder() -> SentenceTransformerEmbedder:
    """The packaged all-MiniLM-L6-v2 (one instance per process; the weights load on first ``encode``)."""
    return SentenceTransformerEmbedder(DEFAULT_MODEL)


def embedder_from_name(name: str, *, label: str = "embedder") -> Embedder:
    """The embedder a store recorded: ``hash-N``, the default MiniLM, or a sentence-transformers path / hub id.

    A store's ``meta`` is a file anyone can edit: a name that is none of these (empty, control characters, a
    ``hash-`` name without a dimension in range) is a ``ValueError`` saying why. A local path stays allowed: an
    offline node's models are directories, and loading one runs no code of its own (no ``trust_remote_code``,
    torch's weights-only unpickling); one that is not a model fails when first used. ``label`` starts the message of
    an ``EmbedderUnavailable`` if the model cannot be loaded then.

    >>> embedder_from_name("hash-128").dim
    128
    >>> embedder_from_name("hash-0")
    Traceback (most recent call last):
    ValueError: hash embedder dimension must be 1 to 65536, got 0
    """
    if not isinstance(name, str) or not name.strip() or len(name) > 1024 or _CONTROL.search(name):
        raise ValueError(f"{name!r:.80} is not an embedder name (hash-N, {DEFAULT_MODEL}, a model path or hub id)")
    if name.startswith("hash-"):
        m = re.fullmatch(r"hash-([0-9]{1,12})", name)
        if not m:
            raise ValueError(f"{name!r:.80} is not hash-N with N a dimension of 1 to {MAX_HASH_DIM}")
        return HashEmbedder(int(m.group(1)))
    if name == DEFAULT_MODEL:
        return default_embedder()
    return SentenceTransformerEmbedder(name, label=label)
