# The core's table (included by _arc_c.pyx): a key's hash to its node.
# Open addressing, linear probing, no tombstones, load <= 0.7. Every walk
# starts at probe_start and moves by probe_next; walks that look for a slot
# by its node index (EMPTY: the first free one) are first_slot. The table
# is the core's fields table, table_bits and table_used; these functions
# take the core (a C pointer: no reference counting, no Python call), and
# bump its epoch on every change, as every change to the storage does.

ctypedef struct Slot:
    int32_t idx         # node index, or EMPTY
    uint32_t h32        # fold(hash): probes skip most nodes without a load


cdef inline uint32_t fold(Py_hash_t h) noexcept nogil:
    return <uint32_t>(<uint64_t>h ^ (<uint64_t>h >> 32))


cdef inline size_t probe_start(uint32_t h32, uint32_t bits) noexcept nogil:
    # Fibonacci hashing spreads sequential hashes (small ints) out.
    return (<uint32_t>(h32 * 2654435769U)) >> (32 - bits)


cdef inline size_t probe_next(size_t s, size_t mask) noexcept nogil:
    return (s + 1) & mask


cdef inline size_t first_slot(const Slot *table, uint32_t bits, uint32_t h32,
                              int32_t idx) noexcept nogil:
    """The first slot from h32's home on that holds node idx (EMPTY: the
    first free slot). There is one: the load stays below 1."""
    cdef size_t mask = (<size_t>1 << bits) - 1
    cdef size_t s = probe_start(h32, bits)
    while table[s].idx != idx:
        s = probe_next(s, mask)
    return s


cdef int32_t table_find(ARCCore core, object key, Py_hash_t hash, int lists) except -2:
    """Node index of key if one of lists (a mask) holds it, else EMPTY:
    the probe walk from the hash's home slot. Keys are unique across the
    lists, so for keys that keep Python's hash and eq contract at most
    one node equals key; for keys that break it, the first in probe
    order wins (docs/hardening.md, "The key contract").

    __eq__ may run another thread's calls, or a read's callbacks may
    mutate: the stored key is held while it runs, and if the storage
    changed meanwhile the walk starts again, as CPython's dict does."""
    cdef uint32_t h = fold(hash)
    cdef size_t mask, s
    cdef int32_t i
    cdef uint64_t epoch
    cdef PyObject *stored
    cdef int same
    while True:
        mask = (<size_t>1 << core.table_bits) - 1
        s = probe_start(h, core.table_bits)
        epoch = core.epoch
        while True:
            i = core.table[s].idx
            if i == EMPTY:
                return EMPTY
            if (core.table[s].h32 == h and core.nodes[i].hash == hash
                    and (1 << core.nodes[i].where) & lists):
                stored = core.nodes[i].key
                if stored is <PyObject *>key:  # identity first, as dicts do
                    return i
                Py_XINCREF(stored)
                same = PyObject_RichCompareBool(stored, <PyObject *>key, Py_EQ)
                Py_XDECREF(stored)  # may run a __del__
                if same < 0:
                    return -2
                if core.epoch != epoch:
                    break  # the storage changed: walk again
                if same:
                    return i
            s = probe_next(s, mask)


cdef int table_reserve(ARCCore core) except -1:
    """Grow the table so that one more entry keeps the load <= 0.7."""
    cdef uint32_t bits = core.table_bits
    cdef size_t old_size = <size_t>1 << bits
    cdef size_t size, s, j
    cdef Slot *old = core.table
    cdef Slot *table
    if (core.table_used + 1) * 10 <= <Py_ssize_t>old_size * 7:
        return 0
    bits += 1
    size = <size_t>1 << bits
    table = <Slot *>PyMem_Malloc(size * sizeof(Slot))
    if table is NULL:
        raise MemoryError()
    for s in range(size):
        table[s].idx = EMPTY
    core.table = table
    core.table_bits = bits
    core.epoch += 1
    for j in range(old_size):
        if old[j].idx != EMPTY:
            table[first_slot(table, bits, old[j].h32, EMPTY)] = old[j]
    PyMem_Free(old)
    return 0


cdef inline void table_add(ARCCore core, int32_t i, Py_hash_t hash) noexcept:
    """Give node i (its hash) a slot; table_reserve made room."""
    cdef uint32_t h = fold(hash)
    cdef size_t s = first_slot(core.table, core.table_bits, h, EMPTY)
    core.table[s].idx = i
    core.table[s].h32 = h
    core.table_used += 1
    core.epoch += 1


cdef void table_del(ARCCore core, int32_t i) noexcept:
    """Drop node i's slot, shifting its probe run back (no tombstones)."""
    cdef size_t mask = (<size_t>1 << core.table_bits) - 1
    cdef size_t s = first_slot(core.table, core.table_bits, fold(core.nodes[i].hash), i)
    cdef size_t j, home
    j = s
    while True:
        j = probe_next(j, mask)
        if core.table[j].idx == EMPTY:
            break
        home = probe_start(core.table[j].h32, core.table_bits)
        # Move slot j into the hole at s unless its home lies in (s, j].
        if ((j - home) & mask) >= ((j - s) & mask):
            core.table[s] = core.table[j]
            s = j
    core.table[s].idx = EMPTY
    core.table_used -= 1
    core.epoch += 1
