/* What the symm helper's sources share. One extension, polycast.runtime.symm._symm:
 *
 *   _symm.c         the Barrier type and the module;
 *   _symm_wait.c    publishing a slot and waiting for peers' (spin, yield, futex);
 *   _symm_fold.c    the reductions, each element folded in rank order;
 *   _symm_slots.c   a small slotted call, started and finished from barrier.py;
 *   _symm_fast.c    the kept repeated calls (Comm -> here, no Python in between);
 *   _symm_single.c  the kept single-copy allgathers and broadcasts.
 *
 * The compiled hot path of the symm epoch barrier, of small slotted calls and of single-copy
 * allgathers and broadcasts (polycast/runtime/symm/barrier.py, staged.py and single.py hold
 * the same protocol in Python, the fallback; both run the same layout, so a compiled rank and
 * a Python rank interoperate).
 *
 * Layout (barrier.py): each rank's control block is an array of uint64 slots: EPOCH (0), the
 * call's descriptor at 1 + (epoch & 1), PROGRESS (3), SLEEP (4: non-zero while the rank sleeps
 * on a peer's futex), ADDR (5: where a single-copy call's array lies in the rank's memory). A rank stores its data, then its descriptor, then its epoch with a
 * release store; a waiter reads peers' epochs with acquire loads, so the data a peer wrote
 * before publishing is visible once its epoch is. A rank about to sleep raises SLEEP, fences
 * (seq_cst) and looks again before FUTEX_WAIT on the peer's epoch (its low 32 bits); a
 * publisher fences after its epoch store and wakes its own epoch's futex when any peer's SLEEP
 * is up: no wake-up is lost either way round.
 *
 * A wait follows the one wait policy (../transport/wait.h: spin, then sched_yield, the core
 * going to whoever is runnable: with more ranks than cores, usually the peer waited for), then
 * sleeps once on a futex, and returns how many peers are still missing; barrier.py loops over it, checking the deadline and the driver's dead
 * peers between calls (every ~1-2 ms), so every wait stays bounded.
 *
 * Small slotted calls (staged.py: data published at epoch e lies in slot e & 1 of each rank's
 * slots segment) run whole here: copy in, publish, wait, compare descriptors, then copy out or
 * reduce in rank order (sum/prod of float32/float64, sum/prod/min/max of the integer types;
 * each element reduced in the same order as numpy's fold, so the bits agree). Anything else
 * stays in numpy.
 */
#ifndef POLYCAST_SYMM_H
#define POLYCAST_SYMM_H
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

#include "../transport/wait.h"

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


typedef struct {
    int kind, root, t, op;
    uint64_t e;
    Py_buffer src, dst;
    int has_src, has_dst;
    int cma;                /* a single-copy call (its pending phase: 1 opening, 2 closing) */
    Py_ssize_t isz;         /* (single-copy broadcast: the itemsize, for where it cuts) */
} Call;


/* The kept call shapes of the fast path (_symm_fast.c). */
#define NENT 16
typedef struct {
    int kind, flag, t, opc;     /* flag: in place (allreduce) or the root (bcast) */
    int cma;                    /* single copy (see "single-copy calls" below), not slotted */
    Py_ssize_t nbytes, isz;
    unsigned long long sig;
    PyObject *dtype, *op, *what;                /* owned; op NULL for bcast */
} Entry;

struct Fast {
    pc_wait_policy wait;        /* the caller thread's wait policy (arm's) */
    int nent, next, pending, pc_locked;    /* (pending: pc.cma, its phase) */
    PyObject *ndarray, *in_place, *acquire, *release, *jobs;
    Entry ent[NENT];
    Call pc;                    /* the pending call: its buffers, and the run lock, held */
    unsigned long long last_e;
    PyObject *last_what;
};

typedef void (*fold_fn)(char *, char **, int, Py_ssize_t);

/* _symm_wait.c */
extern unsigned long long n_waits, n_polls, n_yields, n_sleeps;
int missing_of(Bar *b, int only, int slot, uint64_t target, int *first);
void publish(Bar *b, int slot, uint64_t value);
int wait_slot(Bar *b, int only, int slot, uint64_t target, const pc_wait_policy *p,
              double sleep_s);
int sigs_equal(Bar *b, uint64_t e);

/* _symm_fold.c */
fold_fn fold_for(int t, int op, int *itemsize);
PyObject *supports(PyObject *mod, PyObject *args);

/* _symm_slots.c */
void release(Call *c);
void copy_in(Bar *b, Call *c);
void copy_out(Bar *b, Call *c);
PyObject *Bar_start(Bar *self, PyObject *args);
PyObject *Bar_finish(Bar *self, PyObject *args);

/* _symm_fast.c */
extern unsigned long long n_fast;
extern PyObject *str_dtype;
void unlock(struct Fast *f);
void drop_pending(struct Fast *f);
void fast_free(Bar *b);
Entry *lookup(struct Fast *f, int kind, Py_ssize_t nbytes, PyObject *dtype, PyObject *op,
              int flag);
PyObject *Bar_arm(Bar *self, PyObject *args);
PyObject *Bar_disarm(Bar *self, PyObject *noargs);
PyObject *Bar_add(Bar *self, PyObject *args);
PyObject *Bar_allreduce(Bar *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *Bar_allgather(Bar *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *Bar_reduce_scatter(Bar *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *Bar_bcast(Bar *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *Bar_call(Bar *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *Bar_finish_pending(Bar *self, PyObject *noargs);
PyObject *Bar_drop_pending(Bar *self, PyObject *noargs);
PyObject *Bar_last(Bar *self, PyObject *noargs);

/* _symm_single.c */
extern unsigned long long n_single, n_single_pending[2];
PyObject *cma_rest(Bar *b, Call *c);
PyObject *run_cma(Bar *b, Entry *en, Call *c);
PyObject *Bar_cma_error(Bar *self, PyObject *noargs);
PyObject *Bar_set_pids(Bar *self, PyObject *args);

#endif
