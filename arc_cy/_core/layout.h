/* Everything the compiled ARC core knows about CPython's object layout
 * beyond its documented C API. Nothing else in arc.pyx reads an object
 * by offset.
 *
 * 1. ctypes instances (ChunkStatus) are CDataObjects. Their first fields,
 *    unchanged from CPython 3.8 to 3.13 (Modules/_ctypes/ctypes.h), are:
 *
 *        PyObject_HEAD
 *        char *b_ptr;          the instance's buffer (inline or on the heap)
 *        int b_needsfree;
 *        CDataObject *b_base;
 *        Py_ssize_t b_size;    the buffer's size in bytes
 *
 *    Invariant relied on: b_ptr points to at least b_size readable bytes
 *    (ctypes.resize() updates both together). A chunk's type can change
 *    after insert() (__class__ assignment), so the offset of ref_cnt is
 *    looked up from the chunk's current type and checked against b_size on
 *    every read; b_size shares the header's cache line with b_ptr and
 *    ob_type. arc_check_layout() verifies the layout once, at import.
 *    ref_cnt may be unaligned (a packed structure): it is read with memcpy.
 *
 * 2. The chunk type whose offset is cached is held weakly. A weak
 *    reference's wr_object is the object, or Py_None once it is gone (set
 *    before the object's memory can be reused), so comparing a chunk's type
 *    with it tells whether the cached offset is that type's.
 *
 *    A type can change after its check (a class attribute set, a base's,
 *    its bases). CPython then sets its tp_version_tag to 0 (and its
 *    subclasses'), and a later lookup gives it a new tag, never one it gave
 *    before: the tag its own attribute cache is keyed on. So the cached
 *    offset is also keyed on the tag the type had when it was checked
 *    (never 0: a type without a tag is not cached, and is checked again at
 *    every read). Py_TPFLAGS_VALID_VERSION_TAG is not read: 3.13 no longer
 *    sets it, and a tag of 0 says the same. This is the one place the tag
 *    is read (arc.pyx checks at import that tags act so).
 *
 * 3. Lists handed to Python code never hold NULL items: arc_list_from
 *    fills a new list at once, with nothing that can run Python code (or a
 *    collection) between its allocation and its last item.
 *
 * 4. The garbage collector must see the keys and chunks held in C arrays:
 *    arc_set_gc_slots installs the core's own tp_traverse/tp_clear, which
 *    call the ones Cython generated (returned through *base_*).
 */
#ifndef ARC_LAYOUT_H
#define ARC_LAYOUT_H

#include <Python.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    char *b_ptr;
    int b_needsfree;
    PyObject *b_base;
    Py_ssize_t b_size;
} arc_cdata;

/* The object a weak reference refers to, or Py_None once it is gone. */
static inline PyObject *arc_weak_target(PyObject *ref)
{
    return ((PyWeakReference *)ref)->wr_object;
}

/* ref_cnt of chunk, if it is of the type type_ref (a weak reference) refers
 * to, that type's version tag is still tag, and its ref_cnt is at byte
 * offset off. Returns 0 and stores it in *out, or -1 (no exception set)
 * when chunk is not of that type (or that type is gone, or changed since
 * its check) or its buffer is too small: the caller checks the type again
 * (the slow path). */
static inline int arc_ref_cnt(PyObject *chunk, PyObject *type_ref,
                              unsigned int tag, Py_ssize_t off, int32_t *out)
{
    const arc_cdata *c = (const arc_cdata *)chunk;
    PyTypeObject *tp = Py_TYPE(chunk);
    if ((PyObject *)tp != arc_weak_target(type_ref)
            || tp->tp_version_tag != tag
            || off > c->b_size - (Py_ssize_t)sizeof(int32_t))
        return -1;
    memcpy(out, c->b_ptr + off, sizeof(int32_t));
    return 0;
}

/* ref_cnt of chunk at byte offset off, if chunk is of type tp (just
 * checked) and its buffer holds it: 0, or -1 (no exception set). */
static inline int arc_ref_cnt_as(PyObject *chunk, PyObject *tp,
                                 Py_ssize_t off, int32_t *out)
{
    const arc_cdata *c = (const arc_cdata *)chunk;
    if ((PyObject *)Py_TYPE(chunk) != tp
            || off > c->b_size - (Py_ssize_t)sizeof(int32_t))
        return -1;
    memcpy(out, c->b_ptr + off, sizeof(int32_t));
    return 0;
}

/* The version tag of type tp now (0: none). */
static inline unsigned int arc_type_tag(PyObject *tp)
{
    return ((PyTypeObject *)tp)->tp_version_tag;
}

/* The version tag of type tp, given one first if it has none: by CPython's
 * own lookup of a name (a str) that no type defines, which assigns tags and
 * runs no Python code on a type's own (str-keyed) dict. 0: CPython gives it
 * none (it ran out of tags). */
static inline unsigned int arc_type_tag_given(PyObject *tp, PyObject *name)
{
    if (((PyTypeObject *)tp)->tp_version_tag == 0)
        (void)_PyType_Lookup((PyTypeObject *)tp, name);
    return ((PyTypeObject *)tp)->tp_version_tag;
}

/* The buffer size of a ctypes instance (what ctypes.sizeof(chunk) says). */
static inline Py_ssize_t arc_cdata_size(PyObject *chunk)
{
    return ((const arc_cdata *)chunk)->b_size;
}

/* Checks the layout above against ctypes itself, given an instance and the
 * values ctypes.addressof() and ctypes.sizeof() report for it. */
static inline int arc_check_layout(PyObject *inst, size_t address,
                                   Py_ssize_t size)
{
    const arc_cdata *c = (const arc_cdata *)inst;
    return (size_t)c->b_ptr == address && c->b_size == size;
}

/* New references to the n objects at src, stored at dst. */
static inline void arc_copy_refs(PyObject **dst, PyObject **src, Py_ssize_t n)
{
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_INCREF(src[k]);
        dst[k] = src[k];
    }
}

/* A new (a, b) tuple, or NULL with an exception set. */
static inline PyObject *arc_pair(PyObject *a, PyObject *b)
{
    PyObject *t = PyTuple_New(2);
    if (t == NULL)
        return NULL;
    Py_INCREF(a);
    PyTuple_SET_ITEM(t, 0, a);
    Py_INCREF(b);
    PyTuple_SET_ITEM(t, 1, b);
    return t;
}

/* A new list of the n owned references at items, moved into it (items[k]
 * become NULL), or NULL with an exception set (items untouched). A
 * collection can start only inside PyList_New, before the list exists. */
static inline PyObject *arc_list_from(PyObject **items, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyList_SET_ITEM(list, k, items[k]);
        items[k] = NULL;
    }
    return list;
}

static inline void arc_set_gc_slots(PyTypeObject *tp, traverseproc traverse,
                                    inquiry clear, traverseproc *base_traverse,
                                    inquiry *base_clear)
{
    *base_traverse = tp->tp_traverse;
    *base_clear = tp->tp_clear;
    tp->tp_traverse = traverse;
    tp->tp_clear = clear;
}

#if defined(__GNUC__) || defined(__clang__)
#define arc_prefetch(p) __builtin_prefetch((const void *)(p))
#else
#define arc_prefetch(p) ((void)(p))
#endif

#endif /* ARC_LAYOUT_H */
