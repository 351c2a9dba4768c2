# What arc.pyx calls in C: CPython's API beyond Cython's own cpython.*
# declarations, layout.h, where every access that depends on CPython's
# object layout lives, with its invariants, and siphash.h (the recording's
# keyed hash).

from cpython.object cimport PyObject, PyTypeObject
from libc.stdint cimport int32_t, uint64_t


cdef extern from "Python.h":
    Py_hash_t PyObject_Hash(object) except -1
    int PyObject_RichCompareBool(PyObject*, PyObject*, int)
    int PyObject_GenericSetAttr(object, object, PyObject*) except -1
    int PySet_Contains(PyObject*, PyObject*) except -1
    int PySequence_Contains(PyObject*, PyObject*) except -1
    bint PyAnySet_CheckExact(object)
    bint PyList_CheckExact(object)
    bint PyTuple_CheckExact(object)
    Py_ssize_t PySequence_Fast_GET_SIZE(object)
    PyObject **PySequence_Fast_ITEMS(object)
    object PyWeakref_NewRef(object, object)
    Py_ssize_t PY_SSIZE_T_MAX

    # The garbage collector's slots (arc_set_gc_slots).
    ctypedef int (*gc_visitproc "visitproc")(PyObject *, void *) noexcept
    ctypedef int (*gc_traverseproc "traverseproc")(
        PyObject *, gc_visitproc, void *) noexcept
    ctypedef int (*gc_inquiry "inquiry")(PyObject *) noexcept


cdef extern from "layout.h":
    int arc_ref_cnt(PyObject *chunk, PyObject *type_ref, unsigned int tag,
                    Py_ssize_t off, int32_t *out) nogil
    int arc_ref_cnt_as(PyObject *chunk, PyObject *tp, Py_ssize_t off,
                       int32_t *out) nogil
    unsigned int arc_type_tag(PyObject *tp) nogil
    unsigned int arc_type_tag_given(PyObject *tp, PyObject *name)
    PyObject *arc_weak_target(PyObject *ref) nogil
    Py_ssize_t arc_cdata_size(PyObject *chunk) nogil
    bint arc_check_layout(object inst, size_t address, Py_ssize_t size)
    void arc_copy_refs(PyObject **dst, PyObject **src, Py_ssize_t n) nogil
    PyObject *arc_pair(PyObject *a, PyObject *b) except NULL
    list arc_list_from(PyObject **items, Py_ssize_t n)
    void arc_prefetch(const void *p) nogil
    void arc_set_gc_slots(PyTypeObject *tp, gc_traverseproc traverse,
                          gc_inquiry clear, gc_traverseproc *base_traverse,
                          gc_inquiry *base_clear)


cdef extern from "siphash.h":
    uint64_t arc_siphash24(const char *data, size_t len, uint64_t k0, uint64_t k1) nogil
    int arc_decimal(uint64_t v, char *out) nogil


# The Cython that generated the module, which setup.py defines at build time.
cdef extern from *:
    """
    #ifndef ARC_CY_CYTHON_VERSION
    #define ARC_CY_CYTHON_VERSION "unknown (not built by arc_cy's setup.py)"
    #endif
    """
    const char *ARC_CY_CYTHON_VERSION
