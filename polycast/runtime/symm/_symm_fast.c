/* One call for a repeated small call (comm -> here, no Python in between).
 * staged.py keeps an entry per call shape the first time such a call ran through the Python
 * path (which checked everything and chose this path); Comm.Allreduce / Comm.Bcast then hand
 * their arguments here first. A call is "mine" only when the arrays are exactly numpy arrays,
 * C-contiguous (recvbuf writable), of the kept dtype (the same dtype object) and size, with
 * the kept op / root / in-place, no symm job is queued and the communicator's run lock is
 * free: checked on every call, from the arrays themselves (the communicator's configuration
 * is fixed when it is made: nothing else can change a kept call's path). Anything else returns False with nothing touched, and the caller
 * takes the Python path (which raises every error). Python disarms it (disarm()) when the
 * symm path stops taking calls (broken barrier, refused staging, freed state, user symm
 * arrays). A wait longer than the spin and the yields returns to barrier.py's bounded loop
 * holding the call (pending), as start()/finish() do. */
#include "_symm.h"

unsigned long long n_fast;     /* calls the fast path ran (tests count them) */
PyObject *str_dtype;

static void entry_clear(Entry *en) {
    Py_CLEAR(en->dtype); Py_CLEAR(en->op); Py_CLEAR(en->what);
}

void unlock(struct Fast *f) {
    PyObject *r = PyObject_CallNoArgs(f->release);
    if (r) Py_DECREF(r); else PyErr_WriteUnraisable(f->release);
}

void drop_pending(struct Fast *f) {
    if (!f->pending) return;
    f->pending = 0;
    release(&f->pc);
    if (f->pc_locked) unlock(f);
}

void fast_free(Bar *b) {
    struct Fast *f = b->fast;
    if (!f) return;
    b->fast = NULL;
    drop_pending(f);
    for (int i = 0; i < f->nent; i++) entry_clear(&f->ent[i]);
    Py_XDECREF(f->ndarray); Py_XDECREF(f->in_place);
    Py_XDECREF(f->acquire); Py_XDECREF(f->release);
    Py_XDECREF(f->jobs); Py_XDECREF(f->last_what);
    PyMem_Free(f);
}

/* arm(ndarray, IN_PLACE, lock.acquire, lock.release, jobs, policy) (policy:
 * WaitPolicy.c_args, the calling threads') */
PyObject *Bar_arm(Bar *self, PyObject *args) {
    PyObject *o[5], *pol;
    pc_wait_policy p;
    if (!PyArg_ParseTuple(args, "O!OOOOO!", &PyType_Type, &o[0], &o[1], &o[2], &o[3], &o[4],
                          &PyTuple_Type, &pol) || !pc_wait_policy_parse(pol, &p))
        return NULL;
    fast_free(self);        /* (without slots, only single-copy calls can be added) */
    struct Fast *f = PyMem_Calloc(1, sizeof(struct Fast));
    if (!f) return PyErr_NoMemory();
    PyObject **dst[5] = {&f->ndarray, &f->in_place, &f->acquire, &f->release, &f->jobs};
    for (int i = 0; i < 5; i++) *dst[i] = Py_NewRef(o[i]);
    f->wait = p;
    self->fast = f;
    Py_RETURN_NONE;
}

PyObject *Bar_disarm(Bar *self, PyObject *noargs) {
    fast_free(self);
    Py_RETURN_NONE;
}

/* add(kind, nbytes, dtype, op or None, flag, sig, dtype code, op code, what[, cma])
 * cma: a single-copy allgather or broadcast (set_pids first), not a slotted call. */
PyObject *Bar_add(Bar *self, PyObject *args) {
    Entry en = {0};
    PyObject *dtype, *op, *what;
    if (!PyArg_ParseTuple(args, "inOOiKiiU|p", &en.kind, &en.nbytes, &dtype, &op, &en.flag,
                          &en.sig, &en.t, &en.opc, &what, &en.cma))
        return NULL;
    struct Fast *f = self->fast;
    int isz = 1;
    int P = self->size, ok = f && en.nbytes > 0;
    if (en.cma) {
        PyObject *got = PyObject_GetAttrString(dtype, "itemsize");
        if (!got) return NULL;
        en.isz = PyLong_AsSsize_t(got);
        Py_DECREF(got);
        if (en.isz == -1 && PyErr_Occurred()) return NULL;
        ok = ok && self->pids && en.isz > 0 && en.nbytes % en.isz == 0 && op == Py_None
             && (en.kind == K_ALLGATHER ? en.nbytes % P == 0 && en.flag == 0
                 : en.kind == K_BCAST && en.flag >= 0 && en.flag < P);
    } else switch (en.kind) {   /* (nbytes: recvbuf's; what a rank copies in must fit a slot) */
    case K_ALLREDUCE:
        ok = ok && en.nbytes <= self->half && PyUnicode_CheckExact(op)
             && fold_for(en.t, en.opc, &isz) && en.nbytes % isz == 0 && (en.flag & ~1) == 0;
        break;
    case K_REDUCE_SCATTER:
        ok = ok && en.nbytes * P <= self->half && PyUnicode_CheckExact(op)
             && fold_for(en.t, en.opc, &isz) && en.nbytes % isz == 0 && en.flag == 0;
        break;
    case K_ALLGATHER:
        ok = ok && en.nbytes % P == 0 && en.nbytes / P <= self->half && op == Py_None
             && en.flag == 0;
        break;
    case K_BCAST:
        ok = ok && en.nbytes <= self->half && op == Py_None && en.flag >= 0 && en.flag < P;
        break;
    default:
        ok = 0;
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "symm fast path: not armed, or not such a call");
        return NULL;
    }
    /* (a shape kept again, e.g. after a call the gate sent to Python: replaced, not doubled) */
    Entry *slot = lookup(f, en.kind, en.nbytes, dtype, op == Py_None ? NULL : op, en.flag);
    if (!slot) slot = f->nent < NENT ? &f->ent[f->nent++] : &f->ent[f->next++ % NENT];
    entry_clear(slot);
    en.dtype = Py_NewRef(dtype);
    en.op = op == Py_None ? NULL : Py_NewRef(op);
    en.what = Py_NewRef(what);
    *slot = en;
    Py_RETURN_NONE;
}

Entry *lookup(struct Fast *f, int kind, Py_ssize_t nbytes, PyObject *dtype,
                     PyObject *op, int flag) {
    for (int i = 0; i < f->nent; i++) {
        Entry *en = &f->ent[i];
        if (en->kind != kind || en->nbytes != nbytes || en->dtype != dtype || en->flag != flag)
            continue;
        if (en->op == op || (op && en->op && PyUnicode_Compare(en->op, op) == 0))
            return en;
    }
    return NULL;
}

/* Whether the call may run here now; 1 with the communicator's run lock taken. */
static int gate(struct Fast *f, Entry *en) {
    (void)en;
    Py_ssize_t nj = PyObject_Length(f->jobs);
    if (nj != 0) goto no;
    PyObject *got = PyObject_CallOneArg(f->acquire, Py_False);
    if (!got) goto no;
    int ok = got == Py_True;
    Py_DECREF(got);
    return ok;
no:
    PyErr_Clear();
    return 0;
}

/* The call (buffers in c) once its entry is found: True done, False not mine (nothing done),
 * -1 descriptors differ (nothing copied out: the caller raises MismatchError), n > 0 peers
 * still missing (pending: the caller waits in barrier.py's loop, then finish_pending()).
 * nonblocking (an I-variant): only a short spin, and a pending call gives the run lock back
 * (its rest is queued first in the communicator's job queue; no other fast call starts
 * while one is pending). */
#define NB_SPIN_S 10e-6
static PyObject *run_fast(Bar *b, Entry *en, Call *c, int nonblocking) {
    struct Fast *f = b->fast;
    if ((en->cma && nonblocking) || !gate(f, en)) {
        release(c);
        Py_RETURN_FALSE;
    }
    if (en->cma) return run_cma(b, en, c);
    unsigned long long e = ++b->epoch;
    c->e = e; c->kind = en->kind; c->t = en->t; c->op = en->opc;
    c->root = en->kind == K_BCAST ? en->flag : 0;
    f->last_e = e;
    Py_XSETREF(f->last_what, Py_NewRef(en->what));
    n_fast++;
    copy_in(b, c);
    __atomic_store_n(&b->ctrl[b->rank][S_SIG0 + (e & 1)], (uint64_t)en->sig, __ATOMIC_RELAXED);
    publish(b, S_EPOCH, e);
    pc_wait_policy nb = {f->wait.spin_s < NB_SPIN_S ? f->wait.spin_s : NB_SPIN_S, 0, 0, 0, 0};
    int n = wait_slot(b, -1, S_EPOCH, e, nonblocking ? &nb : &f->wait, 0.0);
    if (n > 0) {
        f->pc = *c;
        f->pc.cma = 0;
        f->pending = 1;
        f->pc_locked = !nonblocking;
        if (nonblocking) unlock(f);
        return PyLong_FromLong(n);
    }
    int same = sigs_equal(b, e);
    if (same) copy_out(b, c);
    release(c);
    unlock(f);
    if (same) Py_RETURN_TRUE;
    return PyLong_FromLong(-1);
}

static int get_buf(PyObject *o, Py_buffer *v, int writable) {
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The two arrays of an allreduce / allgather / reduce-scatter in c (send IN_PLACE: recv's
 * memory), and their dtype; 1 if they may be a fast call (*same: one memory), else 0 with
 * nothing held. */
static int two_arrays(struct Fast *f, PyObject *send, PyObject *recv, Call *c, PyObject **dt,
                      int *same) {
    *same = send == f->in_place;
    if (*same) send = recv;
    else if (Py_TYPE(send) != (PyTypeObject *)f->ndarray) return 0;
    if (Py_TYPE(recv) != (PyTypeObject *)f->ndarray) return 0;
    PyObject *d1 = PyObject_GetAttr(recv, str_dtype), *d2;
    if (!d1) { PyErr_Clear(); return 0; }
    Py_DECREF(d1);          /* (only compared: the array holds it) */
    if (!*same) {
        if (!(d2 = PyObject_GetAttr(send, str_dtype))) { PyErr_Clear(); return 0; }
        Py_DECREF(d2);
        if (d2 != d1) return 0;
    }
    *dt = d1;
    memset(c, 0, sizeof(*c));
    if (!get_buf(recv, &c->dst, 1)) return 0;
    c->has_dst = 1;
    if (!get_buf(send, &c->src, 0)) { release(c); return 0; }
    c->has_src = 1;
    char *s0 = c->src.buf, *d0 = c->dst.buf;
    if (s0 == d0 && c->src.len == c->dst.len) *same = 1;
    else if (s0 < d0 + c->dst.len && d0 < s0 + c->src.len) { release(c); return 0; }
    return 1;
}

static int nonblocking_arg(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t n,
                           const char *usage, int *nb) {
    if (nargs != n && nargs != n + 1) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *nb = nargs == n + 1 && PyObject_IsTrue(args[n]) == 1;
    return 0;
}

/* allreduce(sendbuf, recvbuf, op[, nonblocking]) */
PyObject *Bar_allreduce(Bar *self, PyObject *const *args, Py_ssize_t nargs) {
    struct Fast *f = self->fast;
    int nb, same;
    PyObject *dt;
    Call c;
    if (nonblocking_arg(args, nargs, 3, "allreduce(sendbuf, recvbuf, op[, nonblocking])",
                        &nb) < 0)
        return NULL;
    if (!f || f->pending || !PyUnicode_CheckExact(args[2])
        || !two_arrays(f, args[0], args[1], &c, &dt, &same))
        Py_RETURN_FALSE;
    Entry *en = c.src.len != c.dst.len ? NULL
        : lookup(f, K_ALLREDUCE, c.dst.len, dt, args[2], same);
    if (!en) { release(&c); Py_RETURN_FALSE; }
    return run_fast(self, en, &c, nb);
}

/* allgather(sendbuf, recvbuf[, nonblocking]): not in place (that takes the Python path) */
PyObject *Bar_allgather(Bar *self, PyObject *const *args, Py_ssize_t nargs) {
    struct Fast *f = self->fast;
    int nb, same;
    PyObject *dt;
    Call c;
    if (nonblocking_arg(args, nargs, 2, "allgather(sendbuf, recvbuf[, nonblocking])", &nb) < 0)
        return NULL;
    if (!f || f->pending || args[0] == Py_None
        || !two_arrays(f, args[0], args[1], &c, &dt, &same))
        Py_RETURN_FALSE;
    Entry *en = same || c.src.len * self->size != c.dst.len ? NULL
        : lookup(f, K_ALLGATHER, c.dst.len, dt, NULL, 0);
    if (!en) { release(&c); Py_RETURN_FALSE; }
    return run_fast(self, en, &c, nb);
}

/* reduce_scatter(sendbuf, recvbuf, op[, nonblocking]): not in place */
PyObject *Bar_reduce_scatter(Bar *self, PyObject *const *args, Py_ssize_t nargs) {
    struct Fast *f = self->fast;
    int nb, same;
    PyObject *dt;
    Call c;
    if (nonblocking_arg(args, nargs, 3, "reduce_scatter(sendbuf, recvbuf, op[, nonblocking])",
                        &nb) < 0)
        return NULL;
    if (!f || f->pending || !PyUnicode_CheckExact(args[2])
        || !two_arrays(f, args[0], args[1], &c, &dt, &same))
        Py_RETURN_FALSE;
    Entry *en = same || c.dst.len * self->size != c.src.len ? NULL
        : lookup(f, K_REDUCE_SCATTER, c.dst.len, dt, args[2], 0);
    if (!en) { release(&c); Py_RETURN_FALSE; }
    return run_fast(self, en, &c, nb);
}

/* bcast(buf, root[, nonblocking]) */
PyObject *Bar_bcast(Bar *self, PyObject *const *args, Py_ssize_t nargs) {
    struct Fast *f = self->fast;
    int nb;
    if (nonblocking_arg(args, nargs, 2, "bcast(buf, root[, nonblocking])", &nb) < 0)
        return NULL;
    PyObject *buf = args[0];
    if (!f || f->pending || Py_TYPE(buf) != (PyTypeObject *)f->ndarray
        || !PyLong_CheckExact(args[1]))
        Py_RETURN_FALSE;
    int overflow;
    long root = PyLong_AsLongAndOverflow(args[1], &overflow);
    if (overflow || root < 0 || root >= self->size) { PyErr_Clear(); Py_RETURN_FALSE; }
    PyObject *dt = PyObject_GetAttr(buf, str_dtype);
    if (!dt) { PyErr_Clear(); Py_RETURN_FALSE; }
    Py_DECREF(dt);
    Call c = {0};
    Py_buffer *v = root == self->rank ? &c.src : &c.dst;
    if (!get_buf(buf, v, root != self->rank)) Py_RETURN_FALSE;
    if (root == self->rank) c.has_src = 1; else c.has_dst = 1;
    Entry *en = lookup(f, K_BCAST, v->len, dt, NULL, (int)root);
    if (!en) { release(&c); Py_RETURN_FALSE; }
    return run_fast(self, en, &c, nb);
}

/* finish_pending() -> 0, or -1 (descriptors differ): a pending call, once every peer arrived.
 * A single-copy call may also answer -2 (a copy failed) or n > 0 (pending again, at its
 * closing barrier: last() says which epoch). */
PyObject *Bar_finish_pending(Bar *self, PyObject *noargs) {
    struct Fast *f = self->fast;
    int first;
    if (!f || !f->pending || missing_of(self, -1, S_EPOCH, f->pc.e, &first)) {
        PyErr_SetString(PyExc_RuntimeError, "symm fast path: nothing to finish, or early");
        return NULL;
    }
    if (f->pc.cma) {
        Call c = f->pc;             /* (the buffers and the run lock move to c) */
        f->pending = 0;
        if (c.cma == 1) {
            PyObject *got = cma_rest(self, &c);
            if (got == Py_True) { Py_DECREF(got); return PyLong_FromLong(0); }
            return got;
        }
        release(&c);
        unlock(f);
        return PyLong_FromLong(0);
    }
    int rc = 0;
    if (!sigs_equal(self, f->pc.e)) rc = -1;
    else copy_out(self, &f->pc);
    drop_pending(f);
    return PyLong_FromLong(rc);
}

/* drop_pending(): give up a pending call (its wait raised): buffers and run lock released. */
PyObject *Bar_drop_pending(Bar *self, PyObject *noargs) {
    if (self->fast) drop_pending(self->fast);
    Py_RETURN_NONE;
}


/* last() -> (epoch, what) of the last fast call (for barrier.py's wait and messages). */
PyObject *Bar_last(Bar *self, PyObject *noargs) {
    struct Fast *f = self->fast;
    if (!f || !f->last_what) Py_RETURN_NONE;
    return Py_BuildValue("KO", f->last_e, f->last_what);
}

/* call(kind, sendbuf, recvbuf, op or root, nonblocking): the one entry the dispatch uses
 * (polycast/dispatch/call.py), as allreduce(sendbuf, recvbuf, op), bcast(recvbuf, root),
 * allgather(sendbuf, recvbuf) or reduce_scatter(sendbuf, recvbuf, op) by kind. */
PyObject *Bar_call(Bar *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "call(kind, sendbuf, recvbuf, op_or_root, nonblocking)");
        return NULL;
    }
    long kind = PyLong_AsLong(args[0]);
    if (kind == -1 && PyErr_Occurred()) return NULL;
    PyObject *a[4];
    switch (kind) {
    case K_ALLREDUCE:
    case K_REDUCE_SCATTER:
        a[0] = args[1]; a[1] = args[2]; a[2] = args[3]; a[3] = args[4];
        return kind == K_ALLREDUCE ? Bar_allreduce(self, a, 4) : Bar_reduce_scatter(self, a, 4);
    case K_ALLGATHER:
        a[0] = args[1]; a[1] = args[2]; a[2] = args[4];
        return Bar_allgather(self, a, 3);
    case K_BCAST:
        a[0] = args[2]; a[1] = args[3]; a[2] = args[4];
        return Bar_bcast(self, a, 3);
    }
    Py_RETURN_FALSE;
}
