"""A sentence-transformers model under ONNX Runtime: the CPU path for embedding queries and facts.

PyTorch eager re-packs every weight matrix into its GEMM layout on every call; for a query of a dozen tokens that
packing is most of the time (MiniLM: ~14 ms per query on a 2-core machine). ONNX Runtime packs the weights once, when
the session opens (~5 ms per query, the same vectors). The whole sentence-transformers pipeline (transformer, pooling,
normalization) is exported once with ``torch.onnx`` into ``cache_dir()``, under a fingerprint of its weights, module
configuration and the exporting versions, and every later process loads that file.

Why not sentence-transformers' own ``backend="onnx"`` (checked 2026-12): it loads through ``optimum.onnxruntime``,
whose only releases (optimum-onnx ≤ 0.1.0) require ``transformers<4.58``; pip finds no set of versions with the
transformers 5.x this project needs (``pip install --dry-run "optimum-onnx[onnxruntime]" "transformers>=5.17,<5.25"``:
ResolutionImpossible). Its torch backend is the ~14 ms path above. When optimum supports transformers 5, this
module can go.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

CACHE_ENV = "MEMSTATE_CACHE"
logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where exported models live: ``$MEMSTATE_CACHE/onnx``, by default ``~/.cache/memstate/onnx``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "memstate") / "onnx"


class _Pipeline(torch.nn.Module):
    """The sentence-transformers model as a function of token ids and mask (what ONNX needs as inputs)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model({"input_ids": input_ids, "attention_mask": attention_mask})["sentence_embedding"]


def fingerprint(model) -> str:
    """Identifies an export: the modules' configuration (``repr``: pooling, normalization, max length), every
    weight, and the torch / onnxruntime versions that made and run it."""
    import onnxruntime

    h = hashlib.blake2b(digest_size=10)
    h.update(f"{model!r}|torch {torch.__version__}|onnxruntime {onnxruntime.__version__}".encode())
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def export(model, target: Path) -> None:
    """Export ``model`` to ``target/model.onnx`` (a directory, so a large model's external weights go with it),
    atomically: a concurrent export of the same model loses the rename race harmlessly."""
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    work.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    try:
        example = model.preprocess(["an example sentence to trace the graph with", "a short one"])
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
        with _quiet(), torch.no_grad():
            torch.onnx.export(
                _Pipeline(model.cpu()).eval(),
                (example["input_ids"], example["attention_mask"]),
                str(work / "model.onnx"),
                input_names=["input_ids", "attention_mask"],
                output_names=["sentence_embedding"],
                dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
                dynamo=True,
            )
        try:
            work.rename(target)
        except OSError:
            if not (target / "model.onnx").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter prints its stages and warns about operators this model does not use (torchvision's)."""
    onnx_logger = logging.getLogger("torch.onnx")
    level = onnx_logger.level
    onnx_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        onnx_logger.setLevel(level)


class OnnxSentenceEncoder:
    """``encode(texts)`` of a loaded sentence-transformers ``model`` (which keeps tokenizing), run by ONNX Runtime
    on at most 2 threads: a query is too small to split further, and a busy machine punishes more."""

    def __init__(self, model) -> None:
        import onnxruntime as ort

        self.model = model
        self.path = cache_dir() / fingerprint(model)
        if not (self.path / "model.onnx").exists():
            logger.info("exporting the embedder to ONNX once, into %s", self.path)
            export(model, self.path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = min(2, os.cpu_count() or 1)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy-waiting between calls
        try:
            self.session = ort.InferenceSession(str(self.path / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        except Exception:
            shutil.rmtree(self.path, ignore_errors=True)  # a broken export must not be loaded again
            raise

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """One float32 row per text. Texts are batched longest first, as sentence-transformers does, so a batch
        pads to similar lengths."""
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out: np.ndarray | None = None
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            features = self.model.preprocess([texts[i] for i in rows])
            feed = {k: features[k].numpy().astype(np.int64, copy=False) for k in ("input_ids", "attention_mask")}
            vecs = self.session.run(None, feed)[0]
            if out is None:
                out = np.empty((len(texts), vecs.shape[1]), dtype=np.float32)
            out[rows] = vecs
        assert out is not None, "encode needs at least one text"
        return out
