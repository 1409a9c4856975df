/* The compiled network model's types, flows and drain heap (the parts: _network.h). */
#include "_network.h"
#include <math.h>
#include <structmember.h>

/* -- small growable arrays ------------------------------------------------------------ */
int grow(void **p, int32_t *cap, int32_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    if (c > INT32_MAX) { PyErr_NoMemory(); return -1; }
    void *q = PyMem_Realloc(*p, (size_t)c * size);
    if (!q) { PyErr_NoMemory(); return -1; }
    *p = q;
    *cap = (int32_t)c;
    return 0;
}

int flows_push(FlowList *v, FlowObject *f) {
    if (v->n == v->cap && grow((void **)&v->a, &v->cap, v->n + 1, sizeof(FlowObject *)) < 0)
        return -1;
    v->a[v->n++] = f;
    return 0;
}

/* A fresh stamp for a per-link marker array (cleared when the counter wraps). */
uint32_t next_epoch(uint32_t *epoch, uint32_t *arr, int32_t n) {
    if (++*epoch == 0) {
        memset(arr, 0, (size_t)n * sizeof(uint32_t));
        *epoch = 1;
    }
    return *epoch;
}

/* -- Flow ------------------------------------------------------------------------------ */
static void Flow_free_arrays(FlowObject *f) {
    PyMem_Free(f->lk);
    PyMem_Free(f->pos);
    f->lk = f->pos = NULL;
}

static int Flow_traverse(FlowObject *f, visitproc visit, void *arg) {
    Py_VISIT(f->data);
    Py_VISIT(f->links);
    return 0;
}

static int Flow_clear(FlowObject *f) {
    Py_CLEAR(f->data);
    Py_CLEAR(f->links);
    return 0;
}

static void Flow_dealloc(FlowObject *f) {
    PyObject_GC_UnTrack(f);
    Flow_clear(f);
    Py_CLEAR(f->key);
    Flow_free_arrays(f);
    PyObject_GC_Del(f);
}

static PyObject *Flow_repr(FlowObject *f) {
    char buf[160];
    PyOS_snprintf(buf, sizeof buf, "Flow(fid=%lld, nbytes=%lld, rate=%.17g, finish=%.17g)",
                  f->fid, f->nbytes, f->rate, f->finish);
    return PyUnicode_FromString(buf);
}

#define RO(name, type, doc) {#name, type, offsetof(FlowObject, name), READONLY, doc}
static PyMemberDef Flow_members[] = {
    RO(fid, T_LONGLONG, "the flow's id (in start order)"),
    RO(nbytes, T_LONGLONG, "wire bytes"),
    RO(start, T_DOUBLE, "start time, s"),
    RO(data, T_OBJECT, "the driver's tag"),
    RO(links, T_OBJECT, "link ids, as given"),
    RO(remaining, T_DOUBLE, "bytes left at t_last"),
    RO(rate, T_DOUBLE, "bytes/s"),
    RO(t_last, T_DOUBLE, "time remaining was last brought up to date"),
    RO(finish, T_DOUBLE, "drain time at the current rate"),
    RO(version, T_LONGLONG, "drain-heap entries with another version are stale"),
    RO(cap, T_DOUBLE, "the sender's own limit, bytes/s"),
    RO(goodput, T_DOUBLE, "payload bytes per wire byte"),
    RO(solo, T_DOUBLE, "its own limit: min(cap, its slowest link)"),
    RO(by, T_LONGLONG, "its bottleneck link (-1: its own limit)"),
    {NULL}
};

static PyTypeObject FlowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polycast.sim._network.Flow",
    .tp_basicsize = sizeof(FlowObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A flow of the compiled network model (fields as network.Flow's).",
    .tp_dealloc = (destructor)Flow_dealloc,
    .tp_traverse = (traverseproc)Flow_traverse,
    .tp_clear = (inquiry)Flow_clear,
    .tp_repr = (reprfunc)Flow_repr,
    .tp_members = Flow_members,
};

/* -- the drain heap: (finish, fid, version), a strong reference per entry ----------------- */
static inline int drain_less(const Drain *a, const Drain *b) {
    if (a->t != b->t) return a->t < b->t;
    if (a->fid != b->fid) return a->fid < b->fid;
    return a->ver < b->ver;
}

int drain_push(State *s, FlowObject *f) {
    if (s->hn == s->hcap) {
        Py_ssize_t c = s->hcap ? 2 * s->hcap : 64;
        Drain *h = PyMem_Realloc(s->heap, (size_t)c * sizeof(Drain));
        if (!h) { PyErr_NoMemory(); return -1; }
        s->heap = h;
        s->hcap = c;
    }
    Drain e = {f->finish, f->fid, f->version, f};
    Py_INCREF(f);
    Py_ssize_t i = s->hn++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!drain_less(&e, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
    return 0;
}

static Drain drain_pop(State *s) {
    Drain top = s->heap[0];
    Drain last = s->heap[--s->hn];
    Py_ssize_t i = 0, n = s->hn;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && drain_less(&s->heap[c + 1], &s->heap[c])) c++;
        if (!drain_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

static inline int drain_live(const Drain *e) {
    return e->f->active && e->f->version == e->ver;
}

/* -- State ----------------------------------------------------------------------------- */
static int get_doubles(PyObject *obj, Py_buffer *b, double **out, Py_ssize_t n,
                       const char *what) {
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return -1;
    const char *fmt = b->format ? b->format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
    if (strcmp(fmt, "d") != 0 || b->itemsize != 8 || b->len != n * 8) {
        PyErr_Format(PyExc_ValueError, "%s: %zd contiguous float64 expected", what, n);
        PyBuffer_Release(b);
        b->obj = NULL;
        return -1;
    }
    *out = b->buf;
    return 0;
}

static int State_init(State *s, PyObject *args, PyObject *kw) {
    static char *names[] = {"capacity", "sat", "load", "maxrate", "link_bytes",
                            "refills_before_component", NULL};
    PyObject *cap, *sat, *load, *maxrate, *lb;
    int rbc;
    if (s->lf) {
        PyErr_SetString(PyExc_RuntimeError, "State is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOi", names, &cap, &sat, &load, &maxrate,
                                     &lb, &rbc))
        return -1;
    Py_ssize_t n = PyObject_Length(cap), nnet = PyObject_Length(lb);
    if (n < 0 || nnet < 0) return -1;
    if (n >= INT32_MAX || nnet > n) {
        PyErr_SetString(PyExc_ValueError, "link_bytes covers at most the links");
        return -1;
    }
    if (get_doubles(cap, &s->bcap, &s->cap, n, "capacity") < 0 ||
        get_doubles(sat, &s->bsat, &s->sat, n, "sat") < 0 ||
        get_doubles(load, &s->bload, &s->load, n, "load") < 0 ||
        get_doubles(maxrate, &s->bmax, &s->maxrate, n, "maxrate") < 0 ||
        get_doubles(lb, &s->blb, &s->lb, nnet, "link_bytes") < 0)
        return -1;
    s->nl = (int32_t)n;
    s->nnet = (int32_t)nnet;
    s->refills_before_component = rbc;
    s->fepoch = 1;                      /* (stamps start at 0: nothing freed yet) */
    size_t m = (size_t)(n ? n : 1);
    s->lf = PyMem_Calloc(m, sizeof(IncList));
    s->lby = PyMem_Calloc(m, sizeof(FlowList));
    s->fstamp = PyMem_Calloc(m, sizeof(uint32_t));
    s->freed = PyMem_Calloc(m, sizeof(int32_t));
    s->lstamp = PyMem_Calloc(m, sizeof(uint32_t));
    s->lidx = PyMem_Calloc(m, sizeof(int32_t));
    s->tstamp = PyMem_Calloc(m, sizeof(uint32_t));
    s->tdelta = PyMem_Calloc(m, sizeof(double));
    s->ttop = PyMem_Calloc(m, sizeof(double));
    s->tlist = PyMem_Calloc(m, sizeof(int32_t));
    s->cstamp = PyMem_Calloc(m, sizeof(uint32_t));
    s->flows = PyDict_New();
    if (!s->lf || !s->lby || !s->fstamp || !s->freed || !s->lstamp || !s->lidx ||
        !s->tstamp || !s->tdelta || !s->ttop || !s->tlist || !s->cstamp) {
        PyErr_NoMemory();
        return -1;
    }
    return s->flows ? 0 : -1;
}

static int State_traverse(State *s, visitproc visit, void *arg) {
    Py_VISIT(s->flows);
    for (int32_t i = 0; i < s->added.n; i++) Py_VISIT(s->added.a[i]);
    for (Py_ssize_t i = 0; i < s->hn; i++) Py_VISIT(s->heap[i].f);
    return 0;
}

static int State_clear(State *s) {
    Py_CLEAR(s->flows);
    for (int32_t i = 0; i < s->added.n; i++) Py_DECREF(s->added.a[i]);
    s->added.n = 0;
    for (Py_ssize_t i = 0; i < s->hn; i++) Py_DECREF(s->heap[i].f);
    s->hn = 0;
    return 0;
}

static void State_dealloc(State *s) {
    PyObject_GC_UnTrack(s);
    State_clear(s);
    if (s->lf) {
        for (int32_t l = 0; l < s->nl; l++) {
            PyMem_Free(s->lf[l].a);
            PyMem_Free(s->lby[l].a);
        }
    }
    Py_buffer *bs[] = {&s->bcap, &s->bsat, &s->bload, &s->bmax, &s->blb};
    for (size_t i = 0; i < sizeof bs / sizeof *bs; i++)
        if (bs[i]->obj) PyBuffer_Release(bs[i]);
    void *ps[] = {s->lf, s->lby, s->heap, s->added.a, s->freed, s->fstamp, s->region.a,
                  s->lstamp, s->lidx, s->lrem, s->lcnt, s->lver, s->llink, s->loff, s->lmem,
                  s->gbound, s->gby, s->gorder, s->gopen, s->sh, s->tstamp, s->tdelta,
                  s->ttop, s->tlist, s->tight, s->cstamp, s->stack};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) PyMem_Free(ps[i]);
    PyObject_GC_Del(s);
}

/* The links of a flow: a 1-d buffer of 4- or 8-byte integers (numpy int64/int32), or any
 * sequence of ints. */
static int read_links(State *s, PyObject *obj, int32_t **out, int32_t *count) {
    Py_buffer b;
    Py_ssize_t n;
    int32_t *lk = NULL;
    if (PyObject_GetBuffer(obj, &b, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
        const char *fmt = b.format ? b.format : "B";
        if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
        int ok = b.ndim == 1 && fmt[1] == 0 && (b.itemsize == 8 || b.itemsize == 4) &&
                 strchr("qlinQLIN", fmt[0]) != NULL;
        int sgn = ok && strchr("qlin", fmt[0]) != NULL;
        if (!ok) {
            PyBuffer_Release(&b);
            PyErr_SetString(PyExc_TypeError, "links: a 1-d array of integers expected");
            return -1;
        }
        n = b.shape[0];
        lk = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int32_t));
        if (!lk) { PyBuffer_Release(&b); PyErr_NoMemory(); return -1; }
        const char *p = b.buf;
        for (Py_ssize_t i = 0; i < n; i++, p += b.strides[0]) {
            long long v;
            if (b.itemsize == 8) v = sgn ? *(const int64_t *)p : (long long)*(const uint64_t *)p;
            else v = sgn ? *(const int32_t *)p : (long long)*(const uint32_t *)p;
            if (v < 0 || v >= s->nl) {
                PyMem_Free(lk);
                PyBuffer_Release(&b);
                PyErr_Format(PyExc_ValueError, "link id %lld is not among the %d links", v,
                             (int)s->nl);
                return -1;
            }
            lk[i] = (int32_t)v;
        }
        PyBuffer_Release(&b);
    } else {
        PyErr_Clear();
        PyObject *fast = PySequence_Fast(obj, "links: a sequence of link ids expected");
        if (!fast) return -1;
        n = PySequence_Fast_GET_SIZE(fast);
        lk = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int32_t));
        if (!lk) { Py_DECREF(fast); PyErr_NoMemory(); return -1; }
        for (Py_ssize_t i = 0; i < n; i++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
            if (v == -1 && PyErr_Occurred()) { PyMem_Free(lk); Py_DECREF(fast); return -1; }
            if (v < 0 || v >= s->nl) {
                PyMem_Free(lk);
                Py_DECREF(fast);
                PyErr_Format(PyExc_ValueError, "link id %lld is not among the %d links", v,
                             (int)s->nl);
                return -1;
            }
            lk[i] = (int32_t)v;
        }
        Py_DECREF(fast);
    }
    if (n == 0) {
        PyMem_Free(lk);
        PyErr_SetString(PyExc_ValueError, "a flow crosses at least one link");
        return -1;
    }
    *out = lk;
    *count = (int32_t)n;
    return 0;
}

/* Start a flow (add_flow's work, for the compiled events loop too): lk (nl link ids, checked
 * by the caller) becomes the flow's, freed on failure; links is what Flow.links shows.
 * Returns a new reference. */
FlowObject *net_add_flow(State *s, int32_t *lk, int32_t nl, long long nbytes, double now,
                         PyObject *data, PyObject *links, double cap, double goodput) {
    int32_t *pos = PyMem_Malloc((size_t)nl * sizeof(int32_t));
    FlowObject *f = PyObject_GC_New(FlowObject, &FlowType);
    PyObject *key = PyLong_FromLongLong(s->next_fid);
    if (!pos || !f || !key) {
        PyMem_Free(lk);
        PyMem_Free(pos);
        Py_XDECREF(key);
        if (f) { f->data = f->links = f->key = NULL; f->lk = f->pos = NULL; Py_DECREF(f); }
        if (!pos) PyErr_NoMemory();
        return NULL;
    }
    f->fid = s->next_fid;
    f->nbytes = nbytes;
    f->version = 0;
    f->by = -1;
    f->start = now;
    f->remaining = (double)nbytes;
    f->rate = 0.0;
    f->t_last = now;
    f->finish = INFINITY;
    f->cap = cap;
    f->goodput = goodput;
    Py_INCREF(data);
    f->data = data;
    Py_INCREF(links);
    f->links = links;
    f->key = key;
    f->nl = nl;
    f->lk = lk;
    f->pos = pos;
    f->bypos = -1;
    f->active = 0;
    f->mark = 0;
    f->gi = -1;
    f->x = 0.0;
    f->xby = -1;
    PyObject_GC_Track(f);
    /* Listed in the flows, the added list and on its links, or (a failed allocation)
     * nowhere: each step undoes the ones before it. */
    if (PyDict_SetItem(s->flows, key, (PyObject *)f) < 0) {
        Py_DECREF(f);
        return NULL;
    }
    PyObject *et, *ev, *tb;
    if (flows_push(&s->added, f) < 0) {
        PyErr_Fetch(&et, &ev, &tb);
        PyDict_DelItem(s->flows, key);
        PyErr_Restore(et, ev, tb);
        Py_DECREF(f);
        return NULL;
    }
    Py_INCREF(f);                       /* the added list's reference */
    double solo = INFINITY;
    for (int32_t k = 0; k < nl; k++) {
        IncList *v = &s->lf[lk[k]];
        if (v->n == v->cap && grow((void **)&v->a, &v->cap, v->n + 1, sizeof(Inc)) < 0) {
            for (int32_t j = k - 1; j >= 0; j--) s->lf[lk[j]].n--;   /* (appended last) */
            s->added.n--;
            Py_DECREF(f);
            PyErr_Fetch(&et, &ev, &tb);
            PyDict_DelItem(s->flows, key);
            PyErr_Restore(et, ev, tb);
            Py_DECREF(f);
            return NULL;
        }
        pos[k] = v->n;
        v->a[v->n++] = (Inc){f, k};
        if (s->cap[lk[k]] < solo) solo = s->cap[lk[k]];
    }
    f->solo = solo < cap ? solo : cap;
    f->active = 1;
    for (int32_t k = 0; k < nl; k++)
        if (lk[k] < s->nnet) s->lb[lk[k]] += (double)nbytes;
    s->next_fid++;
    s->flows_started++;
    return f;
}


/* add_flow(links, nbytes, now, data, cap=inf, goodput=1.0) -> Flow */
static PyObject *State_add_flow(State *s, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    PyObject *a[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    static const char *names[] = {"links", "nbytes", "now", "data", "cap", "goodput"};
    if (nargs > 6) {
        PyErr_SetString(PyExc_TypeError, "add_flow takes at most 6 arguments");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) a[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, j);
        int i = 0;
        while (i < 6 && PyUnicode_CompareWithASCIIString(k, names[i]) != 0) i++;
        if (i == 6 || a[i]) {
            PyErr_Format(PyExc_TypeError, "add_flow: unexpected or repeated argument %R", k);
            return NULL;
        }
        a[i] = args[nargs + j];
    }
    for (int i = 0; i < 4; i++)
        if (!a[i]) {
            PyErr_Format(PyExc_TypeError, "add_flow: missing argument %s", names[i]);
            return NULL;
        }
    long long nbytes = PyLong_AsLongLong(a[1]);
    if (nbytes == -1 && PyErr_Occurred()) return NULL;
    if (nbytes <= 0) {
        PyErr_SetString(PyExc_ValueError,
                        "flows carry at least one byte; the driver handles empty messages");
        return NULL;
    }
    double now = PyFloat_AsDouble(a[2]);
    double cap = a[4] ? PyFloat_AsDouble(a[4]) : INFINITY;
    double goodput = a[5] ? PyFloat_AsDouble(a[5]) : 1.0;
    if (PyErr_Occurred()) return NULL;
    int32_t *lk, nl;
    if (read_links(s, a[0], &lk, &nl) < 0) return NULL;
    return (PyObject *)net_add_flow(s, lk, nl, nbytes, now, a[3], a[0], cap, goodput);
}

/* next_time() -> the earliest drain time of an active flow (inf if none) */
double net_next_time(State *s) {
    while (s->hn) {
        if (drain_live(&s->heap[0])) return s->heap[0].t;
        Drain e = drain_pop(s);
        Py_DECREF(e.f);
    }
    return INFINITY;
}

static PyObject *State_next_time(State *s, PyObject *unused) {
    return PyFloat_FromDouble(net_next_time(s));
}

static void drain(State *s, FlowObject *f) {
    f->active = 0;
    f->remaining = 0.0;
    set_by(s, f, -1);
    double rate = f->rate;
    for (int32_t k = 0; k < f->nl; k++) {
        int32_t l = f->lk[k];
        IncList *v = &s->lf[l];
        int32_t p = f->pos[k];
        Inc last = v->a[--v->n];
        if (p != v->n) {
            v->a[p] = last;
            last.f->pos[last.k] = p;
        }
        if (!v->n) {                    /* empty: no round-off left behind */
            s->load[l] = 0.0;
            s->maxrate[l] = 0.0;
        } else {
            s->load[l] -= rate;
        }
        if (s->fstamp[l] != s->fepoch) {
            s->fstamp[l] = s->fepoch;
            s->freed[s->nfreed++] = l;
        }
    }
    Flow_free_arrays(f);
    f->nl = 0;
}

/* The next flow drained at or before bound, removed (a new reference); NULL when none is
 * left (or, with an exception set, when the flows dict failed). */
FlowObject *net_pop_drained(State *s, double bound) {
    while (s->hn && s->heap[0].t <= bound) {
        Drain e = drain_pop(s);
        FlowObject *f = e.f;
        if (!drain_live(&e)) {
            Py_DECREF(f);
            continue;
        }
        drain(s, f);
        if (PyDict_DelItem(s->flows, f->key) < 0) { Py_DECREF(f); return NULL; }
        return f;
    }
    return NULL;
}

/* pop_drained(bound) -> [Flow]: remove and return the flows drained at or before bound */
static PyObject *State_pop_drained(State *s, PyObject *arg) {
    double bound = PyFloat_AsDouble(arg);
    if (bound == -1.0 && PyErr_Occurred()) return NULL;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    FlowObject *f;
    while ((f = net_pop_drained(s, bound)) != NULL) {
        int bad = PyList_Append(out, (PyObject *)f) < 0;
        Py_DECREF(f);
        if (bad) { Py_DECREF(out); return NULL; }
    }
    if (PyErr_Occurred()) { Py_DECREF(out); return NULL; }
    return out;
}

static PyMethodDef State_methods[] = {
    {"add_flow", (PyCFunction)(void (*)(void))State_add_flow, METH_FASTCALL | METH_KEYWORDS,
     "add_flow(links, nbytes, now, data, cap=inf, goodput=1.0) -> Flow"},
    {"pop_drained", (PyCFunction)State_pop_drained, METH_O,
     "pop_drained(bound) -> the flows drained at or before bound"},
    {"next_time", (PyCFunction)State_next_time, METH_NOARGS,
     "next_time() -> the earliest drain time of an active flow (inf if none)"},
    {"settle", (PyCFunction)State_settle, METH_O,
     "settle(now): the max-min fair rates after the flows added and drained since the last"},
    {NULL}
};

static PyMemberDef State_members[] = {
    {"flows", T_OBJECT, offsetof(State, flows), READONLY, "fid -> Flow, the active flows"},
    {"recomputes", T_LONGLONG, offsetof(State, recomputes), READONLY, "regions water-filled"},
    {"refills", T_LONGLONG, offsetof(State, refills), READONLY, "... again after a check"},
    {"components", T_LONGLONG, offsetof(State, components), READONLY,
     "... as whole connected components"},
    {"flows_started", T_LONGLONG, offsetof(State, flows_started), READONLY, "flows added"},
    {NULL}
};

static PyTypeObject StateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "polycast.sim._network.State",
    .tp_basicsize = sizeof(State),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "State(capacity, sat, load, maxrate, link_bytes, refills_before_component): "
              "the network's flows, links and drain heap (network.Network delegates to it)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)State_init,
    .tp_dealloc = (destructor)State_dealloc,
    .tp_traverse = (traverseproc)State_traverse,
    .tp_clear = (inquiry)State_clear,
    .tp_methods = State_methods,
    .tp_members = State_members,
};

static PyMethodDef module_methods[] = {
    {"run_events", events_run, METH_VARARGS,
     "run_events(state, arrays, kinds, paced, time_rtol, max_time_s, max_events): the fast "
     "path's events mode (polycast/sim/_events.c)"},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "polycast.sim._network",
    "The simulator's compiled network model (polycast/sim/network.py delegates to it) and the "
    "fast path's events loop on it.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__network(void) {
    if (PyType_Ready(&FlowType) < 0 || PyType_Ready(&StateType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&FlowType);
    Py_INCREF(&StateType);
    if (PyModule_AddObject(m, "Flow", (PyObject *)&FlowType) < 0 ||
        PyModule_AddObject(m, "State", (PyObject *)&StateType) < 0 ||
        PyModule_AddIntConstant(m, "ABI", NETWORK_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
