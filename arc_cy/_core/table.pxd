# The core's key table: a key's hash to its node in the node store
# (nodes.pxd). Open addressing, linear probing, no tombstones.
#
# Invariant: `used` slots hold a node index (the others EMPTY), one for
# each node in a list, with fold(its hash) in h32; the load stays <= 0.7;
# every node is found from its hash's home slot (probe_start) by
# probe_next steps without crossing an EMPTY slot. `epoch` moves on every
# change to the slots (a probe that ran __eq__ checks it, with the node
# store's). The table compares keys only in table_find, which reads the
# node store; nothing else here reads a node.

from cpython.object cimport PyObject, Py_EQ
from cpython.ref cimport Py_XINCREF, Py_XDECREF
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.string cimport memset

from .capi cimport PyObject_RichCompareBool, arc_prefetch
from .nodes cimport EMPTY, FREE, NodeStore


cdef enum:
    MIN_TABLE_BITS = 3

ctypedef struct Slot:
    int32_t idx         # node index, or EMPTY
    uint32_t h32        # fold(hash): probes skip most nodes without a load

ctypedef struct Table:
    Slot *slots         # 1 << bits of them
    uint32_t bits
    Py_ssize_t used     # slots that hold a node
    uint64_t epoch      # bumped on every change to the slots


# --- probing --------------------------------------------------------------

cdef inline uint32_t fold(Py_hash_t h) noexcept nogil:
    return <uint32_t>(<uint64_t>h ^ (<uint64_t>h >> 32))


cdef inline size_t probe_start(uint32_t h32, uint32_t bits) noexcept nogil:
    # Fibonacci hashing spreads sequential hashes (small ints) out.
    return (<uint32_t>(h32 * 2654435769U)) >> (32 - bits)


cdef inline size_t probe_next(size_t s, size_t mask) noexcept nogil:
    return (s + 1) & mask


cdef inline size_t first_slot(const Slot *slots, uint32_t bits, uint32_t h32,
                              int32_t idx) noexcept nogil:
    """The first slot from h32's home on that holds node idx (EMPTY: the
    first free slot). There is one: the load stays below 1."""
    cdef size_t mask = (<size_t>1 << bits) - 1
    cdef size_t s = probe_start(h32, bits)
    while slots[s].idx != idx:
        s = probe_next(s, mask)
    return s


cdef inline void table_ask(const Table *t, Py_hash_t hash) noexcept nogil:
    """Ask for the memory of hash's home slot (a walk that will forget the
    node: table_del starts there)."""
    arc_prefetch(&t.slots[probe_start(fold(hash), t.bits)])


# --- the table's memory ---------------------------------------------------

cdef inline void table_empty(Table *t) noexcept:
    """Every slot EMPTY; a grown table gives its memory back (if that
    fails, it keeps it). Needs no allocation: it cannot fail halfway."""
    cdef Slot *small
    if t.bits > MIN_TABLE_BITS:
        small = <Slot *>PyMem_Realloc(t.slots, sizeof(Slot) << MIN_TABLE_BITS)
        if small is not NULL:
            t.slots = small
            t.bits = MIN_TABLE_BITS
    memset(t.slots, 0xFF, sizeof(Slot) << t.bits)  # all EMPTY
    t.used = 0
    t.epoch += 1


cdef inline int table_init(Table *t) except -1:
    """The smallest table, empty (t's memory was zeroed, as a cdef class's
    fields are)."""
    t.slots = <Slot *>PyMem_Malloc(sizeof(Slot) << MIN_TABLE_BITS)
    if t.slots is NULL:
        raise MemoryError()
    t.bits = MIN_TABLE_BITS
    table_empty(t)
    return 0


cdef inline void table_free(Table *t) noexcept:
    PyMem_Free(t.slots)
    t.slots = NULL


# --- lookups and changes --------------------------------------------------

cdef inline int32_t table_find(const Table *t, const NodeStore *s, object key,
                               Py_hash_t hash, int lists) except -2:
    """Node index of key if one of lists (a mask of 1 << where) holds it,
    else EMPTY: the probe walk from the hash's home slot. Keys are unique
    across the lists, so for keys that keep Python's hash and eq contract
    at most one node equals key; for keys that break it, the first in
    probe order wins (docs/hardening.md, "The key contract").

    __eq__ may run another thread's calls, or a read's callbacks may
    mutate: the stored key is held while it runs, and if the table or the
    node store changed meanwhile the walk starts again, as CPython's dict
    does."""
    cdef uint32_t h = fold(hash)
    cdef size_t mask, i_slot
    cdef int32_t i
    cdef uint64_t epoch, nodes_epoch
    cdef PyObject *stored
    cdef int same
    while True:
        mask = (<size_t>1 << t.bits) - 1
        i_slot = probe_start(h, t.bits)
        epoch = t.epoch
        nodes_epoch = s.epoch
        while True:
            i = t.slots[i_slot].idx
            if i == EMPTY:
                return EMPTY
            if (t.slots[i_slot].h32 == h and s.nodes[i].hash == hash
                    and (1 << s.nodes[i].where) & lists):
                stored = s.nodes[i].key
                if stored is <PyObject *>key:  # identity first, as dicts do
                    return i
                Py_XINCREF(stored)
                same = PyObject_RichCompareBool(stored, <PyObject *>key, Py_EQ)
                Py_XDECREF(stored)  # may run a __del__
                if same < 0:
                    return -2
                if t.epoch != epoch or s.epoch != nodes_epoch:
                    break  # the storage changed: walk again
                if same:
                    return i
            i_slot = probe_next(i_slot, mask)


cdef inline int table_reserve(Table *t) except -1:
    """Grow the table so that one more entry keeps the load <= 0.7."""
    return table_reserve_n(t, 1)


cdef inline int table_reserve_n(Table *t, Py_ssize_t n) except -1:
    """Grow the table so that n more entries keep the load <= 0.7."""
    cdef uint32_t bits = t.bits
    cdef size_t old_size = <size_t>1 << bits
    cdef size_t size, j, k
    cdef Slot *old = t.slots
    cdef Slot *slots
    if (t.used + n) * 10 <= <Py_ssize_t>old_size * 7:
        return 0
    while (t.used + n) * 10 > <Py_ssize_t>(<size_t>1 << bits) * 7:
        bits += 1
    size = <size_t>1 << bits
    slots = <Slot *>PyMem_Malloc(size * sizeof(Slot))
    if slots is NULL:
        raise MemoryError()
    for k in range(size):
        slots[k].idx = EMPTY
    t.slots = slots
    t.bits = bits
    t.epoch += 1
    for j in range(old_size):
        if old[j].idx != EMPTY:
            slots[first_slot(slots, bits, old[j].h32, EMPTY)] = old[j]
    PyMem_Free(old)
    return 0


cdef inline void table_add(Table *t, int32_t i, Py_hash_t hash) noexcept nogil:
    """Give node i (its hash) a slot; table_reserve made room."""
    cdef uint32_t h = fold(hash)
    cdef size_t k = first_slot(t.slots, t.bits, h, EMPTY)
    t.slots[k].idx = i
    t.slots[k].h32 = h
    t.used += 1
    t.epoch += 1


cdef inline void table_del(Table *t, int32_t i, Py_hash_t hash) noexcept nogil:
    """Drop node i's slot (hash: the node's), shifting its probe run back
    (no tombstones)."""
    cdef size_t mask = (<size_t>1 << t.bits) - 1
    cdef size_t k = first_slot(t.slots, t.bits, fold(hash), i)
    cdef size_t j, home
    j = k
    while True:
        j = probe_next(j, mask)
        if t.slots[j].idx == EMPTY:
            break
        home = probe_start(t.slots[j].h32, t.bits)
        # Move slot j into the hole at k unless its home lies in (k, j].
        if ((j - home) & mask) >= ((j - k) & mask):
            t.slots[k] = t.slots[j]
            k = j
    t.slots[k].idx = EMPTY
    t.used -= 1
    t.epoch += 1


# --- the check ------------------------------------------------------------

cdef inline int table_check(const Table *t, const NodeStore *s,
                            Py_ssize_t live) except -1:
    """Assert the invariant above, for a node store whose lists hold live
    nodes (the core's _check asserted the lists)."""
    cdef size_t k, size = <size_t>1 << t.bits
    cdef Py_ssize_t slots = 0
    cdef int32_t i, w
    for k in range(size):
        i = t.slots[k].idx
        if i != EMPTY:
            slots += 1
            assert s.nodes[i].where != FREE, f"slot {k} points at a free node"
            assert fold(s.nodes[i].hash) == t.slots[k].h32
    assert slots == live == t.used, "table and lists disagree"
    assert t.used * 10 <= <Py_ssize_t>size * 7, "table overfull"
    # Every node is found from its hash's home slot without crossing an
    # empty slot (by index: no __eq__, so keys that break the contract are
    # checked too).
    for w in range(4):
        i = s.head[w]
        while i != EMPTY:
            k = probe_start(fold(s.nodes[i].hash), t.bits)
            while t.slots[k].idx != i:
                assert t.slots[k].idx != EMPTY, f"node {i} is not in its probe run"
                k = probe_next(k, size - 1)
            i = s.nodes[i].next
    return 0
