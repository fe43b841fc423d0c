/* The façade's common calls, straight from Python into a compiled kernel.
 *
 * An allocate+free pair through the Python API cost two Python methods and two
 * calls into Numba's CPython wrappers (tuple of arguments, unboxing, boxing):
 * about 0.6 us here, where the kernels' own work is about 0.15 us; through
 * this, about a third of that (docs/performance.md, "An allocate+free pair
 * through the API").
 *
 * A ``FastMethod`` is a class attribute standing for one of those methods
 * (``allocate_raw``, ``deallocate_raw``). Called with one plain ``int``, it
 * reads the instance's ``KernelEntry`` (an attribute the allocator sets when it
 * arms its fast paths) and calls the kernel's C entry, lock-free, as the Python
 * method would. An answer > 0 is the common one (an address, or a freed size):
 * it returns the address, or None for a free. Any other answer, 0 included (what
 * Numba's C wrapper answers if a kernel raised), goes to the class's Python
 * continuation (``after(self, value, answer)``), so that no kernel call is
 * repeated. Any other
 * call (keywords, more arguments, another type, a value out of range, an
 * allocator not armed) goes to the Python method itself (``general``), which
 * decides everything as before. The kernels never release the GIL, and neither
 * does this: it runs where the Python method would.
 *
 * A ``KernelEntry`` holds a buffer view of the allocator's state array (the
 * array stays alive and cannot be resized while it is held), the kernel's C
 * entry and the largest value the fast path takes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int64_t (*kernel_entry_fn)(int64_t state_address, int64_t value, _Bool locked);

/* ------------------------------------------------------------------ KernelEntry */

typedef struct {
    PyObject_HEAD
    kernel_entry_fn fn;
    int64_t state_address;
    int64_t largest;
    Py_buffer state;
} KernelEntry;

static int
entry_init(PyObject *op, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"address", "state", "largest", NULL};
    KernelEntry *self = (KernelEntry *)op;
    unsigned long long address;
    long long largest;
    PyObject *state;

    if (self->fn != NULL) {
        PyErr_SetString(PyExc_TypeError, "KernelEntry is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KOL:KernelEntry", names,
                                     &address, &state, &largest))
        return -1;
    if (address == 0) {
        PyErr_SetString(PyExc_ValueError, "KernelEntry: the kernel's address is 0");
        return -1;
    }
    if (PyObject_GetBuffer(state, &self->state, PyBUF_WRITABLE | PyBUF_FORMAT
                           | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    /* native int64 only: NumPy gives "l" (or "q") for it */
    if (self->state.itemsize != 8 || self->state.len < 8 || self->state.format == NULL
        || (strcmp(self->state.format, "l") != 0 && strcmp(self->state.format, "q") != 0)) {
        PyBuffer_Release(&self->state);
        self->state.obj = NULL;
        PyErr_SetString(PyExc_TypeError, "KernelEntry: the state must be an int64 array");
        return -1;
    }
    self->fn = (kernel_entry_fn)(uintptr_t)address;
    self->state_address = (int64_t)(uintptr_t)self->state.buf;
    self->largest = largest;
    return 0;
}

static void
entry_dealloc(PyObject *op)
{
    KernelEntry *self = (KernelEntry *)op;
    if (self->state.obj != NULL)
        PyBuffer_Release(&self->state);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *
entry_get_largest(PyObject *op, void *closure)
{
    return PyLong_FromLongLong(((KernelEntry *)op)->largest);
}

static PyGetSetDef entry_getset[] = {
    {"largest", entry_get_largest, NULL, "The largest value the fast path takes.", NULL},
    {NULL},
};

static PyTypeObject KernelEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_bfc.allocators._fastpath.KernelEntry",
    .tp_doc = "KernelEntry(address, state, largest): a kernel's C entry on one "
              "allocator's state array (int64), for values in (0, largest].",
    .tp_basicsize = sizeof(KernelEntry),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = entry_init,
    .tp_dealloc = entry_dealloc,
    .tp_getset = entry_getset,
};

/* ------------------------------------------------------------------ FastMethod */

enum { ALLOCATION = 0, RELEASE = 1 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *general;     /* the Python method: every call it is given */
    PyObject *after;       /* after(self, value, answer): an answer not the common one */
    PyObject *entry_name;  /* the instance attribute holding its KernelEntry */
    int kind;
    PyObject *dict;        /* __doc__, __name__, __wrapped__, ... (functools.update_wrapper) */
} FastMethod;

static PyObject *
method_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FastMethod *self = (FastMethod *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);

    if (self->general == NULL) {  /* never initialised, or cleared by the collector */
        PyErr_SetString(PyExc_TypeError, "FastMethod is not initialised");
        return NULL;
    }
    if (nargs == 2 && kwnames == NULL && PyLong_CheckExact(args[1])) {
        PyObject *entry_object = PyObject_GetAttr(args[0], self->entry_name);
        if (entry_object == NULL) {
            /* not an allocator: the Python method says what is wrong */
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return NULL;
            PyErr_Clear();
        }
        else if (Py_IS_TYPE(entry_object, &KernelEntryType)) {
            KernelEntry *entry = (KernelEntry *)entry_object;
            int overflow = 0;
            long long value = PyLong_AsLongLongAndOverflow(args[1], &overflow);
            if (!overflow && value > 0 && value <= entry->largest) {
                int64_t answer = entry->fn(entry->state_address, value, 0);
                Py_DECREF(entry_object);
                if (answer > 0) {
                    if (self->kind == ALLOCATION)
                        return PyLong_FromLongLong(answer);
                    Py_RETURN_NONE;
                }
                PyObject *answer_object = PyLong_FromLongLong(answer);
                if (answer_object == NULL)
                    return NULL;
                PyObject *after_args[3] = {args[0], args[1], answer_object};
                PyObject *result = PyObject_Vectorcall(self->after, after_args, 3, NULL);
                Py_DECREF(answer_object);
                return result;
            }
            Py_DECREF(entry_object);
        }
        else {
            Py_DECREF(entry_object);
        }
    }
    return PyObject_Vectorcall(self->general, args, nargsf, kwnames);
}

static int
method_init(PyObject *op, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"general", "after", "entry_name", "releases", NULL};
    FastMethod *self = (FastMethod *)op;
    PyObject *general, *after, *entry_name;
    int releases;

    if (self->general != NULL) {
        PyErr_SetString(PyExc_TypeError, "FastMethod is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOUp:FastMethod", names,
                                     &general, &after, &entry_name, &releases))
        return -1;
    if (!PyCallable_Check(general) || !PyCallable_Check(after)) {
        PyErr_SetString(PyExc_TypeError, "FastMethod: general and after must be callable");
        return -1;
    }
    Py_INCREF(entry_name);
    PyUnicode_InternInPlace(&entry_name);
    self->general = Py_NewRef(general);
    self->after = Py_NewRef(after);
    self->entry_name = entry_name;
    self->kind = releases ? RELEASE : ALLOCATION;
    self->vectorcall = method_vectorcall;
    return 0;
}

static PyObject *
method_descr_get(PyObject *op, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(op);
    return PyMethod_New(op, obj);
}

static PyObject *
method_repr(PyObject *op)
{
    return PyUnicode_FromFormat("<FastMethod %R>", ((FastMethod *)op)->general);
}

static int
method_traverse(PyObject *op, visitproc visit, void *arg)
{
    FastMethod *self = (FastMethod *)op;
    Py_VISIT(self->general);
    Py_VISIT(self->after);
    Py_VISIT(self->dict);
    return 0;
}

static int
method_clear(PyObject *op)
{
    FastMethod *self = (FastMethod *)op;
    Py_CLEAR(self->general);
    Py_CLEAR(self->after);
    Py_CLEAR(self->entry_name);
    Py_CLEAR(self->dict);
    return 0;
}

static void
method_dealloc(PyObject *op)
{
    PyObject_GC_UnTrack(op);
    method_clear(op);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *
method_get_general(PyObject *op, void *closure)
{
    FastMethod *self = (FastMethod *)op;
    if (self->general == NULL) {
        PyErr_SetString(PyExc_TypeError, "FastMethod is not initialised");
        return NULL;
    }
    return Py_NewRef(self->general);
}

/* Pickled (and copied) by reference, as the function it stands for:
 * ``__qualname__`` in ``__module__`` (both set by functools.update_wrapper). */
static PyObject *
method_reduce(PyObject *op, PyObject *unused)
{
    return PyObject_GetAttrString(op, "__qualname__");
}

static PyMethodDef method_methods[] = {
    {"__reduce__", method_reduce, METH_NOARGS, NULL},
    {NULL},
};

static PyGetSetDef method_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"general", method_get_general, NULL, "The Python method every other call goes to.", NULL},
    {NULL},
};

static PyTypeObject FastMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "numba_bfc.allocators._fastpath.FastMethod",
    .tp_doc = "FastMethod(general, after, entry_name, releases): a method whose common "
              "call goes straight to the instance's KernelEntry.",
    .tp_basicsize = sizeof(FastMethod),
    .tp_dictoffset = offsetof(FastMethod, dict),
    .tp_vectorcall_offset = offsetof(FastMethod, vectorcall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_call = PyVectorcall_Call,
    .tp_new = PyType_GenericNew,
    .tp_init = method_init,
    .tp_dealloc = method_dealloc,
    .tp_traverse = method_traverse,
    .tp_clear = method_clear,
    .tp_descr_get = method_descr_get,
    .tp_repr = method_repr,
    .tp_getset = method_getset,
    .tp_methods = method_methods,
};

/* ------------------------------------------------------------------ module */

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "numba_bfc.allocators._fastpath",
    .m_doc = "The façade's common calls, straight from Python into a compiled kernel.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    if (PyType_Ready(&KernelEntryType) < 0 || PyType_Ready(&FastMethodType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&fastpath_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "KernelEntry", (PyObject *)&KernelEntryType) < 0
        || PyModule_AddObjectRef(module, "FastMethod", (PyObject *)&FastMethodType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
