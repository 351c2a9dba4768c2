"""arc_cy's ChunkStatus with vLLM hidden (any import of vllm fails): the
stand-in. Prints its layout as JSON: fields (name, size, offset), size,
alignment, and a new chunk's ref_cnt, chunk_id and is_ready."""

import builtins
import ctypes
import json

real_import = builtins.__import__


def no_vllm(name, *args, **kwargs):
    if name == "vllm" or name.startswith("vllm."):
        raise ImportError("vLLM hidden")
    return real_import(name, *args, **kwargs)


builtins.__import__ = no_vllm
from arc_cy import _vllm  # noqa: E402 -- imported with vLLM hidden

assert not _vllm.HAVE_VLLM
cs = _vllm.ChunkStatus
c = cs(7)
print(
    json.dumps(
        {
            "fields": [(f[0], ctypes.sizeof(f[1]), getattr(cs, f[0]).offset) for f in cs._fields_],
            "size": ctypes.sizeof(cs),
            "align": ctypes.alignment(cs),
            "init": [c.ref_cnt, c.chunk_id, c.is_ready],
        }
    )
)
