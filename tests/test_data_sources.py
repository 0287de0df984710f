"""The data-source registry: a toy source defined here (its own module, nothing else edited: neither
``data_build/build.py`` nor the registry names it) is built by ``memstate build-data`` from a YAML section named
after it; unknown sources and keys are configuration errors that list the registered sources."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from memstate.cli import main
from memstate.data_build.build import DataConfig, load_data_config
from memstate.data_build.fever import FeverConfig
from memstate.data_build.records import EvidenceClaim, SourceRead
from memstate.data_build.registry import DataSource, get_source, register, source_names, unregister
from memstate.errors import ConfigError


@dataclass
class ToyConfig:
    claims: int = field(default=30, metadata={"help": "Invented claims, half of them supported."})


def read_toy(section: ToyConfig, config: DataConfig, log) -> SourceRead:
    """Invented claims with one evidence sentence each: no input files, so nothing to account for."""
    items = []
    for n in range(section.claims):
        label = "supported" if n % 2 == 0 else "refuted"
        verb = "confirms" if label == "supported" else "denies"
        evidence = (f"Toy gazette {n}: the registry {verb} that lamp {n} is blue.",)
        items.append(EvidenceClaim("toy", str(n), f"Lamp {n} is blue.", label, evidence))
    return SourceRead(source="toy", items=items, stats={"claims": section.claims, "seed": config.seed})


TOY = DataSource("toy", "invented lamp claims", ToyConfig, read_toy)


@pytest.fixture
def toy():
    register(TOY)
    yield TOY
    unregister("toy")


def test_builtins_register_in_their_modules_in_build_order() -> None:
    assert source_names()[:4] == ("fever", "scifact", "personamem", "synthetic")
    assert get_source("fever").section is FeverConfig
    assert get_source("personamem").read.__module__ == "memstate.data_build.personamem"


def test_a_registered_toy_source_is_built_from_its_yaml_section(toy, tmp_path) -> None:
    assert source_names()[-1] == "toy"  # the default order puts it after the built-ins
    yaml = tmp_path / "toy.yaml"
    yaml.write_text("toy:\n  claims: 40\nshortcut_probe: warn\nprogress: false\nseed: 3\n", encoding="utf-8")
    config = load_data_config(yaml)
    assert config.sources == {"toy": ToyConfig(claims=40)}
    assert main(["build-data", "--config", str(yaml), "--out", str(tmp_path / "out")]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="utf-8"))
    # The manifest records the toy section under its own name, as for the built-ins.
    assert manifest["config"]["toy"] == {"claims": 40} and manifest["config"]["fever"] is None
    assert manifest["counts"]["source"] == {"toy": 40 * 3}  # one instance per claim and perspective
    assert manifest["source_stats"] == {"toy": {"claims": 40, "seed": 3}}
    rows = (tmp_path / "out" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    assert rows and all(json.loads(r)["source"] == "toy" for r in rows)


def test_config_errors_list_the_registered_sources(toy, tmp_path) -> None:
    yaml = tmp_path / "bad.yaml"
    yaml.write_text("toy: {claimz: 3}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.yaml: toy: unknown key\(s\) \['claimz'\]; known keys are \['claims'\]"):
        load_data_config(yaml)
    yaml.write_text("toys: {claims: 3}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown key\(s\) \['toys'\]; known keys are \[.*'toy'"):
        load_data_config(yaml)
    yaml.write_text("sources: {toy: {claims: 3}}\n", encoding="utf-8")  # sections are top-level keys only
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['sources'\]"):
        load_data_config(yaml)
    yaml.write_text("seed: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="names no source: give at least one of fever, .*, synthetic, toy$"):
        load_data_config(yaml)
    with pytest.raises(ValueError, match=r"unknown source\(s\) \['lamps'\]; registered: .*, toy"):
        DataConfig(sources={"lamps": ToyConfig()})
    with pytest.raises(ValueError, match=r"sources\['toy'\] must be a ToyConfig, got dict"):
        DataConfig(sources={"toy": {"claims": 3}})
    with pytest.raises(ConfigError, match="unknown data source 'lamps'; known: .*, toy"):
        get_source("lamps")


def test_a_name_is_registered_once(toy) -> None:
    register(TOY)  # the same source again (a module imported twice) is fine
    with pytest.raises(ValueError, match="data source 'toy' is already registered"):
        register(DataSource("toy", "other", ToyConfig, lambda section, config, log: SourceRead("toy", [])))
