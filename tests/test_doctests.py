"""The doctests of every module of the installed ``memstate`` package, its stages included.

pytest's ``--doctest-modules`` would import ``evaluate/stats.py`` under its folder's name (``evaluate.stats``): a second
copy of the module beside ``memstate.evaluate.stats``, and one that shadows Hugging Face's ``evaluate``. Walking the
package imports each module under its one real name.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import tomllib
from pathlib import Path

import pytest

STAGES = ("data_build", "reward", "train", "serve", "evaluate", "memory", "experiment")
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _modules() -> list[str]:
    names = []
    for package in ("memstate", *(f"memstate.{stage}" for stage in STAGES)):
        module = importlib.import_module(package)
        names.append(package)
        # A stage lives in its own top-level folder (the editable install maps it), so each is walked from its own path.
        names += [m.name for m in pkgutil.walk_packages(module.__path__, f"{package}.") if m.name.count(".") <= 3]
    return sorted(set(names))


MODULES = _modules()


def test_every_stage_is_walked() -> None:
    assert {
        "memstate.schema",
        "memstate.evaluate.stats",
        "memstate.evaluate.memsyco.data",
        "memstate.memory.store",
        "memstate.sources.personamem",
        "memstate.experiment.leak",
    } <= set(MODULES)


def test_stages_are_the_installed_folders() -> None:
    """Every stage folder pyproject.toml maps into the package is walked: a new stage cannot be left out unseen."""
    with PYPROJECT.open("rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    assert set(STAGES) == {name.removeprefix("memstate.") for name in package_dir if name != "memstate"}


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} doctests failed in {name} (see the output above)"
