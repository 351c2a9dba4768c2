"""The vendored vLLM files against their record (tests/data/vllm/record.json,
tools/vendored.py): CI installs one release, so every release's files are
checked here against the hashes recorded from its sdist; the record meets
the sdist itself when tools/vllm_compat.sh runs (``compare``)."""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from helpers import REPO

_spec = importlib.util.spec_from_file_location("vendored", REPO / "tools" / "vendored.py")
vendored = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(vendored)  # type: ignore[union-attr]

RELEASE = "0.34.0"


def test_the_vendored_files_are_the_recorded_ones():
    assert vendored.check() == []
    entries = vendored.load()
    assert sorted(entries) == sorted(p.name for p in vendored.DATA.iterdir() if p.is_dir())
    for release, entry in entries.items():
        assert entry["sdist"] == f"vllm-{release}.tar.gz"
        assert len(entry["sdist_sha256"]) == 64 and int(entry["sdist_sha256"], 16) >= 0
        assert "vllm/v1/kv_offload/cpu/policies/arc.py" in entry["files"]


@pytest.fixture
def copy(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "vllm"
    shutil.copytree(vendored.DATA, data)
    return data, data / "record.json"


def _edit_a_byte(data: Path, record: Path) -> str:
    path = data / RELEASE / "vllm/v1/kv_offload/cpu/policies/arc.py"
    path.write_bytes(path.read_bytes() + b"\n")
    return f"{RELEASE}/vllm/v1/kv_offload/cpu/policies/arc.py: sha256 "


def _add_a_file(data: Path, record: Path) -> str:
    (data / RELEASE / "extra.py").write_text("")
    return f"{RELEASE}/extra.py: not in the record"


def _remove_a_file(data: Path, record: Path) -> str:
    (data / RELEASE / "vllm/v1/kv_offload/tiering/manager.py").unlink()
    return f"{RELEASE}/vllm/v1/kv_offload/tiering/manager.py: recorded, missing here"


def _add_a_release(data: Path, record: Path) -> str:
    (data / "9.9.9").mkdir()
    return "9.9.9: files here, no entry in record.json"


def _remove_a_release(data: Path, record: Path) -> str:
    shutil.rmtree(data / RELEASE)
    return f"{RELEASE}: an entry in record.json, no files here"


@pytest.mark.parametrize(
    "change", [_edit_a_byte, _add_a_file, _remove_a_file, _add_a_release, _remove_a_release]
)
def test_check_reports_every_kind_of_difference(change, copy):
    data, record = copy
    assert vendored.check(data, record) == []
    expected = change(data, record)
    problems = vendored.check(data, record)
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def _sdist(data: Path, edit: bytes = b"") -> bytes:
    """A tarball laid out as vLLM's sdist, holding the vendored files."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, _ in vendored.vendored(data, RELEASE).items():
            content = (data / RELEASE / path).read_bytes() + edit
            info = tarfile.TarInfo(f"vllm-{RELEASE}/{path}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def test_compare_meets_the_record_with_an_sdist(copy):
    data, record = copy
    sdist = _sdist(data)
    assert vendored.record_entry(RELEASE, f"vllm-{RELEASE}.tar.gz", sdist, data, record) == []
    assert vendored.compare(RELEASE, sdist, record) == []
    other = _sdist(data, edit=b"# changed\n")
    problems = vendored.compare(RELEASE, other, record)
    assert problems[0].startswith(f"{RELEASE}: the sdist's sha256 is "), problems
    assert len(problems) == 1 + len(json.loads(record.read_text())[RELEASE]["files"]), problems
    # A vendored file that is not the sdist's is never recorded.
    assert vendored.record_entry(RELEASE, "x.tar.gz", other, data, record)
    assert vendored.compare(RELEASE, sdist, record) == []
