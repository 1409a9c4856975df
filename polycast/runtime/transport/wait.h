/* The one wait policy, compiled: spin, yield, then sleep (polycast/runtime/transport/wait.py
 * says why; its WaitPolicy.c_args is the pc_wait_policy below, its Waiter the Python twin of
 * pc_waiter). Included by the compiled replay (runtime/driver/_replay.c) and the symm
 * barrier (runtime/symm/_symm_wait.c); each sleeps on its own futex words, for at most the
 * policy's slice, and checks its own bound between sleeps. Header-only (static inline). */
#ifndef POLYCAST_WAIT_H
#define POLYCAST_WAIT_H

#include <Python.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#define PC_YIELD_RAN_OTHERS_S 10e-6  /* a yield longer than this ran another task */
enum { PC_SPIN = 0, PC_YIELD = 1, PC_SLEEP = 2 };

typedef struct {
    double spin_s;          /* busy looks before the first yield */
    double yield_s;         /* own CPU spent looking and yielding, then sleep */
    double yield_wall_s;    /* the yield phase's bound in wall time */
    double slice_s;         /* the longest sleep before looking again */
    int futex;              /* sleep on futexes (else nap) */
} pc_wait_policy;

typedef struct {
    double start, last, own;
} pc_waiter;

/* WaitPolicy.c_args -> *p; 0 with a Python error set when it is not that tuple. */
static inline int pc_wait_policy_parse(PyObject *args, pc_wait_policy *p) {
    return PyArg_ParseTuple(args, "ddddp;a WaitPolicy.c_args tuple", &p->spin_s, &p->yield_s,
                            &p->yield_wall_s, &p->slice_s, &p->futex);
}

static inline double pc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* An absolute CLOCK_MONOTONIC time ``seconds`` from now (futex_waitv's timeout). */
static inline struct timespec pc_deadline(double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = (long long)(seconds * 1e9) + ts.tv_nsec;
    ts.tv_sec += ns / 1000000000LL;
    ts.tv_nsec = ns % 1000000000LL;
    return ts;
}

/* A relative time of ``seconds`` (FUTEX_WAIT's, nanosleep's). */
static inline struct timespec pc_interval(double seconds) {
    struct timespec tv;
    tv.tv_sec = (time_t)seconds;
    tv.tv_nsec = (long)((seconds - (double)tv.tv_sec) * 1e9);
    return tv;
}

static inline void pc_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* A wait starts (again: input came, so the spin begins anew). */
static inline void pc_wait_begin(pc_waiter *w, double now) {
    w->start = w->last = now;
    w->own = 0;
}

/* What the policy says to do after a look that found nothing, at ``now``. */
static inline int pc_wait_phase(const pc_waiter *w, const pc_wait_policy *p, double now) {
    double waited = now - w->start;
    if (waited < p->spin_s)
        return PC_SPIN;
    if (w->own < p->yield_s && waited < p->spin_s + p->yield_wall_s)
        return PC_YIELD;
    return PC_SLEEP;
}

/* The spin phase's pause between looks. */
static inline void pc_wait_spin(void) {
    for (int i = 0; i < 32; i++)
        pc_cpu_relax();
}

/* The yield phase's: the core to whoever is runnable; the step counts as our own CPU when
 * the yield came straight back (nobody else wanted the core). */
static inline void pc_wait_yield(pc_waiter *w) {
    double before = pc_now();
    sched_yield();
    double after = pc_now();
    if (after - before < PC_YIELD_RAN_OTHERS_S)
        w->own += after - w->last;
    w->last = after;
}

#endif
