# The core's node store: one node per key the policy knows (in t1, t2, b1
# or b2), in a growable array with a free list, and the four lists, doubly
# linked through node indices. Moving an entry between lists relinks nodes;
# it never touches the key table (table.pxd), which maps a key's hash to
# its node.
#
# Invariant: each list runs head -> tail by next (tail -> head by prev),
# its nodes say `where` it is and size[w] counts them; every node below
# `used` is in one list or in the free list (where == FREE); only a node
# in a list owns a key (t1 and t2's own a chunk too). `version[w]` moves
# on every change to list w (iterators check it); `epoch` on every change
# to a node or the array (a probe that ran __eq__ checks it); `stamps`
# counts the moves to a list's MRU end (ARC+'s recency order).
# Only the functions here write a node or the store: a node's record (key,
# hash, chunk) through node_fill, node_set_key and node_take_chunk, its
# links through the list functions; nodes_check asserts the invariant.

from cpython.object cimport PyObject
from cpython.ref cimport Py_XINCREF, Py_XDECREF
from cpython.mem cimport PyMem_Realloc, PyMem_Free
from libc.stdint cimport int32_t, uint8_t, uint16_t, uint32_t, uint64_t

from .capi cimport arc_prefetch, gc_visitproc


cdef enum:
    T1 = 0
    T2 = 1
    B1 = 2
    B2 = 3
    FREE = 4
    EMPTY = -1


ctypedef struct Node:
    PyObject *key       # owned
    PyObject *chunk     # owned; NULL for ghosts and free nodes
    Py_hash_t hash      # the key's hash: the table never rehashes keys
    int32_t prev        # list links, or the free-list link in next
    int32_t next
    uint8_t where       # T1, T2, B1, B2 or FREE
    # When the entry was last put at a list's MRU end (a 56-bit count of
    # such moves): ARC+'s recency order. In the padding.
    uint8_t stamp_hi
    uint16_t stamp_mid
    uint32_t stamp_lo

ctypedef struct NodeStore:
    Node *nodes
    int32_t cap
    int32_t used            # high-water mark; below it, live or free
    int32_t free_head
    uint64_t stamps         # entries put in a list so far (Node.stamp_*)
    uint64_t epoch          # bumped on every change to a node or the array
    # The lists t1, t2, b1, b2 (indexed by T1..B2).
    int32_t head[4]
    int32_t tail[4]
    Py_ssize_t size[4]
    uint64_t version[4]     # bumped on every change to a list

ctypedef struct Walk:
    # A forward-only walk over one list, C state on its caller's stack. It
    # keeps a lookahead, `ahead`, whose memory its caller asks for.
    int32_t pos         # the next node, or EMPTY
    int32_t ahead       # a node past pos, or EMPTY


# --- stamps ---------------------------------------------------------------

cdef inline uint64_t stamp_of(const Node *node) noexcept nogil:
    return ((<uint64_t>node.stamp_hi << 48) | (<uint64_t>node.stamp_mid << 32)
            | node.stamp_lo)


cdef inline void set_stamp(Node *node, uint64_t stamp) noexcept nogil:
    node.stamp_hi = <uint8_t>(stamp >> 48)
    node.stamp_mid = <uint16_t>(stamp >> 32)
    node.stamp_lo = <uint32_t>stamp


# --- the array ------------------------------------------------------------

cdef inline void nodes_reset(NodeStore *s) noexcept nogil:
    """No nodes and empty lists (the array, if any, is the caller's to
    release: nodes_release)."""
    cdef int w
    s.nodes = NULL
    s.cap = 0
    s.used = 0
    s.free_head = EMPTY
    s.epoch += 1
    for w in range(4):
        s.head[w] = EMPTY
        s.tail[w] = EMPTY
        s.size[w] = 0
        s.version[w] += 1


cdef inline void nodes_release(const NodeStore *old) noexcept:
    """Release a detached store (a copy of one that nodes_reset emptied,
    or one that is going away): its lists' references, t1, t2, b1 then b2,
    each from its LRU end, a key then its chunk; then the array. Python
    code run meanwhile cannot reach the array: no other store holds it."""
    cdef int w
    cdef int32_t i
    cdef Node *node
    if old.nodes is NULL:  # none allocated (or __cinit__ failed before any)
        return
    for w in range(4):
        i = old.head[w]
        while i != EMPTY:
            node = &old.nodes[i]
            i = node.next
            Py_XDECREF(node.key)
            Py_XDECREF(node.chunk)
    PyMem_Free(old.nodes)


cdef inline int nodes_reserve(NodeStore *s, Py_ssize_t n, Py_ssize_t limit) except -1:
    """Room for n node_new() calls that cannot fail: the array grows, up to
    limit nodes (else MemoryError), so that n nodes past `used` exist."""
    cdef Py_ssize_t cap
    cdef Node *grown
    if s.used + n <= s.cap:
        return 0
    if s.used + n > limit:
        raise MemoryError()
    cap = min(max(64, 2 * <Py_ssize_t>s.cap, s.used + n), limit)
    grown = <Node *>PyMem_Realloc(s.nodes, cap * sizeof(Node))
    if grown is NULL:
        raise MemoryError()
    s.nodes = grown
    s.cap = <int32_t>cap
    s.epoch += 1
    return 0


cdef inline int32_t node_new(NodeStore *s, Py_ssize_t limit) except -1:
    """A free node's index (its fields are the caller's to set); the array
    grows, up to limit nodes, when none is free."""
    cdef int32_t i = s.free_head
    if i != EMPTY:
        s.free_head = s.nodes[i].next
        return i
    nodes_reserve(s, 1, limit)
    i = s.used
    s.used += 1
    return i


cdef inline PyObject *node_set_key(NodeStore *s, int32_t i, PyObject *key) noexcept:
    """Node i's key becomes key (a new reference to it is taken); the old
    key is returned, owned: the caller's to release."""
    cdef Node *node = &s.nodes[i]
    cdef PyObject *old = node.key
    Py_XINCREF(key)
    node.key = key
    s.epoch += 1
    return old


cdef inline void node_fill(NodeStore *s, int32_t i, PyObject *key, PyObject *chunk,
                           Py_hash_t hash) noexcept:
    """Node i (new, or a ghost out of its list whose old key the caller
    took) records key, its hash and chunk (NULL for a ghost), taking a new
    reference to each; the caller links it into a list next."""
    cdef Node *node = &s.nodes[i]
    Py_XINCREF(key)
    Py_XINCREF(chunk)
    node.key = key
    node.chunk = chunk
    node.hash = hash
    s.epoch += 1


cdef inline PyObject *node_take_chunk(NodeStore *s, int32_t i) noexcept nogil:
    """Node i's chunk, owned, is the caller's now: the node holds none (a
    ghost's, once it is moved to b1 or b2)."""
    cdef PyObject *chunk = s.nodes[i].chunk
    s.nodes[i].chunk = NULL
    s.epoch += 1
    return chunk


cdef inline void node_free(NodeStore *s, int32_t i) noexcept nogil:
    """Node i (out of its list; its references taken) goes to the free list."""
    cdef Node *node = &s.nodes[i]
    node.key = NULL
    node.chunk = NULL
    node.where = FREE
    node.next = s.free_head
    s.free_head = i
    s.epoch += 1


# --- the lists ------------------------------------------------------------

cdef inline void list_link(NodeStore *s, int32_t i, uint8_t w) noexcept nogil:
    """Append node i at the MRU end of list w: an insertion (a new stamp)."""
    cdef Node *node = &s.nodes[i]
    cdef int32_t t = s.tail[w]
    node.where = w
    set_stamp(node, s.stamps)
    s.stamps += 1
    node.prev = t
    node.next = EMPTY
    if t == EMPTY:
        s.head[w] = i
    else:
        s.nodes[t].next = i
    s.tail[w] = i
    s.size[w] += 1
    s.version[w] += 1
    s.epoch += 1


cdef inline void list_unlink(NodeStore *s, int32_t i) noexcept nogil:
    """Take node i out of its list (its `where` stays until it is linked
    or freed)."""
    cdef Node *node = &s.nodes[i]
    cdef uint8_t w = node.where
    if node.prev == EMPTY:
        s.head[w] = node.next
    else:
        s.nodes[node.prev].next = node.next
    if node.next == EMPTY:
        s.tail[w] = node.prev
    else:
        s.nodes[node.next].prev = node.prev
    s.size[w] -= 1
    s.version[w] += 1
    s.epoch += 1


cdef inline void list_move(NodeStore *s, int32_t i, uint8_t w) noexcept nogil:
    """Node i goes to the MRU end of list w, as a new insertion there."""
    list_unlink(s, i)
    list_link(s, i, w)


cdef inline void list_to_end(NodeStore *s, int32_t i, uint8_t w) noexcept nogil:
    """OrderedDict.move_to_end: node i, in list w, goes to its MRU end;
    already there, nothing changes (iterators go on, the stamp stays)."""
    if s.tail[w] != i:
        list_move(s, i, w)


cdef inline void list_renew(NodeStore *s, int32_t i, uint8_t w) noexcept nogil:
    """ARC+'s move_to_end with a new stamp: node i, in list w, goes to its
    MRU end; already there, only its stamp changes (iterators go on)."""
    if s.tail[w] != i:
        list_move(s, i, w)
    else:
        set_stamp(&s.nodes[i], s.stamps)
        s.stamps += 1


# --- walks ----------------------------------------------------------------

cdef inline void walk_start(Walk *walk, const NodeStore *s, uint8_t w) noexcept nogil:
    """A walk of list w from its LRU end; its lookahead starts there."""
    walk.pos = s.head[w]
    walk.ahead = walk.pos


cdef inline const Node *walk_ahead(Walk *walk, const NodeStore *s) noexcept nogil:
    """The lookahead's node (walk.ahead is not EMPTY), its key asked for;
    the lookahead moves past it. The caller asks for what else it reads."""
    cdef const Node *node = &s.nodes[walk.ahead]
    arc_prefetch(node.key)
    walk.ahead = node.next
    return node


cdef inline int32_t walk_next(Walk *walk, const NodeStore *s) noexcept nogil:
    """The walk's next node (walk.pos, which is not EMPTY). The walk moves
    on before its caller can unlink or free the node."""
    cdef int32_t i = walk.pos
    walk.pos = s.nodes[i].next
    return i


# --- the check ------------------------------------------------------------

cdef inline Py_ssize_t nodes_check(const NodeStore *s) except -1:
    """Assert the invariant above (runs no user code); the number of nodes
    in the four lists."""
    cdef int w
    cdef int32_t i, prev
    cdef Py_ssize_t count, live = 0, free = 0
    cdef const Node *node
    for w in range(4):
        name = ("t1", "t2", "b1", "b2")[w]
        count = 0
        prev = EMPTY
        i = s.head[w]
        while i != EMPTY:
            assert 0 <= i < s.used, f"bad link {i} in {name}"
            node = &s.nodes[i]
            assert node.where == w, f"node {i} in {name} says {node.where}"
            assert node.prev == prev, f"node {i} has prev {node.prev}, not {prev}"
            assert node.key is not NULL, f"node {i} in {name} has no key"
            assert (node.chunk is not NULL) == (w <= T2), f"node {i} chunk"
            assert stamp_of(node) < s.stamps, f"node {i} has a stamp from the future"
            count += 1
            assert count <= s.used, f"cycle in {name}"
            prev = i
            i = node.next
        assert s.tail[w] == prev, f"{name} tail is wrong"
        assert count == s.size[w], f"{name} has {count}, size says {s.size[w]}"
        live += count
    i = s.free_head
    while i != EMPTY:
        assert 0 <= i < s.used, f"bad link {i} in the free list"
        assert s.nodes[i].where == FREE, f"node {i} in the free list says {s.nodes[i].where}"
        free += 1
        assert free <= s.used, "cycle in the free list"
        i = s.nodes[i].next
    assert live + free == s.used, "nodes leaked"
    return live


# --- the collector --------------------------------------------------------

cdef inline int nodes_traverse(const NodeStore *s, gc_visitproc visit,
                               void *arg) noexcept:
    """tp_traverse's visit of every reference the nodes own."""
    cdef int32_t i
    cdef int r
    for i in range(s.used):
        if s.nodes[i].where != FREE:
            r = visit(s.nodes[i].key, arg)
            if r:
                return r
            if s.nodes[i].chunk is not NULL:
                r = visit(s.nodes[i].chunk, arg)
                if r:
                    return r
    return 0
