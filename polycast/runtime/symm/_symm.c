/* The symm helper's Barrier type and module (its parts, and the protocol: _symm.h). */
#include "_symm.h"

static void Bar_dealloc(Bar *self) {
    fast_free(self);
    PyMem_Free(self->ctrl);
    PyMem_Free(self->slots);
    PyMem_Free(self->pids);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int addr_list(PyObject *seq, int size, void **out) {
    PyObject *fast = PySequence_Fast(seq, "a sequence of addresses");
    if (!fast) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != size) {
        PyErr_SetString(PyExc_ValueError, "one address per rank");
        Py_DECREF(fast);
        return -1;
    }
    for (int p = 0; p < size; p++) {
        out[p] = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(fast, p));
        if (PyErr_Occurred()) { Py_DECREF(fast); return -1; }
    }
    Py_DECREF(fast);
    return 0;
}

/* Barrier(rank, ctrl_addresses): the caller keeps the control blocks mapped while it lives. */
static int Bar_init(Bar *self, PyObject *args, PyObject *kw) {
    int rank;
    PyObject *ctrl;
    if (!PyArg_ParseTuple(args, "iO", &rank, &ctrl)) return -1;
    Py_ssize_t size = PySequence_Size(ctrl);
    if (size < 1 || rank < 0 || rank >= size) {
        PyErr_SetString(PyExc_ValueError, "rank out of range");
        return -1;
    }
    self->size = (int)size;
    self->rank = rank;
    self->ctrl = PyMem_Calloc(size, sizeof(uint64_t *));
    self->slots = PyMem_Calloc(size, sizeof(char *));
    if (!self->ctrl || !self->slots) { PyErr_NoMemory(); return -1; }
    return addr_list(ctrl, self->size, (void **)self->ctrl);
}

/* set_slots(addresses, half): each rank's slots segment, two slots of half bytes. */
static PyObject *Bar_set_slots(Bar *self, PyObject *args) {
    PyObject *seq;
    Py_ssize_t half;
    if (!PyArg_ParseTuple(args, "On", &seq, &half)) return NULL;
    if (addr_list(seq, self->size, (void **)self->slots) < 0) return NULL;
    self->half = half;
    Py_RETURN_NONE;
}

/* publish(slot, value): release store, and wake the peers sleeping on it. */
static PyObject *Bar_publish(Bar *self, PyObject *args) {
    int slot;
    unsigned long long v;
    if (!PyArg_ParseTuple(args, "iK", &slot, &v)) return NULL;
    publish(self, slot, v);
    Py_RETURN_NONE;
}

/* wait(only, slot, target, policy, sleep_s) -> peers still missing (only: a rank, or -1 for
 * every other rank; policy: WaitPolicy.c_args). */
static PyObject *Bar_wait(Bar *self, PyObject *args) {
    int only, slot;
    unsigned long long target;
    double sl;
    PyObject *pol;
    pc_wait_policy p;
    if (!PyArg_ParseTuple(args, "iiKO!d", &only, &slot, &target, &PyTuple_Type, &pol, &sl) ||
            !pc_wait_policy_parse(pol, &p))
        return NULL;
    if (only >= self->size || only == self->rank) {
        PyErr_SetString(PyExc_ValueError, "wait: no such peer");
        return NULL;
    }
    return PyLong_FromLong(wait_slot(self, only, slot, target, &p, sl));
}


static PyObject *Bar_get_armed(Bar *self, void *closure) {
    return PyBool_FromLong(self->fast != NULL);
}

static PyObject *Bar_get_epoch(Bar *self, void *closure) {
    return PyLong_FromUnsignedLongLong(self->epoch);
}

static int Bar_set_epoch(Bar *self, PyObject *v, void *closure) {
    if (!v) { PyErr_SetString(PyExc_TypeError, "epoch cannot be deleted"); return -1; }
    unsigned long long e = PyLong_AsUnsignedLongLong(v);
    if (e == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    self->epoch = e;
    return 0;
}

static PyGetSetDef Bar_getset[] = {
    {"epoch", (getter)Bar_get_epoch, (setter)Bar_set_epoch, "the barrier's epoch", NULL},
    {"armed", (getter)Bar_get_armed, NULL, "whether repeated calls take the fast path", NULL},
    {NULL},
};

static PyMethodDef Bar_methods[] = {
    {"arm", (PyCFunction)Bar_arm, METH_VARARGS, "start keeping repeated small calls"},
    {"disarm", (PyCFunction)Bar_disarm, METH_NOARGS, "forget every kept call"},
    {"add", (PyCFunction)Bar_add, METH_VARARGS, "keep a call shape"},
    {"call", (PyCFunction)(void (*)(void))Bar_call, METH_FASTCALL,
     "a kept call (kind, sendbuf, recvbuf, op or root, nonblocking): True, False (not mine), "
     "-1 (mismatch) or peers missing"},
    {"finish_pending", (PyCFunction)Bar_finish_pending, METH_NOARGS, "the rest of a pending call"},
    {"drop_pending", (PyCFunction)Bar_drop_pending, METH_NOARGS, "give a pending call up"},
    {"last", (PyCFunction)Bar_last, METH_NOARGS, "(epoch, what) of the last fast call"},
    {"cma_error", (PyCFunction)Bar_cma_error, METH_NOARGS, "where a single-copy call failed"},
    {"set_pids", (PyCFunction)Bar_set_pids, METH_VARARGS, "each rank's process id"},
    {"set_slots", (PyCFunction)Bar_set_slots, METH_VARARGS, "each rank's slots segment"},
    {"publish", (PyCFunction)Bar_publish, METH_VARARGS, "release-store a slot, wake sleepers"},
    {"wait", (PyCFunction)Bar_wait, METH_VARARGS, "wait as the policy says, sleep once: peers missing"},
    {"start", (PyCFunction)Bar_start, METH_VARARGS, "a small slotted call, up to its wait"},
    {"finish", (PyCFunction)Bar_finish, METH_VARARGS, "the rest of a start() that waited"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BarType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polycast.runtime.symm._symm.Barrier",
    .tp_basicsize = sizeof(Bar),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "the epoch barrier's and small slotted calls' hot path",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Bar_init,
    .tp_dealloc = (destructor)Bar_dealloc,
    .tp_methods = Bar_methods,
    .tp_getset = Bar_getset,
};

static PyObject *stats(PyObject *mod, PyObject *noargs) {
    return Py_BuildValue("{sKsKsKsKsKsKsKsK}", "waits", n_waits, "polls", n_polls, "yields",
                         n_yields, "sleeps", n_sleeps, "fast", n_fast, "single", n_single,
                         "single_pending_open", n_single_pending[0],
                         "single_pending_close", n_single_pending[1]);
}

static PyMethodDef module_methods[] = {
    {"stats", stats, METH_NOARGS, "waits, polls, yields and futex sleeps so far (process)"},
    {"supports", supports, METH_VARARGS, "whether (dtype code, op code) folds here"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_symm", "symm barrier and small-call hot path", -1, module_methods,
};

PyMODINIT_FUNC PyInit__symm(void) {
    if (!(str_dtype = PyUnicode_InternFromString("dtype"))) return NULL;
    if (PyType_Ready(&BarType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&BarType);
    if (PyModule_AddObject(m, "Barrier", (PyObject *)&BarType) < 0) {
        Py_DECREF(&BarType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

