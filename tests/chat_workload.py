"""A stand-in: chat_workload lives in harness/chat_workload.py, which pytest's ``pythonpath``
setting (pyproject.toml) and bench/run.sh's PYTHONPATH put on sys.path.

This file keeps the name importable where only tests/ is on the path: the
child process that tests/test_scheduler_e2e.py starts (``python -P -m
recorder`` with PYTHONPATH = tests/). It loads harness/chat_workload.py under the
same module name, so there is one module either way. It can go once that
child's PYTHONPATH holds harness/ too.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "harness", "chat_workload.py")
_spec = importlib.util.spec_from_file_location(__name__, _FILE)
assert _spec is not None and _spec.loader is not None, _FILE
_module = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _module
_spec.loader.exec_module(_module)
