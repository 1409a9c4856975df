/* The compiled replay of a memoized call (optional; runtime/driver/replay.py uses it).
 *
 * The engine (polycast/engine) decides what a call does; for a collective it has seen
 * before (small, or whose large messages are all pulled DATA), on a rank whose every peer
 * is on a compiled shm ring, it hands this module the rank's program once (a Plan: steps
 * with kind, ring, tag, one byte run per buffer, reduce and pull flags, dependencies) and
 * then, per call, only the call's sequence number and arrays. Run carries the steps out as
 * the engine would, with the GIL released:
 *   - ready SENDs and COPYs first (in the engine's order: roots, then successors as their
 *     dependencies complete): a SEND is one DATA frame written into the peer's ring, its
 *     header byte-identical to wire.Header.pack (a peer on the Python path cannot tell);
 *   - then a ready RECV's frame, checked field by field (magic, version, kind DATA, flags,
 *     comm, seq, src, tag, stream, offset, length, signature), delivered or reduced into
 *     the destination;
 *   - a pulled DATA (a large message between ranks that read each other single-copy,
 *     engine/rendezvous.py) is the driver's descriptor frame, also byte-identical
 *     (driver/peers.py): a pulled SEND writes where its bytes lie and is done when the
 *     peer's acknowledgement names its seq; a pulled RECV reads the peer's bytes straight
 *     into place with process_vm_readv and writes the acknowledgement. A pulled DATA the
 *     engine held early comes in as (address, nbytes, seq) and is read when its RECV starts.
 *     Python keeps the seqs (passed in, handed back) and takes a run's written SENDs over;
 *   - waiting: as the one wait policy says (../transport/wait.h: spin, yield, then sleep on
 *     the rings' futex counters), up to the caller's bound without input.
 * A frame for a RECV of this call that has not started yet (its dependencies first) stays at
 * its ring's head until the RECV starts, as the engine would hold it; with nothing else
 * moving and a frame behind it, the run stops (the engine holds frames, the helper cannot).
 * Anything else stops the run with the frame UNCONSUMED and says why: a frame that is not
 * the expected DATA of this call (an ABORT, another signature, a driver frame, an
 * acknowledgement of something else, a descriptor it cannot read), a full ring, a reader that sleeps on a doorbell frame, a reducing copy onto
 * overlapping memory, no progress within the caller's bound (a dead or
 * stopped peer, a late one). The caller hands the engine the steps done (a downward-closed
 * set: a step starts only after its dependencies) and the engine carries on from there,
 * so every error is still raised by the Python engine, on every rank.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <linux/futex.h>

#include "../transport/_ring.h"
#include "../transport/wait.h"

#define MAX_STEPS 64
#define MAX_SLOTS 16
#define HEADER_NBYTES 44
/* Another sleeper of this process (the progress thread, runtime/driver/progress.py) sets and
 * clears the rings' sleeping flag without asking: cleared while we sleep, the writer's next
 * frame wakes nobody. So we sleep in the policy's slices, re-flagging each time, and in
 * short ones while the flag is someone else's. */
#define SLEEP_SHARED_S 200e-6
#define FUTEX2_SIZE_U32 0x02

struct waitv {                  /* the kernel's struct futex_waitv */
    uint64_t val, uaddr;
    uint32_t flags, reserved;
};
#define WAKE_ALL (1 << 30)      /* driver/peers.py WAKE_ALL */
/* Single-copy frames (runtime/transport/frames.py, runtime/transport/cma.py): a descriptor "<QQQ" (seq,
 * address, nbytes) followed by the engine header; an acknowledgement, the "<Q" seqs read. */
#define DESC_NBYTES 24
#define F_PULL 0x04             /* wire.F_PULL: a DATA its receiver reads when it wants */

enum { K_SEND = 0, K_RECV = 1, K_COPY = 2 };
enum { R_DONE = 0, R_WAIT = 1, R_FRAME = 2, R_FULL = 3, R_DOORBELL = 4, R_OVERLAP = 5,
       R_LIMIT = 6 };
enum { DT_F32 = 0, DT_F64 = 1, DT_I32 = 2, DT_I64 = 3, DT_NONE = -1 };
enum { OP_SUM = 0, OP_PROD = 1, OP_MIN = 2, OP_MAX = 3, OP_NONE = -1 };

typedef struct {
    int kind, reduce, buf, dst, slot;
    int pull;                           /* SEND/RECV: a pulled DATA (a descriptor frame) */
    uint32_t tag;
    uint64_t off, nbytes, doff;         /* byte offsets into buf / dst */
    uint32_t ndeps;
    uint64_t succ;                      /* successors, a bit per step */
} Step;

typedef struct {
    PyObject_HEAD
    uint32_t comm, rank, sig;
    int dt, op, nsteps, nslots;
    Step steps[MAX_STEPS];
    RingMap *in[MAX_SLOTS], *out[MAX_SLOTS];
    uint32_t peer[MAX_SLOTS];           /* the slot's peer (local rank: the header's src) */
    long pid[MAX_SLOTS];                /* its process, read by process_vm_readv (0: none) */
    uint64_t need[3];                   /* bytes of send, recv, tmp the steps reach */
    int writes[3];                      /* whether the steps write that buffer */
    unsigned long long runs, full;      /* calls run, calls that ran to the end */
    unsigned long long looks, yields;   /* looks at the rings that found nothing; yields */
    unsigned long long sleeps;          /* futex sleeps on the rings' data counters */
} Plan;

static inline void be32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static inline uint32_t rd32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* wire.Header(kind=DATA, comm, seq, src, tag, offset=0, length, sig, stream=0).pack():
 * "!HBBB3xIIIIIQII" = magic, version, kind, flags, pad, comm, seq, src, tag, stream,
 * offset, length, sig. */
static void pack_header(unsigned char *h, uint32_t comm, uint32_t seq, uint32_t src,
                        uint32_t tag, uint32_t length, uint32_t sig) {
    memset(h, 0, HEADER_NBYTES);
    h[0] = 0x50; h[1] = 0x43; h[2] = 1; h[3] = 1;
    be32(h + 8, comm); be32(h + 12, seq); be32(h + 16, src); be32(h + 20, tag);
    be32(h + 36, length); be32(h + 40, sig);
}

/* dst[i] = dst[i] op src[i], as numpy's ufunc(dst, src, out=dst) does. Integers wrap (as
 * numpy arrays do): done in unsigned arithmetic, where C defines it. */
#define REDUCE_LOOP(T, EXPR) do {                                                   \
        for (uint64_t i = 0; i < n; i++) {                                          \
            T a, b;                                                                 \
            memcpy(&a, dst + i * sizeof(T), sizeof(T));                             \
            memcpy(&b, src + i * sizeof(T), sizeof(T));                             \
            T c = (EXPR);                                                           \
            memcpy(dst + i * sizeof(T), &c, sizeof(T));                             \
        }                                                                           \
    } while (0)

/* Sum and product wrap in the unsigned type; min and max compare signed values. */
#define INT_REDUCE(U, S) do {                                                       \
        uint64_t n = nbytes / sizeof(U);                                            \
        if (op == OP_SUM) REDUCE_LOOP(U, a + b);                                    \
        else if (op == OP_PROD) REDUCE_LOOP(U, a * b);                              \
        else if (op == OP_MIN) REDUCE_LOOP(S, a < b ? a : b);                       \
        else REDUCE_LOOP(S, a > b ? a : b);                                         \
    } while (0)

static void reduce_into(char *dst, const char *src, uint64_t nbytes, int dt, int op) {
    switch (dt) {
    case DT_F32: {
        uint64_t n = nbytes / 4;
        if (op == OP_SUM) REDUCE_LOOP(float, a + b);
        else REDUCE_LOOP(float, a * b);
        break;
    }
    case DT_F64: {
        uint64_t n = nbytes / 8;
        if (op == OP_SUM) REDUCE_LOOP(double, a + b);
        else REDUCE_LOOP(double, a * b);
        break;
    }
    case DT_I32:
        INT_REDUCE(uint32_t, int32_t);
        break;
    default:
        INT_REDUCE(uint64_t, int64_t);
        break;
    }
}

static void Plan_dealloc(Plan *self) {
    for (int s = 0; s < self->nslots; s++) {
        Py_XDECREF(self->in[s]);
        Py_XDECREF(self->out[s]);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Plan(comm, rank, sig, dtype_code, op_code, slots, steps): slots [(RingMap in, RingMap
 * out, peer)], steps [(kind, slot, tag, buf, off, nbytes, dst, doff, reduce, ndeps,
 * successors)] with byte offsets; runtime/driver/replay.py makes it from the engine's
 * plan (engine/replay.py) and checks what C cannot (eligibility). */
static int Plan_init(Plan *self, PyObject *args, PyObject *kw) {
    unsigned long comm, rank, sig;
    int dt, op;
    PyObject *slots, *steps;
    if (!PyArg_ParseTuple(args, "kkkiiO!O!", &comm, &rank, &sig, &dt, &op, &PyList_Type,
                          &slots, &PyList_Type, &steps))
        return -1;
    if (self->nslots) {
        PyErr_SetString(PyExc_ValueError, "a replay Plan is made once");
        return -1;
    }
    Py_ssize_t ns = PyList_GET_SIZE(slots), nt = PyList_GET_SIZE(steps);
    if (ns > MAX_SLOTS || nt > MAX_STEPS || nt < 1) {
        PyErr_Format(PyExc_ValueError, "a replay plan has 1..%d steps and at most %d peers",
                     MAX_STEPS, MAX_SLOTS);
        return -1;
    }
    if (dt < DT_NONE || dt > DT_I64 || op < OP_NONE || op > OP_MAX) {
        PyErr_SetString(PyExc_ValueError, "unknown dtype or op code");
        return -1;
    }
    self->comm = comm; self->rank = rank; self->sig = sig; self->dt = dt; self->op = op;
    for (Py_ssize_t s = 0; s < ns; s++) {
        PyObject *in, *out;
        unsigned long peer;
        long pid = 0;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(slots, s), "O!O!k|l", &RingMapType, &in,
                              &RingMapType, &out, &peer, &pid))
            return -1;
        Py_INCREF(in); Py_INCREF(out);
        self->in[s] = (RingMap *)in; self->out[s] = (RingMap *)out;
        self->peer[s] = peer;
        self->pid[s] = pid;
        self->nslots = s + 1;
    }
    for (Py_ssize_t i = 0; i < nt; i++) {
        Step *st = &self->steps[i];
        unsigned long tag;
        unsigned long long off, nbytes, doff, succ;
        unsigned int ndeps;
        st->pull = 0;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(steps, i), "iikiKKiKpIK|p", &st->kind,
                              &st->slot, &tag, &st->buf, &off, &nbytes, &st->dst, &doff,
                              &st->reduce, &ndeps, &succ, &st->pull))
            return -1;
        st->tag = tag; st->off = off; st->nbytes = nbytes; st->doff = doff;
        st->ndeps = ndeps; st->succ = succ;
        if (st->kind < K_SEND || st->kind > K_COPY || st->buf < 0 || st->buf > 2
                || (st->kind == K_COPY && (st->dst < 0 || st->dst > 2))
                || (st->kind != K_COPY && (st->slot < 0 || st->slot >= ns))
                || (st->reduce && (dt == DT_NONE || op == OP_NONE))
                || (nt < 64 && (succ >> nt))
                /* a pulled step: a peer we can read, no reduction (read in place) */
                || (st->pull && (st->kind == K_COPY || st->reduce
                                 || self->pid[st->slot] <= 0))) {
            PyErr_Format(PyExc_ValueError, "replay step %zd is malformed", i);
            return -1;
        }
        if (st->nbytes) {
            if (self->need[st->buf] < off + nbytes)
                self->need[st->buf] = off + nbytes;
            if (st->kind == K_RECV)
                self->writes[st->buf] = 1;
            if (st->kind == K_COPY) {
                if (self->need[st->dst] < doff + nbytes)
                    self->need[st->dst] = doff + nbytes;
                self->writes[st->dst] = 1;
            }
        }
    }
    self->nsteps = (int)nt;
    return 0;
}

/* Write a frame into ``r``: prefix (``kind``, ``plen``), then ``hdr_n`` bytes of ``hdr``,
 * then ``nbytes`` of ``payload``. A DATA: kind HEADER_NBYTES, plen its payload's length; a
 * driver frame (KIND_CMA, KIND_CMA_DONE): its bytes all in ``hdr``, plen = hdr_n. 0 written,
 * -1 the ring lacks the space. */
static int write_frame(RingMap *r, uint32_t kind, uint64_t plen, const unsigned char *hdr,
                       uint64_t hdr_n, const char *payload, uint64_t nbytes) {
    uint64_t cap = r->cap;
    uint64_t total = pad16(PREFIX_NBYTES + hdr_n + nbytes);
    uint64_t head = __atomic_load_n(slot(r, SLOT_HEAD), __ATOMIC_RELAXED);     /* ours */
    uint64_t tail = __atomic_load_n(slot(r, SLOT_TAIL), __ATOMIC_ACQUIRE);
    uint64_t pos = head & (cap - 1);
    uint64_t skip = pos + total > cap ? cap - pos : 0;
    if (cap - (head - tail) < skip + total)
        return -1;
    if (skip) {
        put_prefix(r->data + pos, KIND_WRAP, 0);
        head += skip;
        pos = 0;
    }
    char *p = r->data + pos;
    put_prefix(p, kind, plen);
    memcpy(p + PREFIX_NBYTES, hdr, hdr_n);
    if (nbytes)
        memcpy(p + PREFIX_NBYTES + hdr_n, payload, nbytes);
    __atomic_store_n(slot(r, SLOT_HEAD), head + total, __ATOMIC_RELEASE);
    return 0;
}

/* (reader) give the ring back up to ``pos``; whether its writer was blocked on space. */
static int give_back(RingMap *r, uint64_t pos) {
    __atomic_store_n(slot(r, SLOT_TAIL), pos, __ATOMIC_RELEASE);
    if (bump_and_check(r, SLOT_SPACE_BELL, SLOT_WRITER_BLOCKED)) {
        __atomic_store_n(slot(r, SLOT_WRITER_BLOCKED), 0, __ATOMIC_RELAXED);
        return 1;
    }
    return 0;
}

typedef struct {
    uint64_t done, doorbell, blocked;
    int reason, nsent, nrecv;
    uint64_t sent_nbytes, recv_nbytes;
    uint64_t looks, yields, sleeps;
    uint64_t written;                   /* pulled SENDs written, not yet acknowledged */
    uint64_t seq[MAX_STEPS];            /* a pulled SEND's single-copy seq (written ones) */
    int nread, nowed;                   /* pulled RECVs read; their acks left to Python */
    int owed_slot[MAX_STEPS];
    uint64_t owed_seq[MAX_STEPS];
} Outcome;

/* A pulled DATA the engine holds early: where its bytes are (runtime/transport/cma.RemotePayload). */
typedef struct {
    uint64_t addr, nbytes, seq;
} Remote;

static inline void le64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }  /* "<Q" */
static inline uint64_t rd_le64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* Copy ``nbytes`` at ``addr`` in process ``pid`` into ``dst`` (process_vm_readv): 0, or -1
 * when the kernel refuses or the writer is gone (Python's reader then says why). */
static int read_remote(long pid, char *dst, uint64_t addr, uint64_t nbytes) {
    uint64_t done = 0;
    while (done < nbytes) {
        struct iovec lo = {dst + done, nbytes - done};
        struct iovec re = {(void *)(uintptr_t)(addr + done), nbytes - done};
        ssize_t got = process_vm_readv((pid_t)pid, &lo, 1, &re, 1, 0);
        if (got <= 0)
            return -1;
        done += (uint64_t)got;
    }
    return 0;
}

/* A frame went into ``r`` (slot ``s``): bump its data counter and wake a reader asleep on
 * it; a reader asleep in select needs a doorbell frame from Python: 1 (the slot marked). */
static int ring_bell(Outcome *o, RingMap *r, int s, int can_futex) {
    uint64_t sleeping = bump_and_check(r, SLOT_DATA_BELL, SLOT_READER_SLEEPING);
    if (!sleeping)
        return 0;
    if (sleeping == SLEEP_FUTEX && can_futex) {
        syscall(SYS_futex, (void *)slot(r, SLOT_DATA_BELL), FUTEX_WAKE, WAKE_ALL, NULL, NULL,
                0);
        return 0;
    }
    o->doorbell |= (uint64_t)1 << s;
    o->reason = R_DOORBELL;
    return 1;
}

/* We read the peer's single-copy payload ``seq``: say so in its ring (as driver/peers.py's
 * acknowledgement), or leave it to Python when the ring is full. */
static void acknowledge(Plan *pl, Outcome *o, int s, uint64_t seq, int can_futex) {
    unsigned char ack[8];
    le64(ack, seq);
    if (write_frame(pl->out[s], KIND_CMA_DONE, 8, ack, 8, NULL, 0) < 0) {
        o->owed_slot[o->nowed] = s;
        o->owed_seq[o->nowed++] = seq;
        return;
    }
    ring_bell(o, pl->out[s], s, can_futex);
}

/* Step i is done: its successors whose last dependency it was become ready (queued in
 * order, as the engine's ready deque). */
static inline void step_done(Outcome *o, const Step *st, int i, uint32_t *ndeps, int *queue,
                             int *qt, int *ndone) {
    o->done |= (uint64_t)1 << i;
    (*ndone)++;
    for (uint64_t m = st->succ; m; m &= m - 1) {
        int j = __builtin_ctzll(m);
        if (--ndeps[j] == 0)
            queue[(*qt)++] = j;
    }
}

/* Sleep until a frame may have come into one of the rings of ``slots`` (a bit per slot), at
 * most ``timeout_s``: the futex handshake of shm.py's readers (the writer bumps the data
 * counter, then wakes a reader whose sleeping flag says SLEEP_FUTEX). The flag is shared
 * with this process's other sleepers: set only where it is clear, cleared only where set
 * here; a ring whose reader sleeps on a doorbell frame (SLEEP_SELECT) keeps us awake.
 * Returns whether it slept. */
static int sleep_on_rings(Plan *pl, uint64_t slots, const uint64_t *pos, double timeout_s,
                          double slice_s) {
    struct waitv w[MAX_SLOTS];
    uint64_t mine = 0;
    int n = 0, ready = 0, shared = 0;
    for (uint64_t m = slots; m; m &= m - 1) {
        int s = __builtin_ctzll(m);
        RingMap *r = pl->in[s];
        w[n].val = (uint32_t)__atomic_load_n(slot(r, SLOT_DATA_BELL), __ATOMIC_ACQUIRE);
        w[n].uaddr = (uint64_t)(uintptr_t)slot(r, SLOT_DATA_BELL);
        w[n].flags = FUTEX2_SIZE_U32;
        w[n].reserved = 0;
        n++;
        uint64_t expected = 0;
        if (__atomic_compare_exchange_n(slot(r, SLOT_READER_SLEEPING), &expected, SLEEP_FUTEX,
                                        0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            mine |= (uint64_t)1 << s;
        else if (expected != SLEEP_FUTEX)
            ready = 1;          /* a select sleeper's flag: not ours to change; stay awake */
        else
            shared = 1;         /* another futex sleeper's: it may clear it under us */
    }
    if (shared && slice_s > SLEEP_SHARED_S)
        slice_s = SLEEP_SHARED_S;
    if (timeout_s > slice_s)
        timeout_s = slice_s;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (uint64_t m = slots; m && !ready; m &= m - 1) {
        int s = __builtin_ctzll(m);
        if (__atomic_load_n(slot(pl->in[s], SLOT_HEAD), __ATOMIC_ACQUIRE) > pos[s])
            ready = 1;
    }
    if (!ready && timeout_s > 0) {
        struct timespec ts = pc_deadline(timeout_s);
        syscall(SYS_futex_waitv, w, n, 0, &ts, CLOCK_MONOTONIC);
    }
    for (uint64_t m = mine; m; m &= m - 1) {
        uint64_t expected = SLEEP_FUTEX;
        __atomic_compare_exchange_n(slot(pl->in[__builtin_ctzll(m)], SLOT_READER_SLEEPING),
                                    &expected, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    return !ready && timeout_s > 0;
}

/* ``limit``: stop once that many steps are done (< 0: no limit); the tests interrupt a
 * replay at every step this way (the replay_step_limit test hook). */
static void run_steps(Plan *pl, uint32_t seq, char **base, uint64_t *pos, double wait_s,
                      const pc_wait_policy *policy, int can_futex, int limit,
                      const char **held, Remote *const *remote, uint64_t *cseq,
                      Outcome *o) {
    int ndone = 0;
    int n = pl->nsteps;
    uint32_t ndeps[MAX_STEPS];
    int queue[MAX_STEPS], qh = 0, qt = 0;
    uint64_t all = n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1);
    uint64_t waiting = 0;               /* RECVs started, not done */
    unsigned char hdr[HEADER_NBYTES], expect[MAX_SLOTS][24], expect_pull[MAX_SLOTS][24];
    unsigned char desc[DESC_NBYTES + HEADER_NBYTES];
    uint64_t behind[MAX_SLOTS];         /* a parked slot: where the frame after it starts */
    for (int i = 0; i < n; i++) {
        ndeps[i] = pl->steps[i].ndeps;
        if (!ndeps[i])
            queue[qt++] = i;
    }
    for (int s = 0; s < pl->nslots; s++) {
        /* what a frame from the slot's peer must start with, up to its tag */
        pack_header(hdr, pl->comm, seq, pl->peer[s], 0, 0, pl->sig);
        memcpy(expect[s], hdr, 20);
        hdr[4] = F_PULL;
        memcpy(expect_pull[s], hdr, 20);
    }
    double last = pc_now();     /* when input last came */
    pc_waiter w;                /* the wait since then (the policy's phases) */
    pc_wait_begin(&w, last);
    for (;;) {
        while (qh < qt) {
            int i = queue[qh];
            Step *st = &pl->steps[i];
            if (st->kind != K_RECV && limit >= 0 && ndone >= limit) {
                o->reason = R_LIMIT;
                return;
            }
            qh++;
            if (st->kind == K_SEND && st->pull) {
                /* A pulled DATA (driver/peers.py _send_single_copy): the descriptor of our
                 * bytes and the header flagged F_PULL; done on the peer's acknowledgement,
                 * our memory untouched until then. */
                RingMap *r = pl->out[st->slot];
                uint64_t cs = cseq[st->slot] + 1;
                le64(desc, cs);
                le64(desc + 8, (uint64_t)(uintptr_t)(base[st->buf] + st->off));
                le64(desc + 16, st->nbytes);
                pack_header(desc + DESC_NBYTES, pl->comm, seq, pl->rank, st->tag,
                            (uint32_t)st->nbytes, pl->sig);
                desc[DESC_NBYTES + 4] = F_PULL;
                if (write_frame(r, KIND_CMA, sizeof desc, desc, sizeof desc, NULL, 0) < 0) {
                    o->reason = R_FULL;
                    return;
                }
                cseq[st->slot] = cs;
                o->seq[i] = cs;
                o->written |= (uint64_t)1 << i;
                o->nsent++;
                o->sent_nbytes += st->nbytes;
                if (ring_bell(o, r, st->slot, can_futex))
                    return;     /* written, not done: the engine adopts it as written */
                continue;
            } else if (st->kind == K_SEND) {
                RingMap *r = pl->out[st->slot];
                pack_header(hdr, pl->comm, seq, pl->rank, st->tag, (uint32_t)st->nbytes,
                            pl->sig);
                if (write_frame(r, HEADER_NBYTES, st->nbytes, hdr, HEADER_NBYTES,
                                base[st->buf] + st->off, st->nbytes) < 0) {
                    o->reason = R_FULL;
                    return;
                }
                o->nsent++;
                o->sent_nbytes += st->nbytes;
                ring_bell(o, r, st->slot, can_futex);
            } else if (st->kind == K_COPY) {
                if (st->nbytes) {
                    char *src = base[st->buf] + st->off, *dst = base[st->dst] + st->doff;
                    if (st->reduce) {
                        if (src < dst + st->nbytes && dst < src + st->nbytes) {
                            o->reason = R_OVERLAP;      /* Python raises it, as always */
                            return;
                        }
                        reduce_into(dst, src, st->nbytes, pl->dt, pl->op);
                    } else if (src != dst) {
                        memmove(dst, src, st->nbytes);
                    }
                }
            } else if (remote[i] != NULL) {
                /* a pulled DATA held early, unread: read it now, as the engine's _start
                 * does (a refused read stops the run; Python's read then says why) */
                const Remote *rm = remote[i];
                if (read_remote(pl->pid[st->slot], base[st->buf] + st->off, rm->addr,
                                st->nbytes) < 0) {
                    o->reason = R_FRAME;
                    return;
                }
                o->nread++;
                acknowledge(pl, o, st->slot, rm->seq, can_futex);
            } else if (held[i] != NULL) {
                /* its frame came before the call (the engine's early buffer): as the
                 * engine's _start does with a held message */
                if (st->nbytes) {
                    if (st->reduce)
                        reduce_into(base[st->buf] + st->off, held[i], st->nbytes, pl->dt,
                                    pl->op);
                    else
                        memcpy(base[st->buf] + st->off, held[i], st->nbytes);
                }
            } else {
                waiting |= (uint64_t)1 << i;
                continue;
            }
            step_done(o, st, i, ndeps, queue, &qt, &ndone);
            if (o->reason == R_DOORBELL)
                return;         /* the peer sleeps until the caller sends it a doorbell */
        }
        if (o->done == all) {
            o->reason = R_DONE;
            return;
        }
        if (limit >= 0 && ndone >= limit) {
            o->reason = R_LIMIT;
            return;
        }
        int progressed = 0;
        uint64_t wanted = 0;            /* slots with a started RECV or an awaited ack */
        uint64_t parked = 0;            /* slots whose next frame waits for its RECV */
        for (int s = 0; s < pl->nslots; s++) {
            uint64_t mine = 0, acks = 0;
            for (uint64_t m = waiting | o->written; m; m &= m - 1) {
                int j = __builtin_ctzll(m);
                if (pl->steps[j].slot == s) {
                    if (pl->steps[j].kind == K_RECV)
                        mine |= (uint64_t)1 << j;
                    else
                        acks |= (uint64_t)1 << j;
                }
            }
            if (!mine && !acks)
                continue;
            wanted |= (uint64_t)1 << s;
            RingMap *r = pl->in[s];
            uint64_t cap = r->cap;
            uint64_t head = __atomic_load_n(slot(r, SLOT_HEAD), __ATOMIC_ACQUIRE);
            while (pos[s] < head) {
                uint64_t at = pos[s] & (cap - 1);
                const unsigned char *p = (const unsigned char *)r->data + at;
                uint32_t hdr_len;
                uint64_t plen;
                memcpy(&hdr_len, p, 4);
                memcpy(&plen, p + 4, 8);
                if (hdr_len == KIND_WRAP) {
                    pos[s] += cap - at;
                    if (give_back(r, pos[s]))
                        o->blocked |= (uint64_t)1 << s;
                    continue;
                }
                const unsigned char *body = p + PREFIX_NBYTES;
                uint64_t hl = hdr_len >= KIND_BASE ? 0 : hdr_len;
                if (plen > cap / 4 || at + pad16(PREFIX_NBYTES + hl + plen) > cap) {
                    o->reason = R_FRAME;
                    return;
                }
                uint64_t next = pos[s] + pad16(PREFIX_NBYTES + hl + plen);
                if (hdr_len == KIND_CMA_DONE) {
                    /* acknowledgements: each must name a SEND of ours awaiting it (else
                     * the frame is Python's, whole) */
                    uint64_t hit = 0;
                    if (!plen || plen % 8) {
                        o->reason = R_FRAME;
                        return;
                    }
                    for (uint64_t k = 0; k < plen; k += 8) {
                        uint64_t sq = rd_le64(body + k);
                        int found = -1;
                        for (uint64_t m = acks & ~hit; m; m &= m - 1) {
                            int j = __builtin_ctzll(m);
                            if (o->seq[j] == sq) {
                                found = j;
                                break;
                            }
                        }
                        if (found < 0) {
                            o->reason = R_FRAME;
                            return;
                        }
                        hit |= (uint64_t)1 << found;
                    }
                    pos[s] = next;
                    if (give_back(r, pos[s]))
                        o->blocked |= (uint64_t)1 << s;
                    o->written &= ~hit;
                    for (uint64_t m = hit; m; m &= m - 1) {
                        int j = __builtin_ctzll(m);
                        step_done(o, &pl->steps[j], j, ndeps, queue, &qt, &ndone);
                    }
                    progressed = 1;
                    break;
                }
                int pulled = hdr_len == KIND_CMA;
                const unsigned char *h = pulled ? body + DESC_NBYTES : body;
                static const unsigned char zeros[12];
                if ((pulled ? plen != DESC_NBYTES + HEADER_NBYTES : hdr_len != HEADER_NBYTES)
                        || memcmp(h, pulled ? expect_pull[s] : expect[s], 20)
                        || memcmp(h + 24, zeros, 12) || rd32(h + 40) != pl->sig) {
                    o->reason = R_FRAME;
                    return;
                }
                uint32_t tag = rd32(h + 20), length = rd32(h + 36);
                int i = -1;
                for (uint64_t m = mine; m; m &= m - 1) {
                    int j = __builtin_ctzll(m);
                    if (pl->steps[j].tag == tag) {
                        i = j;
                        break;
                    }
                }
                if (i < 0) {
                    /* A RECV of this call that has not started (its dependencies first:
                     * the engine would hold the frame): leave it at the ring's head and
                     * look at this ring again once the step starts. */
                    for (int j = 0; j < n && i < 0; j++) {
                        Step *sj = &pl->steps[j];
                        if (sj->kind == K_RECV && sj->slot == s && sj->tag == tag
                                && !(o->done >> j & 1) && !(waiting >> j & 1)
                                && remote[j] == NULL && held[j] == NULL)
                            i = j;
                    }
                    Step *sp = i >= 0 ? &pl->steps[i] : NULL;
                    if (sp != NULL && length == sp->nbytes && sp->pull == pulled
                            && (pulled ? rd_le64(body + 16) == length : plen == length)) {
                        parked |= (uint64_t)1 << s;
                        behind[s] = next;
                        break;
                    }
                    o->reason = R_FRAME;        /* wrong: Python's */
                    return;
                }
                Step *st = &pl->steps[i];
                if (length != st->nbytes || st->pull != pulled
                        || (pulled ? rd_le64(body + 16) != length : plen != length)) {
                    o->reason = R_FRAME;        /* wrong: Python's */
                    return;
                }
                if (pulled) {
                    if (length && read_remote(pl->pid[s], base[st->buf] + st->off,
                                              rd_le64(body + 8), length) < 0) {
                        o->reason = R_FRAME;    /* Python reads it again, and says why */
                        return;
                    }
                    o->nread++;
                } else if (length) {
                    char *dst = base[st->buf] + st->off;
                    const char *src = (const char *)h + HEADER_NBYTES;
                    if (st->reduce)
                        reduce_into(dst, src, length, pl->dt, pl->op);
                    else
                        memcpy(dst, src, length);
                }
                uint64_t sq = pulled ? rd_le64(body) : 0;
                pos[s] = next;
                if (give_back(r, pos[s]))
                    o->blocked |= (uint64_t)1 << s;
                if (pulled)
                    acknowledge(pl, o, s, sq, can_futex);
                o->nrecv++;
                o->recv_nbytes += length;
                waiting &= ~((uint64_t)1 << i);
                step_done(o, st, i, ndeps, queue, &qt, &ndone);
                progressed = 1;
                break;          /* its successors first, as the engine's pump does */
            }
        }
        if (progressed && o->reason == R_DOORBELL)
            return;             /* the peer sleeps until the caller sends it a doorbell */
        double now = pc_now();
        if (progressed) {
            last = now;
            pc_wait_begin(&w, now);
            continue;
        }
        /* Nothing moved. A frame may wait behind a parked one (an acknowledgement, the
         * DATA that would start the parked RECV): the engine's, which can hold frames. */
        for (uint64_t m = parked; m; m &= m - 1) {
            int s = __builtin_ctzll(m);
            if (__atomic_load_n(slot(pl->in[s], SLOT_HEAD), __ATOMIC_ACQUIRE) > behind[s]) {
                o->reason = R_FRAME;
                return;
            }
        }
        uint64_t look[MAX_SLOTS];           /* where new input would start, per ring */
        for (int s = 0; s < pl->nslots; s++)
            look[s] = parked >> s & 1 ? behind[s] : pos[s];
        if (now - last > wait_s) {
            o->reason = R_WAIT;
            return;
        }
        o->looks++;
        int phase = pc_wait_phase(&w, policy, now);
        if (phase == PC_SLEEP && can_futex) {
            /* Spun long enough with the core to ourselves (the peer we wait for runs
             * elsewhere, or is not running), or yielded long enough to others (a loaded
             * machine: a yielding task waits its turn; a woken one runs at once). Sleep,
             * so an idle core can take a waiting rank, and be woken by the peer's frame;
             * a slice that ended with nothing new sleeps on (only input restarts the spin). */
            if (sleep_on_rings(pl, wanted, look, wait_s - (now - last), policy->slice_s))
                o->sleeps++;
            continue;
        }
        if (phase == PC_SPIN) {
            pc_wait_spin();
            continue;
        }
        o->yields++;            /* (and without futexes, yield until the bound) */
        pc_wait_yield(&w);
    }
}

/* run(seq, send, recv, tmp, positions, (wait_seconds, policy), can_futex, step_limit, held,
 *     disjoint) -> (wait_seconds: no input for this long ends the run; policy:
 *     transport/wait.py's WaitPolicy.c_args)
 * (done_mask, reason, doorbell_slots, blocked_slots, nsent, sent_nbytes, nrecv,
 * recv_nbytes). ``positions`` (the in-rings' read positions, a list per slot) is updated in
 * place. ``held``: [(step, payload)] of RECVs whose frame the engine already holds (taken
 * when the step starts; not counted in nrecv). ``disjoint``: raise ValueError, with nothing
 * done, when send and recv share memory. */
static PyObject *Plan_run(Plan *self, PyObject *args) {
    unsigned long seq;
    PyObject *objs[3], *positions;
    double wait_s;
    int can_futex, limit = -1, disjoint = 0;
    PyObject *held_list = Py_None, *cseq_list = Py_None, *pol;
    pc_wait_policy policy;
    if (!PyArg_ParseTuple(args, "kOOOO!(dO!)p|iOpO", &seq, &objs[0], &objs[1], &objs[2],
                          &PyList_Type, &positions, &wait_s, &PyTuple_Type, &pol,
                          &can_futex, &limit, &held_list, &disjoint, &cseq_list)
            || !pc_wait_policy_parse(pol, &policy))
        return NULL;
    if (cseq_list != Py_None && (!PyList_Check(cseq_list)
                                 || PyList_GET_SIZE(cseq_list) != self->nslots)) {
        PyErr_SetString(PyExc_ValueError, "one single-copy seq per peer ring, or None");
        return NULL;
    }
    if (held_list != Py_None && !PyList_Check(held_list)) {
        PyErr_SetString(PyExc_TypeError, "held must be a list of (step, payload) or None");
        return NULL;
    }
    if (!self->nslots || PyList_GET_SIZE(positions) != self->nslots) {
        PyErr_SetString(PyExc_ValueError, "one read position per peer ring");
        return NULL;
    }
    uint64_t pos[MAX_SLOTS], cseq[MAX_SLOTS] = {0};
    for (int s = 0; s < self->nslots; s++) {
        pos[s] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(positions, s));
        if (PyErr_Occurred())
            return NULL;
        if (cseq_list != Py_None) {
            cseq[s] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(cseq_list, s));
            if (PyErr_Occurred())
                return NULL;
        }
        if (!self->in[s]->held || !self->out[s]->held) {
            PyErr_SetString(PyExc_ValueError, "ring mapping released");
            return NULL;
        }
    }
    Py_buffer views[3], hviews[MAX_STEPS];
    char *base[3] = {NULL, NULL, NULL};
    const char *held[MAX_STEPS] = {NULL};
    Remote remotes[MAX_STEPS];
    Remote *remote[MAX_STEPS] = {NULL};
    int got[3] = {0, 0, 0}, nheld = 0, pull_sends = 0;
    for (int i = 0; i < self->nsteps; i++)
        pull_sends |= self->steps[i].pull && self->steps[i].kind == K_SEND;
    if (pull_sends && cseq_list == Py_None) {
        PyErr_SetString(PyExc_ValueError, "a plan with pulled SENDs needs the single-copy seqs");
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t nh = held_list == Py_None ? 0 : PyList_GET_SIZE(held_list);
    if (nh > MAX_STEPS) {
        PyErr_SetString(PyExc_ValueError, "more held frames than steps");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < nh; k++) {
        int i;
        PyObject *obj;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(held_list, k), "iO", &i, &obj))
            goto out;
        if (i < 0 || i >= self->nsteps || self->steps[i].kind != K_RECV || held[i] != NULL
                || remote[i] != NULL) {
            PyErr_Format(PyExc_ValueError, "held frame for step %d, not a RECV of the plan", i);
            goto out;
        }
        if (PyTuple_Check(obj)) {
            /* (address, nbytes, seq): a pulled DATA held unread (runtime/transport/cma.py) */
            Remote *rm = &remotes[i];
            unsigned long long a, n, sq;
            if (!PyArg_ParseTuple(obj, "KKK", &a, &n, &sq))
                goto out;
            if (!self->steps[i].pull || n != self->steps[i].nbytes) {
                PyErr_Format(PyExc_ValueError, "held pulled DATA for step %d does not fit it",
                             i);
                goto out;
            }
            rm->addr = a; rm->nbytes = n; rm->seq = sq;
            remote[i] = rm;
            continue;
        }
        if (PyObject_GetBuffer(obj, &hviews[nheld], PyBUF_SIMPLE) < 0)
            goto out;
        nheld++;
        if ((uint64_t)hviews[nheld - 1].len != self->steps[i].nbytes) {
            PyErr_Format(PyExc_ValueError, "held frame of %zd bytes for step %d of %llu",
                         hviews[nheld - 1].len, i, (unsigned long long)self->steps[i].nbytes);
            goto out;
        }
        held[i] = hviews[nheld - 1].buf ? (const char *)hviews[nheld - 1].buf : "";
    }
    for (int b = 0; b < 3; b++) {
        if (!self->need[b])
            continue;
        if (objs[b] == Py_None) {
            PyErr_Format(PyExc_ValueError, "replay buffer %d is missing", b);
            goto out;
        }
        if (PyObject_GetBuffer(objs[b], &views[b],
                               self->writes[b] ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
            goto out;
        got[b] = 1;
        if ((uint64_t)views[b].len < self->need[b]) {
            PyErr_Format(PyExc_ValueError, "replay buffer %d holds %zd bytes, the plan "
                         "reaches %llu", b, views[b].len, (unsigned long long)self->need[b]);
            goto out;
        }
        base[b] = (char *)views[b].buf;
    }
    /* a call straight from the comm layer (runtime/driver/direct.py) hands the user's own
     * send and recv: memory they share is Python's to refuse, before anything moves */
    if (disjoint && got[0] && got[1] && base[0] < base[1] + views[1].len
            && base[1] < base[0] + views[0].len) {
        PyErr_SetString(PyExc_ValueError, "replay send and recv buffers overlap");
        goto out;
    }
    Outcome o;
    memset(&o, 0, sizeof o);
    o.reason = R_WAIT;
    Py_BEGIN_ALLOW_THREADS
    run_steps(self, (uint32_t)seq, base, pos, wait_s, &policy, can_futex, limit,
              held, remote, cseq, &o);
    Py_END_ALLOW_THREADS
    self->runs++;
    self->looks += o.looks;
    self->yields += o.yields;
    self->sleeps += o.sleeps;
    if (o.reason == R_DONE)
        self->full++;
    for (int s = 0; s < self->nslots; s++) {
        PyObject *v = PyLong_FromUnsignedLongLong(pos[s]);
        if (v == NULL || PyList_SetItem(positions, s, v) < 0)
            goto out;
    }
    if (cseq_list != Py_None)
        for (int s = 0; s < self->nslots; s++) {
            PyObject *v = PyLong_FromUnsignedLongLong(cseq[s]);
            if (v == NULL || PyList_SetItem(cseq_list, s, v) < 0)
                goto out;
        }
    PyObject *written = NULL, *owed = NULL;
    /* None when empty (the common case: a whole call) */
    if ((o.written && (written = PyList_New(0)) == NULL)
            || (o.nowed && (owed = PyList_New(0)) == NULL))
        goto lists_failed;
    {
        for (uint64_t m = o.written; m; m &= m - 1) {
            int j = __builtin_ctzll(m);
            PyObject *t = Py_BuildValue("(iK)", j, (unsigned long long)o.seq[j]);
            if (t == NULL || PyList_Append(written, t) < 0) {
                Py_XDECREF(t);
                goto lists_failed;
            }
            Py_DECREF(t);
        }
        for (int k = 0; k < o.nowed; k++) {
            PyObject *t = Py_BuildValue("(iK)", o.owed_slot[k],
                                        (unsigned long long)o.owed_seq[k]);
            if (t == NULL || PyList_Append(owed, t) < 0) {
                Py_XDECREF(t);
                goto lists_failed;
            }
            Py_DECREF(t);
        }
    }
    result = Py_BuildValue("(KiKKiKiKOOi)", (unsigned long long)o.done, o.reason,
                           (unsigned long long)o.doorbell, (unsigned long long)o.blocked,
                           o.nsent, (unsigned long long)o.sent_nbytes, o.nrecv,
                           (unsigned long long)o.recv_nbytes, written ? written : Py_None,
                           owed ? owed : Py_None, o.nread);
lists_failed:
    Py_XDECREF(written);
    Py_XDECREF(owed);
out:
    for (int b = 0; b < 3; b++)
        if (got[b])
            PyBuffer_Release(&views[b]);
    for (int k = 0; k < nheld; k++)
        PyBuffer_Release(&hviews[k]);
    return result;
}

static PyObject *Plan_counts(Plan *self, PyObject *unused) {
    return Py_BuildValue("(KKKKK)", self->runs, self->full, self->looks, self->yields,
                         self->sleeps);
}

static PyMethodDef Plan_methods[] = {
    {"run", (PyCFunction)Plan_run, METH_VARARGS,
     "run(seq, send, recv, tmp, positions, (wait_seconds, WaitPolicy.c_args), "
     "can_futex, step_limit=-1, held=None, disjoint=False, cma_seqs=None) -> "
     "(done_mask, reason, doorbell_slots, blocked_slots, nsent, sent_nbytes, nrecv, "
     "recv_nbytes, written, owed, nread)"},
    {"counts", (PyCFunction)Plan_counts, METH_NOARGS,
     "(calls run, calls run to the end, looks at the rings that found nothing, yields, "
     "futex sleeps)"},
    {NULL}
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polycast.runtime.transport._ring.ReplayPlan",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One rank's program of a memoized small call, replayed over compiled rings.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
};

int replay_add_types(PyObject *m) {
    if (PyType_Ready(&PlanType) < 0)
        return -1;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "ReplayPlan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        return -1;
    }
    return 0;
}
