/* settle: network.py's *Settling* in C -- the region, its water-filling on what the other
 * flows leave, the two checks that widen it, the component after too many refills, and
 * the new rates and drain times (the parts: _network.h). */
#include "_network.h"
#include <math.h>

int set_by(State *s, FlowObject *f, int32_t l) {
    if (f->by == l) return 0;
    if (l >= 0) {                       /* (room first: a failure changes nothing) */
        FlowList *v = &s->lby[l];
        if (v->n == v->cap && grow((void **)&v->a, &v->cap, v->n + 1, sizeof(FlowObject *)) < 0)
            return -1;
    }
    if (f->by >= 0) {
        FlowList *v = &s->lby[f->by];
        FlowObject *last = v->a[--v->n];
        if (f->bypos != v->n) {
            v->a[f->bypos] = last;
            last->bypos = f->bypos;
        }
    }
    f->by = l;
    f->bypos = -1;
    if (l >= 0) {
        FlowList *v = &s->lby[l];
        f->bypos = v->n;
        v->a[v->n++] = f;
    }
    return 0;
}

static int resize(void *pp, int32_t n, size_t size) {
    void **p = pp;
    void *q = PyMem_Realloc(*p, (size_t)(n ? n : 1) * size);
    if (!q) { PyErr_NoMemory(); return -1; }
    *p = q;
    return 0;
}

static int region_add(State *s, FlowObject *f) {
    if (f->mark == s->rstamp) return 0;
    f->mark = s->rstamp;
    return flows_push(&s->region, f);
}

/* -- the water-filling ------------------------------------------------------------------ */
static inline int share_less(const Share *a, const Share *b) {
    return a->share < b->share || (a->share == b->share && a->idx < b->idx);
}

static int share_push(State *s, double share, int32_t idx, int32_t ver) {
    if (s->shn == s->shcap) {
        Py_ssize_t c = s->shcap ? 2 * s->shcap : 256;
        Share *h = PyMem_Realloc(s->sh, (size_t)c * sizeof(Share));
        if (!h) { PyErr_NoMemory(); return -1; }
        s->sh = h;
        s->shcap = c;
    }
    Share e = {share, idx, ver};
    Py_ssize_t i = s->shn++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!share_less(&e, &s->sh[p])) break;
        s->sh[i] = s->sh[p];
        i = p;
    }
    s->sh[i] = e;
    return 0;
}

static void share_pop(State *s) {
    Share last = s->sh[--s->shn];
    Py_ssize_t i = 0, n = s->shn;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && share_less(&s->sh[c + 1], &s->sh[c])) c++;
        if (!share_less(&s->sh[c], &last)) break;
        s->sh[i] = s->sh[c];
        i = c;
    }
    if (n) s->sh[i] = last;
}

static double *sort_key;
static int by_bound(const void *a, const void *b) {
    double x = sort_key[*(const int32_t *)a], y = sort_key[*(const int32_t *)b];
    if (x != y) return x < y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* Max-min rates of the region (f->x, f->xby) on what the other flows leave of each link.
 * Progressive filling as water_fill.py's fill_small: a link only one flow of the region
 * crosses is part of that flow's own bound; a shared link stops its open flows at its fair
 * share, the smallest first (a heap of shares); an own bound at or below the smallest
 * share (to 1e-12) stops its flow first. */
static int fill(State *s) {
    FlowList *R = &s->region;
    int32_t n = R->n;
    double *load = s->load, *capl = s->cap;
    if (n == 1) {
        FlowObject *f = R->a[0];
        double best = f->cap;
        int32_t by = -1;
        for (int32_t k = 0; k < f->nl; k++) {
            int32_t l = f->lk[k];
            double r = capl[l] - (load[l] - f->rate);
            if (r < best) { best = r; by = l; }
        }
        f->x = best > 0.0 ? best : 0.0;
        f->xby = by;
        return 0;
    }
    if (n > s->gcap) {
        int32_t c = n > 2 * s->gcap ? n : 2 * s->gcap;
        if (resize(&s->gbound, c, sizeof(double)) < 0 || resize(&s->gby, c, sizeof(int32_t)) < 0 ||
            resize(&s->gorder, c, sizeof(int32_t)) < 0 || resize(&s->gopen, c, sizeof(char)) < 0)
            return -1;
        s->gcap = c;
    }
    int32_t ninc = 0;
    for (int32_t i = 0; i < n; i++) ninc += R->a[i]->nl;
    int32_t most = ninc < s->nl ? ninc : s->nl;     /* distinct links at most */
    if (most > s->lcap) {
        int32_t c = most > 2 * s->lcap ? most : 2 * s->lcap;
        if (c > s->nl) c = s->nl;
        if (resize(&s->lrem, c, sizeof(double)) < 0 || resize(&s->lcnt, c, sizeof(int32_t)) < 0 ||
            resize(&s->lver, c, sizeof(int32_t)) < 0 || resize(&s->llink, c, sizeof(int32_t)) < 0 ||
            resize(&s->loff, c + 1, sizeof(int32_t)) < 0)
            return -1;
        s->lcap = c;
    }
    if (ninc > s->memcap) {
        int32_t c = ninc > 2 * s->memcap ? ninc : 2 * s->memcap;
        if (resize(&s->lmem, c, sizeof(int32_t)) < 0) return -1;
        s->memcap = c;
    }
    /* the region's links: local index, what is left of each, how many region flows */
    uint32_t ep = next_epoch(&s->lepoch, s->lstamp, s->nl);
    int32_t nloc = 0;
    for (int32_t i = 0; i < n; i++) {
        FlowObject *f = R->a[i];
        f->gi = i;
        for (int32_t k = 0; k < f->nl; k++) {
            int32_t l = f->lk[k];
            int32_t j;
            if (s->lstamp[l] != ep) {
                s->lstamp[l] = ep;
                j = s->lidx[l] = nloc++;
                s->lrem[j] = capl[l] - load[l];
                s->lcnt[j] = 0;
                s->lver[j] = 0;
                s->llink[j] = l;
            } else {
                j = s->lidx[l];
            }
            s->lrem[j] += f->rate;
            s->lcnt[j]++;
        }
    }
    /* members per shared link (CSR), and each flow's own bound */
    int32_t *off = s->loff;
    off[0] = 0;
    for (int32_t j = 0; j < nloc; j++) {
        if (s->lrem[j] < 0.0) s->lrem[j] = 0.0;   /* the others' round-off past capacity */
        off[j + 1] = off[j] + (s->lcnt[j] > 1 ? s->lcnt[j] : 0);
    }
    for (int32_t i = 0; i < n; i++) {
        FlowObject *f = R->a[i];
        s->gbound[i] = f->cap;
        s->gby[i] = -1;
        s->gopen[i] = 1;
        s->gorder[i] = i;
    }
    for (int32_t j = 0; j < nloc; j++) s->lver[j] = off[j];     /* fill cursor for now */
    for (int32_t i = 0; i < n; i++) {
        FlowObject *f = R->a[i];
        for (int32_t k = 0; k < f->nl; k++) {
            int32_t l = f->lk[k], j = s->lidx[l];
            if (s->lcnt[j] > 1) {
                s->lmem[s->lver[j]++] = i;
            } else if (s->lrem[j] < s->gbound[i]) {
                s->gbound[i] = s->lrem[j];
                s->gby[i] = l;
            }
        }
    }
    s->shn = 0;
    for (int32_t j = 0; j < nloc; j++) {
        s->lver[j] = 0;
        if (s->lcnt[j] > 1 && share_push(s, s->lrem[j] / s->lcnt[j], j, 0) < 0) return -1;
    }
    sort_key = s->gbound;
    qsort(s->gorder, (size_t)n, sizeof(int32_t), by_bound);
    int32_t left = n, next = 0;
    while (left) {
        double lam = INFINITY;
        int32_t which = -1;
        while (s->shn) {
            Share *t = &s->sh[0];
            if (t->ver == s->lver[t->idx] && s->lcnt[t->idx] > 0) {
                lam = t->share;
                which = t->idx;
                break;
            }
            share_pop(s);
        }
        while (!s->gopen[s->gorder[next]]) next++;
        double bmin = s->gbound[s->gorder[next]];
        int own = bmin <= lam * (1 + 1e-12);
        int32_t from = own ? next : off[which], to = own ? n : off[which + 1];
        for (int32_t q = from; q < to; q++) {
            int32_t i = own ? s->gorder[q] : s->lmem[q];
            if (!s->gopen[i]) continue;
            if (own && s->gbound[i] > bmin * (1 + 1e-12)) break;
            FlowObject *f = R->a[i];
            double x;
            if (own) {
                x = s->gbound[i] < lam ? s->gbound[i] : lam;
                f->xby = s->gby[i];
            } else {
                x = lam;
                f->xby = s->llink[which];
            }
            f->x = x;
            s->gopen[i] = 0;
            left--;
            for (int32_t k = 0; k < f->nl; k++) {
                int32_t j = s->lidx[f->lk[k]];
                if (off[j] == off[j + 1]) continue;     /* not shared: in its bound */
                s->lrem[j] -= x;
                if (--s->lcnt[j] > 0 &&
                    share_push(s, s->lrem[j] / s->lcnt[j], j, ++s->lver[j]) < 0)
                    return -1;
            }
        }
    }
    for (int32_t i = 0; i < n; i++)
        if (!(R->a[i]->x > 0.0)) R->a[i]->x = 0.0;
    return 0;
}

/* -- the checks ----------------------------------------------------------------------------- */
static int push_tight(State *s, int32_t l, double top) {
    if (s->ntight == s->tightcap &&
        grow((void **)&s->tight, &s->tightcap, s->ntight + 1, sizeof(Tight)) < 0)
        return -1;
    s->tight[s->ntight++] = (Tight){l, top};
    return 0;
}

/* network.py's Network._check: the flows that fail join the region; 1 if any did. */
static int check(State *s) {
    FlowList *R = &s->region;
    int32_t n0 = R->n;
    int grew = 0;
    s->ntight = 0;
    /* (1) a flow of the region stopped by a link goes at least as fast as the others */
    for (int32_t i = 0; i < n0; i++) {
        FlowObject *f = R->a[i];
        double x = f->x;
        int32_t l = f->xby;
        if (l < 0 || x >= f->solo * (1 - 1e-12) || x >= s->maxrate[l] * (1 - SAT_RTOL))
            continue;
        double top = 0.0, hi = x * (1 + SAT_RTOL);
        int extra = 0;
        IncList *v = &s->lf[l];
        for (int32_t p = 0; p < v->n; p++) {
            FlowObject *g = v->a[p].f;
            if (g->mark == s->rstamp) continue;
            if (g->rate > hi) {
                if (region_add(s, g) < 0) return -1;
                extra = 1;
            }
            if (g->rate > top) top = g->rate;
        }
        if (extra) grew = 1;
        else if (push_tight(s, l, (top > x ? top : x) * (1 + 1e-12)) < 0) return -1;
    }
    /* (2) outside flows stopped by a link where a flow of the region changed rate */
    uint32_t ep = next_epoch(&s->tepoch, s->tstamp, s->nl);
    s->ntouched = 0;
    for (int32_t i = 0; i < n0; i++) {
        FlowObject *f = R->a[i];
        double x = f->x;
        if (x == f->rate) continue;
        double d = x - f->rate;
        for (int32_t k = 0; k < f->nl; k++) {
            int32_t l = f->lk[k];
            if (!s->lby[l].n) continue;
            if (s->tstamp[l] != ep) {
                s->tstamp[l] = ep;
                s->tdelta[l] = d;
                s->ttop[l] = x;
                s->tlist[s->ntouched++] = l;
            } else {
                s->tdelta[l] += d;
                if (x > s->ttop[l]) s->ttop[l] = x;
            }
        }
    }
    for (int32_t t = 0; t < s->ntouched; t++) {
        int32_t l = s->tlist[t];
        double d = s->tdelta[l], top = s->ttop[l];
        int sat = s->load[l] + d >= s->sat[l];
        FlowList *v = &s->lby[l];
        for (int32_t p = 0; p < v->n; p++) {
            FlowObject *g = v->a[p];
            if (g->mark == s->rstamp) continue;
            /* (the region's unchanged rates there were no faster than g before) */
            if (sat && g->rate >= top * (1 - SAT_RTOL)) continue;
            if (region_add(s, g) < 0) return -1;
            grew = 1;
        }
    }
    if (!grew)
        for (int32_t t = 0; t < s->ntight; t++) s->maxrate[s->tight[t].l] = s->tight[t].top;
    return grew;
}

/* Every flow joined to the region through shared links. */
static int component(State *s) {
    FlowList *R = &s->region;
    uint32_t ep = next_epoch(&s->cepoch, s->cstamp, s->nl);
    if (!s->stack && resize(&s->stack, s->nl, sizeof(int32_t)) < 0) return -1;
    for (int32_t i = 0; i < R->n; i++) {            /* (flows that join are appended) */
        FlowObject *f = R->a[i];
        int32_t top = 0;
        for (int32_t k = 0; k < f->nl; k++) {
            int32_t l = f->lk[k];
            if (s->cstamp[l] != ep) {
                s->cstamp[l] = ep;
                s->stack[top++] = l;
            }
        }
        while (top) {
            IncList *v = &s->lf[s->stack[--top]];
            for (int32_t p = 0; p < v->n; p++)
                if (region_add(s, v->a[p].f) < 0) return -1;
        }
    }
    return 0;
}

/* -- the new rates -------------------------------------------------------------------------- */
static int apply(State *s, double now) {
    FlowList *R = &s->region;
    for (int32_t i = 0; i < R->n; i++) {
        FlowObject *f = R->a[i];
        double rate = f->x, old = f->rate;
        if (!(rate > 0)) {
            PyObject *r = PyFloat_FromDouble(rate);
            if (r) PyErr_Format(PyExc_AssertionError, "flow %lld settled at rate %R", f->fid, r);
            Py_XDECREF(r);
            return -1;
        }
        if (old > 0) {
            f->remaining -= old * (now - f->t_last);
            if (f->remaining < 0) f->remaining = 0.0;
        }
        f->t_last = now;
        if (set_by(s, f, rate < f->solo * (1 - 1e-12) ? f->xby : -1) < 0) return -1;
        if (f->finish != INFINITY && fabs(rate - old) <= old * 1e-13)
            continue;                   /* unchanged: keep the drain time (no drift) */
        f->rate = rate;
        f->finish = now + f->remaining / rate;
        f->version++;
        if (drain_push(s, f) < 0) return -1;
        double d = rate - old;
        for (int32_t k = 0; k < f->nl; k++) {
            int32_t l = f->lk[k];
            s->load[l] += d;
            if (s->maxrate[l] < rate) s->maxrate[l] = rate;
        }
    }
    return 0;
}

PyObject *State_settle(State *s, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (!s->added.n && !s->nfreed) Py_RETURN_NONE;
    if (++s->rstamp == 0) {             /* wrapped: clear every flow's mark */
        PyObject *k, *v;
        Py_ssize_t p = 0;
        while (PyDict_Next(s->flows, &p, &k, &v)) ((FlowObject *)v)->mark = 0;
        s->rstamp = 1;
    }
    FlowList *R = &s->region;
    R->n = 0;
    int err = 0;
    for (int32_t i = 0; i < s->added.n; i++) {
        FlowObject *f = s->added.a[i];
        if (!err && f->active && region_add(s, f) < 0) err = 1;
        Py_DECREF(f);
    }
    s->added.n = 0;
    for (int32_t i = 0; i < s->nfreed && !err; i++) {
        FlowList *v = &s->lby[s->freed[i]];
        for (int32_t p = 0; p < v->n; p++)
            if (region_add(s, v->a[p]) < 0) { err = 1; break; }
    }
    s->nfreed = 0;
    next_epoch(&s->fepoch, s->fstamp, s->nl);
    if (err) return NULL;
    if (!R->n) Py_RETURN_NONE;
    int widened = 0;
    for (;;) {
        s->recomputes++;
        if (fill(s) < 0) return NULL;
        int grew = check(s);
        if (grew < 0) return NULL;
        if (!grew) break;
        s->refills++;
        if (++widened > s->refills_before_component) {
            /* a region that keeps widening (a multicast tree joins many flows): fill its
             * whole component once, as a from-scratch water-filling would */
            s->components++;
            if (component(s) < 0 || fill(s) < 0) return NULL;
            break;
        }
    }
    if (apply(s, now) < 0) return NULL;
    Py_RETURN_NONE;
}
