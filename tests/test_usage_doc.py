"""docs/usage.md's Python API example runs as written, on both
implementations."""

from __future__ import annotations

import doctest
import re

import pytest

import arc_cy
from helpers import REPO


def _example() -> str:
    text = (REPO / "docs" / "usage.md").read_text()
    section = text[text.index("## Python API") :]
    [block] = re.findall(r"```pycon\n(.*?)```", section.split("\n## ")[0], re.S)
    return block


def test_the_python_api_example_runs(policy_cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    arc_cy.ARCCachePolicy  # noqa: B018 -- loads the lazy names before one is patched
    monkeypatch.setattr(arc_cy, "ARCCachePolicy", policy_cls)
    test = doctest.DocTestParser().get_doctest(_example(), {}, "usage.md", "docs/usage.md", 0)
    assert len(test.examples) >= 10
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False) == doctest.TestResults(0, len(test.examples))
