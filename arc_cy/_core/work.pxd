# The core's working storage: what the running call holds while Python
# code may run, in C arrays that no such code can reach or resize. `refs`
# owns references (the caller's keys, copied on entry; the key objects a
# call replaces or forgets; the chunks it drops; the pairs evict()
# returns), which the core's tp_traverse visits; `scratch` holds node
# indices.
#
# Invariant: refs[0:used] are owned (a NULL among them is skipped), and
# `used` is 0 between calls: the core releases them (work_release) when a
# call returns, after busy is cleared. A call reserves room before it holds
# anything (work_reserve), so that holding cannot fail.

from cpython.object cimport PyObject
from cpython.ref cimport Py_XDECREF
from cpython.mem cimport PyMem_Realloc, PyMem_Free
from libc.stdint cimport int32_t

from .capi cimport (
    PyList_CheckExact,
    PySequence_Fast_GET_SIZE,
    PySequence_Fast_ITEMS,
    PyTuple_CheckExact,
    arc_copy_refs,
    gc_visitproc,
)


cdef enum:
    # refs keeps its buffer between calls up to this many references
    # (an evict(1024) with as many ghosts forgotten needs 2048).
    WORK_KEPT = 4096

ctypedef struct Work:
    PyObject **refs     # references the running call holds (owned)
    Py_ssize_t used
    Py_ssize_t cap
    int32_t *scratch    # node indices of the running call
    Py_ssize_t scratch_cap


cdef inline int work_grow(Work *work, Py_ssize_t n) noexcept:
    """Room for n more references; -1 (no exception set) if there is no
    memory for it."""
    cdef Py_ssize_t need = work.used + n
    cdef Py_ssize_t cap = max(need, 2 * work.cap, 64)
    cdef PyObject **grown
    if need <= work.cap:
        return 0
    grown = <PyObject **>PyMem_Realloc(work.refs, cap * sizeof(PyObject *))
    if grown is NULL:
        return -1
    work.refs = grown
    work.cap = cap
    return 0


cdef inline int work_reserve(Work *work, Py_ssize_t n) except -1:
    """Room for n more references, or MemoryError."""
    if work.used + n > work.cap and work_grow(work, n) < 0:
        raise MemoryError()
    return 0


cdef inline void work_hold(Work *work, PyObject *ref) noexcept nogil:
    """Move an owned reference in (room was reserved)."""
    work.refs[work.used] = ref
    work.used += 1


cdef inline Py_ssize_t work_hold_keys(Work *work, object keys) except -1:
    """Copy the caller's keys in (at 0..n, work being empty between calls)
    and return n. A list or tuple is read as given: nothing runs between
    reading its items and copying them."""
    cdef Py_ssize_t n
    if not (PyList_CheckExact(keys) or PyTuple_CheckExact(keys)):
        keys = list(keys)  # as vLLM: always complete, unlike a tuple
    n = PySequence_Fast_GET_SIZE(keys)
    work_reserve(work, n)
    arc_copy_refs(work.refs + work.used, PySequence_Fast_ITEMS(keys), n)
    work.used += n
    return n


cdef inline void work_release(Work *work) noexcept:
    """Release the references held. A __del__ run meanwhile may call the
    policy again: it finds the work empty (and gets a buffer of its own)."""
    cdef PyObject **items = work.refs
    cdef Py_ssize_t k, n = work.used, cap = work.cap
    if n == 0:
        return
    work.refs = NULL
    work.used = 0
    work.cap = 0
    for k in range(n):
        Py_XDECREF(items[k])
    if work.refs is NULL and cap <= WORK_KEPT:
        work.refs = items
        work.cap = cap
    else:
        PyMem_Free(items)


cdef inline void work_free(Work *work) noexcept:
    """Release what is held, then the memory (the core's __dealloc__)."""
    work_release(work)
    PyMem_Free(work.refs)
    work.refs = NULL
    work.cap = 0
    PyMem_Free(work.scratch)
    work.scratch = NULL
    work.scratch_cap = 0


cdef inline int32_t *work_scratch(Work *work, Py_ssize_t n) except NULL:
    """Room for n node indices (kept between calls)."""
    cdef int32_t *grown
    if n > work.scratch_cap or work.scratch is NULL:
        n = max(n, 64)
        grown = <int32_t *>PyMem_Realloc(work.scratch, n * sizeof(int32_t))
        if grown is NULL:
            raise MemoryError()
        work.scratch = grown
        work.scratch_cap = n
    return work.scratch


cdef inline int work_traverse(const Work *work, gc_visitproc visit,
                              void *arg) noexcept:
    """tp_traverse's visit of every reference held."""
    cdef Py_ssize_t k
    cdef int r
    for k in range(work.used):
        if work.refs[k] is not NULL:
            r = visit(work.refs[k], arg)
            if r:
                return r
    return 0
