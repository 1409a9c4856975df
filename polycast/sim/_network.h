/* The simulator's compiled network model (polycast/sim/network.py says what it models and
 * how settle works; this is the same state and the same algorithm, in C).
 *
 * Parts: _network.c (the Flow and State types, add_flow, pop_drained, next_time, the drain
 * heap, the module) and _network_settle.c (settle: the region, the water-filling, the
 * checks, the component, applying the rates). */
#ifndef POLYCAST_SIM_NETWORK_H
#define POLYCAST_SIM_NETWORK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Bumped with every change to the interface network.py calls (a build from older source
 * is then refused and the pure-Python model runs). */
#define NETWORK_ABI 1

#define SAT_RTOL 1e-9

/* One active (or drained) flow. Python reads every field through read-only members; the
 * state owns the arrays below while the flow is active. */
typedef struct FlowObject {
    PyObject_HEAD
    long long fid, nbytes, version, by;
    double start, remaining, rate, t_last, finish, cap, goodput, solo;
    PyObject *data, *links, *key;   /* the driver's tag, the links as given, fid as int */
    int32_t nl;
    int32_t *lk;                    /* link ids */
    int32_t *pos;                   /* this flow's place in each link's list */
    int32_t bypos;                  /* its place in its bottleneck link's list */
    int active;
    uint32_t mark;                  /* == State.rstamp: in the region being settled */
    int32_t gi;                     /* its index in the group being filled */
    double x;                       /* the fill's rate */
    int32_t xby;                    /* the fill's bottleneck link (-1: its own limit) */
} FlowObject;

typedef struct { FlowObject *f; int32_t k; } Inc;          /* flow f's k-th link */
typedef struct { Inc *a; int32_t n, cap; } IncList;
typedef struct { FlowObject **a; int32_t n, cap; } FlowList;
typedef struct { double t; long long fid, ver; FlowObject *f; } Drain;
typedef struct { double share; int32_t idx, ver; } Share;
typedef struct { int32_t l; double top; } Tight;

typedef struct {
    PyObject_HEAD
    int32_t nl, nnet;               /* links (host ports included), network links */
    Py_buffer bcap, bsat, bload, bmax, blb;
    double *cap, *sat, *load, *maxrate, *lb;   /* the Python arrays' memory */
    IncList *lf;                    /* per link: its flows */
    FlowList *lby;                  /* per link: the flows it is the bottleneck of */
    Drain *heap; Py_ssize_t hn, hcap;          /* (finish, fid, version) */
    PyObject *flows;                /* fid -> Flow */
    FlowList added;                 /* strong references until the next settle */
    int32_t *freed; int32_t nfreed; uint32_t *fstamp; uint32_t fepoch;
    long long next_fid, recomputes, refills, components, flows_started;
    int refills_before_component;
    /* settle's scratch */
    FlowList region; uint32_t rstamp;
    uint32_t *lstamp; uint32_t lepoch; int32_t *lidx;          /* link -> local index */
    double *lrem; int32_t *lcnt, *lver, *llink, *loff, *lmem; int32_t lcap, memcap;
    double *gbound; int32_t *gby, *gorder; char *gopen; int32_t gcap;
    Share *sh; Py_ssize_t shn, shcap;
    uint32_t *tstamp; uint32_t tepoch; double *tdelta, *ttop; int32_t *tlist; int32_t ntouched;
    Tight *tight; int32_t ntight, tightcap;
    uint32_t *cstamp; uint32_t cepoch; int32_t *stack;
} State;

/* _network.c */
int grow(void **p, int32_t *cap, int32_t need, size_t size);
int flows_push(FlowList *v, FlowObject *f);
int drain_push(State *s, FlowObject *f);
uint32_t next_epoch(uint32_t *epoch, uint32_t *arr, int32_t n);
/* for the compiled events loop (_events.c) */
FlowObject *net_add_flow(State *s, int32_t *lk, int32_t nl, long long nbytes, double now,
                         PyObject *data, PyObject *links, double cap, double goodput);
double net_next_time(State *s);
FlowObject *net_pop_drained(State *s, double bound);

/* _events.c: the fast path's events mode (fast_events.py) as one C loop */
PyObject *events_run(PyObject *self, PyObject *args);

/* _network_settle.c */
PyObject *State_settle(State *s, PyObject *arg);
int set_by(State *s, FlowObject *f, int32_t l);    /* l = -1 never fails */

#endif
