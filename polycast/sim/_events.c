/* The fast path's events mode in C: polycast/sim/fast_events.py's loop (its docstring says
 * what it mirrors: the engines' order), run on the plan's arrays and the compiled network
 * state with no Python per event. fast_events.py builds the arrays once (_EventRun), calls
 * run() here when the compiled model is in use and the run needs nothing the loop leaves to
 * Python (a NIC model, in-network reduction), and commits the results itself.
 *
 * One rule: every event, push and channel start happens in the Python loop's order, so
 * that the heap's (time, push order) and the network's flow ids come out the same. */
#include "_network.h"
#include <math.h>
#include <string.h>

enum { E_POST, E_SENDDONE, E_ARR, E_MARR, E_PACE, E_KICK };
enum { I_MSG, I_MCAST, I_EOS };          /* a channel's items: a message, a stream's data, its end */

typedef struct { double t; long long seq; int kind; int64_t a, b; } Ev;
typedef struct { double t; int64_t n; int64_t next; int type; } Item;

typedef struct {
    /* the plan (read-only but deps_left, steps_left, mrecv_left: the run's counters) */
    int64_t N, M, Q, C;
    const int64_t *kind, *q, *local, *mem, *wire, *nbytes, *ep, *chan, *recv_of_send;
    const double *lat, *t_eos, *t_next, *mcap, *goodput, *post_t;
    int64_t *deps_left;
    const int64_t *succ_ptr, *succ;
    const int64_t *lk_ptr; const int32_t *lk;
    const int64_t *mbase, *nmem, *fin_of, *mq;
    const int8_t *mfin;
    int64_t *steps_left, *mrecv_left;
    const int64_t *roots_ptr, *roots;
    const int64_t *mg_ptr, *g_ptr, *g_nodes; const double *g_lat;
    double *done_t, *start_t, *completed, *pacer;
    int paced;
    int64_t SEND, RECV, COPY, MCAST, MRECV, FIN;
    double time_rtol;
    /* the run */
    State *net;
    double now;
    long long events, seq, pending;
    char *arrived, *started, *fin_out, *fin_in, *done_m, *busy, *inkick;
    Ev *heap; Py_ssize_t hn, hcap;
    Item *items; int64_t nitems, icap;
    int64_t *head, *tail;                /* per channel: its items, a list through Item.next */
    int64_t *kick; int64_t nkick, kcap;
    int64_t *ready; int64_t nready, rcap;
    FlowObject **drained; int64_t ndrained, dcap;
} Run;

static int grow64(void **p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = PyMem_Realloc(*p, (size_t)c * size);
    if (!q) { PyErr_NoMemory(); return -1; }
    *p = q;
    *cap = c;
    return 0;
}

static inline double same_time_bound(const Run *r, double t) {
    return t + fabs(t) * r->time_rtol + 1e-18;       /* network.same_time_bound */
}

/* -- the event heap: (time, push order) ---------------------------------------------- */
static inline int ev_less(const Ev *a, const Ev *b) {
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int push(Run *r, double t, int kind, int64_t a, int64_t b) {
    if (r->hn == r->hcap) {
        Py_ssize_t c = r->hcap ? 2 * r->hcap : 1024;
        Ev *h = PyMem_Realloc(r->heap, (size_t)c * sizeof(Ev));
        if (!h) { PyErr_NoMemory(); return -1; }
        r->heap = h;
        r->hcap = c;
    }
    Ev e = {t, ++r->seq, kind, a, b};
    Py_ssize_t i = r->hn++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!ev_less(&e, &r->heap[p])) break;
        r->heap[i] = r->heap[p];
        i = p;
    }
    r->heap[i] = e;
    return 0;
}

static Ev pop(Run *r) {
    Ev top = r->heap[0];
    Ev last = r->heap[--r->hn];
    Py_ssize_t i = 0, n = r->hn;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && ev_less(&r->heap[c + 1], &r->heap[c])) c++;
        if (!ev_less(&r->heap[c], &last)) break;
        r->heap[i] = r->heap[c];
        i = c;
    }
    if (n) r->heap[i] = last;
    return top;
}

/* A message's two events (_push_msg: one heap entry each here, the same order). */
static int push_msg(Run *r, int64_t n, double lat) {
    if (push(r, r->now, E_SENDDONE, n, 0) < 0) return -1;
    return push(r, r->now + lat, E_ARR, n, 0);
}

/* -- channels (_emit, _flush, _start_next) -------------------------------------------- */
static int emit(Run *r, int64_t key, int type, int64_t n, double t) {
    if (r->nitems == r->icap && grow64((void **)&r->items, &r->icap, r->nitems + 1,
                                       sizeof(Item)) < 0)
        return -1;
    int64_t i = r->nitems++;
    r->items[i] = (Item){t, n, -1, type};
    if (r->tail[key] >= 0) r->items[r->tail[key]].next = i;
    else r->head[key] = i;
    r->tail[key] = i;
    if (!r->busy[key] && !r->inkick[key]) {
        if (r->nkick == r->kcap && grow64((void **)&r->kick, &r->kcap, r->nkick + 1,
                                          sizeof(int64_t)) < 0)
            return -1;
        r->kick[r->nkick++] = key;
        r->inkick[key] = 1;
    }
    return 0;
}

static inline void chan_pop(Run *r, int64_t key) {
    int64_t i = r->head[key];
    r->head[key] = r->items[i].next;
    if (r->head[key] < 0) r->tail[key] = -1;
}

static int add_flow(Run *r, int64_t n, long long code, double cap) {
    int64_t a = r->lk_ptr[n], nl = r->lk_ptr[n + 1] - a;
    int32_t *lk = PyMem_Malloc((size_t)(nl ? nl : 1) * sizeof(int32_t));
    if (!lk) { PyErr_NoMemory(); return -1; }
    memcpy(lk, r->lk + a, (size_t)nl * sizeof(int32_t));
    PyObject *data = PyLong_FromLongLong(code);
    if (!data) { PyMem_Free(lk); return -1; }
    FlowObject *f = net_add_flow(r->net, lk, (int32_t)nl, (long long)r->wire[n], r->now, data,
                                 Py_None, cap, r->goodput[n]);
    Py_DECREF(data);
    if (!f) return -1;
    Py_DECREF(f);
    return 0;
}

static int mcast_arrivals(Run *r, int64_t m, double t) {
    for (int64_t g = r->mg_ptr[m]; g < r->mg_ptr[m + 1]; g++)
        if (push(r, t + r->g_lat[g], E_MARR, m, g) < 0) return -1;
    return 0;
}

static int start_next(Run *r, int64_t key) {
    double now = r->now;
    while (r->head[key] >= 0) {
        Item *it = &r->items[r->head[key]];
        int64_t n = it->n;
        if (it->type == I_MSG) {
            chan_pop(r, key);
            if (r->wire[n]) {
                if (add_flow(r, n, n, INFINITY) < 0) return -1;
                r->busy[key] = 1;
                return 0;
            }
            if (push_msg(r, n, r->lat[n]) < 0) return -1;
            continue;
        }
        if (it->t > same_time_bound(r, now)) {
            r->busy[key] = 1;
            return push(r, it->t, E_KICK, key, 0);
        }
        int type = it->type;
        chan_pop(r, key);
        if (type == I_EOS) continue;
        if (r->wire[n]) {
            if (add_flow(r, n, -n - 1, r->mcap[n]) < 0) return -1;
            r->busy[key] = 1;
            return 0;
        }
        if (mcast_arrivals(r, n, now) < 0) return -1;
    }
    r->busy[key] = 0;
    return 0;
}

static int flush(Run *r) {
    int64_t nk = r->nkick;
    if (!nk) return 0;
    for (int64_t i = 0; i < nk; i++) r->inkick[r->kick[i]] = 0;
    r->nkick = 0;
    /* start_next queues no message, so the kick list stays empty while this runs */
    for (int64_t i = 0; i < nk; i++) {
        int64_t key = r->kick[i];
        if (!r->busy[key] && start_next(r, key) < 0) return -1;
    }
    return 0;
}

/* -- the engine's steps --------------------------------------------------------------- */
static int ready_add(Run *r, int64_t x) {
    if (r->nready == r->rcap && grow64((void **)&r->ready, &r->rcap, r->nready + 1,
                                       sizeof(int64_t)) < 0)
        return -1;
    r->ready[r->nready++] = x;
    return 0;
}

static int step_done(Run *r, int64_t n) {
    r->done_t[n] = r->now;
    for (int64_t j = r->succ_ptr[n]; j < r->succ_ptr[n + 1]; j++) {
        int64_t x = r->succ[j];
        if (!--r->deps_left[x] && ready_add(r, x) < 0) return -1;
    }
    r->steps_left[r->mem[n]]--;
    return 0;
}

static void maybe_complete(Run *r, int64_t m) {
    if (r->steps_left[m] || r->done_m[m]) return;
    if (r->mfin[m] && !(r->fin_out[m] && r->fin_in[m])) return;
    r->done_m[m] = 1;
    r->completed[m] = r->now;
    r->pending--;
}

static int send_fin(Run *r, int64_t q, int64_t i) {
    int64_t f = r->fin_of[q] + i;
    return emit(r, r->chan[f], I_MSG, f, 0.0);
}

/* an MRECV done: in a pump (ready already in use) or by its stream's arrival (outer) */
static int stream_complete(Run *r, int64_t n, int outer);
static int pump(Run *r);

static int start_mcast(Run *r, int64_t n) {
    double now = r->now;
    int64_t ep = r->ep[n];
    double t0 = now;
    if (r->paced && r->pacer[ep] > now) t0 = r->pacer[ep];
    int64_t key = r->chan[n];
    if (emit(r, key, I_MCAST, n, t0) < 0 || emit(r, key, I_EOS, n, t0 + r->t_eos[n]) < 0)
        return -1;
    if (r->paced) {
        double pn = t0 + r->t_next[n];
        r->pacer[ep] = pn;
        if (pn > now) return push(r, pn, E_PACE, n, 0);
    }
    return step_done(r, n);
}

/* Start the ready steps in order, and those each releases after them (the engine's pump). */
static int pump(Run *r) {
    double now = r->now;
    for (int64_t i = 0; i < r->nready; i++) {
        int64_t n = r->ready[i];
        r->started[n] = 1;
        r->start_t[n] = now;
        int64_t k = r->kind[n];
        int rc = 0;
        if (k == r->SEND) rc = emit(r, r->chan[n], I_MSG, n, 0.0);
        else if (k == r->RECV) { if (r->arrived[n]) rc = step_done(r, n); }
        else if (k == r->COPY) rc = step_done(r, n);
        else if (k == r->MCAST) rc = start_mcast(r, n);
        else if (k == r->MRECV) {
            if (r->arrived[n] || !r->nbytes[n]) rc = stream_complete(r, n, 0);
        }
        if (rc < 0) return -1;
    }
    r->nready = 0;
    return 0;
}

static int stream_complete(Run *r, int64_t n, int outer) {
    if (outer) r->nready = 0;
    if (step_done(r, n) < 0) return -1;
    int64_t m = r->mem[n];
    if (--r->mrecv_left[m] == 0 && send_fin(r, r->q[n], r->local[n]) < 0) return -1;
    if (outer) {
        if (r->nready && pump(r) < 0) return -1;
        maybe_complete(r, m);
    }
    return 0;
}

static int complete_step(Run *r, int64_t n) {
    r->nready = 0;
    if (step_done(r, n) < 0) return -1;
    if (r->nready && pump(r) < 0) return -1;
    maybe_complete(r, r->mem[n]);
    return 0;
}

static int post(Run *r, int64_t m) {
    int64_t q = r->mq[m], i = m - r->mbase[q];
    r->nready = 0;
    for (int64_t j = r->roots_ptr[m]; j < r->roots_ptr[m + 1]; j++)
        if (ready_add(r, r->roots[j]) < 0) return -1;
    if (pump(r) < 0) return -1;
    if (r->mfin[m] && !r->mrecv_left[m] && send_fin(r, q, i) < 0) return -1;
    maybe_complete(r, m);
    return 0;
}

static int event(Run *r, const Ev *e) {
    int64_t a = e->a;
    r->events++;
    switch (e->kind) {
    case E_ARR: {                          /* the message of node a arrived */
        int64_t x = r->recv_of_send[a];
        if (x >= 0) {
            r->arrived[x] = 1;
            if (r->started[x] && complete_step(r, x) < 0) return -1;
        } else {                           /* a FIN, at its member's ring successor */
            int64_t q = r->q[a];
            int64_t m = r->mbase[q] + (r->local[a] + 1) % r->nmem[q];
            r->fin_in[m] = 1;
            maybe_complete(r, m);
        }
        break;
    }
    case E_SENDDONE:                       /* the message of node a left its sender */
        if (r->kind[a] == r->FIN) {
            int64_t m = r->mem[a];
            r->fin_out[m] = 1;
            maybe_complete(r, m);
        } else if (complete_step(r, a) < 0) return -1;
        break;
    case E_MARR:                           /* stream a arrived at the nodes of group b */
        for (int64_t j = r->g_ptr[e->b]; j < r->g_ptr[e->b + 1]; j++) {
            int64_t x = r->g_nodes[j];
            r->arrived[x] = 1;
            if (r->started[x] && isnan(r->done_t[x])) {
                if (stream_complete(r, x, 1) < 0 || flush(r) < 0) return -1;
            }
        }
        return 0;
    case E_PACE:
        if (complete_step(r, a) < 0) return -1;
        break;
    case E_KICK:
        r->busy[a] = 0;
        if (start_next(r, a) < 0) return -1;
        break;
    case E_POST:
        if (post(r, a) < 0) return -1;
        break;
    }
    return flush(r);
}

static int drained(Run *r, FlowObject *f) {
    long long code = PyLong_AsLongLong(f->data);
    if (code == -1 && PyErr_Occurred()) return -1;
    int64_t n = code >= 0 ? code : -code - 1;
    if (code >= 0) {
        if (push_msg(r, n, r->lat[n]) < 0) return -1;
    } else if (mcast_arrivals(r, n, r->now) < 0) return -1;
    int64_t key = r->chan[n];
    r->busy[key] = 0;
    return start_next(r, key);
}

/* One instant (network.run_batch): the flows drained by its bound (all taken off first,
 * as pop_drained does), the events queued by it, then one settle. */
static int batch(Run *r, double t) {
    double bound = same_time_bound(r, t);
    FlowObject *f;
    r->ndrained = 0;
    while ((f = net_pop_drained(r->net, bound)) != NULL) {
        if (r->ndrained == r->dcap && grow64((void **)&r->drained, &r->dcap, r->ndrained + 1,
                                             sizeof(FlowObject *)) < 0) {
            Py_DECREF(f);
            return -1;
        }
        r->drained[r->ndrained++] = f;
    }
    int err = PyErr_Occurred() != NULL;
    for (int64_t i = 0; i < r->ndrained; i++) {
        if (!err && drained(r, r->drained[i]) < 0) err = 1;
        Py_DECREF(r->drained[i]);
    }
    r->ndrained = 0;
    if (err) return -1;
    while (r->hn && r->heap[0].t <= bound) {
        Ev e = pop(r);
        if (event(r, &e) < 0) return -1;
    }
    PyObject *tt = PyFloat_FromDouble(t);
    if (!tt) return -1;
    PyObject *res = State_settle(r->net, tt);
    Py_DECREF(tt);
    if (!res) return -1;
    Py_DECREF(res);
    return 0;
}

/* -- the arguments: contiguous numpy arrays by name --------------------------------- */
typedef struct { Py_buffer b[48]; int n; } Bufs;

static void *arr(PyObject *d, const char *name, Bufs *bs, Py_ssize_t itemsize, int writable,
                 Py_ssize_t *len) {
    PyObject *o = PyDict_GetItemString(d, name);
    if (!o) { PyErr_Format(PyExc_KeyError, "events run: no array %s", name); return NULL; }
    Py_buffer *b = &bs->b[bs->n];
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                           (writable ? PyBUF_WRITABLE : 0)) < 0)
        return NULL;
    bs->n++;
    if (b->itemsize != itemsize || b->ndim != 1) {
        PyErr_Format(PyExc_TypeError, "events run: %s: a 1-d array of %zd-byte items expected",
                     name, itemsize);
        return NULL;
    }
    if (len) *len = b->shape[0];
    return b->buf ? b->buf : (void *)"";
}

/* run(state, arrays: dict, kinds: (SEND, RECV, COPY, MCAST, MRECV, FIN), paced, time_rtol,
 *     max_time_s, max_events) -> (status, now, pending, events); status 0: done,
 *     1: deadlock, 2: past max_time_s, 3: past max_events. */
PyObject *events_run(PyObject *self, PyObject *args) {
    PyObject *st, *d;
    Run r;
    memset(&r, 0, sizeof r);
    int paced;
    double max_time;
    long long max_events;
    if (!PyArg_ParseTuple(args, "OO!(LLLLLL)pddL", &st, &PyDict_Type, &d, &r.SEND, &r.RECV,
                          &r.COPY, &r.MCAST, &r.MRECV, &r.FIN, &paced, &r.time_rtol, &max_time,
                          &max_events))
        return NULL;
    if (strcmp(Py_TYPE(st)->tp_name, "polycast.sim._network.State") != 0) {
        PyErr_SetString(PyExc_TypeError, "events run: a compiled network State expected");
        return NULL;
    }
    r.net = (State *)st;
    r.paced = paced;
    Bufs bs;
    bs.n = 0;
    PyObject *out = NULL;
    Py_ssize_t N, M, Q, C, np;
    int ok =
        (r.kind = arr(d, "kind", &bs, 8, 0, &N)) && (r.q = arr(d, "q", &bs, 8, 0, NULL)) &&
        (r.local = arr(d, "local", &bs, 8, 0, NULL)) && (r.mem = arr(d, "mem", &bs, 8, 0, NULL)) &&
        (r.wire = arr(d, "wire", &bs, 8, 0, NULL)) &&
        (r.nbytes = arr(d, "nbytes", &bs, 8, 0, NULL)) && (r.ep = arr(d, "ep", &bs, 8, 0, NULL)) &&
        (r.chan = arr(d, "chan", &bs, 8, 0, NULL)) &&
        (r.recv_of_send = arr(d, "recv_of_send", &bs, 8, 0, NULL)) &&
        (r.lat = arr(d, "lat", &bs, 8, 0, NULL)) && (r.t_eos = arr(d, "t_eos", &bs, 8, 0, NULL)) &&
        (r.t_next = arr(d, "t_next", &bs, 8, 0, NULL)) &&
        (r.mcap = arr(d, "mcap", &bs, 8, 0, NULL)) &&
        (r.goodput = arr(d, "goodput", &bs, 8, 0, NULL)) &&
        (r.post_t = arr(d, "post_t", &bs, 8, 0, &M)) &&
        (r.deps_left = arr(d, "deps_left", &bs, 8, 1, NULL)) &&
        (r.succ_ptr = arr(d, "succ_ptr", &bs, 8, 0, NULL)) &&
        (r.succ = arr(d, "succ", &bs, 8, 0, NULL)) &&
        (r.lk_ptr = arr(d, "lk_ptr", &bs, 8, 0, NULL)) && (r.lk = arr(d, "lk", &bs, 4, 0, NULL)) &&
        (r.mbase = arr(d, "mbase", &bs, 8, 0, &Q)) && (r.nmem = arr(d, "nmem", &bs, 8, 0, NULL)) &&
        (r.fin_of = arr(d, "fin_of", &bs, 8, 0, NULL)) && (r.mq = arr(d, "mq", &bs, 8, 0, NULL)) &&
        (r.mfin = arr(d, "mfin", &bs, 1, 0, NULL)) &&
        (r.steps_left = arr(d, "steps_left", &bs, 8, 1, NULL)) &&
        (r.mrecv_left = arr(d, "mrecv_left", &bs, 8, 1, NULL)) &&
        (r.roots_ptr = arr(d, "roots_ptr", &bs, 8, 0, NULL)) &&
        (r.roots = arr(d, "roots", &bs, 8, 0, NULL)) &&
        (r.mg_ptr = arr(d, "mg_ptr", &bs, 8, 0, NULL)) &&
        (r.g_ptr = arr(d, "g_ptr", &bs, 8, 0, NULL)) &&
        (r.g_nodes = arr(d, "g_nodes", &bs, 8, 0, NULL)) &&
        (r.g_lat = arr(d, "g_lat", &bs, 8, 0, NULL)) &&
        (r.done_t = arr(d, "done_t", &bs, 8, 1, NULL)) &&
        (r.start_t = arr(d, "start_t", &bs, 8, 1, NULL)) &&
        (r.completed = arr(d, "completed", &bs, 8, 1, NULL)) &&
        (r.pacer = arr(d, "pacer", &bs, 8, 1, &np));
    if (!ok) goto done;
    /* the sizes the loop indexes with: checked once here */
    C = 0;
    for (Py_ssize_t i = 0; i < N; i++) if (r.chan[i] >= C) C = r.chan[i] + 1;
    {
        Py_ssize_t want[][2] = {{bs.b[1].shape[0], N}, {bs.b[2].shape[0], N}, {bs.b[3].shape[0], N},
                                {bs.b[4].shape[0], N}, {bs.b[5].shape[0], N}, {bs.b[6].shape[0], N},
                                {bs.b[7].shape[0], N}, {bs.b[8].shape[0], N}, {bs.b[9].shape[0], N},
                                {bs.b[10].shape[0], N}, {bs.b[11].shape[0], N},
                                {bs.b[12].shape[0], N}, {bs.b[13].shape[0], N},
                                {bs.b[15].shape[0], N}, {bs.b[16].shape[0], N + 1},
                                {bs.b[18].shape[0], N + 1}, {bs.b[21].shape[0], Q},
                                {bs.b[22].shape[0], Q}, {bs.b[23].shape[0], M},
                                {bs.b[24].shape[0], M}, {bs.b[25].shape[0], M},
                                {bs.b[26].shape[0], M}, {bs.b[27].shape[0], M + 1},
                                {bs.b[29].shape[0], N + 1}, {bs.b[33].shape[0], N},
                                {bs.b[34].shape[0], N}, {bs.b[35].shape[0], M}};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
            if (want[i][0] != want[i][1]) {
                PyErr_Format(PyExc_ValueError, "events run: array %zu has %zd items, not %zd",
                             i, want[i][0], want[i][1]);
                goto done;
            }
        for (Py_ssize_t i = 0; i < N; i++)
            if (r.ep[i] < 0 || r.ep[i] >= np) {
                PyErr_SetString(PyExc_ValueError, "events run: an endpoint past the pacer array");
                goto done;
            }
    }
    r.N = N; r.M = M; r.Q = Q; r.C = C;
    r.arrived = PyMem_Calloc((size_t)N + 1, 1);
    r.started = PyMem_Calloc((size_t)N + 1, 1);
    r.fin_out = PyMem_Calloc((size_t)M + 1, 1);
    r.fin_in = PyMem_Calloc((size_t)M + 1, 1);
    r.done_m = PyMem_Calloc((size_t)M + 1, 1);
    r.busy = PyMem_Calloc((size_t)C + 1, 1);
    r.inkick = PyMem_Calloc((size_t)C + 1, 1);
    r.head = PyMem_Malloc(((size_t)C + 1) * sizeof(int64_t));
    r.tail = PyMem_Malloc(((size_t)C + 1) * sizeof(int64_t));
    if (!r.arrived || !r.started || !r.fin_out || !r.fin_in || !r.done_m || !r.busy ||
        !r.inkick || !r.head || !r.tail) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i <= C; i++) r.head[i] = r.tail[i] = -1;
    r.pending = M;
    for (Py_ssize_t m = 0; m < M; m++)
        if (push(&r, r.post_t[m], E_POST, m, 0) < 0) goto done;
    int status = 0;
    long long batches = 0;
    while (r.pending) {
        double t = r.hn ? r.heap[0].t : INFINITY;
        double tn = net_next_time(r.net);
        if (tn < t) t = tn;
        if (t == INFINITY) { status = 1; break; }
        if (t > max_time) { status = 2; break; }
        r.now = t;
        if (batch(&r, t) < 0) goto done;
        if (r.events > max_events) { status = 3; break; }
        if (!(++batches & 4095) && PyErr_CheckSignals() < 0) goto done;
    }
    out = Py_BuildValue("(idLL)", status, r.now, r.pending, r.events);
done:
    for (int i = 0; i < bs.n; i++) PyBuffer_Release(&bs.b[i]);
    PyMem_Free(r.arrived); PyMem_Free(r.started); PyMem_Free(r.fin_out); PyMem_Free(r.fin_in);
    PyMem_Free(r.done_m); PyMem_Free(r.busy); PyMem_Free(r.inkick); PyMem_Free(r.head);
    PyMem_Free(r.tail); PyMem_Free(r.heap); PyMem_Free(r.items); PyMem_Free(r.kick);
    PyMem_Free(r.ready); PyMem_Free(r.drained);
    return out;
}
