"""The design's import contract (docs: "Layout"), checked on the source: every ``import`` and ``from … import`` of
every module, function-level (lazy) imports and ``TYPE_CHECKING`` blocks included.

import-linter cannot check it: its graph builder (grimp) only walks a top-level package's own folder, and the stages
are ``memstate.*`` subpackages living in their own top-level folders.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("data_build", "reward", "train", "serve", "evaluate", "memory", "experiment")
# What each stage may import besides the core (``memstate.<core module>``); prefixes, as in the design.
ALLOWED: dict[str, tuple[str, ...]] = {
    "core": (),
    # The PersonaMem builder draws its relations with the memory pipeline's one relation rule, so the policy
    # learns from edges drawn as they are served.
    "data_build": ("memstate.memory.relation_rule",),
    "reward": (),
    # Validation during training reports its gain with evaluation's cluster-bootstrap CI (train/validation.py).
    "train": ("memstate.reward", "memstate.evaluate.stats"),
    "serve": (),
    "evaluate": ("memstate.reward", "memstate.serve.client", "memstate.memory"),
    "memory": ("memstate.serve.client",),
    # An experiment runs the whole method end to end, as the CLI does: it may use every stage but serving; no stage
    # imports it.
    "experiment": ("memstate.data_build", "memstate.reward", "memstate.train", "memstate.evaluate"),
}


def imported_modules(path: Path) -> set[str]:
    """Absolute module names a file imports, lazy ones included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}:{node.lineno}: relative import; the project uses absolute imports")
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def layer_of(module: str) -> str | None:
    """The layer a ``memstate`` module belongs to (None outside the project)."""
    parts = module.split(".")
    if parts[0] != "memstate":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else "core"


def _files() -> list[tuple[str, Path]]:
    files = [("core", p) for p in sorted((ROOT / "memstate").rglob("*.py")) if p.name != "cli.py"]
    files += [(stage, p) for stage in STAGES for p in sorted((ROOT / stage).rglob("*.py"))]
    return files


def violations(files: list[tuple[str, Path]], root: Path = ROOT) -> list[str]:
    found = []
    for layer, path in files:
        for name in sorted(imported_modules(path)):
            target = layer_of(name)
            if target in (None, "core", layer):
                continue
            if not any(name == a or name.startswith(a + ".") for a in ALLOWED[layer]):
                found.append(f"{path.relative_to(root)}: {layer} imports {name}")
    return found


def test_layers_import_only_what_the_design_allows() -> None:
    files = _files()
    assert {layer for layer, _ in files} == {"core", *STAGES}
    assert violations(files) == []


# The released formats, each read (and validated) by one core module of memstate.sources for every stage.
SOURCES = ROOT / "memstate" / "sources"
FORMATS = ("fever", "scifact", "personamem", "locomo", "memsyco")


def test_every_released_format_has_one_core_reader() -> None:
    files = _files()
    readers = {p.stem: layer for layer, p in files if p.parent == SOURCES}
    assert {name: readers.get(name) for name in FORMATS} == dict.fromkeys(FORMATS, "core")
    # The readers' old homes are gone (no second copy, no re-export).
    assert not (ROOT / "memstate" / "personamem.py").exists() and not (ROOT / "memory" / "locomo.py").exists()
    # Each stage that reads a format imports its reader.
    users = {layer for layer, p in files for name in imported_modules(p) if name.startswith("memstate.sources.")}
    assert {"data_build", "memory", "evaluate"} <= users


def test_the_responders_package_is_core() -> None:
    """The responder (protocol, config, both backends) is one core package: checked as core, so it imports no stage,
    and its old flat modules are gone (no second copy, no re-export)."""
    files = _files()
    responders = {p.stem: layer for layer, p in files if p.parent == ROOT / "memstate" / "responders"}
    assert responders == dict.fromkeys(("__init__", "protocol", "config", "local", "remote"), "core")
    old = ("responder.py", "responder_protocol.py", "responder_config.py", "http_responder.py")
    assert not any((ROOT / "memstate" / name).exists() for name in old)


@pytest.mark.parametrize(
    ("layer", "source", "allowed"),
    [
        ("core", "from memstate.reward.score import score", False),
        ("core", "def f():\n    import memstate.memory.store", False),
        ("reward", "from memstate.train import run", False),
        ("serve", "from memstate.evaluate.stats import x", False),
        ("memory", "from memstate.serve.api import create_app", False),
        ("memory", "from memstate.serve.client import ReasoningStateClient", True),
        ("train", "from memstate.reward.counterfactual import x", True),
        ("evaluate", "from memstate.memory.store import MemoryStore", True),
        ("core", "from memstate.data_build.records import SourceRead", False),
        ("memory", "from memstate.sources.locomo import read_locomo", True),
        ("core", "def f():\n    from memstate.reward.fit import fit_facts", False),
        ("reward", "from memstate.responders.remote import OpenAIResponder", True),
    ],
)
def test_the_check_catches_a_forbidden_import(tmp_path: Path, layer: str, source: str, allowed: bool) -> None:
    path = tmp_path / "module.py"
    path.write_text(source + "\n")
    assert (violations([(layer, path)], root=tmp_path) == []) is allowed


def test_the_shared_prefix_trainer_imports_nothing_else_of_memstate() -> None:
    """``SharedPrefixGRPOTrainer`` is a component a plain TRL user takes as is (docs/shared_prefix.md): importing it
    loads its own two modules and the core's errors, no stage (reward, responders, memory, ...). Checked in a fresh
    interpreter, imports of imports included."""
    import subprocess
    import sys

    # one marked line: importing TRL may log to stdout (DeepSpeed's accelerator detection, when it is installed)
    code = (
        "import sys, memstate.train.shared_prefix\n"
        "print('loaded', *sorted(m for m in sys.modules if m.split('.')[0] == 'memstate'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = next(line.split()[1:] for line in out.splitlines() if line.startswith("loaded "))
    assert loaded == ["memstate", "memstate.errors", "memstate.train", "memstate.train.packing",
                      "memstate.train.shared_prefix"]  # fmt: skip
