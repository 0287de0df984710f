"""The sycophancy world's shipped models (examples/sycophancy_world/, built by ``memstate experiment world``, used by
``make demo``) are the ones world.json describes: their bytes, the data they were made for, the responder's
behaviour on the unseen users."""

import json
from pathlib import Path

import pytest

from memstate.cli import main
from memstate.data import load_split
from memstate.errors import ConfigError
from memstate.experiment.demo import WORLD_FILE
from memstate.experiment.sycophancy import responder_behaviour
from memstate.experiment.world import FOLLOW_USER, TRUST_EVIDENCE, USE_LATEST
from memstate.experiment.world_models import CHECKED_INSTANCES, check_world, instances_sha256
from memstate.responders.local import TransformersResponder
from memstate.tiny_models import tree_sha256

ROOT = Path(__file__).resolve().parents[1]
WORLD = ROOT / WORLD_FILE.parent
RECORD = json.loads((ROOT / WORLD_FILE).read_text())


@pytest.fixture(scope="module")
def world_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world") / "data"
    assert main(["build-data", "--config", str(ROOT / RECORD["data_config"]), "--out", str(out)]) == 0
    return out


def test_the_shipped_files_are_the_recorded_ones():
    hashes = tree_sha256(WORLD)
    del hashes["world.json"]
    assert hashes == RECORD["files"]
    assert {"responder/model.safetensors", "policy/model.safetensors", "policy/tokenizer.json"} <= set(hashes)


def test_the_data_config_builds_the_data_the_responder_was_made_for_and_the_demo_refuses_another(world_data, tmp_path):
    assert instances_sha256(world_data) == RECORD["data_instances_sha256"]
    check_world(WORLD, world_data)
    config = (ROOT / RECORD["data_config"]).read_text()
    assert "\nseed: 0\n" in config
    (tmp_path / "seed1.yaml").write_text(config.replace("\nseed: 0\n", "\nseed: 1\n"))
    other = tmp_path / "other"
    assert main(["build-data", "--config", str(tmp_path / "seed1.yaml"), "--out", str(other)]) == 0
    with pytest.raises(ConfigError, match="rebuild the world: memstate experiment world"):
        check_world(WORLD, other)


def test_the_shipped_responder_behaves_as_recorded_on_the_unseen_users(world_data):
    test = load_split(world_data, "test")
    assert len(test) == RECORD["test_instances"]
    responder = TransformersResponder(str(WORLD / "responder"), batch_size=32)
    # the first 240 of the 720 (a third of the time; world.json records both)
    measured = responder_behaviour(responder, test[:CHECKED_INSTANCES], "likelihood")
    recorded = RECORD[f"responder_behaviour_first_{CHECKED_INSTANCES}"]
    assert measured.keys() == recorded.keys()
    for key, value in recorded.items():
        # another CPU may round a near-tie the other way on a few of the 720 instances
        assert (measured[key] is None) == (value is None), key
        assert value is None or abs(measured[key] - value) <= 0.02, (key, measured[key], value)
    # what makes it the world's responder: it fails without a state, and does what a rule of a pair says
    assert measured["no_state_sycophancy_rate"] > 0.3 and measured["no_state_outdated_rate"] > 0.9
    assert min(measured[f"follows[{rule}]"] for rule in (TRUST_EVIDENCE, FOLLOW_USER, USE_LATEST)) > 0.8
