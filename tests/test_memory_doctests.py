"""The doctests of the ``memory`` package (pytest's ``testpaths`` does not list it, so they are run from here)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ("memory.concepts", "memory.embed", "memory.rule_extractor", "memory.store", "memory.validate")


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
