/* The compiled hot path of the symm epoch barrier and of small slotted calls
 * (polycast/runtime/symm/barrier.py and staged.py hold the same protocol in Python, the
 * fallback; both run the same layout, so a compiled rank and a Python rank interoperate).
 *
 * Layout (barrier.py): each rank's control block is an array of uint64 slots: EPOCH (0), the
 * call's descriptor at 1 + (epoch & 1), PROGRESS (3), SLEEP (4: non-zero while the rank sleeps
 * on a peer's futex). A rank stores its data, then its descriptor, then its epoch with a
 * release store; a waiter reads peers' epochs with acquire loads, so the data a peer wrote
 * before publishing is visible once its epoch is. A rank about to sleep raises SLEEP, fences
 * (seq_cst) and looks again before FUTEX_WAIT on the peer's epoch (its low 32 bits); a
 * publisher fences after its epoch store and wakes its own epoch's futex when any peer's SLEEP
 * is up: no wake-up is lost either way round.
 *
 * A wait spins, then sched_yields (the core goes to whoever is runnable: with more ranks than
 * cores, usually the peer waited for), then sleeps once on a futex, and returns how many peers
 * are still missing; barrier.py loops over it, checking the deadline and the driver's dead
 * peers between calls (every ~1-2 ms), so every wait stays bounded.
 *
 * Small slotted calls (staged.py: data published at epoch e lies in slot e & 1 of each rank's
 * slots segment) run whole here: copy in, publish, wait, compare descriptors, then copy out or
 * reduce in rank order (sum/prod of float32/float64, sum/prod/min/max of the integer types;
 * each element reduced in the same order as numpy's fold, so the bits agree). Anything else
 * stays in numpy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sched.h>
#include <errno.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <linux/futex.h>

enum { S_EPOCH = 0, S_SIG0 = 1, S_PROGRESS = 3, S_SLEEP = 4, S_ADDR = 5 };
enum { K_ALLREDUCE = 0, K_BCAST = 1, K_ALLGATHER = 2, K_REDUCE_SCATTER = 3 };
enum { OP_SUM = 1, OP_PROD = 2, OP_MIN = 3, OP_MAX = 4 };
enum { T_F32 = 1, T_F64, T_I8, T_I16, T_I32, T_I64, T_U8, T_U16, T_U32, T_U64 };

/* Copies and folds above this many bytes release the GIL. */
#define NOGIL_NBYTES (64 << 10)

typedef struct {
    PyObject_HEAD
    int size, rank;
    uint64_t **ctrl;        /* each rank's control block */
    char **slots;           /* each rank's slots segment (two slots of half bytes), or NULL */
    Py_ssize_t half;
    unsigned long long epoch;   /* the barrier's epoch (barrier.py reads and moves it here) */
    struct Fast *fast;          /* the kept repeated calls (NULL: none kept) */
    pid_t *pids;                /* each rank's process, for single-copy calls (NULL: none) */
    int cma_errno, cma_peer, cma_write;     /* the last single-copy failure */
} Bar;

/* Counts for the benches (bench/symm.py --floor): waits that had to wait, polls, yields,
 * sleeps. Per process, unsynchronised: only read while no call runs. */
static unsigned long long n_waits, n_polls, n_yields, n_sleeps;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Peers (every other rank, or only rank ``only`` when >= 0) whose slot is still below
 * target; *first: the lowest such rank. */
static int missing_of(Bar *b, int only, int slot, uint64_t target, int *first) {
    if (only >= 0) {
        *first = only;
        return __atomic_load_n(&b->ctrl[only][slot], __ATOMIC_ACQUIRE) < target;
    }
    int n = 0;
    for (int p = 0; p < b->size; p++) {
        if (p == b->rank) continue;
        if (__atomic_load_n(&b->ctrl[p][slot], __ATOMIC_ACQUIRE) < target) {
            if (!n) *first = p;
            n++;
        }
    }
    return n;
}

static void publish(Bar *b, int slot, uint64_t value) {
    uint64_t *own = b->ctrl[b->rank];
    __atomic_store_n(&own[slot], value, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (int p = 0; p < b->size; p++) {
        if (p != b->rank && __atomic_load_n(&b->ctrl[p][S_SLEEP], __ATOMIC_RELAXED)) {
            syscall(SYS_futex, (void *)&own[slot], FUTEX_WAKE, b->size, NULL, NULL, 0);
            return;
        }
    }
}

/* Spin for spin_s, sched_yield until yield_s after the start, then (sleep_s > 0) sleep once
 * for up to sleep_s: on the first missing peer's futex, or a plain nap without futexes.
 * Returns how many peers are still missing. The GIL is released past the spin. */
#define missing(b, slot, target, first) missing_of(b, only, slot, target, first)
static int wait_slot(Bar *b, int only, int slot, uint64_t target, double spin_s,
                     double yield_s, double sleep_s, int use_futex) {
    int first = 0;
    int n = missing(b, slot, target, &first);
    if (!n) return 0;
    n_waits++;
    double t0 = now_s();
    while (now_s() - t0 < spin_s) {
        for (int i = 0; i < 32; i++) cpu_relax();
        n_polls++;
        if (!(n = missing(b, slot, target, &first))) return 0;
    }
    if (yield_s <= 0 && sleep_s <= 0) return n;
    PyThreadState *ts = PyEval_SaveThread();
    while (now_s() - t0 < yield_s) {
        sched_yield();
        n_yields++;
        if (!(n = missing(b, slot, target, &first))) break;
    }
    if (n && sleep_s > 0) {
        struct timespec tv;
        tv.tv_sec = (time_t)sleep_s;
        tv.tv_nsec = (long)((sleep_s - (double)tv.tv_sec) * 1e9);
        if (use_futex) {
            uint64_t *own = b->ctrl[b->rank];
            __atomic_store_n(&own[S_SLEEP], 1, __ATOMIC_SEQ_CST);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            if ((n = missing(b, slot, target, &first))) {
                n_sleeps++;
                uint64_t *w = &b->ctrl[first][slot];
                uint64_t seen = __atomic_load_n(w, __ATOMIC_ACQUIRE);
                if (seen < target)      /* the low 32 bits (little-endian) */
                    syscall(SYS_futex, (void *)w, FUTEX_WAIT, (uint32_t)seen, &tv, NULL, 0);
            }
            __atomic_store_n(&own[S_SLEEP], 0, __ATOMIC_RELEASE);
        } else {
            nanosleep(&tv, NULL);
        }
        n = missing(b, slot, target, &first);
    }
    PyEval_RestoreThread(ts);
    return n;
}
#undef missing

/* ---- folds: out = b0 op b1 op ... in the order given --------------------------------- */
/* Vectorised (-O3) for the machine's widest unit where the compiler can dispatch at load
 * time (as numpy's loops do); each element is still one IEEE operation per rank, in order. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WIDE __attribute__((target_clones("avx2", "default")))
#else
#define WIDE
#endif
#define FOLD(NAME, T, EXPR)                                                              \
    WIDE static void NAME(char *out_, char **blk, int nb, Py_ssize_t n) {                 \
        T *out = (T *)out_;                                                               \
        const T *x = (const T *)blk[0], *y = (const T *)blk[1];                           \
        for (Py_ssize_t i = 0; i < n; i++) { T a = x[i], c = y[i]; out[i] = (EXPR); }     \
        for (int k = 2; k < nb; k++) {                                                    \
            y = (const T *)blk[k];                                                        \
            for (Py_ssize_t i = 0; i < n; i++) { T a = out[i], c = y[i]; out[i] = (EXPR); } \
        }                                                                                 \
    }
/* Signed sums and products wrap as numpy's do: computed in the unsigned type. */
#define INTFOLDS(S, T, U)                                                                 \
    FOLD(sum_##S, T, (T)((U)a + (U)c))                                                    \
    FOLD(prod_##S, T, (T)((U)a * (U)c))                                                   \
    FOLD(min_##S, T, (a <= c ? a : c))                                                    \
    FOLD(max_##S, T, (a >= c ? a : c))
FOLD(sum_f32, float, a + c)
FOLD(prod_f32, float, a * c)
FOLD(sum_f64, double, a + c)
FOLD(prod_f64, double, a * c)
INTFOLDS(i8, int8_t, uint8_t)
INTFOLDS(i16, int16_t, uint16_t)
INTFOLDS(i32, int32_t, uint32_t)
INTFOLDS(i64, int64_t, uint64_t)
INTFOLDS(u8, uint8_t, uint8_t)
INTFOLDS(u16, uint16_t, uint16_t)
INTFOLDS(u32, uint32_t, uint32_t)
INTFOLDS(u64, uint64_t, uint64_t)

typedef void (*fold_fn)(char *, char **, int, Py_ssize_t);

/* The fold for (dtype code, op code), NULL where numpy must do it (float min/max: numpy's
 * NaN and signed-zero rules). */
static fold_fn fold_for(int t, int op, int *itemsize) {
#define INTS(C, S, SZ) case C: *itemsize = SZ; \
        return op == OP_SUM ? sum_##S : op == OP_PROD ? prod_##S : op == OP_MIN ? min_##S \
             : op == OP_MAX ? max_##S : NULL;
    switch (t) {
    case T_F32: *itemsize = 4; return op == OP_SUM ? sum_f32 : op == OP_PROD ? prod_f32 : NULL;
    case T_F64: *itemsize = 8; return op == OP_SUM ? sum_f64 : op == OP_PROD ? prod_f64 : NULL;
    INTS(T_I8, i8, 1) INTS(T_I16, i16, 2) INTS(T_I32, i32, 4) INTS(T_I64, i64, 8)
    INTS(T_U8, u8, 1) INTS(T_U16, u16, 2) INTS(T_U32, u32, 4) INTS(T_U64, u64, 8)
    }
#undef INTS
    return NULL;
}

static PyObject *supports(PyObject *mod, PyObject *args) {
    int t, op, isz;
    if (!PyArg_ParseTuple(args, "ii", &t, &op)) return NULL;
    return PyBool_FromLong(fold_for(t, op, &isz) != NULL);
}

/* ---- the Barrier object ---------------------------------------------------------------- */
static void fast_free(Bar *b);

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

/* wait(only, slot, target, spin_s, yield_s, sleep_s, use_futex) -> peers still missing
 * (only: a rank, or -1 for every other rank). */
static PyObject *Bar_wait(Bar *self, PyObject *args) {
    int only, slot, fx;
    unsigned long long target;
    double spin, yld, sl;
    if (!PyArg_ParseTuple(args, "iiKdddp", &only, &slot, &target, &spin, &yld, &sl, &fx))
        return NULL;
    if (only >= self->size || only == self->rank) {
        PyErr_SetString(PyExc_ValueError, "wait: no such peer");
        return NULL;
    }
    return PyLong_FromLong(wait_slot(self, only, slot, target, spin, yld, sl, fx));
}

/* sigs_equal(epoch): whether every rank published the same descriptor at epoch. */
static int sigs_equal(Bar *b, uint64_t e) {
    int s = S_SIG0 + (int)(e & 1);
    uint64_t mine = __atomic_load_n(&b->ctrl[b->rank][s], __ATOMIC_RELAXED);
    for (int p = 0; p < b->size; p++)
        if (__atomic_load_n(&b->ctrl[p][s], __ATOMIC_ACQUIRE) != mine) return 0;
    return 1;
}

typedef struct {
    int kind, root, t, op;
    uint64_t e;
    Py_buffer src, dst;
    int has_src, has_dst;
    int cma;                /* a single-copy call (its pending phase: 1 opening, 2 closing) */
    Py_ssize_t isz;         /* (single-copy broadcast: the itemsize, for where it cuts) */
} Call;

static void release(Call *c) {
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

static void copy_in(Bar *b, Call *c) {
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

static void copy_out(Bar *b, Call *c) {
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

/* start(kind, epoch, sig, src, dst, root, dtype, op, spin_s, yield_s, use_futex) ->
 *   0: done; -1: done waiting but the descriptors differ (nothing copied out: raise);
 *   n > 0: n peers still missing after the spin and the yields (wait, then finish()). */
static PyObject *Bar_start(Bar *self, PyObject *args) {
    Call c;
    unsigned long long e, sig;
    PyObject *src, *dst;
    double spin, yld;
    int fx;
    if (!PyArg_ParseTuple(args, "iKKOOiiiddp", &c.kind, &e, &sig, &src, &dst, &c.root, &c.t,
                          &c.op, &spin, &yld, &fx))
        return NULL;
    c.e = e;
    if (parse_call(self, src, dst, &c) < 0) return NULL;
    int big = call_nbytes(self, &c) > NOGIL_NBYTES;
    PyThreadState *ts = big ? PyEval_SaveThread() : NULL;
    copy_in(self, &c);
    __atomic_store_n(&self->ctrl[self->rank][S_SIG0 + (e & 1)], (uint64_t)sig, __ATOMIC_RELAXED);
    publish(self, S_EPOCH, e);
    if (ts) PyEval_RestoreThread(ts);
    int n = wait_slot(self, -1, S_EPOCH, e, spin, yld, 0.0, fx);
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
static PyObject *Bar_finish(Bar *self, PyObject *args) {
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

/* ---- one call for a repeated small call (comm -> here, no Python in between) --------------
 * staged.py keeps an entry per call shape the first time such a call ran through the Python
 * path (which checked everything and chose this path); Comm.Allreduce / Comm.Bcast then hand
 * their arguments here first. A call is "mine" only when the arrays are exactly numpy arrays,
 * C-contiguous (recvbuf writable), of the kept dtype (the same dtype object) and size, with
 * the kept op / root / in-place, neither POLYCAST_SYMM nor POLYCAST_<COLL>_ALGO is set, no
 * symm job is queued and the communicator's run lock is free: checked on every call, from
 * the arrays themselves. Anything else returns False with nothing touched, and the caller
 * takes the Python path (which raises every error). Python disarms it (disarm()) when the
 * symm path stops taking calls (broken barrier, refused staging, freed state, user symm
 * arrays). A wait longer than the spin and the yields returns to barrier.py's bounded loop
 * holding the call (pending), as start()/finish() do. */
#define NENT 16
typedef struct {
    int kind, flag, t, opc;     /* flag: in place (allreduce) or the root (bcast) */
    int cma;                    /* single copy (see "single-copy calls" below), not slotted */
    Py_ssize_t nbytes, isz;
    unsigned long long sig;
    PyObject *dtype, *op, *what, *env_key;      /* owned; op NULL for bcast */
} Entry;

struct Fast {
    double spin_s, yield_s;
    int use_futex, nent, next, pending, pc_locked;    /* (pending: pc.cma, its phase) */
    PyObject *ndarray, *in_place, *env, *symm_key, *acquire, *release, *jobs;
    Entry ent[NENT];
    Call pc;                    /* the pending call: its buffers, and the run lock, held */
    unsigned long long last_e;
    PyObject *last_what;
};

static unsigned long long n_fast;     /* calls the fast path ran (tests count them) */
static unsigned long long n_single;   /* of them, single-copy calls */
static unsigned long long n_single_pending[2];  /* their waits left to Python, by barrier */
static PyObject *str_dtype;

static void entry_clear(Entry *en) {
    Py_CLEAR(en->dtype); Py_CLEAR(en->op); Py_CLEAR(en->what); Py_CLEAR(en->env_key);
}

static void unlock(struct Fast *f) {
    PyObject *r = PyObject_CallNoArgs(f->release);
    if (r) Py_DECREF(r); else PyErr_WriteUnraisable(f->release);
}

static void drop_pending(struct Fast *f) {
    if (!f->pending) return;
    f->pending = 0;
    release(&f->pc);
    if (f->pc_locked) unlock(f);
}

static void fast_free(Bar *b) {
    struct Fast *f = b->fast;
    if (!f) return;
    b->fast = NULL;
    drop_pending(f);
    for (int i = 0; i < f->nent; i++) entry_clear(&f->ent[i]);
    Py_XDECREF(f->ndarray); Py_XDECREF(f->in_place); Py_XDECREF(f->env);
    Py_XDECREF(f->symm_key); Py_XDECREF(f->acquire); Py_XDECREF(f->release);
    Py_XDECREF(f->jobs); Py_XDECREF(f->last_what);
    PyMem_Free(f);
}

/* arm(ndarray, IN_PLACE, environ_store, b"POLYCAST_SYMM", lock.acquire, lock.release, jobs,
 *     spin_s, yield_s, use_futex) */
static PyObject *Bar_arm(Bar *self, PyObject *args) {
    PyObject *o[7];
    double spin, yld;
    int fx;
    if (!PyArg_ParseTuple(args, "O!OO!O!OOOddp", &PyType_Type, &o[0], &o[1], &PyDict_Type,
                          &o[2], &PyBytes_Type, &o[3], &o[4], &o[5], &o[6], &spin, &yld, &fx))
        return NULL;
    fast_free(self);        /* (without slots, only single-copy calls can be added) */
    struct Fast *f = PyMem_Calloc(1, sizeof(struct Fast));
    if (!f) return PyErr_NoMemory();
    PyObject **dst[7] = {&f->ndarray, &f->in_place, &f->env, &f->symm_key, &f->acquire,
                         &f->release, &f->jobs};
    for (int i = 0; i < 7; i++) *dst[i] = Py_NewRef(o[i]);
    f->spin_s = spin; f->yield_s = yld; f->use_futex = fx;
    self->fast = f;
    Py_RETURN_NONE;
}

static PyObject *Bar_disarm(Bar *self, PyObject *noargs) {
    fast_free(self);
    Py_RETURN_NONE;
}

static Entry *lookup(struct Fast *f, int kind, Py_ssize_t nbytes, PyObject *dtype,
                     PyObject *op, int flag);

/* add(kind, nbytes, dtype, op or None, flag, sig, dtype code, op code, what, env_key[, cma])
 * cma: a single-copy allgather or broadcast (set_pids first), not a slotted call. */
static PyObject *Bar_add(Bar *self, PyObject *args) {
    Entry en = {0};
    PyObject *dtype, *op, *what, *key;
    if (!PyArg_ParseTuple(args, "inOOiKiiUO!|p", &en.kind, &en.nbytes, &dtype, &op, &en.flag,
                          &en.sig, &en.t, &en.opc, &what, &PyBytes_Type, &key, &en.cma))
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
    en.env_key = Py_NewRef(key);
    *slot = en;
    Py_RETURN_NONE;
}

static Entry *lookup(struct Fast *f, int kind, Py_ssize_t nbytes, PyObject *dtype,
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
    if (PyDict_GetItemWithError(f->env, f->symm_key) || PyDict_GetItemWithError(f->env, en->env_key)
        || PyErr_Occurred())
        goto no;
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

/* ---- single-copy calls (single.py's allgather and broadcast, kept like the small ones) ----
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
static PyObject *cma_rest(Bar *b, Call *c) {
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
        int n = wait_slot(b, -1, S_EPOCH, e, f->spin_s, f->yield_s, 0.0, f->use_futex);
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
static PyObject *run_cma(Bar *b, Entry *en, Call *c) {
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
    int n = wait_slot(b, -1, S_EPOCH, e, f->spin_s, f->yield_s, 0.0, f->use_futex);
    if (n > 0) {
        hold_pending(f, c, 1);
        return PyLong_FromLong(n);
    }
    return cma_rest(b, c);
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
    int n = nonblocking
        ? wait_slot(b, -1, S_EPOCH, e, f->spin_s < NB_SPIN_S ? f->spin_s : NB_SPIN_S, 0.0, 0.0, 0)
        : wait_slot(b, -1, S_EPOCH, e, f->spin_s, f->yield_s, 0.0, f->use_futex);
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
static PyObject *Bar_allreduce(Bar *self, PyObject *const *args, Py_ssize_t nargs) {
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
static PyObject *Bar_allgather(Bar *self, PyObject *const *args, Py_ssize_t nargs) {
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
static PyObject *Bar_reduce_scatter(Bar *self, PyObject *const *args, Py_ssize_t nargs) {
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
static PyObject *Bar_bcast(Bar *self, PyObject *const *args, Py_ssize_t nargs) {
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
static PyObject *Bar_finish_pending(Bar *self, PyObject *noargs) {
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
static PyObject *Bar_drop_pending(Bar *self, PyObject *noargs) {
    if (self->fast) drop_pending(self->fast);
    Py_RETURN_NONE;
}

/* cma_error() -> (peer, errno, wrote): where the last single-copy call's copy failed. */
static PyObject *Bar_cma_error(Bar *self, PyObject *noargs) {
    return Py_BuildValue("iiO", self->cma_peer, self->cma_errno,
                         self->cma_write ? Py_True : Py_False);
}

/* set_pids(pids): each rank's process id, for single-copy calls. */
static PyObject *Bar_set_pids(Bar *self, PyObject *args) {
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

/* last() -> (epoch, what) of the last fast call (for barrier.py's wait and messages). */
static PyObject *Bar_last(Bar *self, PyObject *noargs) {
    struct Fast *f = self->fast;
    if (!f || !f->last_what) Py_RETURN_NONE;
    return Py_BuildValue("KO", f->last_e, f->last_what);
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
    {"allreduce", (PyCFunction)(void (*)(void))Bar_allreduce, METH_FASTCALL,
     "a kept Allreduce: True, False (not mine), -1 (mismatch) or peers missing"},
    {"bcast", (PyCFunction)(void (*)(void))Bar_bcast, METH_FASTCALL, "a kept Bcast: as allreduce"},
    {"allgather", (PyCFunction)(void (*)(void))Bar_allgather, METH_FASTCALL,
     "a kept Allgather: as allreduce"},
    {"reduce_scatter", (PyCFunction)(void (*)(void))Bar_reduce_scatter, METH_FASTCALL,
     "a kept Reduce_scatter_block: as allreduce"},
    {"finish_pending", (PyCFunction)Bar_finish_pending, METH_NOARGS, "the rest of a pending call"},
    {"drop_pending", (PyCFunction)Bar_drop_pending, METH_NOARGS, "give a pending call up"},
    {"last", (PyCFunction)Bar_last, METH_NOARGS, "(epoch, what) of the last fast call"},
    {"cma_error", (PyCFunction)Bar_cma_error, METH_NOARGS, "where a single-copy call failed"},
    {"set_pids", (PyCFunction)Bar_set_pids, METH_VARARGS, "each rank's process id"},
    {"set_slots", (PyCFunction)Bar_set_slots, METH_VARARGS, "each rank's slots segment"},
    {"publish", (PyCFunction)Bar_publish, METH_VARARGS, "release-store a slot, wake sleepers"},
    {"wait", (PyCFunction)Bar_wait, METH_VARARGS, "spin, yield, sleep once: peers missing"},
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
