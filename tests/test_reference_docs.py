"""The docs' figures have one home: README.md's results and
docs/scheduler.md's tables are written by bench/summary.py from the
committed reference runs (bench/reference/), between its markers, and no
commit-pinned figure is typed outside them (dated figures written by hand
live in bench/reference/NOTES.md). Standard library only: no vLLM, no
numpy."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import pytest

from helpers import REPO

pytestmark = pytest.mark.repo

# A commit in backticks, as the docs name the tree a figure was measured on.
PINNED = re.compile(r"`[0-9a-f]{7,40}`")


@pytest.fixture(scope="module")
def summary() -> ModuleType:
    spec = importlib.util.spec_from_file_location("summary", REPO / "bench" / "summary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text(path: str) -> str:
    return (REPO / path).read_text(encoding="utf-8")


def test_every_generated_block_is_what_the_reference_runs_give(summary: ModuleType) -> None:
    for path in summary.FILES:
        text = _text(path)
        assert summary.render(path, text) == text, (
            f"{path}: a generated block differs from the reference runs; "
            "run python bench/summary.py"
        )


def test_each_block_is_in_its_file_once(summary: ModuleType) -> None:
    for name, (path, _) in summary.BLOCKS.items():
        assert [n for n, _, _ in summary.spans(_text(path))].count(name) == 1, (name, path)


def test_a_figure_edited_by_hand_is_found(summary: ModuleType) -> None:
    text = summary.render("README.md", _text("README.md"))
    [(_, start, end)] = summary.spans(text)
    block = text[start:end]
    figure = re.search(r"\| (\d+\.\d+)x \|", block)
    assert figure is not None
    edited = text[:start] + block[: figure.start(1)] + "99.9" + block[figure.end(1) :] + text[end:]
    assert edited != text
    assert summary.render("README.md", edited) == text  # the edit is found, and undone


def test_no_commit_pinned_figure_outside_the_generated_blocks(summary: ModuleType) -> None:
    for path in summary.FILES:
        text = _text(path)
        for _, start, end in reversed(summary.spans(text)):
            text = text[:start] + text[end:]
        pinned = [
            (path, i, line) for i, line in enumerate(text.splitlines(), 1) if PINNED.search(line)
        ]
        assert pinned == [], (
            "a commit-pinned figure written by hand: generate it (bench/summary.py) or move "
            "it to bench/reference/NOTES.md"
        )
