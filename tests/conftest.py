"""Shared fixtures: the tiny models and the FEVER fixture dataset are built once per test session."""

from memstate.threads import configure_threads

# As `memstate` does at start, before anything imports torch: the suite's own process waits passively and uses the
# cores it has, so the vLLM server and the DeepSpeed ranks it starts are not slowed by its spinning OpenMP threads.
# Under pytest-xdist (`make test`: `-n auto`) this runs in the controller first, whose exported thread variables the
# workers inherit and keep: each worker runs torch with the machine's thread count and passive waiting (two such
# workers on 2 cores ran the suite 1.5x faster than one process).
configure_threads(import_torch=False)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from memstate.data import load_split  # noqa: E402
from memstate.data_build.build import build_data, load_data_config  # noqa: E402
from memstate.tiny_models import build_tiny_models  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FEVER_CONFIG = ROOT / "configs" / "data" / "fever_fixture.yaml"


@pytest.fixture(scope="session", autouse=True)
def memstate_cache(tmp_path_factory):
    """Exported ONNX embedders go to the session's temporary directory, not the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMSTATE_CACHE", str(tmp_path_factory.mktemp("memstate-cache")))
        yield


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    return build_tiny_models(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def responder(tiny_models):
    """The tiny frozen responder, in-process (loaded once per session: tests only read from it)."""
    from memstate.responders.local import TransformersResponder

    return TransformersResponder(str(tiny_models["responder"]), batch_size=8)


@pytest.fixture(scope="session")
def fever_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fever-data")
    config = load_data_config(FEVER_CONFIG)
    config.progress = False
    build_data(config, out)
    return out


@pytest.fixture(scope="session")
def fever_train(fever_data):
    return load_split(fever_data, "train")
