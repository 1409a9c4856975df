/* What the shared-memory rings' compiled helpers share (polycast/runtime/transport/_ring.c, the rings'
 * hot operations; polycast/runtime/driver/_replay.c, the compiled replay of a memoized small call):
 * the ring layout (ring_layout.h, which the Python rings read too) and the mapped ring object. */
#ifndef POLYCAST_RING_H
#define POLYCAST_RING_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "ring_layout.h"        /* the layout and framing, shared with the Python rings */
/* Copies at least this big run with the GIL released (below it the release costs more). */
#define NOGIL_NBYTES (64 * 1024)
#define MAX_PARTS 64

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int held;
    char *ctrl;
    char *data;
    uint64_t cap;
} RingMap;

static inline uint64_t pad16(uint64_t n) { return (n + ALIGN - 1) & ~(uint64_t)(ALIGN - 1); }

static inline uint64_t *slot(RingMap *r, Py_ssize_t off) { return (uint64_t *)(r->ctrl + off); }

static inline void put_prefix(char *at, uint32_t hdr_len, uint64_t plen) {
    memcpy(at, &hdr_len, 4);      /* little-endian hosts only (runtime/transport/native.py checks) */
    memcpy(at + 4, &plen, 8);
}

/* Bump the u32 counter at ``bell`` (one writer per counter), fence, and return the flag at
 * ``flag`` (the data-side of the handshake). */
static inline uint64_t bump_and_check(RingMap *r, Py_ssize_t bell, Py_ssize_t flag) {
    uint64_t *b = slot(r, bell);
    uint64_t v = (__atomic_load_n(b, __ATOMIC_RELAXED) + 1) & 0xFFFFFFFFu;
    __atomic_store_n(b, v, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return __atomic_load_n(slot(r, flag), __ATOMIC_ACQUIRE);
}

extern PyTypeObject RingMapType;

/* _replay.c: adds its types to the module (0, or -1 with an exception set). */
int replay_add_types(PyObject *module);

#endif
