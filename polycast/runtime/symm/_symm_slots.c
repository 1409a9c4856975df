/* A small slotted call, run whole: copy in, publish, wait, compare the descriptors,
 * then copy out or fold (Barrier.start / finish, from barrier.py's run_small). */
#include "_symm.h"

void release(Call *c) {
    if (c->has_src) PyBuffer_Release(&c->src);
    if (c->has_dst) PyBuffer_Release(&c->dst);
}

/* Parses (kind, epoch, sig, src, dst, root, dtype, op, ...) and checks sizes against the
 * slots. src None: nothing to copy in (a broadcast's non-root); dst None: nothing out. */
static int parse_call(Bar *b, PyObject *src, PyObject *dst, Call *c) {
    c->has_src = c->has_dst = 0;
    if (!b->slots[0]) {
        PyErr_SetString(PyExc_RuntimeError, "symm fast path: no slots set");
        return -1;
    }
    if (src != Py_None) {
        if (PyObject_GetBuffer(src, &c->src, PyBUF_C_CONTIGUOUS) < 0) return -1;
        c->has_src = 1;
    }
    if (dst != Py_None) {
        if (PyObject_GetBuffer(dst, &c->dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
            release(c);
            return -1;
        }
        c->has_dst = 1;
    }
    Py_ssize_t in = c->has_src ? c->src.len : 0, out = c->has_dst ? c->dst.len : 0;
    int P = b->size, isz = 1;
    int ok;
    switch (c->kind) {
    case K_ALLREDUCE:
        ok = c->has_src && c->has_dst && in == out && in <= b->half
             && fold_for(c->t, c->op, &isz) && in % isz == 0;
        break;
    case K_BCAST:
        ok = c->root >= 0 && c->root < P && in <= b->half && out <= b->half
             && (b->rank == c->root ? c->has_src && !c->has_dst : c->has_dst && !c->has_src);
        break;
    case K_ALLGATHER:
        ok = c->has_src && c->has_dst && in * P == out && in <= b->half;
        break;
    case K_REDUCE_SCATTER:
        ok = c->has_src && c->has_dst && out * P == in && in <= b->half
             && fold_for(c->t, c->op, &isz) && out % isz == 0;
        break;
    default:
        ok = 0;
    }
    if (!ok) {
        release(c);
        PyErr_SetString(PyExc_ValueError, "symm fast path: buffers do not fit this call");
        return -1;
    }
    return 0;
}

void copy_in(Bar *b, Call *c) {
    char *mine = b->slots[b->rank] + (c->e & 1) * b->half;
    Py_ssize_t n = c->has_src ? c->src.len : 0;
    if (c->kind == K_ALLGATHER) {
        memcpy(mine, c->src.buf, n);
        char *own = (char *)c->dst.buf + (Py_ssize_t)b->rank * n;
        if (own != (char *)c->src.buf)      /* not IN_PLACE: our block, while peers arrive */
            memcpy(own, c->src.buf, n);
    } else if (c->has_src) {
        memcpy(mine, c->src.buf, n);
    }
}

void copy_out(Bar *b, Call *c) {
    Py_ssize_t off = (c->e & 1) * b->half;
    int P = b->size, r = b->rank, isz = 1;
    char *blk[P];
    switch (c->kind) {
    case K_ALLREDUCE:
        for (int p = 0; p < P; p++) blk[p] = b->slots[p] + off;
        if (P == 1) memcpy(c->dst.buf, blk[0], c->dst.len);
        else {
            fold_fn f = fold_for(c->t, c->op, &isz);
            f(c->dst.buf, blk, P, c->dst.len / isz);
        }
        break;
    case K_BCAST:
        if (r != c->root) memcpy(c->dst.buf, b->slots[c->root] + off, c->dst.len);
        break;
    case K_ALLGATHER: {
        Py_ssize_t n = c->src.len;
        for (int i = 1; i < P; i++) {
            int p = (r + i) % P;
            memcpy((char *)c->dst.buf + p * n, b->slots[p] + off, n);
        }
        break;
    }
    case K_REDUCE_SCATTER: {
        Py_ssize_t n = c->dst.len;      /* ours first, then the peers rotated (staged.py) */
        for (int i = 0; i < P; i++) blk[i] = b->slots[(r + i) % P] + off + (Py_ssize_t)r * n;
        if (P == 1) memcpy(c->dst.buf, blk[0], n);
        else {
            fold_fn f = fold_for(c->t, c->op, &isz);
            f(c->dst.buf, blk, P, n / isz);
        }
        break;
    }
    }
}

static Py_ssize_t call_nbytes(Bar *b, Call *c) {
    return (c->has_src ? c->src.len : 0) + (c->has_dst ? c->dst.len : 0) * (c->kind == K_ALLREDUCE ? b->size : 1);
}

/* start(kind, epoch, sig, src, dst, root, dtype, op, policy) -> (policy: WaitPolicy.c_args)
 *   0: done; -1: done waiting but the descriptors differ (nothing copied out: raise);
 *   n > 0: n peers still missing after the spin and the yields (wait, then finish()). */
PyObject *Bar_start(Bar *self, PyObject *args) {
    Call c;
    unsigned long long e, sig;
    PyObject *src, *dst;
    PyObject *pol;
    pc_wait_policy p;
    if (!PyArg_ParseTuple(args, "iKKOOiiiO!", &c.kind, &e, &sig, &src, &dst, &c.root, &c.t,
                          &c.op, &PyTuple_Type, &pol) || !pc_wait_policy_parse(pol, &p))
        return NULL;
    c.e = e;
    if (parse_call(self, src, dst, &c) < 0) return NULL;
    int big = call_nbytes(self, &c) > NOGIL_NBYTES;
    PyThreadState *ts = big ? PyEval_SaveThread() : NULL;
    copy_in(self, &c);
    __atomic_store_n(&self->ctrl[self->rank][S_SIG0 + (e & 1)], (uint64_t)sig, __ATOMIC_RELAXED);
    publish(self, S_EPOCH, e);
    if (ts) PyEval_RestoreThread(ts);
    int n = wait_slot(self, -1, S_EPOCH, e, &p, 0.0);
    if (n == 0) {
        if (!sigs_equal(self, e)) n = -1;
        else {
            ts = big ? PyEval_SaveThread() : NULL;
            copy_out(self, &c);
            if (ts) PyEval_RestoreThread(ts);
        }
    }
    release(&c);
    return PyLong_FromLong(n);
}

/* finish(kind, epoch, src, dst, root, dtype, op) -> 0, or -1 (descriptors differ): the rest
 * of a start() that returned n > 0, once every peer arrived. */
PyObject *Bar_finish(Bar *self, PyObject *args) {
    Call c;
    unsigned long long e;
    PyObject *src, *dst;
    if (!PyArg_ParseTuple(args, "iKOOiii", &c.kind, &e, &src, &dst, &c.root, &c.t, &c.op))
        return NULL;
    c.e = e;
    if (parse_call(self, src, dst, &c) < 0) return NULL;
    int rc = 0, first;
    if (missing_of(self, -1, S_EPOCH, e, &first)) {
        release(&c);
        PyErr_SetString(PyExc_RuntimeError, "symm fast path: finish before every peer arrived");
        return NULL;
    }
    if (!sigs_equal(self, e)) rc = -1;
    else {
        PyThreadState *ts = call_nbytes(self, &c) > NOGIL_NBYTES ? PyEval_SaveThread() : NULL;
        copy_out(self, &c);
        if (ts) PyEval_RestoreThread(ts);
    }
    release(&c);
    return PyLong_FromLong(rc);
}
