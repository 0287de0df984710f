"""The MiniLM embedder under ONNX Runtime: the same vectors as sentence-transformers' own encode, an export made once
and reused from the cache, and a broken cached export removed instead of loaded again."""

from pathlib import Path

import numpy as np
import pytest

from memstate.memory import onnx_encoder
from memstate.memory.embed import SentenceTransformerEmbedder

TEXTS = [
    "What drink does the user prefer in the morning these days?",
    "hi",
    "I moved from Berlin to Lisbon last spring and now I prefer green tea over coffee in the mornings.",
    "My sister's wedding is in June.",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("memstate-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(onnx_encoder.CACHE_ENV, str(path))
        yield path


@pytest.fixture(scope="module")
def onnx_embedder(cache):
    embedder = SentenceTransformerEmbedder(runtime="onnx")
    assert embedder.active_runtime == "onnx"
    return embedder


def test_onnx_vectors_match_torch(onnx_embedder):
    torch_embedder = SentenceTransformerEmbedder(runtime="torch")
    assert torch_embedder.active_runtime == "torch"
    texts = TEXTS * 20  # longest-first batching and padding across two batches of 64
    onnx_vecs, torch_vecs = onnx_embedder.encode(texts), torch_embedder.encode(texts)
    assert onnx_vecs.shape == torch_vecs.shape == (len(texts), 384)
    np.testing.assert_allclose(onnx_vecs, torch_vecs, atol=1e-5)
    # one text alone (no padding) gives the row it had in the batch
    np.testing.assert_allclose(onnx_embedder.encode([TEXTS[2]])[0], onnx_vecs[2], atol=1e-5)
    assert float(onnx_vecs[0] @ onnx_vecs[2]) > float(onnx_vecs[0] @ onnx_vecs[3])  # tea question ~ tea answer


def test_export_is_cached_and_reused(onnx_embedder, cache, monkeypatch):
    exports = list((cache / "onnx").glob("*/model.onnx"))
    assert len(exports) == 1 and exports[0].parent == onnx_embedder._onnx.path

    def no_export(*_):
        raise AssertionError("the cached export should have been loaded")

    monkeypatch.setattr(onnx_encoder, "export", no_export)
    again = SentenceTransformerEmbedder(runtime="onnx")
    assert again.active_runtime == "onnx"
    np.testing.assert_allclose(again.encode(TEXTS), onnx_embedder.encode(TEXTS), atol=1e-6)
    assert not list((cache / "onnx").glob(".*"))  # no export work directory left behind


def test_broken_export_is_removed_not_reloaded(onnx_embedder, tmp_path, monkeypatch):
    monkeypatch.setenv(onnx_encoder.CACHE_ENV, str(tmp_path))
    broken = tmp_path / "onnx" / onnx_embedder._onnx.path.name
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(Exception, match="(?i)protobuf|invalid|load model"):
        onnx_encoder.OnnxSentenceEncoder(onnx_embedder._model)
    assert not broken.exists()


def test_unknown_runtime_is_refused():
    with pytest.raises(ValueError, match="runtime 'tensorrt'"):
        SentenceTransformerEmbedder(runtime="tensorrt")


def test_one_minilm_per_process(onnx_embedder, monkeypatch):
    """memory's embedders and data_build load the packaged MiniLM through memstate.embedding: one copy per device."""
    import sentence_transformers

    from memstate.data_build import personamem
    from memstate.embedding import DEFAULT_MODEL, default_model_path, load_sentence_transformer, resolve_model
    from memstate.sources.skips import SkipLog

    model = load_sentence_transformer()
    assert onnx_embedder._model is model
    assert SentenceTransformerEmbedder(runtime="torch", device="cpu")._load() is model
    assert load_sentence_transformer(DEFAULT_MODEL, "cpu") is load_sentence_transformer(default_model_path()) is model
    assert resolve_model() == (default_model_path(), True)  # bundled weights: local_files_only, never the network

    def no_second_load(*args, **kwargs):
        raise AssertionError("the model was loaded a second time")

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", no_second_load)
    fixture = Path(__file__).parent / "fixtures" / "personamem"
    read = personamem.read_personamem(
        fixture, "questions_32k.csv", "shared_contexts_32k.jsonl", SkipLog(skip_invalid=True), max_questions=1
    )
    assert len(read.items) == 1  # built with the model memory embeds with
    assert not hasattr(personamem, "default_embedder")  # no second loader left in data_build
