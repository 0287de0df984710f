"""The distribution's import names: the stages install as ``memstate.<stage>`` (from the design's top-level folders),
so the project can sit next to Hugging Face ``evaluate`` and a user's own ``train.py``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("data_build", "reward", "train", "serve", "evaluate", "memory", "experiment")
BOTH = (
    "import evaluate, memstate.evaluate.run, memstate.evaluate.stats; "
    "assert hasattr(evaluate, 'load'), evaluate.__file__; "
    "assert 'site-packages' in evaluate.__file__, evaluate.__file__; "
    "print(evaluate.__file__); print(memstate.evaluate.run.__file__)"
)


def test_every_package_folder_is_installed_under_memstate() -> None:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("memstate", *STAGES)
        for init in (ROOT / top).rglob("__init__.py")
    }
    expected = {name if name.startswith("memstate") else f"memstate.{name}" for name in folders}
    assert set(setup["packages"]) == expected
    assert setup["package-dir"] == {"memstate": "memstate"} | {f"memstate.{s}": s for s in STAGES}


def test_hugging_face_evaluate_and_memstate_both_import(tmp_path: Path) -> None:
    """The development install (editable) next to Hugging Face ``evaluate``, from a directory outside the checkout."""
    out = subprocess.run([sys.executable, "-c", BOTH], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    hf, ours = out.stdout.split()
    assert Path(ours).resolve() == ROOT / "evaluate" / "run.py"


def test_a_built_wheel_installs_next_to_hugging_face_evaluate(tmp_path: Path) -> None:
    """A regular (non-editable) install: the wheel's ``memstate/evaluate`` beside site-packages' ``evaluate``."""
    source, target = tmp_path / "source", tmp_path / "site"  # a copy: the build writes build/ and *.egg-info in-tree
    for name in ("memstate", *STAGES):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    build = subprocess.run(
        [*install, "--target", str(target), str(source)], capture_output=True, text=True, timeout=600
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert (target / "memstate" / "evaluate" / "memsyco" / "judge.py").is_file()
    assert (target / "memstate" / "responders" / "remote.py").is_file()  # a core subpackage
    assert not (target / "evaluate").exists() and not (target / "train").exists()
    # The wheel goes first on the path, so the editable install cannot stand in for it.
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", BOTH], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    hf, ours = out.stdout.split()
    assert Path(ours).is_relative_to(target)
