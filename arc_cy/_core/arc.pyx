# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: auto_pickle=False, binding=False
"""Compiled ARC core: the decisions of its twin (arc_cy/_twin/arc.py), on C-level lists.

Layout: the core holds three parts, each a C struct with the functions
that own it, in a .pxd of its own: the node store (nodes.pxd: every key
the policy knows, in t1, t2, b1 or b2, has one node in a growable array;
the four lists are doubly linked through node indices), the key table
(table.pxd: open addressing, a key's hash to its node) and the working
storage (work.pxd). Moving an entry between lists relinks two nodes and
never touches the table. ARCCore holds the parts, the policy's values and
busy; what reaches two parts (a walk that forgets, a lookup) is its own.

The rules of docs/hardening.md, as they apply here:

Busy: every call sets busy before its first user code (a key's __hash__ or
__eq__, protected.__contains__, a target's arithmetic, n.__index__, the
caller's iterable, a collection and its gc.callbacks), with nothing between
it and the try that clears it, and clears it after its last (get()'s truth
test of the chunk included); while it is set, mutators are refused, in
any thread. Reads nest, and take busy only when it is free: a read in
another thread can outlive the call whose busy it found, so every probe
checks `epoch` after each __eq__ and starts again if the storage changed,
as CPython's dict does. Outside busy (a view's iterator) no pointer into
the storage is held across anything that can allocate: what is needed is
read into owned references first, and the list's version is checked again
on the next step.

Surface: nothing internal is a Python object. The list walks (evict()'s
cursors) are C structs; a view's iterator is made from a live core by its
constructor, and nothing can re-state it (no pickling: auto_pickle is
off). Neither class is cleared to None by the garbage collector
(no_gc_clear): the core's own clear only drops its entries (_core_clear).

Working storage: what a call holds while Python code may run is never a
Python object that such code could reach and resize. Node indices live in
`work.scratch`; references (the caller's keys, copied on entry; the key objects
a call replaces or forgets; the chunks it drops; the pairs evict() returns)
live in `work.refs`, a C array that owns them and that tp_traverse visits. They
are released when the call returns, after busy is cleared, so a __del__
that calls back finds a consistent policy (and an empty `work`). clear()
and __init__ called again detach the whole node store (_detach_all) and
release it once busy is cleared, as the collector's clear does at once:
every list is empty before anything is let go of. A list is handed to
Python only when nothing can run between its allocation and its last item
(arc_list_from).
"""

cimport cython
from cpython.object cimport Py_EQ, PyObject, PyTypeObject
from cpython.type cimport PyType_IsSubtype
from cpython.ref cimport Py_XDECREF
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.bytes cimport (
    PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE,
)
from libc.stdint cimport int32_t, uint8_t, uint64_t

from arc_cy._core.capi cimport (
    PY_SSIZE_T_MAX,
    ARC_CY_CYTHON_VERSION,
    PyAnySet_CheckExact,
    PyList_CheckExact,
    PySequence_Fast_ITEMS,
    PyTuple_CheckExact,
    PyObject_GenericSetAttr,
    PyObject_Hash,
    PyObject_RichCompareBool,
    PySequence_Contains,
    PySet_Contains,
    arc_cdata_size,
    arc_check_layout,
    arc_decimal,
    arc_list_from,
    arc_pair,
    arc_prefetch,
    arc_ref_cnt,
    arc_ref_cnt_as,
    arc_set_gc_slots,
    arc_siphash24,
    arc_type_tag,
    arc_type_tag_given,
    arc_weak_target,
    gc_inquiry,
    gc_traverseproc,
    gc_visitproc,
)
from arc_cy._core.nodes cimport (
    B1,
    B2,
    EMPTY,
    T1,
    T2,
    Node,
    NodeStore,
    Walk,
    list_link,
    list_move,
    list_renew,
    list_to_end,
    list_unlink,
    node_fill,
    node_free,
    node_new,
    node_set_key,
    node_take_chunk,
    nodes_check,
    nodes_release,
    nodes_reserve,
    nodes_reset,
    nodes_traverse,
    stamp_of,
    walk_ahead,
    walk_next,
    walk_start,
)
from arc_cy._core.table cimport (
    Table,
    table_add,
    table_ask,
    table_check,
    table_del,
    table_empty,
    table_find,
    table_free,
    table_init,
    table_reserve,
    table_reserve_n,
)
from arc_cy._core.work cimport (
    Work,
    work_free,
    work_hold,
    work_hold_keys,
    work_release,
    work_reserve,
    work_scratch,
    work_traverse,
)

from arc_cy._vllm import CachePolicy, order_request_keys
from arc_cy._core.arguments import (
    MAX_ENTRIES,
    MISSING,
    check_capacity,
    check_evict_n,
    check_max_entries,
    check_target,
    missing_arguments,
)
from arc_cy._core.chunks import chunk_entry, dead_ref
from arc_cy._policy import PLUS_DOC, POLICY_DOC
from arc_cy._guard import vllm_guard
from arc_cy._messages import (
    MSG_CHUNK_SIZE,
    MSG_DUPLICATE,
    MSG_FULL,
    MSG_MUTATED,
    MSG_NO_ACCESSOR,
    MSG_NO_COPY,
    MSG_ARC_NO_FATES,
    MSG_PLUS_NO_TARGET,
    MSG_REENTRANT,
)
from arc_cy._core.views import LIST_NAMES, ListView
from arc_cy._record import record_for

# A required argument's default: its absence raises Python's own TypeError.
cdef object NO_ARG = MISSING
# A name no type defines: its lookup gives a type a version tag (layout.h).
cdef str _NO_NAME = "_arc_cy_no_such_attribute"
# Whether version tags act as layout.h says (checked at import, below);
# where they do not, every read checks its chunk's type again: slow, and
# still right.
cdef bint _tags_act = False
# The node store grows up to this many nodes.
cdef Py_ssize_t MAX_NODES = MAX_ENTRIES
# ARCPlusCachePolicy, once defined: a core of it (or of a subclass) is ARC+.
cdef object _PLUS_TYPE = None


cdef enum:
    # How far ahead of a list walk the memory it will touch is requested.
    PREFETCH_AHEAD = 8

# The methods that can be running when user code calls back in: busy holds
# the running one's index here, 0 when none runs. The OP_* are derived from
# this one table.
cdef tuple OP_NAMES = (
    None, "get", "insert", "remove", "touch", "on_store_miss",
    "on_request_finished", "evict", "clear", "target_t1_size",
    "_check_invariants", "__init__", "_max_entries",
)
cdef int OP_GET = OP_NAMES.index("get")
cdef int OP_INSERT = OP_NAMES.index("insert")
cdef int OP_REMOVE = OP_NAMES.index("remove")
cdef int OP_TOUCH = OP_NAMES.index("touch")
cdef int OP_STORE_MISS = OP_NAMES.index("on_store_miss")
cdef int OP_FINISHED = OP_NAMES.index("on_request_finished")
cdef int OP_EVICT = OP_NAMES.index("evict")
cdef int OP_CLEAR = OP_NAMES.index("clear")
cdef int OP_TARGET = OP_NAMES.index("target_t1_size")
cdef int OP_CHECK = OP_NAMES.index("_check_invariants")
cdef int OP_INIT = OP_NAMES.index("__init__")
cdef int OP_LIMIT = OP_NAMES.index("_max_entries")

cdef enum:
    INSERTED_ONLY = 1
    REUSED = 2
    # ARC+'s on_request_finished: a key the call met nearer the tail (the
    # request's keys may repeat), in its `found`.
    SEEN = -3

# ARC+'s ghost fates (ARCCore.fates): a ghost asked for again, or trimmed.
cdef enum:
    RETURNED_B1 = 0
    FORGOTTEN_B1 = 1
    RETURNED_B2 = 2
    FORGOTTEN_B2 = 3

# What a call tells the recorder once it returned (ARCCore._note).
cdef enum:
    NOTE_ACCESS = 0
    NOTE_MISS = 1
    NOTE_FINISHED = 2
    NOTE_CLEARED = 3
    NOTE_PINNED = 4

# Sets of lists, as bit masks of (1 << where), for table_find.
cdef enum:
    IN_T = (1 << T1) | (1 << T2)
    IN_B = (1 << B1) | (1 << B2)
    IN_ANY = IN_T | IN_B


# What a walk asks for ahead of it: what the scan reads of an entry, or what
# forgetting one touches. Always a constant where a walk starts or steps: the
# C compiler drops the other branch.
cdef enum:
    SCAN = 0
    FORGET = 1


cdef inline int _check_which(int which) except -1:
    if not 0 <= which < 4:
        raise IndexError(which)
    return 0


# Declared here, defined below: _ListIter, which ARCCore returns, holds one.
cdef class ARCCore


@cython.final
@cython.no_gc_clear
cdef class _ListIter:
    """(key, value) pairs of one list, LRU first; fails if the list changes.
    Made only whole, from a live core and a list number it checks (also when
    Python code calls it, or its __new__); nothing re-states it, and the
    collector does not clear it (its core would read as None): a cycle
    through it runs through its core, whose clear breaks it."""
    cdef:
        ARCCore core
        int32_t pos
        uint8_t which
        bint done
        uint64_t version

    def __cinit__(self, ARCCore core not None, int which):
        _check_which(which)
        self.core = core
        self.which = which
        self.pos = core.store.head[which]
        self.version = core.store.version[which]

    def __iter__(self):
        return self

    def __next__(self):
        cdef Node *node
        # Like OrderedDict's iterators: at the end, a change goes unnoticed.
        if self.done or self.pos == EMPTY:
            self.done = True
            raise StopIteration
        if self.core.store.version[self.which] != self.version:
            raise RuntimeError(MSG_MUTATED)
        node = &self.core.store.nodes[self.pos]
        self.pos = node.next
        # Owned references before the pair is made: making it may start a
        # collection whose callbacks change the policy (no busy is held).
        key = <object>node.key
        value = None if node.chunk is NULL else <object>node.chunk
        return (key, value)


@cython.no_gc_clear
cdef class ARCCore:
    cdef:
        # The parts, each with the functions that own it.
        NodeStore store         # the nodes and the lists t1, t2, b1, b2
        Table table             # a key's hash to its node
        Work work               # what the running call holds

        # The policy's values.
        Py_ssize_t capacity     # cache_capacity (check_capacity bounds it)
        object target           # int() of it is taken in evict(), as vLLM does
        Py_ssize_t max_entries  # t1 + t2 + b1 + b2 never exceed this
        bint plus               # ARC+ (arc_cy._policy.PLUS_DOC), its steps in _plus_*
        # ARC+: its ghosts' fates, indexed by RETURNED_B1 .. FORGOTTEN_B2
        # (0 in ARC). Cleared with the lists, kept by the collector's clear.
        uint64_t fates[4]

        # The running call.
        int busy                # OP_* of the running method, or 0

        # What reaches the policy, to ARC_CY_RECORD_TRACE (arc_cy._record),
        # or None: told after a call returns (_note); loads by their pins
        # only where vLLM shows no load whole (before 0.33: not by_access).
        object recorder
        bint note_pins

        # Caches and counters.
        object last_type_ref    # a weak reference to the chunk type last
        unsigned int last_tag   # seen, its version tag when checked (never
        Py_ssize_t last_off     # 0 while cached), and its ref_cnt offset
        Py_ssize_t visits       # entries examined by evict() scans

    # --- storage: the node store and the table together -------------------

    cdef inline void _detach_all(self, NodeStore *old) noexcept:
        """Forget every entry at once, and give grown memory back: the node
        store goes to old (its caller releases it, nodes_release), the
        table is emptied. It needs no allocation, so it cannot fail."""
        old[0] = self.store
        table_empty(&self.table)
        nodes_reset(&self.store)

    cdef void _empty(self) noexcept:
        """_detach_all, then the release (__cinit__, the collector's
        tp_clear): a __del__ that calls back finds an empty policy."""
        cdef NodeStore old
        self._detach_all(&old)
        nodes_release(&old)

    # --- walks: evict()'s scan and _trim ----------------------------------
    # The node store walks a list (nodes.pxd); what a walk asks for ahead
    # of it is the core's, since a walk that forgets touches the table too.

    cdef inline void _ask_ahead(self, Walk *walk, int what) noexcept:
        """Ask for what the walk will read of node walk.ahead, and move
        ahead to the next node: at 10^6 entries these are random accesses
        into memory far larger than the cache."""
        cdef const Node *node = walk_ahead(walk, &self.store)  # and its key
        if what == SCAN:
            # The ChunkStatus object: its header holds b_ptr; a small
            # struct's buffer sits inside the object, past the header.
            arc_prefetch(node.chunk)
            arc_prefetch(<char *>node.chunk + 64)
        else:
            # The table slot that table_del empties.
            table_ask(&self.table, node.hash)

    cdef inline void _walk_start(self, Walk *walk, uint8_t w, int what) noexcept:
        """A walk of list w from its LRU end, PREFETCH_AHEAD nodes asked for."""
        cdef int count = PREFETCH_AHEAD
        walk_start(walk, &self.store, w)
        while count > 0 and walk.ahead != EMPTY:
            self._ask_ahead(walk, what)
            count -= 1

    cdef inline int32_t _walk_step(self, Walk *walk, int what) noexcept:
        """The walk's next node (walk.pos, which is not EMPTY), one more
        node's memory asked for."""
        if walk.ahead != EMPTY:
            self._ask_ahead(walk, what)
        return walk_next(walk, &self.store)

    # What a call forgets goes to work, to be released when it returns.

    cdef void _trim(self, uint8_t w, Py_ssize_t drop) noexcept:
        """Forget the drop oldest ghosts of w; their keys go to work (room
        was reserved)."""
        cdef Walk walk
        cdef int32_t i
        self._walk_start(&walk, w, FORGET)
        while drop > 0:
            i = self._walk_step(&walk, FORGET)
            list_unlink(&self.store, i)
            table_del(&self.table, i, self.store.nodes[i].hash)
            work_hold(&self.work, self.store.nodes[i].key)
            node_free(&self.store, i)
            drop -= 1

    # --- busy ------------------------------------------------------------

    cdef inline int _enter(self, int op) except -1:
        """Take busy for mutator op: refused while any call runs. C code:
        nothing runs between it and the caller's try that clears it."""
        if self.busy:
            raise RuntimeError(MSG_REENTRANT.format(OP_NAMES[op], OP_NAMES[self.busy]))
        self.busy = op
        return 0

    cdef inline void _leave(self) noexcept:
        """End of a call: not busy, then what it held is released."""
        self.busy = 0
        if self.work.used:
            work_release(&self.work)

    cdef inline bint _read_begin(self) noexcept:
        """A read takes busy where a mutator would (free), else it nests;
        it gives busy back only if it took it."""
        if self.busy:
            return False
        self.busy = OP_GET
        return True

    # --- the policy's helpers --------------------------------------------

    cdef inline Py_ssize_t _ref_off(self, object tp) except -1:
        """Offset of ref_cnt in chunk type tp as it is now (TypeError if it
        has none): cached while tp's version tag is the one it was checked
        with (docs/hardening.md, rule 7)."""
        cdef unsigned int tag
        if (<PyObject *>tp is arc_weak_target(<PyObject *>self.last_type_ref)
                and arc_type_tag(<PyObject *>tp) == self.last_tag):
            return self.last_off
        # The tag is read before the check: a change while it runs is seen
        # at the next read.
        tag = arc_type_tag_given(<PyObject *>tp, <PyObject *>_NO_NAME) if _tags_act else 0
        entry = chunk_entry(tp, tag)  # (weak ref, offset)
        if tag:  # held weakly: a type made at run time is not kept alive
            self.last_type_ref = entry[0]
            self.last_tag = tag
        else:  # no tag: checked again at every read
            self.last_type_ref = dead_ref()
            self.last_tag = 0
        self.last_off = entry[1]
        return self.last_off

    cdef int _ref_cnt_slow(self, PyObject *chunk, int32_t *out) except -1:
        tp = type(<object>chunk)
        cdef Py_ssize_t off = self._ref_off(tp)
        # The check ran Python code: chunk must still be of the type checked.
        if arc_ref_cnt_as(chunk, <PyObject *>tp, off, out) == 0:
            return 0
        raise TypeError(MSG_CHUNK_SIZE.format(
            type(<object>chunk).__qualname__, arc_cdata_size(chunk), off))

    cdef inline int _ref_cnt(self, PyObject *chunk, int32_t *out) except -1:
        """chunk.ref_cnt, read through the chunk's current type (it may have
        changed since insert(), or been changed itself) and within its
        buffer."""
        if arc_ref_cnt(chunk, <PyObject *>self.last_type_ref, self.last_tag,
                       self.last_off, out) == 0:
            return 0
        return self._ref_cnt_slow(chunk, out)

    cdef Py_ssize_t _threshold(self) except? -1:
        """int(target_t1_size), clamped to Py_ssize_t."""
        cdef object whole = int(self.target)
        if whole > PY_SSIZE_T_MAX:
            return PY_SSIZE_T_MAX
        if whole < -PY_SSIZE_T_MAX:
            return -PY_SSIZE_T_MAX
        return whole

    cdef int _adapt(self, int32_t i) except -1:
        """A ghost hit: shift target_t1_size toward the list that was hit."""
        # Python arithmetic on purpose: target_t1_size keeps the exact value
        # and type (int or float) that vLLM's expressions would give it.
        cdef uint8_t w = self.store.nodes[i].where
        cdef double ratio
        cdef object delta, value, capacity
        if w == B1:
            ratio = self.store.size[B2] / <double>self.store.size[B1]
        else:
            ratio = self.store.size[B1] / <double>self.store.size[B2]
        # max(1, ratio): the int 1 unless ratio is larger
        if ratio > 1.0:
            delta = ratio
        else:
            delta = 1
        if w == B1:
            value = self.target + delta
            capacity = self.capacity
            if capacity < value:  # min(value, capacity)
                value = capacity
        else:
            value = self.target - delta
            if 0 > value:  # max(value, 0)
                value = 0
        self.target = value
        list_to_end(&self.store, i, w)
        return 0

    cdef int _resolve(self, Py_ssize_t n, int lists, int32_t *found) except -1:
        """Look the n keys in work up before anything changes, so that a
        failing lookup changes nothing: found[j] becomes the node of key j
        in lists, or EMPTY."""
        cdef Py_ssize_t j
        for j in range(n):
            key = <object>self.work.refs[j]
            found[j] = table_find(&self.table, &self.store, key, PyObject_Hash(key), lists)
        return 0

    cdef inline void _set_key(self, int32_t i, PyObject *key) noexcept:
        """Store the caller's key object in node i, as vLLM's dict
        assignments do; the old one goes to work (room was reserved)."""
        if self.store.nodes[i].key is not key:
            work_hold(&self.work, node_set_key(&self.store, i, key))

    cdef Py_ssize_t _resolve_unknown(self, Py_ssize_t n, int32_t *found, Py_hash_t *hashes,
                                     int32_t *slots, Py_ssize_t size) except -1:
        """ARC+'s lookups in on_request_finished, before anything changes,
        tail first, each key once (the request's keys may repeat): found[j]
        becomes the node of key j in any list, else EMPTY, its hash kept in
        hashes[j]; or SEEN where a key nearer the tail was the same node,
        or was in no list and equal to it. slots, a power of two of them,
        is the call's own set of the keys met (C memory: no code the keys
        run can reach it). Returns the number of EMPTYs."""
        cdef Py_ssize_t j, m = 0
        cdef size_t s, mask = <size_t>size - 1
        cdef int32_t k
        cdef int same
        cdef Py_hash_t h
        for s in range(<size_t>size):
            slots[s] = EMPTY
        for j in range(n - 1, -1, -1):
            key = <object>self.work.refs[j]
            h = PyObject_Hash(key)
            found[j] = table_find(&self.table, &self.store, key, h, IN_ANY)
            s = <size_t>h & mask
            while slots[s] != EMPTY:
                k = slots[s]
                if hashes[k] == h:
                    if found[j] != EMPTY:
                        same = found[k] == found[j]  # one node: one key
                    elif found[k] != EMPTY:
                        same = 0  # a key in a list is not one in none
                    else:
                        same = PyObject_RichCompareBool(
                            self.work.refs[k], self.work.refs[j], Py_EQ)
                        if same < 0:
                            return -1
                    if same:
                        found[j] = SEEN
                        break
                s = (s + 1) & mask
            if found[j] != SEEN:
                slots[s] = <int32_t>j
                hashes[j] = h
                m += found[j] == EMPTY
        return m

    cdef void _remember(self, PyObject *key, Py_hash_t h) noexcept:
        """ARC+: key, in no list, goes to b1's MRU end (room was reserved
        in the table and the node store)."""
        cdef int32_t i = node_new(&self.store, MAX_NODES)
        node_fill(&self.store, i, key, NULL, h)
        table_add(&self.table, i, h)
        list_link(&self.store, i, B1)

    cdef int _first_seen(self, object protected) except -1:
        """ARC+: whether protected (vLLM's manager protects the offer's
        keys) holds keys in no list, the keys being stored, and none in b1
        or b2: an offer of keys asked for the first time."""
        cdef int32_t i
        cdef bint new = False
        for key in protected:
            i = table_find(&self.table, &self.store, key, PyObject_Hash(key), IN_ANY)
            if i == EMPTY:
                new = True
            elif self.store.nodes[i].where >= B1:
                return 0
        return new

    cdef int32_t _next_victim(self, Walk *c, object protected, bint fast) except -2:
        """Next node of c's list with ref_cnt == 0 whose key is not
        protected, or EMPTY. evict() is busy: the nodes cannot move, nor
        their keys go, while protected runs."""
        cdef int32_t i
        cdef Node *node
        cdef int hit
        cdef int32_t ref_cnt
        while c.pos != EMPTY:
            i = self._walk_step(c, SCAN)
            node = &self.store.nodes[i]
            self.visits += 1
            self._ref_cnt(node.chunk, &ref_cnt)
            if ref_cnt == 0:
                if fast:
                    hit = PySet_Contains(<PyObject *>protected, node.key)
                else:
                    hit = PySequence_Contains(<PyObject *>protected, node.key)
                if not hit:
                    return i
        return EMPTY

    # --- ARC+'s steps (arc_cy._policy.PLUS_DOC) -------------------------
    # Each is called by the API method of its name, busy, after that
    # method's checks and (but for evict) its lookups. ARC+ orders t1 and
    # t2 by the stamps list_link gives: every move of a resident entry is
    # a list_move or a list_renew (a new stamp), never list_to_end, so that
    # each resident list is in stamp order and the least recent entry of
    # the two is the head with the smaller stamp.

    cdef inline void _forget_fates(self) noexcept:
        cdef int f
        for f in range(4):
            self.fates[f] = 0

    cdef inline void _plus_returned(self, int32_t i) noexcept:
        """Ghost i was asked for again: counted, and to its list's MRU end."""
        cdef uint8_t w = self.store.nodes[i].where
        self.fates[RETURNED_B1 if w == B1 else RETURNED_B2] += 1
        list_to_end(&self.store, i, w)

    cdef inline void _plus_trim(self, Py_ssize_t drop1, Py_ssize_t drop2) noexcept:
        """Forget the oldest ghosts of b1, then of b2 (room was reserved
        in work), counting them."""
        self._trim(B1, drop1)
        self._trim(B2, drop2)
        self.fates[FORGOTTEN_B1] += <uint64_t>drop1
        self.fates[FORGOTTEN_B2] += <uint64_t>drop2

    cdef double _plus_rate(self, int returned) noexcept:
        """returned / (returned + forgotten) of one ghost list, 0 before
        any fate (returned: RETURNED_B1 or RETURNED_B2, forgotten next)."""
        cdef uint64_t back = self.fates[returned], gone = self.fates[returned + 1]
        if back + gone == 0:
            return 0.0
        return <double>back / <double>(back + gone)

    cdef void _plus_store_miss(self, Py_ssize_t n, const int32_t *found) noexcept:
        """on_store_miss: each ghost found, tail first, returned."""
        cdef Py_ssize_t j
        for j in range(n - 1, -1, -1):
            if found[j] != EMPTY:
                self._plus_returned(found[j])

    cdef void _plus_touch(self, Py_ssize_t n, const int32_t *found,
                          const int32_t *ref_cnts) noexcept:
        """touch (vLLM 0.30 to 0.33), tail first: a ready t1 chunk to t2, a
        pending one to t1's MRU end (both under the caller's key object,
        as ARC's), a t2 chunk to t2's MRU end, a ghost returned."""
        cdef Py_ssize_t j
        cdef int32_t i
        cdef uint8_t w
        for j in range(n - 1, -1, -1):
            i = found[j]
            if i == EMPTY:
                continue
            w = self.store.nodes[i].where
            if w == T1:
                self._set_key(i, self.work.refs[j])
                list_move(&self.store, i, T1 if ref_cnts[j] < 0 else T2)
            elif w == T2:
                list_renew(&self.store, i, T2)
            else:
                self._plus_returned(i)

    cdef int _plus_finished(self, Py_ssize_t n, object insertion_only_keys,
                            object reused_keys) except -1:
        """on_request_finished of the n keys held in work, tail first, each
        key once: everything that can fail (the classification, the
        lookups, the reserves for the keys remembered, the key objects
        replaced and the ghosts then forgotten) before the first change."""
        cdef Py_ssize_t j, m, size = 1, asked_b1 = 0, drop1, drop2
        cdef int32_t *found
        cdef int32_t *kinds
        cdef Py_hash_t *hashes
        cdef int32_t i
        cdef uint8_t w
        # found, kinds, then (8-byte aligned: 2 * n int32s) hashes and
        # _resolve_unknown's slots.
        while size < 2 * n:
            size <<= 1
        found = work_scratch(&self.work, 4 * n + size)
        kinds = found + n
        hashes = <Py_hash_t *>(found + 2 * n)
        for j in range(n - 1, -1, -1):
            key = <object>self.work.refs[j]
            if key in insertion_only_keys:
                kinds[j] = INSERTED_ONLY
            elif key in reused_keys:
                kinds[j] = REUSED
            else:
                kinds[j] = 0
        m = self._resolve_unknown(n, found, hashes, found + 4 * n, size)
        for j in range(n):
            i = found[j]
            if i >= 0 and self.store.nodes[i].where == B1:
                asked_b1 += 1
        if m:
            if self.table.used + m > self.max_entries:
                raise MemoryError(MSG_FULL.format(self.max_entries))
            table_reserve_n(&self.table, m)
            nodes_reserve(&self.store, m, MAX_NODES)
        # b1 loses the ghosts asked for (to b2) and gains the keys remembered.
        drop1 = max(0, self.store.size[B1] - asked_b1 + m - self.capacity)
        drop2 = max(0, self.store.size[B2] + asked_b1 - self.capacity)
        # Room, past the n keys held, for every key object replaced (a t1
        # entry reused, a ghost moved: n at most) and every ghost forgotten.
        work_reserve(&self.work, n + drop1 + drop2)
        for j in range(n - 1, -1, -1):
            i = found[j]
            if i == SEEN:
                continue
            if i == EMPTY:  # asked for, and in no list: remembered
                self._remember(self.work.refs[j], hashes[j])
                continue
            w = self.store.nodes[i].where
            if w >= B1:  # a ghost asked for again and not kept: to b2
                self._set_key(i, self.work.refs[j])
                list_move(&self.store, i, B2)
            elif kinds[j] == INSERTED_ONLY:  # a store: recency only
                list_renew(&self.store, i, w)
            elif kinds[j] == REUSED and w == T1:  # popped from t1, stored in t2
                self._set_key(i, self.work.refs[j])
                list_move(&self.store, i, T2)
            elif kinds[j] == REUSED:  # refreshed
                list_renew(&self.store, i, T2)
        self._plus_trim(drop1, drop2)
        return 0

    cdef object _plus_evict(self, Py_ssize_t n, object protected):
        """evict(n > 0, protected): the n least recently requested victims
        of t1 and t2, or None; a first-seen offer refused where it takes a
        t2 victim while b1's ghosts come back less than b2's."""
        cdef Py_ssize_t want, k, n_t1 = 0, drop1, drop2
        cdef Py_ssize_t resident = self.store.size[T1] + self.store.size[T2]
        cdef int32_t *picked
        cdef int32_t i, v1, v2
        cdef Node *node
        cdef Walk c1, c2
        cdef bint fast, guarded
        guarded = (self._first_seen(protected)
                   and self._plus_rate(RETURNED_B1) < self._plus_rate(RETURNED_B2))
        # More than is resident: the scan ends at the step that finds no
        # victim, at the latest the one after every resident.
        want = n if n <= resident else resident + 1
        picked = work_scratch(&self.work, want)
        fast = PyAnySet_CheckExact(protected)
        self._walk_start(&c1, T1, SCAN)
        self._walk_start(&c2, T2, SCAN)
        v1 = self._next_victim(&c1, protected, fast)
        v2 = self._next_victim(&c2, protected, fast)
        for k in range(want):
            if v2 != EMPTY and (v1 == EMPTY or stamp_of(&self.store.nodes[v2])
                                < stamp_of(&self.store.nodes[v1])):
                if guarded:
                    return None  # a first-seen offer does not displace t2
                picked[k] = v2
                v2 = self._next_victim(&c2, protected, fast)
            elif v1 != EMPTY:
                picked[k] = v1
                n_t1 += 1
                v1 = self._next_victim(&c1, protected, fast)
            else:
                return None
        drop1 = max(0, self.store.size[B1] + n_t1 - self.capacity)
        drop2 = max(0, self.store.size[B2] + (want - n_t1) - self.capacity)
        # Everything is allocated before the first change (as ARC's evict).
        work_reserve(&self.work, want + drop1 + drop2)
        for k in range(want):
            node = &self.store.nodes[picked[k]]
            work_hold(&self.work, arc_pair(node.key, node.chunk))
        result = arc_list_from(self.work.refs, want)
        for k in range(want):
            i = picked[k]
            node = &self.store.nodes[i]
            list_move(&self.store, i, B1 if node.where == T1 else B2)
            Py_XDECREF(node_take_chunk(&self.store, i))  # the result holds it
        self._plus_trim(drop1, drop2)
        return result

    cdef void _note(self, int what, object keys, object reused, object req_context) noexcept:
        """Tell the recorder what returned: after the call, not busy. What
        fails there is the recorder's own (arc_cy._record): never the
        caller's, who got the call's result."""
        try:
            if what == NOTE_FINISHED:
                self.recorder.finished(keys, reused, req_context)
            elif what == NOTE_PINNED:  # Recorder.pinned, inline: a note a key loaded
                rec = self.recorder
                if rec.on:
                    seq = rec.seq + 1
                    rec.seq = seq
                    rec.pins[keys] = seq
            elif what == NOTE_CLEARED:
                self.recorder.cleared()
            elif req_context is self.recorder.placed:
                pass  # Recorder.arrive and missed have nothing to note
            elif what == NOTE_MISS:
                self.recorder.missed(req_context)
            else:
                self.recorder.arrive(keys, req_context)
        except Exception:
            pass

    # --- the API: making the policy --------------------------------------

    def __cinit__(self, *args, **kwargs):
        table_init(&self.table)
        nodes_reset(&self.store)
        self.target = 0.0
        self.last_type_ref = dead_ref()  # no chunk type seen yet
        self.last_tag = 0
        self.max_entries = MAX_ENTRIES
        # By its type, in C: no user code (an ABC's __instancecheck__) runs.
        self.plus = _PLUS_TYPE is not None and PyType_IsSubtype(type(self), <type>_PLUS_TYPE)

    def __dealloc__(self):
        work_free(&self.work)
        nodes_release(&self.store)
        table_free(&self.table)

    def __init__(self, cache_capacity=NO_ARG):
        if vllm_guard.plus_pending if self.plus else vllm_guard.pending:
            vllm_guard.check(self.plus)
        # Called again, it starts over as vLLM's __init__ does; _max_entries
        # (arc_cy's own) is reset too. What it drops (the entries, the old
        # target) is released once it is not busy (rule 6).
        cdef Py_ssize_t capacity
        cdef NodeStore old
        self._enter(OP_INIT)
        try:
            # Everything that can fail before the first change: a failed
            # __init__ changes nothing (rule 11). check_capacity bounds it, so
            # it is a C value: storing it cannot fail.
            capacity = check_capacity(cache_capacity)
            self.capacity = capacity
            self.max_entries = MAX_ENTRIES
            target, self.target = self.target, 0.0
            self._forget_fates()
            self._detach_all(&old)
        finally:
            self._leave()
        nodes_release(&old)
        target = None
        if self.recorder is None:  # one a policy, kept if called again
            try:
                self.recorder = record_for(self, self.capacity, keyed_ids)
                self.note_pins = self.recorder is not None and not self.recorder.by_access
            except Exception:  # out of memory to ask: made, not recording
                pass

    def __reduce__(self):
        twin = "plus.ARCPlusCachePolicy" if self.plus else "arc.ARCCachePolicy"
        raise TypeError(MSG_NO_COPY.format(type(self).__qualname__, twin))

    # Python's own errors for a property without a setter or deleter (a
    # Python class's), where Cython's would name ARCCore or say
    # NotImplementedError.
    def __setattr__(self, name, value):
        if name in _PROPERTIES and name not in _SETTABLE:
            raise AttributeError(MSG_NO_ACCESSOR.format(name, type(self).__name__, "setter"))
        PyObject_GenericSetAttr(self, name, <PyObject *>value)

    def __delattr__(self, name):
        if name in _PROPERTIES:
            raise AttributeError(MSG_NO_ACCESSOR.format(name, type(self).__name__, "deleter"))
        PyObject_GenericSetAttr(self, name, NULL)

    # --- the API: attributes ---------------------------------------------

    @property
    def cache_capacity(self):
        return self.capacity

    @property
    def target_t1_size(self):
        if self.plus:  # ARC's alone: ARC+ adapts no target
            raise AttributeError(MSG_PLUS_NO_TARGET)
        return self.target

    @target_t1_size.setter
    def target_t1_size(self, value):
        if self.plus:
            raise AttributeError(MSG_PLUS_NO_TARGET)
        self._enter(OP_TARGET)
        try:
            self.target = check_target(value)
        finally:
            self._leave()

    @property
    def t1(self):
        return ListView(self, T1)

    @property
    def t2(self):
        return ListView(self, T2)

    @property
    def b1(self):
        return ListView(self, B1)

    @property
    def b2(self):
        return ListView(self, B2)

    @property
    def _max_entries(self):
        """The most entries (t1, t2, b1 and b2 together) the policy holds."""
        return self.max_entries

    @_max_entries.setter
    def _max_entries(self, value):
        # For tests: a small limit is reached without allocating 2**29.
        self._enter(OP_LIMIT)
        try:
            self.max_entries = check_max_entries(value)  # runs value.__index__
        finally:
            self._leave()

    # ARC+'s alone: its ghosts' fates (arc_cy._policy.PLUS_DOC), read-only.

    cdef uint64_t _fate(self, int f) except? 0:
        if not self.plus:
            raise AttributeError(MSG_ARC_NO_FATES)
        return self.fates[f]

    @property
    def b1_returned(self):
        return self._fate(RETURNED_B1)

    @property
    def b1_forgotten(self):
        return self._fate(FORGOTTEN_B1)

    @property
    def b2_returned(self):
        return self._fate(RETURNED_B2)

    @property
    def b2_forgotten(self):
        return self._fate(FORGOTTEN_B2)

    @property
    def _scan_visits(self):
        """Entries examined by evict() scans since the policy was made."""
        return self.visits

    # --- the API: CachePolicy --------------------------------------------

    def get(self, key=NO_ARG):
        cdef int32_t i
        cdef bint took
        if key is NO_ARG:
            raise missing_arguments("get", key=key)
        took = self._read_begin()
        try:
            i = table_find(&self.table, &self.store, key, PyObject_Hash(key), IN_T)
            if i == EMPTY:
                return None
            chunk = <object>self.store.nodes[i].chunk
            # vLLM returns `t1.get(key) or t2.get(key)`: a falsy t1 chunk
            # gives None, a t2 chunk is returned untested. The truth test
            # is user code: under busy.
            if self.store.nodes[i].where == T1 and not chunk:
                return None
            return chunk
        finally:
            if took:
                self.busy = 0

    def insert(self, key=NO_ARG, chunk=NO_ARG, req_context=None):
        cdef Py_hash_t h
        cdef int32_t i
        cdef Node *node
        cdef uint8_t to = T1
        if key is NO_ARG or chunk is NO_ARG:
            raise missing_arguments("insert", key=key, chunk=chunk)
        self._enter(OP_INSERT)
        try:
            self._ref_off(type(chunk))
            h = PyObject_Hash(key)
            i = table_find(&self.table, &self.store, key, h, IN_ANY)
            if i == EMPTY:
                if self.table.used >= self.max_entries:
                    raise MemoryError(MSG_FULL.format(self.max_entries))
                table_reserve(&self.table)
                i = node_new(&self.store, MAX_NODES)
                table_add(&self.table, i, h)
            else:
                node = &self.store.nodes[i]
                if node.where <= T2:
                    raise ValueError(
                        MSG_DUPLICATE.format(key, LIST_NAMES[node.where]))
                # A ghost comes back: reuse its node, keep the new key object
                # (the old one is released when this call returns).
                work_reserve(&self.work, 1)
                list_unlink(&self.store, i)
                work_hold(&self.work, node.key)
                if self.plus:  # its second request: frequent (ARC+ step 1)
                    to = T2
            node_fill(&self.store, i, <PyObject *>key, <PyObject *>chunk, h)
            list_link(&self.store, i, to)
        finally:
            self._leave()

    def remove(self, key=NO_ARG):
        cdef int32_t i
        cdef Node *node
        if key is NO_ARG:
            raise missing_arguments("remove", key=key)
        self._enter(OP_REMOVE)
        try:
            i = table_find(&self.table, &self.store, key, PyObject_Hash(key), IN_T)
            if i != EMPTY:
                work_reserve(&self.work, 2)
                node = &self.store.nodes[i]
                list_unlink(&self.store, i)
                table_del(&self.table, i, node.hash)
                work_hold(&self.work, node.key)
                work_hold(&self.work, node.chunk)
                node_free(&self.store, i)
        finally:
            self._leave()

    def on_store_miss(self, keys=NO_ARG, req_context=NO_ARG):
        cdef Py_ssize_t j, n
        cdef int32_t *found
        cdef int32_t i
        if keys is NO_ARG or req_context is NO_ARG:
            raise missing_arguments("on_store_miss", keys=keys, req_context=req_context)
        self._enter(OP_STORE_MISS)
        try:
            n = work_hold_keys(&self.work, keys)
            found = work_scratch(&self.work, n)
            self._resolve(n, IN_B, found)
            if self.plus:
                self._plus_store_miss(n, found)
            else:
                for j in range(n - 1, -1, -1):
                    i = found[j]
                    if i != EMPTY:
                        self._adapt(i)
        finally:
            self._leave()
        if self.recorder is not None:
            self._note(NOTE_MISS, None, None, req_context)

    def touch(self, keys=NO_ARG, req_context=NO_ARG):
        cdef Py_ssize_t j, n
        cdef int32_t *found
        cdef int32_t *ref_cnts
        cdef int32_t i
        cdef Node *node
        if keys is NO_ARG or req_context is NO_ARG:
            raise missing_arguments("touch", keys=keys, req_context=req_context)
        self._enter(OP_TOUCH)
        try:
            n = work_hold_keys(&self.work, keys)
            work_reserve(&self.work, n)  # for the key objects replaced
            found = work_scratch(&self.work, 2 * n)
            ref_cnts = found + n
            self._resolve(n, IN_ANY, found)
            # Every t1 chunk's ref_cnt is read before anything changes: a
            # chunk that cannot be read fails here, and one whose class
            # changes while the call runs (a target's arithmetic) is moved
            # by what was read.
            for j in range(n):
                i = found[j]
                if i != EMPTY and self.store.nodes[i].where == T1:
                    self._ref_cnt(self.store.nodes[i].chunk, &ref_cnts[j])
            if self.plus:
                self._plus_touch(n, found, ref_cnts)
                return
            for j in range(n - 1, -1, -1):
                i = found[j]
                if i == EMPTY:
                    continue
                node = &self.store.nodes[i]
                if node.where == T1:
                    # vLLM pops the entry and stores it again under the
                    # caller's key object (a change, wherever it was).
                    self._set_key(i, self.work.refs[j])
                    if ref_cnts[j] < 0:
                        # still being stored: not a second access
                        list_move(&self.store, i, T1)
                    else:
                        list_move(&self.store, i, T2)
                elif node.where == T2:
                    list_to_end(&self.store, i, T2)
                else:
                    self._adapt(i)
        finally:
            self._leave()

    def on_request_access(self, keys=NO_ARG, req_context=NO_ARG):
        if keys is NO_ARG or req_context is NO_ARG:
            raise missing_arguments("on_request_access", keys=keys, req_context=req_context)
        if self.recorder is not None:
            self._note(NOTE_ACCESS, keys, None, req_context)

    def on_request_finished(self, key_groups=NO_ARG, insertion_only_keys=NO_ARG,
                            reused_keys=NO_ARG, req_context=NO_ARG):
        cdef Py_ssize_t j, n
        cdef int32_t *found
        cdef int32_t *kinds
        cdef int32_t i
        cdef uint8_t w
        if (key_groups is NO_ARG or insertion_only_keys is NO_ARG
                or reused_keys is NO_ARG or req_context is NO_ARG):
            raise missing_arguments(
                "on_request_finished", key_groups=key_groups,
                insertion_only_keys=insertion_only_keys, reused_keys=reused_keys,
                req_context=req_context)
        self._enter(OP_FINISHED)
        try:
            keys = order_request_keys(key_groups, req_context)
            n = work_hold_keys(&self.work, keys)
            work_reserve(&self.work, n)  # for the key objects replaced
            if self.plus:
                self._plus_finished(n, insertion_only_keys, reused_keys)
            else:
                found = work_scratch(&self.work, 2 * n)
                kinds = found + n
                # Classify (tail first, as vLLM asks), then look up only the
                # keys vLLM would look up; a failure in either changes nothing.
                for j in range(n - 1, -1, -1):
                    key = <object>self.work.refs[j]
                    if key in insertion_only_keys:
                        kinds[j] = INSERTED_ONLY
                    elif key in reused_keys:
                        kinds[j] = REUSED
                    else:
                        kinds[j] = 0
                for j in range(n - 1, -1, -1):
                    if kinds[j]:
                        key = <object>self.work.refs[j]
                        found[j] = table_find(&self.table, &self.store, key,
                                              PyObject_Hash(key), IN_T)
                    else:
                        found[j] = EMPTY
                for j in range(n - 1, -1, -1):
                    i = found[j]
                    if i == EMPTY:
                        continue
                    w = self.store.nodes[i].where
                    if kinds[j] == INSERTED_ONLY:
                        # A store is not a frequency hit: refresh recency only.
                        list_to_end(&self.store, i, w)
                    elif w == T1:  # REUSED: popped from t1, stored in t2
                        self._set_key(i, self.work.refs[j])
                        list_move(&self.store, i, T2)
                    else:
                        list_to_end(&self.store, i, T2)
        finally:
            self._leave()
        if self.recorder is not None:
            self._note(NOTE_FINISHED, keys, reused_keys, req_context)

    def evict(self, n=NO_ARG, protected=NO_ARG):
        cdef Py_ssize_t want, k, vt1, n_t1 = 0, drop1, drop2
        cdef Py_ssize_t resident = self.store.size[T1] + self.store.size[T2]
        cdef int32_t *picked
        cdef int32_t i
        cdef Node *node
        cdef Walk c1, c2
        cdef bint fast, exact
        cdef Py_ssize_t threshold = 0
        if n is NO_ARG or protected is NO_ARG:
            raise missing_arguments("evict", n=n, protected=protected)
        self._enter(OP_EVICT)
        try:
            n = check_evict_n(n)
            if n == 0:
                return []
            if self.plus:  # more than is resident: fails as the twin's does
                return self._plus_evict(n if n <= resident else resident + 1, protected)
            # More than is resident: the scan runs as vLLM's does (asking
            # protected, taking int(target)) and ends at the step that
            # finds no victim, at the latest the one after every resident.
            want = n if n <= resident else resident + 1
            picked = work_scratch(&self.work, want)
            fast = PyAnySet_CheckExact(protected)
            self._walk_start(&c1, T1, SCAN)
            self._walk_start(&c2, T2, SCAN)
            # Select without changing anything; t1's size is tracked
            # virtually. Both cursors only move forward (vLLM PR 50992).
            # vLLM takes int(target_t1_size) at every step: once is the same
            # for a float or an int, whose int() runs no user code.
            exact = type(self.target) is float or type(self.target) is int
            if exact:
                threshold = self._threshold()
            vt1 = self.store.size[T1]
            for k in range(want):
                if not exact:
                    threshold = self._threshold()
                if vt1 >= threshold:
                    i = self._next_victim(&c1, protected, fast)
                    if i != EMPTY:
                        picked[k] = i
                        vt1 -= 1
                        continue
                i = self._next_victim(&c2, protected, fast)
                if i != EMPTY:
                    picked[k] = i
                    continue
                # t2 has no victim left: fall back to t1 (vLLM PR 55461).
                i = self._next_victim(&c1, protected, fast)
                if i == EMPTY:
                    return None
                picked[k] = i
                vt1 -= 1
            n_t1 = self.store.size[T1] - vt1
            drop1 = max(0, self.store.size[B1] + n_t1 - self.capacity)
            drop2 = max(0, self.store.size[B2] + (want - n_t1) - self.capacity)

            # Everything is allocated before the first change, so that the
            # changes cannot fail halfway: room for the forgotten ghosts'
            # keys, the pairs (each may start a collection, which sees those
            # made so far in work), then the list, filled at once.
            work_reserve(&self.work, want + drop1 + drop2)
            for k in range(want):
                node = &self.store.nodes[picked[k]]
                work_hold(&self.work, arc_pair(node.key, node.chunk))
            result = arc_list_from(self.work.refs, want)

            for k in range(want):
                i = picked[k]
                node = &self.store.nodes[i]
                list_move(&self.store, i, B1 if node.where == T1 else B2)
                Py_XDECREF(node_take_chunk(&self.store, i))  # the result holds it
            self._trim(B1, drop1)
            self._trim(B2, drop2)
            return result
        finally:
            self._leave()

    def clear(self):
        # What it drops (the entries, the old target) is released once it is
        # not busy (rule 6).
        cdef NodeStore old
        self._enter(OP_CLEAR)
        try:
            self._detach_all(&old)
            target, self.target = self.target, 0.0
            self._forget_fates()
        finally:
            self._leave()
        nodes_release(&old)
        target = None
        if self.recorder is not None:
            self._note(NOTE_CLEARED, None, None, None)

    def mark_evictable(self, key=NO_ARG):
        if key is NO_ARG:
            raise missing_arguments("mark_evictable", key=key)
        return None

    def mark_non_evictable(self, key=NO_ARG):
        if key is NO_ARG:
            raise missing_arguments("mark_non_evictable", key=key)
        if self.note_pins:
            self._note(NOTE_PINNED, key, None, None)

    # --- views and checks ------------------------------------------------

    def _list_len(self, int which):
        _check_which(which)
        return self.store.size[which]

    cdef int32_t _in_list(self, int which, key) except -2:
        cdef int32_t i
        cdef bint took
        _check_which(which)
        took = self._read_begin()
        try:
            i = table_find(&self.table, &self.store, key, PyObject_Hash(key), 1 << which)
        finally:
            if took:
                self.busy = 0
        return i

    def _list_contains(self, int which, key):
        return self._in_list(which, key) != EMPTY

    def _list_getitem(self, int which, key):
        cdef int32_t i = self._in_list(which, key)
        if i == EMPTY:
            raise KeyError(key)
        if which <= T2:
            return <object>self.store.nodes[i].chunk
        return None

    def _list_iter(self, int which):
        return _ListIter(self, which)

    cdef int _check(self) except -1:
        # The node store's invariant, then what its nodes hold (user code:
        # each key's hash is the one recorded, each chunk's type passes
        # insert's check), ARC+'s order (t1 and t2 each in stamp order),
        # the ghost lists' bound, and the table's.
        cdef int w
        cdef int32_t i
        cdef uint64_t last
        cdef const NodeStore *store = &self.store
        cdef Py_ssize_t live = nodes_check(store)
        for w in range(4):
            i = store.head[w]
            last = 0
            while i != EMPTY:
                if w <= T2:
                    self._ref_off(type(<object>store.nodes[i].chunk))
                    if self.plus:
                        assert i == store.head[w] or stamp_of(&store.nodes[i]) > last, (
                            f"node {i} in {LIST_NAMES[w]}: out of its stamps' order")
                        last = stamp_of(&store.nodes[i])
                assert PyObject_Hash(<object>store.nodes[i].key) == store.nodes[i].hash, (
                    f"node {i} in {LIST_NAMES[w]}: its key's hash changed")
                i = store.nodes[i].next
        for w in (B1, B2):
            assert store.size[w] <= self.capacity, (
                f"{LIST_NAMES[w]} holds {store.size[w]} > cache_capacity {self.capacity}")
        table_check(&self.table, store, live)
        return 0

    def _check_invariants(self):
        """Raise AssertionError if the lists or the table are inconsistent."""
        assert self.busy == 0, f"{OP_NAMES[self.busy]}() did not finish"
        assert self.work.used == 0, "a finished call still holds references"
        # The check hashes and compares keys: user code, locked out of changes.
        self.busy = OP_CHECK
        try:
            self._check()
        finally:
            self.busy = 0


# --- the module's wiring, done before ARCCachePolicy subclasses ARCCore ---

# The keys and chunks live in C arrays, out of the garbage collector's
# sight; these slots show them to it, so a cycle through a key or a chunk
# (one that refers back to its policy) can be collected.
cdef gc_traverseproc _base_traverse
cdef gc_inquiry _base_clear  # NULL: ARCCore is no_gc_clear


cdef int _core_traverse(PyObject *o, gc_visitproc visit, void *arg) noexcept:
    cdef ARCCore core = <ARCCore>o
    cdef int r = _base_traverse(o, visit, arg)
    if r:
        return r
    r = work_traverse(&core.work, visit, arg)
    if r:
        return r
    return nodes_traverse(&core.store, visit, arg)


cdef int _core_clear(PyObject *o) noexcept:
    # Breaking a garbage cycle: drop every entry (no call is running), and
    # nothing else (no_gc_clear, docs/hardening.md rule 13): a finalizer
    # later in the same collection finds an empty, valid policy, and its
    # iterators refuse (the lists' versions moved).
    work_release(&(<ARCCore>o).work)
    (<ARCCore>o)._empty()
    return 0


arc_set_gc_slots(<PyTypeObject *>ARCCore, _core_traverse, _core_clear,
                 &_base_traverse, &_base_clear)

# The core's properties, and those of them with a setter.
cdef frozenset _PROPERTIES = frozenset(
    name for name, attr in ARCCore.__dict__.items()
    if type(attr) is type(ARCCore.cache_capacity))
cdef tuple _SETTABLE = ("target_t1_size", "_max_entries")


def _check_layout():
    import ctypes
    probe = (ctypes.c_char * 40)()
    if not arc_check_layout(probe, ctypes.addressof(probe), ctypes.sizeof(probe)):
        raise ImportError("arc_cy: ctypes' object layout is not the one "
                          "layout.h expects")


def _tags_act_so():
    """Whether version tags act as layout.h says: a type is given one, a
    change takes it away, and the next is another."""
    probe = type("Probe", (), {})
    cdef unsigned int first = arc_type_tag_given(<PyObject *>probe, <PyObject *>_NO_NAME)
    probe.changed = True
    if arc_type_tag(<PyObject *>probe) != 0:
        return False
    return 0 != first != arc_type_tag_given(<PyObject *>probe, <PyObject *>_NO_NAME) != 0


_check_layout()
_tags_act = _tags_act_so()


def keyed_ids(requests, uint64_t k0, uint64_t k1):
    """The recording's ids of each request's keys, for a list of lists or
    tuples of bytes: SipHash-2-4 of each key under (k0, k1), its top 63
    bits, as comma-separated decimals (ASCII bytes), one bytes a request.
    TypeError for anything else. The hashing runs without the GIL, once a
    batch (a release and a retake of the GIL the scheduler waits on), on
    tuples of the keys that nothing else can change (arc_cy._record.keyed_ids:
    the same in Python)."""
    cdef Py_ssize_t j, r, n = 0, at = 0, count
    cdef char *out
    cdef const char **data
    cdef Py_ssize_t *size
    cdef Py_ssize_t *ends
    cdef PyObject *key
    cdef tuple keys
    if not PyList_CheckExact(requests):
        raise TypeError(f"keyed_ids: a list of requests, not {type(requests).__name__}")
    cdef list held = list(requests)  # its own references: the keys stay alive
    count = len(held)
    for r in range(count):
        keys = held[r] = _keys_of(held[r], r)
        n += len(keys)
    out = <char *>PyMem_Malloc(21 * n + 1)
    data = <const char **>PyMem_Malloc(n * sizeof(char *) + 1)
    size = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t) + 1)
    ends = <Py_ssize_t *>PyMem_Malloc(count * sizeof(Py_ssize_t) + 1)
    try:
        if out is NULL or data is NULL or size is NULL or ends is NULL:
            raise MemoryError()
        n = 0
        for r in range(count):
            keys = held[r]
            for j in range(len(keys)):
                key = PySequence_Fast_ITEMS(keys)[j]
                data[n] = PyBytes_AS_STRING(<object>key)
                size[n] = PyBytes_GET_SIZE(<object>key)
                n += 1
            ends[r] = n
        with nogil:
            j = 0
            for r in range(count):
                while j < ends[r]:
                    at += arc_decimal(arc_siphash24(data[j], size[j], k0, k1) >> 1, out + at)
                    out[at] = 44  # ","
                    at += 1
                    j += 1
                ends[r] = at  # where request r's ids end, past a ","
        result = []
        at = 0
        for r in range(count):
            result.append(PyBytes_FromStringAndSize(out + at, max(ends[r] - at - 1, 0)))
            at = ends[r]
        return result
    finally:
        PyMem_Free(out)
        PyMem_Free(<void *>data)
        PyMem_Free(size)
        PyMem_Free(ends)


cdef tuple _keys_of(object keys, Py_ssize_t r):
    """Request r's keys as a tuple of its own, each checked to be bytes."""
    cdef Py_ssize_t j
    if not (PyList_CheckExact(keys) or PyTuple_CheckExact(keys)):
        raise TypeError(f"keyed_ids: request {r} is {type(keys).__name__}, not a list or tuple")
    cdef tuple held = tuple(keys)
    for j in range(len(held)):
        if not PyBytes_CheckExact(held[j]):
            raise TypeError(
                f"keyed_ids: request {r}'s item {j} is {type(held[j]).__name__}, not bytes")
    return held


# The Cython that generated this module (recorded by setup.py at build time).
CYTHON_VERSION = ARC_CY_CYTHON_VERSION.decode("ascii")

# Bytes of one entry's node in the core's node array (private: bench/evict.py
# reads it for the bytes its scan reads per entry).
_NODE_SIZE = sizeof(Node)


class ARCCachePolicy(ARCCore, CachePolicy):
    __doc__ = POLICY_DOC  # one text, both implementations' (arc_cy._policy)


class ARCPlusCachePolicy(ARCCore, CachePolicy):
    __doc__ = PLUS_DOC


_PLUS_TYPE = ARCPlusCachePolicy
