"""Copied as sitecustomize.py into a vLLM overlay folder (vllm_overlay.py),
imported before anything else (PYTHONPATH beats site-packages): sets
vllm.__version__ to $FAKE_VLLM_VERSION, as another vLLM release would ("-":
no version and no metadata, as a source tree), and with $FAKE_VLLM_OVERLAY
set, imports vllm's modules from the overlay folder (vllm/...) where it has
a file, as a patched vLLM on PYTHONPATH would."""

import importlib.abc
import importlib.util
import os
import sys

from arc_cy._flags import env_flag

HERE = os.path.dirname(os.path.abspath(__file__))


class Overlay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        file = os.path.join(HERE, *name.split(".")) + ".py"
        if name.startswith("vllm.") and os.path.isfile(file):
            return importlib.util.spec_from_file_location(name, file)
        return None


if env_flag("FAKE_VLLM_OVERLAY"):
    sys.meta_path.insert(0, Overlay())
if os.environ.get("FAKE_VLLM_VERSION") == "-":
    # No version at all, as a source tree or an overlay has none: no
    # __version__, and no installed metadata.
    import importlib.metadata

    import vllm

    del vllm.__version__
    _version = importlib.metadata.version

    def version(name):
        if name == "vllm":
            raise importlib.metadata.PackageNotFoundError(name)
        return _version(name)

    importlib.metadata.version = version
elif os.environ.get("FAKE_VLLM_VERSION"):
    import vllm

    vllm.__version__ = os.environ["FAKE_VLLM_VERSION"]
