/* The shared-memory rings' hot operations in C (optional; runtime/transport/native.py loads it).
 *
 * The protocol and the ring layout stay in runtime/transport/shm.py; this module only does what is
 * hot per frame, with real memory ordering instead of relying on x86-64's store order:
 *   - RingMap.write:  one whole frame (prefix, header, payload parts) copied into the ring,
 *                     published by ONE release store of HEAD (after an acquire load of TAIL);
 *   - RingMap.poll:   acquire load of HEAD, then every plain frame whose payload is small
 *                     enough to copy out, as the Python reader returns them; it stops at the
 *                     first frame the Python reader must handle (pieces, large payloads);
 *   - the counters:   acquire loads, release stores, and the sequentially consistent fence a
 *                     flag-then-check handshake needs (a sleeping reader vs a writer that
 *                     published; a blocked writer vs a reader that freed space);
 *   - futex wake and futex_waitv with the GIL released.
 * Large payload copies release the GIL. Layout (shm.py): a 256-byte control block of u64
 * slots, then the data; frames are prefix "<IQ" (u32 header length or driver kind, u64
 * payload length), header, payload, padded to 16 bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>

#include "_ring.h"

static int check_open(RingMap *r) {
    if (!r->held) {
        PyErr_SetString(PyExc_ValueError, "ring mapping released");
        return -1;
    }
    return 0;
}

static int check_slot(Py_ssize_t off) {
    if (off < 0 || off > CTRL_NBYTES - 8 || (off & 7)) {
        PyErr_Format(PyExc_ValueError, "control slot offset %zd is not an aligned u64 in the "
                     "%d-byte control block", off, CTRL_NBYTES);
        return -1;
    }
    return 0;
}


static int RingMap_init(RingMap *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"buffer", "capacity", NULL};
    PyObject *obj;
    unsigned long long cap;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OK", names, &obj, &cap))
        return -1;
    if (cap < (1u << 16) || (cap & (cap - 1))) {
        PyErr_SetString(PyExc_ValueError, "ring capacity must be a power of two >= 64 KiB");
        return -1;
    }
    if (self->held) {
        PyBuffer_Release(&self->view);
        self->held = 0;
    }
    if (PyObject_GetBuffer(obj, &self->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    self->held = 1;
    if ((uint64_t)self->view.len < CTRL_NBYTES + cap || ((uintptr_t)self->view.buf & 7)) {
        PyBuffer_Release(&self->view);
        self->held = 0;
        PyErr_SetString(PyExc_ValueError, "buffer smaller than the ring or not 8-byte aligned");
        return -1;
    }
    self->ctrl = (char *)self->view.buf;
    self->data = self->ctrl + CTRL_NBYTES;
    self->cap = cap;
    return 0;
}

static void RingMap_dealloc(RingMap *self) {
    if (self->held)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *RingMap_release(RingMap *self, PyObject *unused) {
    if (self->held) {
        PyBuffer_Release(&self->view);
        self->held = 0;
    }
    Py_RETURN_NONE;
}

/* load(offset): acquire load of a control slot. */
static PyObject *RingMap_load(RingMap *self, PyObject *arg) {
    Py_ssize_t off = PyLong_AsSsize_t(arg);
    if ((off == -1 && PyErr_Occurred()) || check_open(self) || check_slot(off))
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(slot(self, off), __ATOMIC_ACQUIRE));
}

/* store(offset, value): release store of a control slot. */
static PyObject *RingMap_store(RingMap *self, PyObject *args) {
    Py_ssize_t off;
    unsigned long long v;
    if (!PyArg_ParseTuple(args, "nK", &off, &v) || check_open(self) || check_slot(off))
        return NULL;
    __atomic_store_n(slot(self, off), (uint64_t)v, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* flag(offset, value): store a flag and fence before the caller's next load (the flag side
 * of a flag-then-check handshake: the peer stores its data then checks the flag). */
static PyObject *RingMap_flag(RingMap *self, PyObject *args) {
    Py_ssize_t off;
    unsigned long long v;
    if (!PyArg_ParseTuple(args, "nK", &off, &v) || check_open(self) || check_slot(off))
        return NULL;
    __atomic_store_n(slot(self, off), (uint64_t)v, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}


/* ring_bell(): (writer, after frames were written) bump DATA_BELL; how the reader sleeps. */
static PyObject *RingMap_ring_bell(RingMap *self, PyObject *unused) {
    if (check_open(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(
        bump_and_check(self, SLOT_DATA_BELL, SLOT_READER_SLEEPING));
}

/* advance(new_tail): (reader) give frames back up to new_tail: release store of TAIL, bump
 * SPACE_BELL; True when a writer was blocked (its flag is cleared: it wants a wake-up). */
static PyObject *RingMap_advance(RingMap *self, PyObject *arg) {
    unsigned long long t = PyLong_AsUnsignedLongLong(arg);
    if ((t == (unsigned long long)-1 && PyErr_Occurred()) || check_open(self))
        return NULL;
    __atomic_store_n(slot(self, SLOT_TAIL), (uint64_t)t, __ATOMIC_RELEASE);
    if (bump_and_check(self, SLOT_SPACE_BELL, SLOT_WRITER_BLOCKED)) {
        __atomic_store_n(slot(self, SLOT_WRITER_BLOCKED), 0, __ATOMIC_RELAXED);
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* write(hdr_len, header, parts, nbytes): (writer) one whole frame, or False when the ring
 * lacks the space now. The caller checks the frame fits one ring piece (shm.Ring.max_piece)
 * and that ``parts`` (contiguous buffers) hold ``nbytes`` bytes together. */
static PyObject *RingMap_write(RingMap *self, PyObject *args) {
    unsigned long hdr_len_in;
    Py_buffer header;
    PyObject *parts;
    unsigned long long nbytes;
    if (!PyArg_ParseTuple(args, "ky*OK", &hdr_len_in, &header, &parts, &nbytes))
        return NULL;
    PyObject *result = NULL;
    Py_buffer bufs[MAX_PARTS];
    Py_ssize_t nparts = 0, got = 0;
    PyObject *seq = PySequence_Fast(parts, "parts must be a sequence of buffers");
    if (seq == NULL || check_open(self))
        goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_PARTS) {
        PyErr_Format(PyExc_ValueError, "at most %d payload parts, got %zd", MAX_PARTS, n);
        goto out;
    }
    uint64_t sum = 0;
    for (; nparts < n; nparts++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, nparts), &bufs[nparts],
                               PyBUF_C_CONTIGUOUS) < 0)
            goto out;
        sum += (uint64_t)bufs[nparts].len;
    }
    got = nparts;
    uint64_t cap = self->cap;
    uint64_t total = pad16(PREFIX_NBYTES + (uint64_t)header.len + nbytes);
    if (sum != nbytes || total > cap / 4) {
        PyErr_Format(PyExc_ValueError, "frame of %llu payload bytes (parts hold %llu) does "
                     "not fit one ring piece", nbytes, (unsigned long long)sum);
        goto out;
    }
    uint64_t head = __atomic_load_n(slot(self, SLOT_HEAD), __ATOMIC_RELAXED);   /* ours */
    uint64_t tail = __atomic_load_n(slot(self, SLOT_TAIL), __ATOMIC_ACQUIRE);
    uint64_t pos = head & (cap - 1);
    uint64_t skip = pos + total > cap ? cap - pos : 0;
    if (cap - (head - tail) < skip + total) {
        result = Py_False;
        Py_INCREF(result);
        goto out;
    }
    if (skip) {                 /* the reader skips to the start on this marker */
        put_prefix(self->data + pos, KIND_WRAP, 0);
        head += skip;
        pos = 0;
    }
    char *p = self->data + pos;
    put_prefix(p, (uint32_t)hdr_len_in, nbytes);
    p += PREFIX_NBYTES;
    memcpy(p, header.buf, header.len);
    p += header.len;
    if (nbytes >= NOGIL_NBYTES) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < got; i++) {
            memcpy(p, bufs[i].buf, bufs[i].len);
            p += bufs[i].len;
        }
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t i = 0; i < got; i++) {
            memcpy(p, bufs[i].buf, bufs[i].len);
            p += bufs[i].len;
        }
    }
    __atomic_store_n(slot(self, SLOT_HEAD), head + total, __ATOMIC_RELEASE);
    result = Py_True;
    Py_INCREF(result);
out:
    for (Py_ssize_t i = 0; i < nparts; i++)      /* the buffers acquired */
        PyBuffer_Release(&bufs[i]);
    Py_XDECREF(seq);
    PyBuffer_Release(&header);
    return result;
}

/* poll(read_pos, max_frames, out, copy_out_nbytes) -> (pos, nframes, head): (reader) append
 * (hdr_len, header, payload, None) to ``out`` for each whole frame from read_pos whose payload
 * is empty (payload None) or at most copy_out_nbytes (copied out: a memoryview of bytes),
 * skipping wrap markers; stops at the first frame the Python reader must handle. */
static PyObject *RingMap_poll(RingMap *self, PyObject *args) {
    unsigned long long pos;
    Py_ssize_t max_frames;
    PyObject *out;
    unsigned long long copy_out;
    if (!PyArg_ParseTuple(args, "KnO!K", &pos, &max_frames, &PyList_Type, &out, &copy_out)
            || check_open(self))
        return NULL;
    uint64_t cap = self->cap;
    uint64_t head = __atomic_load_n(slot(self, SLOT_HEAD), __ATOMIC_ACQUIRE);
    Py_ssize_t n = 0;
    while (pos < head && n < max_frames) {
        uint64_t at = pos & (cap - 1);
        const char *p = self->data + at;
        uint32_t hdr_len;
        uint64_t plen;
        memcpy(&hdr_len, p, 4);
        memcpy(&plen, p + 4, 8);
        if (hdr_len == KIND_WRAP) {
            pos += cap - at;
            continue;
        }
        if (hdr_len == KIND_FRAG_FIRST || hdr_len == KIND_FRAG_MORE || plen > copy_out)
            break;
        uint64_t hl = hdr_len >= KIND_BASE ? 0 : hdr_len;
        uint64_t size = pad16(PREFIX_NBYTES + hl + plen);
        if (at + size > cap) {
            PyErr_Format(PyExc_RuntimeError, "corrupt shm ring: a %llu-byte frame at %llu "
                         "crosses the ring's end", (unsigned long long)size,
                         (unsigned long long)at);
            return NULL;
        }
        PyObject *hdr = PyBytes_FromStringAndSize(p + PREFIX_NBYTES, (Py_ssize_t)hl);
        PyObject *payload = NULL, *tup = NULL;
        if (hdr == NULL)
            return NULL;
        if (plen) {
            PyObject *b = PyBytes_FromStringAndSize(p + PREFIX_NBYTES + hl, (Py_ssize_t)plen);
            if (b == NULL) {
                Py_DECREF(hdr);
                return NULL;
            }
            payload = PyMemoryView_FromObject(b);
            Py_DECREF(b);
            if (payload == NULL) {
                Py_DECREF(hdr);
                return NULL;
            }
        } else {
            payload = Py_None;
            Py_INCREF(payload);
        }
        tup = Py_BuildValue("(kNNO)", (unsigned long)hdr_len, hdr, payload, Py_None);
        if (tup == NULL || PyList_Append(out, tup) < 0) {
            Py_XDECREF(tup);
            return NULL;
        }
        Py_DECREF(tup);
        pos += size;
        n++;
    }
    return Py_BuildValue("(KnK)", pos, n, (unsigned long long)head);
}

static PyMethodDef RingMap_methods[] = {
    {"load", (PyCFunction)RingMap_load, METH_O, "acquire load of the u64 control slot at offset"},
    {"store", (PyCFunction)RingMap_store, METH_VARARGS, "release store of a control slot"},
    {"flag", (PyCFunction)RingMap_flag, METH_VARARGS,
     "store a flag in a control slot, then a full fence"},
    {"ring_bell", (PyCFunction)RingMap_ring_bell, METH_NOARGS,
     "(writer) bump the data counter; the reader's sleeping flag"},
    {"advance", (PyCFunction)RingMap_advance, METH_O,
     "(reader) store the tail, bump the space counter; whether a writer was blocked"},
    {"write", (PyCFunction)RingMap_write, METH_VARARGS, "(writer) one whole frame, or False"},
    {"poll", (PyCFunction)RingMap_poll, METH_VARARGS,
     "(reader) small whole frames from read_pos -> (pos, nframes, head)"},
    {"release", (PyCFunction)RingMap_release, METH_NOARGS, "let go of the mapping's buffer"},
    {NULL}
};

PyTypeObject RingMapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polycast.runtime.transport._ring.RingMap",
    .tp_basicsize = sizeof(RingMap),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The control block and data of one mapped shm ring (runtime/transport/shm.py layout).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RingMap_init,
    .tp_dealloc = (destructor)RingMap_dealloc,
    .tp_methods = RingMap_methods,
};

/* futex_wake(addr, nwaiters, private): FUTEX_WAKE on the u32 at addr. */
static PyObject *futex_wake(PyObject *mod, PyObject *args) {
    unsigned long long addr;
    int n, private_ = 0;
    if (!PyArg_ParseTuple(args, "Ki|p", &addr, &n, &private_))
        return NULL;
    syscall(SYS_futex, (void *)(uintptr_t)addr,
            FUTEX_WAKE | (private_ ? FUTEX_PRIVATE_FLAG : 0), n, NULL, NULL, 0);
    Py_RETURN_NONE;
}

/* futex_waitv(waiters_addr, n, timeout_seconds): sleep (GIL released) on n struct futex_waitv
 * at waiters_addr (runtime/transport/futex.py fills them) until a wake-up, a changed value or the
 * timeout (CLOCK_MONOTONIC). Returns the syscall's result (-errno on failure). */
static PyObject *futex_waitv(PyObject *mod, PyObject *args) {
    unsigned long long addr;
    unsigned int n;
    double timeout;
    if (!PyArg_ParseTuple(args, "KId", &addr, &n, &timeout))
        return NULL;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (timeout > 0) {
        double whole = (double)(long long)timeout;
        ts.tv_sec += (time_t)whole;
        ts.tv_nsec += (long)((timeout - whole) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec += 1;
            ts.tv_nsec -= 1000000000L;
        }
    }
    long rc;
    Py_BEGIN_ALLOW_THREADS
    rc = syscall(SYS_futex_waitv, (void *)(uintptr_t)addr, n, 0, &ts, CLOCK_MONOTONIC);
    if (rc < 0)
        rc = -errno;
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyMethodDef module_methods[] = {
    {"futex_wake", futex_wake, METH_VARARGS, "FUTEX_WAKE on the u32 at an address"},
    {"futex_waitv", futex_waitv, METH_VARARGS, "futex_waitv with the GIL released"},
    {NULL}
};

static struct PyModuleDef ringmodule = {
    PyModuleDef_HEAD_INIT, "polycast.runtime.transport._ring",
    "Compiled hot path of the shared-memory rings (optional).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__ring(void) {
    if (PyType_Ready(&RingMapType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&ringmodule);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RingMapType);
    if (PyModule_AddObject(m, "RingMap", (PyObject *)&RingMapType) < 0) {
        Py_DECREF(&RingMapType);
        Py_DECREF(m);
        return NULL;
    }
    if (replay_add_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    /* The layout this build was compiled with (native.py checks it against the header the
     * Python rings read: a helper built from an older header is not used). */
    PyObject *layout = Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsK}", "PREFIX_NBYTES", (unsigned long long)PREFIX_NBYTES,
        "ALIGN", (unsigned long long)ALIGN, "KIND_BASE", (unsigned long long)KIND_BASE,
        "KIND_WRAP", (unsigned long long)KIND_WRAP, "CTRL_NBYTES", (unsigned long long)CTRL_NBYTES,
        "SLOT_HEAD", (unsigned long long)SLOT_HEAD, "SLOT_TAIL", (unsigned long long)SLOT_TAIL,
        "SLOT_READER_SLEEPING", (unsigned long long)SLOT_READER_SLEEPING,
        "SLOT_DATA_BELL", (unsigned long long)SLOT_DATA_BELL,
        "SLOT_SPACE_BELL", (unsigned long long)SLOT_SPACE_BELL);
    if (layout == NULL || PyModule_AddObject(m, "LAYOUT", layout) < 0) {
        Py_XDECREF(layout);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
