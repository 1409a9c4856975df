/* Single-copy calls (single.py's allgather and broadcast, kept like the small ones).
 * Above the slots, or from 512 KiB a rank when every rank has a core, an allgather or a
 * broadcast on one host reads (and the broadcast's root writes) the peers' arrays with
 * process_vm_readv / writev: each rank publishes its array's address in its ADDR slot, then
 * the opening barrier (descriptors compared: a mismatch copies nothing), the copies (GIL
 * released), and a closing barrier that keeps every array in the call until its readers are
 * done. single.py runs the same protocol in Python with the same descriptors, so a rank here
 * and a rank there interoperate. A wait beyond the spin and the yields returns pending, in
 * its phase (1: at the opening barrier, 2: at the closing one), to barrier.py's bounded loop,
 * which calls finish_pending() until it is done. A failed copy returns -2 with nothing more
 * done (cma_error() says which peer and why; barrier.py raises PeerLost for ESRCH and marks
 * the barrier broken, as single.py does). Blocking calls only: an I-variant takes Python. */
#include "_symm.h"

unsigned long long n_single;   /* fast calls that were single-copy calls */
unsigned long long n_single_pending[2];  /* their waits left to Python, by barrier */

static int cma_move(pid_t pid, char *local, uint64_t remote, Py_ssize_t n, int write) {
    while (n > 0) {
        struct iovec l = {local, (size_t)n}, r = {(void *)(uintptr_t)remote, (size_t)n};
        ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                            : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (got == 0) return EFAULT;
        local += got; remote += (uint64_t)got; n -= got;
    }
    return 0;
}

/* The copies of a single-copy call whose opening barrier passed (GIL released): allgather
 * reads every peer's block straight into dst; a broadcast's root writes the last n / P
 * elements of every other rank's array while each of them reads the rest from the root's
 * (single.py's bcast). 0, or the errno (b->cma_peer, b->cma_write: where it failed). */
static int cma_copies(Bar *b, Call *c) {
    int P = b->size, r = b->rank, err = 0, p = 0, write = 0;
    if (c->kind == K_ALLGATHER) {
        Py_ssize_t n = c->src.len;
        for (int i = 1; i < P && !err; i++) {
            p = (r + i) % P;
            err = cma_move(b->pids[p], (char *)c->dst.buf + p * n,
                           __atomic_load_n(&b->ctrl[p][S_ADDR], __ATOMIC_RELAXED), n, 0);
        }
    } else {
        Py_ssize_t n = r == c->root ? c->src.len : c->dst.len, count = n / c->isz;
        Py_ssize_t cut = (count - count / P) * c->isz;
        if (r == c->root) {
            write = 1;
            for (int i = 1; i < P && !err; i++) {
                p = (r + i) % P;
                err = cma_move(b->pids[p], (char *)c->src.buf + cut,
                               __atomic_load_n(&b->ctrl[p][S_ADDR], __ATOMIC_RELAXED) + cut,
                               n - cut, 1);
            }
        } else {
            p = c->root;
            err = cma_move(b->pids[p], c->dst.buf,
                           __atomic_load_n(&b->ctrl[p][S_ADDR], __ATOMIC_RELAXED), cut, 0);
        }
    }
    if (err) { b->cma_errno = err; b->cma_peer = p; b->cma_write = write; }
    return err;
}

static void hold_pending(struct Fast *f, Call *c, int phase) {
    n_single_pending[phase - 1]++;
    f->pc = *c;
    f->pc.cma = phase;
    f->pending = 1;
    f->pc_locked = 1;
}

/* A single-copy call c (buffers and run lock held) once every peer reached its opening
 * barrier: compare the descriptors, copy, then the closing barrier. True, -1 (descriptors
 * differ: nothing copied), -2 (a copy failed) or n > 0 (pending at the closing barrier). */
PyObject *cma_rest(Bar *b, Call *c) {
    struct Fast *f = b->fast;
    long rc = 0;
    if (!sigs_equal(b, c->e)) rc = -1;
    else {
        PyThreadState *ts = PyEval_SaveThread();
        int err = cma_copies(b, c);
        PyEval_RestoreThread(ts);
        if (err) rc = -2;
    }
    if (rc == 0) {
        unsigned long long e = ++b->epoch;      /* the closing barrier (descriptor 0) */
        c->e = e;
        f->last_e = e;
        __atomic_store_n(&b->ctrl[b->rank][S_SIG0 + (e & 1)], 0, __ATOMIC_RELAXED);
        publish(b, S_EPOCH, e);
        int n = wait_slot(b, -1, S_EPOCH, e, &f->wait, 0.0);
        if (n > 0) {
            hold_pending(f, c, 2);
            return PyLong_FromLong(n);
        }
    }
    release(c);
    unlock(f);
    if (rc == 0) Py_RETURN_TRUE;
    return PyLong_FromLong(rc);
}

/* A kept single-copy call, the run lock taken: publish our array's address (and copy our
 * own block, allgather), then the opening barrier. */
PyObject *run_cma(Bar *b, Entry *en, Call *c) {
    struct Fast *f = b->fast;
    unsigned long long e = ++b->epoch;
    c->e = e; c->kind = en->kind; c->isz = en->isz;
    c->root = en->kind == K_BCAST ? en->flag : 0;
    f->last_e = e;
    Py_XSETREF(f->last_what, Py_NewRef(en->what));
    n_fast++;
    n_single++;
    char *mine = c->has_src ? c->src.buf : c->dst.buf;
    __atomic_store_n(&b->ctrl[b->rank][S_ADDR], (uint64_t)(uintptr_t)mine, __ATOMIC_RELAXED);
    if (en->kind == K_ALLGATHER) {      /* our block, while the peers arrive (not in place) */
        PyThreadState *ts = PyEval_SaveThread();
        memcpy((char *)c->dst.buf + (Py_ssize_t)b->rank * c->src.len, c->src.buf, c->src.len);
        PyEval_RestoreThread(ts);
    }
    __atomic_store_n(&b->ctrl[b->rank][S_SIG0 + (e & 1)], (uint64_t)en->sig, __ATOMIC_RELAXED);
    publish(b, S_EPOCH, e);
    int n = wait_slot(b, -1, S_EPOCH, e, &f->wait, 0.0);
    if (n > 0) {
        hold_pending(f, c, 1);
        return PyLong_FromLong(n);
    }
    return cma_rest(b, c);
}

/* cma_error() -> (peer, errno, wrote): where the last single-copy call's copy failed. */
PyObject *Bar_cma_error(Bar *self, PyObject *noargs) {
    return Py_BuildValue("iiO", self->cma_peer, self->cma_errno,
                         self->cma_write ? Py_True : Py_False);
}

/* set_pids(pids): each rank's process id, for single-copy calls. */
PyObject *Bar_set_pids(Bar *self, PyObject *args) {
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
    PyObject *fast = PySequence_Fast(seq, "a sequence of process ids");
    if (!fast) return NULL;
    pid_t *pids = NULL;
    if (PySequence_Fast_GET_SIZE(fast) != self->size) {
        PyErr_SetString(PyExc_ValueError, "one process id per rank");
        goto fail;
    }
    if (!(pids = PyMem_Calloc(self->size, sizeof(pid_t)))) { PyErr_NoMemory(); goto fail; }
    for (int p = 0; p < self->size; p++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, p));
        if (v == -1 && PyErr_Occurred()) goto fail;
        pids[p] = (pid_t)v;
    }
    Py_DECREF(fast);
    PyMem_Free(self->pids);
    self->pids = pids;
    Py_RETURN_NONE;
fail:
    PyMem_Free(pids);
    Py_DECREF(fast);
    return NULL;
}
