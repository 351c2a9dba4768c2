"""insert() of objects that are not chunks, each into a new policy (the
first chunk it sees) and into one that has seen a real chunk, of the
implementation named on the command line; then evict(). Prints, per
object, what insert raised."""

import ctypes
import json
import sys

from _child import K, policy_class, ready

from arc_cy import ChunkStatus


class Duck:
    ref_cnt = 0


class Other(ctypes.Structure):
    _fields_ = [("chunk_id", ctypes.c_int64), ("ref_cnt", ctypes.c_int16)]


class Union(ctypes.Union):
    _fields_ = [("ref_cnt", ctypes.c_uint32), ("x", ctypes.c_int64)]


class Bitfield(ctypes.Structure):
    _fields_ = [("ref_cnt", ctypes.c_int32, 8)]


Bitfield._fields_[0] = ("ref_cnt", ctypes.c_int32)  # the list, not the layout


class Ready(ChunkStatus):
    @property
    def is_ready(self):
        return True


OBJECTS = {
    "None": lambda: None,
    "int": lambda: 0,
    "float": lambda: 0.0,
    "str": lambda: "chunk",
    "bytes": lambda: b"\0" * 16,
    "duck": Duck,
    "other layout": Other,
    "union": Union,
    "array": lambda: (ctypes.c_int32 * 4)(),
    "pointer": lambda: ctypes.pointer(ctypes.c_int32(0)),
    "c_int32": lambda: ctypes.c_int32(0),
    "ChunkStatus type": lambda: ChunkStatus,
    "memoryview": lambda: memoryview(bytearray(16)),
    "bitfield, _fields_ edited": Bitfield,
    "is_ready overridden": lambda: Ready(1),
}

cls = policy_class(sys.argv[1])
out = {}
for name, make in OBJECTS.items():
    got = []
    for seen_one in (False, True):
        policy = cls(1)
        if seen_one:
            policy.insert(K(0), ready(0), None)
        try:
            policy.insert(K(1), make(), None)
        except TypeError as exc:
            got.append(str(exc))
        else:
            got.append("accepted")
        policy.evict(1, set())
        policy._check_invariants()
    out[name] = got
print(json.dumps(out))
