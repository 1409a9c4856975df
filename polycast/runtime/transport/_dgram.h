/* The multicast datagram path in C: what its parts share (see _dgram.c for what it does).
 *
 *   _dgram.c          the Python module: Placer (open/close/write/feed/recv), mac, send
 *   _dgram_blake2b.c  BLAKE2b (RFC 7693), keyed: the datagrams' MAC
 *   _dgram_place.c    the header checks, the open streams, placement into them
 *   _dgram_read.c     recvmmsg batches, GRO, landing in place, the nap between batches
 *   _dgram_send.c     sendmmsg with UDP GSO
 */
#ifndef POLYCAST_DGRAM_H
#define POLYCAST_DGRAM_H

#include "_dgram_abi.h"   /* DGRAM_ABI: the interface version dgram.py checks */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <poll.h>
#include <time.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define HDR_NBYTES 44
#define MAC_NBYTES 16
#define MAGIC 0x5043
#define VERSION 1
#define K_DATA 2
#define K_EOS 3
#define F_MAC 0x01
#define MAX_PAYLOAD_NBYTES (1ull << 31)

#define BATCH 64                      /* datagrams (or GRO buffers) per recvmmsg */
#define SLOT_NBYTES 65536             /* a datagram or a GRO buffer: IPv4 caps both at 64 KiB */
#define GSO_MAX_SEGMENTS 64
#define GSO_MAX_NBYTES 65000          /* a GSO send is one UDP datagram to the stack */
#define SEND_BATCH 64
#define MAX_WATCH 256                 /* descriptors a recv's nap watches */

/* -- BLAKE2b -------------------------------------------------------------------------------- */
typedef struct {
    uint64_t h[8];
    uint64_t t0, t1;
    uint8_t buf[128];
    size_t c;
    size_t outlen;
} B2;

void b2_init_key(B2 *s, const uint8_t *key, size_t keylen, size_t outlen);
void b2_update(B2 *s, const uint8_t *in, size_t n);
void b2_final(B2 *s, uint8_t *out);

/* -- a datagram's header ---------------------------------------------------------------------- */
typedef struct {
    uint32_t comm, seq, src, tag, stream, length, sig;
    uint64_t offset;
    uint8_t kind;
    const uint8_t *payload;
} Hdr;

/* -- the open streams ------------------------------------------------------------------------- */
typedef struct Dest {
    long long handle;
    uint32_t comm, seq, src, stream, sig;
    Py_buffer view;                   /* the buffer, held from open to close */
    char *base;                       /* view.buf + base offset: element 0 */
    uint64_t *runs;                   /* [a0, b0, a1, b1, ...] element ranges of base */
    uint64_t *prefix;                 /* elements before run i (nruns + 1 entries) */
    size_t nruns;
    uint64_t isz, ce, nchunks, nelems;
    uint8_t *bitmap;
    uint64_t have;
    int eos_seen, eos_pending, hold, dirty;
    uint64_t *ranges;                 /* placed since the last report: [c0, c1) pairs */
    size_t nranges, cap;
    struct Dest *next;                /* in its hash bucket */
} Dest;

#define LAND_SEGS 48                  /* datagrams of one GRO buffer landed in place (64 KiB
                                       * of 1.4 KB datagrams) */
#define NCURSORS 16

typedef struct {
    int fd;
    Dest *d;                          /* NULL: a free cursor */
    uint64_t next;
} Cursor;

typedef struct {
    PyObject_HEAD
    int keyed;
    B2 mac0;                          /* BLAKE2b state after the key block */
    Dest **buckets;
    size_t nbuckets, ndests;
    Dest **dirty;
    size_t ndirty, dirty_cap;
    int busy;                         /* recv running without the GIL */
    int ended;                        /* a stream completed or saw its EOS (this batch) */
    int streaming;                    /* a chunk went to a stream still incomplete */
    int gro;                          /* UDP_GRO asked of the sockets (set_gro) */
    /* recv buffers */
    uint8_t *slots;                   /* a datagram (or GRO buffer) per message; overflow */
    uint8_t *scratch;                 /* landed datagrams that missed, gathered (landing) */
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH][2 * LAND_SEGS + 1];
    char cmsg[BATCH][CMSG_SPACE(sizeof(int))];
    /* landing: per message, the stream and chunks its datagrams are expected to be */
    uint8_t hdrs[BATCH][LAND_SEGS][HDR_NBYTES + MAC_NBYTES];
    struct { Dest *d; uint64_t c0; int nseg; uint32_t seg_nbytes[LAND_SEGS]; } plan[BATCH];
    uint32_t missed[BATCH * LAND_SEGS][3];     /* datagrams that missed: gathered */
    Hdr claims[BATCH * LAND_SEGS];              /* what those placed later say they are */
    Cursor cursors[NCURSORS];         /* per socket: the stream and chunk expected next */
    Dest *last_d;                     /* the last chunk placed (the next cursor) */
    uint64_t last_c;
    int land_segs;                    /* datagrams per message lately (GRO), 1..LAND_SEGS */
    int landing;                      /* landing enabled (set_landing) */
    int land_pause;                   /* batches left in slot mode after a missing batch */
    /* datagrams to hand up after a batch (in slots or scratch) */
    struct { const uint8_t *ptr; uint32_t len, placed; } up[BATCH * 64];
    size_t nup;
    /* counters */
    unsigned long long c_datagrams, c_placed, c_placed_nbytes, c_duplicates, c_up, c_bad_mac,
        c_syscalls, c_gro_buffers, c_eos, c_up_lost,
        c_consumed, c_consumed_nbytes, c_duplicate_eos, c_landed, c_land_missed;
} Placer;

static inline size_t key_hash(uint32_t comm, uint32_t seq, uint32_t src, uint32_t stream) {
    uint64_t x = ((uint64_t)comm << 32 | seq) * 0x9E3779B97F4A7C15ULL;
    x ^= ((uint64_t)src << 32 | stream) * 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 29;
    return (size_t)x;
}

int parse_fields(const uint8_t *d, size_t n, int keyed, Hdr *h);
void dest_free(Dest *d);
int grow_buckets(Placer *p);
Dest *find_handle(Placer *p, long long handle);
void copy_elems(Dest *d, uint64_t e0, uint64_t e1, const uint8_t *src);
int mac_ok2(Placer *p, const uint8_t *hdr, const uint8_t *pay, size_t npay);
int handle_one(Placer *p, const uint8_t *data, size_t n);
int handle_parsed(Placer *p, Hdr h, const uint8_t *hdr, int mac_checked);

/* -- reading ---------------------------------------------------------------------------------- */
double mono_us(void);
int nap(double us, const struct pollfd *watch, int n);
int read_batch(Placer *p, int fd, int vlen);

/* -- sending (Python functions of the module) --------------------------------------------------- */
PyObject *dgram_send(PyObject *mod, PyObject *args);
PyObject *dgram_send_chunks(PyObject *mod, PyObject *args);
PyObject *dgram_gso_available(PyObject *mod, PyObject *ignored);

#endif
