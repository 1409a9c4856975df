/* The shared-memory rings' layout and framing: the one definition both the compiled rings
 * (_ring.c, and the compiled replay in ../driver/_replay.c, through _ring.h) and the Python
 * rings (shm.py, frames.py: layout.py reads this file at import) use. Only
 * "#define NAME <integer expression of earlier names>" lines; comments say what each is. */
#ifndef POLYCAST_RING_LAYOUT_H
#define POLYCAST_RING_LAYOUT_H

/* A frame: a prefix (the header length, or a driver-level kind, as u32; the payload
 * length as u64; little-endian), the engine's header, the payload, padded to ALIGN. */
#define PREFIX_NBYTES 12
#define ALIGN 16

/* Driver-level frames (never seen by the engine) use header lengths from KIND_BASE up. */
#define KIND_BASE 0xFFFFFF00
#define KIND_DOORBELL (KIND_BASE + 1)      /* "look at your shared-memory rings" */
#define KIND_BYE (KIND_BASE + 2)           /* orderly close: not a lost peer */
#define KIND_FRAG_FIRST (KIND_BASE + 3)    /* shm: first piece of a message too big for one slot */
#define KIND_FRAG_MORE (KIND_BASE + 4)     /* shm: a further piece */
#define KIND_CMA (KIND_BASE + 5)           /* shm: a payload to read single-copy (cma.py) */
#define KIND_CMA_DONE (KIND_BASE + 6)      /* shm: done reading those payloads (their seqs) */
#define KIND_WRAP (KIND_BASE + 10)         /* shm: the rest of the ring is padding */

/* A ring's control block (CTRL_NBYTES at the start of the mapping; the data follows): u64
 * slots at these byte offsets. */
#define CTRL_NBYTES 256
#define SLOT_HEAD 0                /* bytes written, ever (the writer's) */
#define SLOT_TAIL 8                /* bytes read and released, ever (the reader's) */
#define SLOT_READER_SLEEPING 16    /* how the reader sleeps: 0, SLEEP_SELECT or SLEEP_FUTEX */
#define SLOT_WRITER_BLOCKED 24     /* the writer waits for space */
#define SLOT_DATA_BELL 32          /* futex counter (low 32 bits) the writer bumps */
#define SLOT_SPACE_BELL 40         /* futex counter the reader bumps when it frees space */
#define SLOT_CMA_VERDICT 48        /* the reader's verdict on single-copy reads (cma.py) */
#define SLEEP_SELECT 1
#define SLEEP_FUTEX 2
#define CMA_UNKNOWN 0
#define CMA_YES 1
#define CMA_NO 2

#endif
