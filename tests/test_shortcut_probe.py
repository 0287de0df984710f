"""The shortcut probes: every build reports them, and a build that hands the label over fails with their figures."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memstate.data_build.build import build_data, load_data_config
from memstate.data_build.probe import MARGIN, ShortcutError, run_probes
from memstate.memory.relation_rule import RELATION_RULE_VERSION
from memstate.schema import Fact, Instance

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["tiny", "fever_fixture"])
def test_every_probe_is_within_the_margin_of_the_majority(name, tmp_path):
    manifest = build_data(load_data_config(ROOT / "configs" / "data" / f"{name}.yaml", progress=False), tmp_path)
    probes = manifest["shortcut_probes"]
    assert probes["passed"] and probes["enforced"]
    names = {(p["source"], p["probe"]) for p in probes["probes"]}
    expected = {"relations", "structure", "user_memory_bow", "relations+user_memory"}
    assert {probe for source, probe in names if source == "fever"} == expected
    for p in probes["probes"]:
        assert p["accuracy"] <= p["majority_rate"] + MARGIN, p
    written = json.loads((tmp_path / "manifest.json").read_text())
    assert written["shortcut_probes"]["method"].startswith("out-of-fold")
    assert written["config"]["evidence_relations"] == "none" and written["config"]["consistent_share"] == 0.5
    assert written["relation_rule"] == RELATION_RULE_VERSION  # the rule that drew the relations trained on


def test_gold_relations_put_back_fail_the_build_with_the_figures(tmp_path):
    config = load_data_config(ROOT / "configs" / "data" / "fever_fixture.yaml", progress=False)
    config.evidence_relations = "gold"
    with pytest.raises(ShortcutError) as err:
        build_data(config, tmp_path / "gold")
    message = str(err.value)
    assert "fever: probe relations+user_memory" in message and "vs majority 0.523" in message
    assert not (tmp_path / "gold" / "train.parquet").exists()  # nothing is written for a failed build


def test_the_cli_fails_on_a_shortcut_or_warns_when_told(tmp_path):
    config = tmp_path / "gold.yaml"
    text = (ROOT / "configs" / "data" / "fever_fixture.yaml").read_text()
    config.write_text(text.replace("tests/fixtures", str(ROOT / "tests" / "fixtures")) + "evidence_relations: gold\n")
    command = [sys.executable, "-m", "memstate.cli", "build-data", "--config", str(config), "--out", str(tmp_path)]
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "shortcut probes predict the answer" in out.stderr
    warned = subprocess.run([*command, "--warn-on-shortcuts"], capture_output=True, text=True, cwd=ROOT)
    assert warned.returncode == 0 and "shortcut probes FAILED (not enforced" in warned.stdout
    assert not json.loads((tmp_path / "manifest.json").read_text())["shortcut_probes"]["enforced"]


def _instance(i: int, answer: str, positional: bool) -> Instance:
    facts = [Fact(f"F{k}", f"sentence {k} of {i}", "evidence") for k in range(1, 4)]
    # The shortcut: the number of facts tells the answer.
    if positional and answer == "refuted":
        facts.append(Fact("F4", f"extra {i}", "evidence"))
    return Instance(
        id=f"i{i}", source="fever", task="evidence_conflict", perspective="belief", question=f"Claim {i}?",
        options=(), answer=answer, answer_kind="label", labels=("supported", "refuted"), facts=tuple(facts),
        relations=(), meta={"group": f"g{i}"},
    )  # fmt: skip


def test_a_structural_shortcut_is_found_and_its_absence_is_not():
    answers = ["supported", "refuted"] * 30
    leaky = run_probes([_instance(i, a, True) for i, a in enumerate(answers)])
    clean = run_probes([_instance(i, a, False) for i, a in enumerate(answers)])
    by = {(p["probe"], p["classifier"]): p["accuracy"] for p in leaky["probes"]}
    assert by[("structure", "tree")] == 1.0 and not leaky["passed"]
    assert clean["passed"] and all(p["accuracy"] <= 0.5 + MARGIN for p in clean["probes"])
    # No injected memory: the memory probes are not run (and not faked).
    assert {p["probe"] for p in clean["probes"]} == {"relations", "structure"}
