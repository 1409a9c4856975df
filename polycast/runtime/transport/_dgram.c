/* The multicast datagram path in C (optional; runtime/transport/dgram.py loads it).
 *
 * It carries out, per datagram, what the engine decided per stream; it decides nothing.
 *
 *   Placer  - the open streams of one process (the engine's OpenStream actions, or the
 *             offload worker's OPEN commands): where each stream's chunks go (a writable
 *             buffer, its element runs, chunk geometry, call signature) and a bitmap.
 *             Placer.recv(fd, n) reads up to n datagrams with recvmmsg (UDP GRO segments
 *             split), checks each header (and its keyed BLAKE2b MAC when the job has a
 *             secret) exactly as engine/wire.py's parse_datagram does, and for a datagram
 *             of an open stream whose chunk geometry and signature match: copies the
 *             payload into place and sets its bit (MCAST_DATA), or notes the end of stream
 *             (MCAST_EOS). A chunk already held is a duplicate: dropped and counted.
 *             Everything else - a header that does not parse, a MAC that does not verify,
 *             a stream not open (early, stale, foreign, own), a signature or geometry that
 *             does not match - is returned unconsumed, for the engine to decide (hold,
 *             drop and count the reason). What was placed is reported per stream as chunk
 *             ranges, with the EOS, once per call.
 *             With landing (Placer.set_landing), a socket's next datagrams are read
 *             straight into the places of the chunks its stream is expected to send next
 *             (_dgram_read.c): one copy, the kernel's, when the prediction holds.
 *   send    - a list of datagrams (header, payload) sent with sendmmsg, consecutive
 *             datagrams of one size grouped into one UDP GSO send (UDP_SEGMENT) where the
 *             kernel takes it. Sent when the engine's pacing says; the caller keeps the
 *             timing.
 *
 * The parts are listed in _dgram.h.
 *
 * Memory safety: a stream's buffer is held (buffer protocol) from open to close, and every
 * element run is checked against it at open, so no datagram can make a write outside it;
 * chunk indices, offsets and lengths are checked against the stream's geometry before any
 * copy, and landing writes only into the places of chunks not held yet. The copies and
 * syscalls run without the GIL; a Placer is used by one thread at a time (open/close/write
 * refuse while recv runs).
 *
 * Wire header (engine/wire.py), network byte order, 44 bytes then [16-byte MAC] then payload:
 *   magic u16 | version u8 | kind u8 | flags u8 | pad 3 | comm u32 | seq u32 | src u32 |
 *   tag u32 | stream u32 | offset u64 | length u32 | sig u32
 */
#include "_dgram.h"

/* ------------------------------------------------------------------------------------------
 * Placer: Python side
 */
static int Placer_init(Placer *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"key", NULL};
    Py_buffer key = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|z*", names, &key))
        return -1;
    if (key.buf && key.len > 64) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "a BLAKE2b key is at most 64 bytes");
        return -1;
    }
    self->keyed = key.buf != NULL && key.len > 0;
    b2_init_key(&self->mac0, self->keyed ? key.buf : NULL, self->keyed ? (size_t)key.len : 0,
                MAC_NBYTES);
    if (key.buf)
        PyBuffer_Release(&key);
    if (!self->slots) {
        self->slots = PyMem_Malloc((size_t)BATCH * SLOT_NBYTES);
        self->scratch = PyMem_Malloc((size_t)BATCH * SLOT_NBYTES);
        if (!self->slots || !self->scratch) {
            PyErr_NoMemory();
            return -1;
        }
    }
    self->land_segs = 1;
    return 0;
}

static void Placer_dealloc(Placer *self) {
    for (size_t i = 0; i < self->nbuckets; i++) {
        Dest *d = self->buckets[i];
        while (d) {
            Dest *next = d->next;
            dest_free(d);
            d = next;
        }
    }
    PyMem_Free(self->buckets);
    PyMem_Free(self->dirty);
    PyMem_Free(self->slots);
    PyMem_Free(self->scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int not_busy(Placer *p) {
    if (p->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Placer used from two threads at once");
        return -1;
    }
    return 0;
}

static PyObject *Placer_open(Placer *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"handle", "comm", "seq", "src", "stream", "sig", "buffer",
                            "base_nbytes", "runs", "itemsize", "chunk_elems", "nchunks",
                            "nelems", NULL};
    long long handle;
    unsigned int comm, seq, src, stream, sig;
    PyObject *bufobj;
    Py_ssize_t base;
    Py_buffer runs = {0};
    unsigned long long isz, ce, nchunks, nelems;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LIIIIIOny*KKKK", names, &handle, &comm, &seq,
                                     &src, &stream, &sig, &bufobj, &base, &runs, &isz, &ce,
                                     &nchunks, &nelems))
        return NULL;
    if (not_busy(self) < 0) {
        PyBuffer_Release(&runs);
        return NULL;
    }
    Dest *d = PyMem_Calloc(1, sizeof(Dest));
    if (!d) {
        PyBuffer_Release(&runs);
        return PyErr_NoMemory();
    }
    const char *why = NULL;
    if (PyObject_GetBuffer(bufobj, &d->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&runs);
        PyMem_Free(d);
        return NULL;
    }
    size_t nruns = (size_t)runs.len / 16;
    if (runs.len % 16 || nruns == 0)
        why = "runs must be packed int64 (start, end) element pairs, at least one";
    else if (isz == 0 || isz > (1u << 20) || ce == 0 || ce > (1ull << 32))
        why = "itemsize and chunk_elems out of range";
    else if (base < 0 || base > d->view.len)
        why = "base offset outside the buffer";
    else if (nelems > (1ull << 40) || nchunks != (nelems + ce - 1) / ce)
        why = "nchunks must be ceil(nelems / chunk_elems)";
    if (!why) {
        d->runs = PyMem_Malloc(nruns * 2 * sizeof(uint64_t));
        d->prefix = PyMem_Malloc((nruns + 1) * sizeof(uint64_t));
        d->bitmap = PyMem_Calloc(nchunks ? nchunks : 1, 1);
        if (!d->runs || !d->prefix || !d->bitmap) {
            PyBuffer_Release(&runs);
            dest_free(d);
            return PyErr_NoMemory();
        }
        const int64_t *r = runs.buf;
        uint64_t total = 0, room = (uint64_t)(d->view.len - base) / isz;
        for (size_t i = 0; i < nruns && !why; i++) {
            int64_t a = r[2 * i], b = r[2 * i + 1];
            if (a < 0 || b < a || (uint64_t)b > room)
                why = "an element run lies outside the buffer";
            d->runs[2 * i] = (uint64_t)a;
            d->runs[2 * i + 1] = (uint64_t)b;
            d->prefix[i] = total;
            total += (uint64_t)(b - a);
        }
        d->prefix[nruns] = total;
        if (!why && total != nelems)
            why = "the runs do not hold nelems elements";
    }
    PyBuffer_Release(&runs);
    if (why) {
        dest_free(d);
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    if (find_handle(self, handle)) {
        dest_free(d);
        PyErr_Format(PyExc_ValueError, "handle %lld is open already", handle);
        return NULL;
    }
    d->handle = handle;
    d->comm = comm;
    d->seq = seq;
    d->src = src;
    d->stream = stream;
    d->sig = sig;
    d->base = (char *)d->view.buf + base;
    d->nruns = nruns;
    d->isz = isz;
    d->ce = ce;
    d->nchunks = nchunks;
    d->nelems = nelems;
    if (self->ndests + 1 > self->nbuckets && grow_buckets(self) < 0) {
        dest_free(d);
        return NULL;
    }
    size_t k = key_hash(comm, seq, src, stream) & (self->nbuckets - 1);
    d->next = self->buckets[k];
    self->buckets[k] = d;
    self->ndests++;
    Py_RETURN_NONE;
}

static PyObject *Placer_close(Placer *self, PyObject *arg) {
    long long handle = PyLong_AsLongLong(arg);
    if (handle == -1 && PyErr_Occurred())
        return NULL;
    if (not_busy(self) < 0)
        return NULL;
    for (size_t i = 0; i < self->nbuckets; i++) {
        for (Dest **pp = &self->buckets[i]; *pp; pp = &(*pp)->next) {
            Dest *d = *pp;
            if (d->handle != handle)
                continue;
            *pp = d->next;
            if (d->dirty)
                for (size_t j = 0; j < self->ndirty; j++)
                    if (self->dirty[j] == d) {
                        self->dirty[j] = self->dirty[--self->ndirty];
                        break;
                    }
            for (int c = 0; c < NCURSORS; c++)
                if (self->cursors[c].d == d)
                    self->cursors[c].d = NULL;
            dest_free(d);
            self->ndests--;
            Py_RETURN_TRUE;
        }
    }
    Py_RETURN_FALSE;
}

static PyObject *Placer_set_hold(Placer *self, PyObject *args) {
    long long handle;
    int on;
    if (!PyArg_ParseTuple(args, "Lp", &handle, &on))
        return NULL;
    Dest *d = find_handle(self, handle);
    if (!d) {
        PyErr_Format(PyExc_KeyError, "no open stream %lld", handle);
        return NULL;
    }
    d->hold = on;
    Py_RETURN_NONE;
}

/* Recovered bytes [offset, offset + len) of an open stream: placed like chunks; returns the
 * chunk range (c0, c1) they covered, or None when they do not cover whole chunks of it. */
static PyObject *Placer_write(Placer *self, PyObject *args) {
    long long handle;
    unsigned long long offset;
    Py_buffer pay;
    if (!PyArg_ParseTuple(args, "LKy*", &handle, &offset, &pay))
        return NULL;
    if (not_busy(self) < 0) {
        PyBuffer_Release(&pay);
        return NULL;
    }
    Dest *d = find_handle(self, handle);
    if (!d) {
        PyBuffer_Release(&pay);
        PyErr_Format(PyExc_KeyError, "no open stream %lld", handle);
        return NULL;
    }
    uint64_t cb = d->ce * d->isz, nbytes = d->nelems * d->isz, n = (uint64_t)pay.len;
    uint64_t end = offset + n;
    if (n == 0 || offset % cb || end > nbytes || end < offset || (end != nbytes && end % cb)) {
        PyBuffer_Release(&pay);
        Py_RETURN_NONE;
    }
    copy_elems(d, offset / d->isz, end / d->isz, pay.buf);
    PyBuffer_Release(&pay);
    uint64_t c0 = offset / cb, c1 = (end + cb - 1) / cb;
    for (uint64_t i = c0; i < c1; i++)
        if (!d->bitmap[i]) {
            d->bitmap[i] = 1;
            d->have++;
        }
    return Py_BuildValue("(KK)", (unsigned long long)c0, (unsigned long long)c1);
}

/* The reports of every stream that placed or saw its EOS since the last call:
 * [(handle, ranges bytes of uint64 (c0, c1) pairs, eos)]. */
static PyObject *take_progress(Placer *p) {
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    for (size_t j = 0; j < p->ndirty; j++) {
        Dest *d = p->dirty[j];
        PyObject *ranges = PyBytes_FromStringAndSize((const char *)d->ranges,
                                                     (Py_ssize_t)(d->nranges * 16));
        PyObject *t = ranges ? Py_BuildValue("(LNO)", d->handle, ranges,
                                             d->eos_pending ? Py_True : Py_False) : NULL;
        if (!t || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(t);
        d->nranges = 0;
        d->eos_pending = 0;
        d->dirty = 0;
    }
    p->ndirty = 0;
    return out;
}

static int append_up(PyObject *up, const uint8_t *data, size_t n, int placed) {
    PyObject *b = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)n);
    if (!b)
        return -1;
    PyObject *t = Py_BuildValue("(NO)", b, placed ? Py_True : Py_False);
    if (!t)
        return -1;
    int r = PyList_Append(up, t);
    Py_DECREF(t);
    return r;
}

/* (progress, up, consumed, consumed_nbytes, duplicates, duplicate_eos) since the counts
 * given (a recv's or feed's result); steals ``up``. */
static PyObject *result(Placer *self, PyObject *up, unsigned long long n0,
                        unsigned long long nb0, unsigned long long dup0,
                        unsigned long long de0) {
    PyObject *prog = take_progress(self);
    if (!prog) {
        Py_DECREF(up);
        return NULL;
    }
    return Py_BuildValue("(NNKKKK)", prog, up, self->c_consumed - n0,
                         self->c_consumed_nbytes - nb0, self->c_duplicates - dup0,
                         self->c_duplicate_eos - de0);
}

/* Placer.feed(data): one datagram from memory (held datagrams, tests, the fuzzer). Returns
 * (progress, up, consumed, consumed_nbytes, duplicates, duplicate_eos) like recv. */
static PyObject *Placer_feed(Placer *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (not_busy(self) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    unsigned long long dup0 = self->c_duplicates, n0 = self->c_consumed,
        nb0 = self->c_consumed_nbytes, de0 = self->c_duplicate_eos;
    int r = handle_one(self, b.buf, (size_t)b.len);
    PyObject *up = PyList_New(0);
    if (r == -2) {
        PyErr_NoMemory();
    } else if (up && r != 1) {
        self->c_up++;
        if (append_up(up, b.buf, (size_t)b.len, r == 2) < 0)
            Py_CLEAR(up);
    }
    PyBuffer_Release(&b);
    if (r == -2 || !up) {
        Py_XDECREF(up);
        return NULL;
    }
    return result(self, up, n0, nb0, dup0, de0);
}

/* Placer.recv(fd, max_datagrams, linger_us=0, gap_us=0): read and handle up to max
 * datagrams; returns (progress, up, consumed, consumed_nbytes, duplicates, duplicate_eos):
 * the streams' reports, [(datagram bytes, placed)] for the engine (placed: a holding
 * stream's copy, already written for the open ranks), the datagrams (and their payload
 * bytes) this call consumed, and how many of those were duplicate chunks and repeated EOS,
 * dropped.
 *
 * Without linger it stops when the socket runs dry. With linger_us, while a stream is
 * mid-way (chunks placed, none completed, no EOS seen), it naps gap_us (without the GIL)
 * and reads what came meanwhile, up to linger_us in all, and stops at a nap that brought
 * nothing or that a descriptor of ``watch`` (the caller's other input) cut short: a paced
 * stream trickles in, and a wake-up per datagram (the caller's loop, or a poll here) costs
 * more than the datagram. */
static PyObject *Placer_recv(Placer *self, PyObject *args) {
    int fd;
    Py_ssize_t max;
    double linger_us = 0, gap_us = 0;
    PyObject *watch_obj = NULL;
    if (!PyArg_ParseTuple(args, "in|ddO", &fd, &max, &linger_us, &gap_us, &watch_obj))
        return NULL;
    if (not_busy(self) < 0)
        return NULL;
    struct pollfd watch[MAX_WATCH];
    int nwatch = 0;
    if (watch_obj && watch_obj != Py_None) {
        PyObject *seq = PySequence_Fast(watch_obj, "watch: a sequence of file descriptors");
        if (!seq)
            return NULL;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq) && nwatch < MAX_WATCH; i++) {
            long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
            watch[nwatch].fd = (int)v;
            watch[nwatch].events = POLLIN;
            watch[nwatch++].revents = 0;
        }
        Py_DECREF(seq);
    }
    PyObject *up = PyList_New(0);
    if (!up)
        return NULL;
    Py_ssize_t total = 0;
    unsigned long long dup0 = self->c_duplicates, n0 = self->c_consumed,
        nb0 = self->c_consumed_nbytes, de0 = self->c_duplicate_eos;
    double t0 = 0;
    self->ended = self->streaming = 0;
    while (total < max) {
        int vlen = (int)(max - total < BATCH ? max - total : BATCH), n;
        self->busy = 1;
        self->nup = 0;
        Py_BEGIN_ALLOW_THREADS
        n = read_batch(self, fd, vlen);
        if (n == 0 && total > 0 && linger_us > 0 && self->streaming && !self->ended) {
            /* a fixed nap, not a wake-up per datagram: what arrives meanwhile is read in
             * one batch (interrupt moderation, as NICs do it) */
            double left = linger_us - (mono_us() - t0);
            if (nap(left < gap_us ? left : gap_us, watch, nwatch))
                n = read_batch(self, fd, vlen);
        }
        Py_END_ALLOW_THREADS
        self->busy = 0;
        if (n == -2) {
            Py_DECREF(up);
            return PyErr_NoMemory();
        }
        for (size_t j = 0; j < self->nup; j++) {
            const uint8_t *b = self->up[j].ptr;
            self->c_up++;
            if (append_up(up, b, self->up[j].len, self->up[j].placed) < 0) {
                Py_DECREF(up);
                return NULL;
            }
        }
        if (n == 0)
            break;
        if (total == 0)
            t0 = mono_us();
        total += n;
    }
    return result(self, up, n0, nb0, dup0, de0);
}

static PyObject *Placer_set_gro(Placer *self, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    int on = 1;
    if (setsockopt(fd, SOL_UDP, UDP_GRO, &on, sizeof(on)) == 0) {
        self->gro = 1;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyObject *Placer_set_landing(Placer *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    if (not_busy(self) < 0)
        return NULL;
    self->landing = on;
    Py_RETURN_NONE;
}

static PyObject *Placer_counters(Placer *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsKsKsKsn}", "datagrams", self->c_datagrams,
                         "placed", self->c_placed, "placed_nbytes", self->c_placed_nbytes,
                         "duplicates", self->c_duplicates, "up", self->c_up,
                         "bad_mac", self->c_bad_mac, "syscalls", self->c_syscalls,
                         "gro_buffers", self->c_gro_buffers, "eos", self->c_eos,
                         "up_lost", self->c_up_lost, "duplicate_eos", self->c_duplicate_eos,
                         "landed", self->c_landed, "land_missed", self->c_land_missed,
                         "open", (Py_ssize_t)self->ndests);
}

static PyObject *Placer_have(Placer *self, PyObject *arg) {
    long long handle = PyLong_AsLongLong(arg);
    if (handle == -1 && PyErr_Occurred())
        return NULL;
    Dest *d = find_handle(self, handle);
    if (!d) {
        PyErr_Format(PyExc_KeyError, "no open stream %lld", handle);
        return NULL;
    }
    return Py_BuildValue("(KK)", (unsigned long long)d->have, (unsigned long long)d->nchunks);
}

static PyMethodDef Placer_methods[] = {
    {"open", (PyCFunction)(void (*)(void))Placer_open, METH_VARARGS | METH_KEYWORDS,
     "open(handle, comm, seq, src, stream, sig, buffer, base_nbytes, runs, itemsize, "
     "chunk_elems, nchunks, nelems): place this stream's chunks into buffer from now on"},
    {"close", (PyCFunction)Placer_close, METH_O, "close(handle): write nothing more there"},
    {"set_hold", (PyCFunction)Placer_set_hold, METH_VARARGS,
     "set_hold(handle, on): also hand up (placed) the stream's datagrams"},
    {"write", (PyCFunction)Placer_write, METH_VARARGS,
     "write(handle, offset, payload): recovered bytes; (c0, c1) or None"},
    {"feed", (PyCFunction)Placer_feed, METH_O, "feed(datagram): (progress, up, consumed, consumed_nbytes, duplicates, duplicate_eos)"},
    {"recv", (PyCFunction)Placer_recv, METH_VARARGS,
     "recv(fd, max_datagrams, linger_us=0, gap_us=0, watch=()): (progress, up, consumed, "
     "consumed_nbytes, duplicates, duplicate_eos)"},
    {"set_gro", (PyCFunction)Placer_set_gro, METH_O,
     "set_gro(fd): ask for UDP GRO on that socket; True if the kernel took it"},
    {"set_landing", (PyCFunction)Placer_set_landing, METH_O,
     "set_landing(on): read datagrams straight into their predicted place"},
    {"counters", (PyCFunction)Placer_counters, METH_NOARGS, "what was read, placed, handed up"},
    {"have", (PyCFunction)Placer_have, METH_O, "have(handle): (chunks held, nchunks)"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject PlacerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "polycast.runtime.transport._dgram.Placer",
    .tp_basicsize = sizeof(Placer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The open multicast streams of one process and their placement.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Placer_init,
    .tp_dealloc = (destructor)Placer_dealloc,
    .tp_methods = Placer_methods,
};

/* mac(key, header, payload): the 16-byte MAC engine/wire.py computes (tests check both). */
static PyObject *dgram_mac(PyObject *mod, PyObject *args) {
    Py_buffer key, a, b;
    if (!PyArg_ParseTuple(args, "y*y*y*", &key, &a, &b))
        return NULL;
    if (key.len > 64) {
        PyBuffer_Release(&key);
        PyBuffer_Release(&a);
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "a BLAKE2b key is at most 64 bytes");
        return NULL;
    }
    B2 s;
    uint8_t out[MAC_NBYTES];
    b2_init_key(&s, key.buf, (size_t)key.len, MAC_NBYTES);
    b2_update(&s, a.buf, (size_t)a.len);
    b2_update(&s, b.buf, (size_t)b.len);
    b2_final(&s, out);
    PyBuffer_Release(&key);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return PyBytes_FromStringAndSize((const char *)out, MAC_NBYTES);
}

static PyMethodDef module_methods[] = {
    {"send", dgram_send, METH_VARARGS, "send(fd, (addr, port), [(header, payload)], gso=True)"},
    {"send_chunks", dgram_send_chunks, METH_VARARGS,
     "send_chunks(fd, (addr, port), key, comm, seq, src, sig, stream, buffer, runs, itemsize, "
     "chunk_elems, nelems, c0, c1, gso=True): a stream's chunks [c0, c1) as datagrams"},
    {"mac", dgram_mac, METH_VARARGS, "mac(key, header, payload): BLAKE2b-128"},
    {"gso_available", dgram_gso_available, METH_NOARGS, "False once the kernel refused GSO"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_dgram",
                                       "The multicast datagram path in C.", -1,
                                       module_methods};

PyMODINIT_FUNC PyInit__dgram(void) {
    if (PyType_Ready(&PlacerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&PlacerType);
    if (PyModule_AddObject(m, "Placer", (PyObject *)&PlacerType) < 0) {
        Py_DECREF(&PlacerType);
        Py_DECREF(m);
        return NULL;
    }
    /* The interface this build has (dgram.py checks it against _dgram_abi.h as it is now:
     * a helper built before a change to these functions is not called). */
    if (PyModule_AddIntConstant(m, "BATCH", BATCH) < 0 ||
        PyModule_AddIntConstant(m, "ABI", DGRAM_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

