/* Publishing a control slot and waiting for peers' (the protocol: _symm.h). */
#include "_symm.h"

/* Counts for the benches (bench/symm.py --floor): waits that had to wait, polls, yields,
 * sleeps. Per process, unsynchronised: only read while no call runs. */
unsigned long long n_waits, n_polls, n_yields, n_sleeps;

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
int missing_of(Bar *b, int only, int slot, uint64_t target, int *first) {
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

void publish(Bar *b, int slot, uint64_t value) {
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
int wait_slot(Bar *b, int only, int slot, uint64_t target, double spin_s,
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

/* sigs_equal(epoch): whether every rank published the same descriptor at epoch. */
int sigs_equal(Bar *b, uint64_t e) {
    int s = S_SIG0 + (int)(e & 1);
    uint64_t mine = __atomic_load_n(&b->ctrl[b->rank][s], __ATOMIC_RELAXED);
    for (int p = 0; p < b->size; p++)
        if (__atomic_load_n(&b->ctrl[p][s], __ATOMIC_ACQUIRE) != mine) return 0;
    return 1;
}
