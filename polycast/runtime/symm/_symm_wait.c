/* Publishing a control slot and waiting for peers' (the protocol: _symm.h). */
#include "_symm.h"

/* Counts for the benches (bench/symm.py --floor): waits that had to wait, polls, yields,
 * sleeps. Per process, unsynchronised: only read while no call runs. */
unsigned long long n_waits, n_polls, n_yields, n_sleeps;

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

/* Wait as the policy says (transport/wait.h: spin, then sched_yield), then (sleep_s > 0)
 * sleep once for up to sleep_s: on the first missing peer's futex, or a plain nap without
 * futexes. Returns how many peers are still missing. The GIL is released past the spin. */
#define missing(b, slot, target, first) missing_of(b, only, slot, target, first)
int wait_slot(Bar *b, int only, int slot, uint64_t target, const pc_wait_policy *p,
              double sleep_s) {
    int first = 0;
    int n = missing(b, slot, target, &first);
    if (!n) return 0;
    n_waits++;
    pc_waiter w;
    pc_wait_begin(&w, pc_now());
    PyThreadState *ts = NULL;
    int phase;
    while ((phase = pc_wait_phase(&w, p, pc_now())) != PC_SLEEP) {
        if (phase == PC_SPIN) {
            pc_wait_spin();
            n_polls++;
        } else {
            if (!ts) ts = PyEval_SaveThread();
            pc_wait_yield(&w);
            n_yields++;
        }
        if (!(n = missing(b, slot, target, &first))) break;
    }
    if (n && sleep_s > 0) {
        if (!ts) ts = PyEval_SaveThread();
        struct timespec tv = pc_interval(sleep_s);
        if (p->futex) {
            uint64_t *own = b->ctrl[b->rank];
            __atomic_store_n(&own[S_SLEEP], 1, __ATOMIC_SEQ_CST);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            if ((n = missing(b, slot, target, &first))) {
                n_sleeps++;
                uint64_t *wd = &b->ctrl[first][slot];
                uint64_t seen = __atomic_load_n(wd, __ATOMIC_ACQUIRE);
                if (seen < target)      /* the low 32 bits (little-endian) */
                    syscall(SYS_futex, (void *)wd, FUTEX_WAIT, (uint32_t)seen, &tv, NULL, 0);
            }
            __atomic_store_n(&own[S_SLEEP], 0, __ATOMIC_RELEASE);
        } else {
            nanosleep(&tv, NULL);
        }
        n = missing(b, slot, target, &first);
    }
    if (ts) PyEval_RestoreThread(ts);
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
