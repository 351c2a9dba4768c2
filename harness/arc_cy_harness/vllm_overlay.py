"""A vLLM that says another version, or whose ARC decides otherwise: an
overlay folder put first on PYTHONPATH, whose ``sitecustomize.py``
(fake_vllm_sitecustomize.py) sets ``vllm.__version__`` to
``$FAKE_VLLM_VERSION`` and, with ``$FAKE_VLLM_OVERLAY`` set, imports vLLM's
modules from the folder where it has a file. Used by tests/test_self_check.py
and engine_tests/ to check that arc_cy's guard refuses a changed ARC."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

SITECUSTOMIZE = Path(__file__).resolve().parent / "fake_vllm_sitecustomize.py"
ARC_FILE = ("vllm", "v1", "kv_offload", "cpu", "policies", "arc.py")
# One decision of vLLM's arc.py, changed: T1 is chosen only when strictly
# larger than its target.
ARC_DECISION = (
    "if virtual_t1_size >= int(self.target_t1_size):",
    "if virtual_t1_size > int(self.target_t1_size):",
)


MANAGER_FILE = ("vllm", "v1", "kv_offload", "cpu", "manager.py")


def write(
    root: Path, file: tuple[str, ...] = ARC_FILE, edit: tuple[str, str] = ARC_DECISION
) -> Path:
    """Make root an overlay whose vLLM file (arc.py) has edit (ARC_DECISION)
    made; returns that file. Set FAKE_VLLM_OVERLAY=1 for it to take effect."""
    # The top-level package's spec only: importing vLLM takes seconds.
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin
    source = Path(spec.origin).parent.joinpath(*file[1:]).read_text()
    assert source.count(edit[0]) == 1
    path = root.joinpath(*file)
    path.parent.mkdir(parents=True)
    path.write_text(source.replace(*edit))
    shutil.copy(SITECUSTOMIZE, root / "sitecustomize.py")
    return path
