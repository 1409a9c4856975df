/* The multicast datagram path in C (optional; runtime/transport/dgram.py loads it).
 *
 * It carries out, per datagram, what the engine decided per stream; it decides nothing.
 *
 *   Placer  - the open streams of one process (the engine's OpenStream actions, or the
 *             offload worker's OPEN commands): where each stream's chunks go (a writable
 *             buffer, its element runs, chunk geometry, call signature) and a bitmap.
 *             Placer.recv(fd, n) reads up to n datagrams with recvmmsg (UDP GRO segments
 *             split), checks each header (and its keyed BLAKE2b MAC when the job has a
 *             secret) exactly as engine/wire.py's parse_datagram does, and for a datagram
 *             of an open stream whose chunk geometry and signature match: copies the
 *             payload into place and sets its bit (MCAST_DATA), or notes the end of stream
 *             (MCAST_EOS). A chunk already held is a duplicate: dropped and counted.
 *             Everything else - a header that does not parse, a MAC that does not verify,
 *             a stream not open (early, stale, foreign, own), a signature or geometry that
 *             does not match - is returned unconsumed, for the engine to decide (hold,
 *             drop and count the reason). What was placed is reported per stream as chunk
 *             ranges, with the EOS, once per call.
 *   send    - a list of datagrams (header, payload) sent with sendmmsg, consecutive
 *             datagrams of one size grouped into one UDP GSO send (UDP_SEGMENT) where the
 *             kernel takes it. Sent when the engine's pacing says; the caller keeps the
 *             timing.
 *
 * Memory safety: a stream's buffer is held (buffer protocol) from open to close, and every
 * element run is checked against it at open, so no datagram can make a write outside it;
 * chunk indices, offsets and lengths are checked against the stream's geometry before any
 * copy. The copies and syscalls run without the GIL; a Placer is used by one thread at a
 * time (open/close/write refuse while recv runs).
 *
 * Wire header (engine/wire.py), network byte order, 44 bytes then [16-byte MAC] then payload:
 *   magic u16 | version u8 | kind u8 | flags u8 | pad 3 | comm u32 | seq u32 | src u32 |
 *   tag u32 | stream u32 | offset u64 | length u32 | sig u32
 */
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

/* ------------------------------------------------------------------------------------------
 * BLAKE2b (RFC 7693), keyed, any digest length up to 64; the MAC is 16 bytes.
 */
static const uint64_t B2_IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
    0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
    0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};
static const uint8_t B2_SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

typedef struct {
    uint64_t h[8];
    uint64_t t0, t1;
    uint8_t buf[128];
    size_t c;
    size_t outlen;
} B2;

static inline uint64_t rotr64(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t load64le(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static void b2_compress(B2 *s, const uint8_t *block, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++)
        m[i] = load64le(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = s->h[i];
        v[i + 8] = B2_IV[i];
    }
    v[12] ^= s->t0;
    v[13] ^= s->t1;
    if (last)
        v[14] = ~v[14];
#define B2G(a, b, c, d, x, y)                                                              \
    do {                                                                                   \
        v[a] = v[a] + v[b] + (x);                                                          \
        v[d] = rotr64(v[d] ^ v[a], 32);                                                    \
        v[c] = v[c] + v[d];                                                                \
        v[b] = rotr64(v[b] ^ v[c], 24);                                                    \
        v[a] = v[a] + v[b] + (y);                                                          \
        v[d] = rotr64(v[d] ^ v[a], 16);                                                    \
        v[c] = v[c] + v[d];                                                                \
        v[b] = rotr64(v[b] ^ v[c], 63);                                                    \
    } while (0)
    for (int r = 0; r < 12; r++) {
        const uint8_t *sg = B2_SIGMA[r];
        B2G(0, 4, 8, 12, m[sg[0]], m[sg[1]]);
        B2G(1, 5, 9, 13, m[sg[2]], m[sg[3]]);
        B2G(2, 6, 10, 14, m[sg[4]], m[sg[5]]);
        B2G(3, 7, 11, 15, m[sg[6]], m[sg[7]]);
        B2G(0, 5, 10, 15, m[sg[8]], m[sg[9]]);
        B2G(1, 6, 11, 12, m[sg[10]], m[sg[11]]);
        B2G(2, 7, 8, 13, m[sg[12]], m[sg[13]]);
        B2G(3, 4, 9, 14, m[sg[14]], m[sg[15]]);
    }
#undef B2G
    for (int i = 0; i < 8; i++)
        s->h[i] ^= v[i] ^ v[i + 8];
}

static void b2_update(B2 *s, const uint8_t *in, size_t n) {
    while (n > 0) {
        if (s->c == 128) {              /* a full block is compressed only when more follows */
            s->t0 += 128;
            if (s->t0 < 128)
                s->t1++;
            b2_compress(s, s->buf, 0);
            s->c = 0;
        }
        size_t take = 128 - s->c;
        if (take > n)
            take = n;
        memcpy(s->buf + s->c, in, take);
        s->c += take;
        in += take;
        n -= take;
    }
}

/* The state after the key block: every MAC of a job starts from it (copied, not redone). */
static void b2_init_key(B2 *s, const uint8_t *key, size_t keylen, size_t outlen) {
    memcpy(s->h, B2_IV, sizeof(B2_IV));
    s->h[0] ^= 0x01010000ULL ^ ((uint64_t)keylen << 8) ^ (uint64_t)outlen;
    s->t0 = s->t1 = 0;
    s->c = 0;
    s->outlen = outlen;
    memset(s->buf, 0, sizeof(s->buf));
    if (keylen > 0) {
        memcpy(s->buf, key, keylen);
        s->c = 128;
    }
}

static void b2_final(B2 *s, uint8_t *out) {
    s->t0 += s->c;
    if (s->t0 < s->c)
        s->t1++;
    memset(s->buf + s->c, 0, 128 - s->c);
    b2_compress(s, s->buf, 1);
    uint8_t full[64];
    for (int i = 0; i < 8; i++) {
        uint64_t w = s->h[i];
        for (int j = 0; j < 8; j++)
            full[8 * i + j] = (uint8_t)(w >> (8 * j));
    }
    memcpy(out, full, s->outlen);
}

/* ------------------------------------------------------------------------------------------
 * The header
 */
typedef struct {
    uint32_t comm, seq, src, tag, stream, length, sig;
    uint64_t offset;
    uint8_t kind;
    const uint8_t *payload;
} Hdr;

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) << 32 | rd32(p + 4); }

/* What parse_datagram (engine/wire.py) accepts, minus the MAC check (done only for datagrams
 * this module would consume); 0 or -1. ``keyed``: the job has a secret. */
static int parse_fields(const uint8_t *d, size_t n, int keyed, Hdr *h) {
    if (n < HDR_NBYTES || rd16(d) != MAGIC || d[2] != VERSION)
        return -1;
    uint8_t kind = d[3], flags = d[4];
    if (kind != K_DATA && kind != K_EOS)
        return -1;
    size_t start = HDR_NBYTES;
    if (keyed) {
        if (flags != F_MAC)
            return -1;
        start += MAC_NBYTES;
        if (n < start)
            return -1;
    } else if (flags != 0) {
        return -1;
    }
    h->length = rd32(d + 36);
    if ((uint64_t)h->length > MAX_PAYLOAD_NBYTES || n != start + (size_t)h->length)
        return -1;
    h->kind = kind;
    h->comm = rd32(d + 8);
    h->seq = rd32(d + 12);
    h->src = rd32(d + 16);
    h->tag = rd32(d + 20);
    h->stream = rd32(d + 24);
    h->offset = rd64(d + 28);
    h->sig = rd32(d + 40);
    h->payload = d + start;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Streams
 */
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

static void dest_free(Dest *d) {
    if (d->view.obj)
        PyBuffer_Release(&d->view);
    PyMem_Free(d->runs);
    PyMem_Free(d->prefix);
    PyMem_Free(d->bitmap);
    PyMem_Free(d->ranges);
    PyMem_Free(d);
}

static int grow_buckets(Placer *p) {
    size_t n = p->nbuckets ? p->nbuckets * 2 : 256;
    Dest **b = PyMem_Calloc(n, sizeof(Dest *));
    if (!b) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < p->nbuckets; i++) {
        Dest *d = p->buckets[i];
        while (d) {
            Dest *next = d->next;
            size_t k = key_hash(d->comm, d->seq, d->src, d->stream) & (n - 1);
            d->next = b[k];
            b[k] = d;
            d = next;
        }
    }
    PyMem_Free(p->buckets);
    p->buckets = b;
    p->nbuckets = n;
    return 0;
}

static Dest *find_handle(Placer *p, long long handle) {
    for (size_t i = 0; i < p->nbuckets; i++)
        for (Dest *d = p->buckets[i]; d; d = d->next)
            if (d->handle == handle)
                return d;
    return NULL;
}

static int add_range(Dest *d, uint64_t c0, uint64_t c1) {
    if (d->nranges && d->ranges[2 * d->nranges - 1] == c0) {
        d->ranges[2 * d->nranges - 1] = c1;
        return 0;
    }
    if (d->nranges == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 16;
        uint64_t *r = PyMem_Realloc(d->ranges, cap * 2 * sizeof(uint64_t));
        if (!r)
            return -1;
        d->ranges = r;
        d->cap = cap;
    }
    d->ranges[2 * d->nranges] = c0;
    d->ranges[2 * d->nranges + 1] = c1;
    d->nranges++;
    return 0;
}

static int mark_dirty(Placer *p, Dest *d) {
    if (d->dirty)
        return 0;
    if (p->ndirty == p->dirty_cap) {
        size_t cap = p->dirty_cap ? p->dirty_cap * 2 : 64;
        Dest **n = PyMem_Realloc(p->dirty, cap * sizeof(Dest *));
        if (!n)
            return -1;
        p->dirty = n;
        p->dirty_cap = cap;
    }
    p->dirty[p->ndirty++] = d;
    d->dirty = 1;
    return 0;
}

/* Copy the stream's elements [e0, e1) from src (their concatenation). Bounds were checked at
 * open: every run lies inside the buffer, and e1 <= nelems. */
static void copy_elems(Dest *d, uint64_t e0, uint64_t e1, const uint8_t *src) {
    uint64_t isz = d->isz;
    if (d->nruns == 1) {
        memcpy(d->base + (d->runs[0] + e0) * isz, src, (size_t)((e1 - e0) * isz));
        return;
    }
    size_t lo = 0, hi = d->nruns;      /* the run holding element e0: prefix[i] <= e0 */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (d->prefix[mid] <= e0)
            lo = mid;
        else
            hi = mid;
    }
    for (size_t i = lo; i < d->nruns && e0 < e1; i++) {
        uint64_t a = d->runs[2 * i], b = d->runs[2 * i + 1];
        uint64_t at = a + (e0 - d->prefix[i]);
        uint64_t take = b - at;
        if (take > e1 - e0)
            take = e1 - e0;
        if (take) {
            memcpy(d->base + at * isz, src, (size_t)(take * isz));
            src += take * isz;
            e0 += take;
        }
    }
}

/* One stream's copy of a parsed datagram: 1 placed, 0 duplicate, -1 not ours to decide. */
static int place(Placer *p, Dest *d, const Hdr *h) {
    if (h->sig != d->sig)
        return -1;
    if (h->kind == K_DATA) {
        uint64_t i = h->tag;
        if (i >= d->nchunks)
            return -1;
        uint64_t e0 = i * d->ce;
        uint64_t nel = d->nelems - e0 < d->ce ? d->nelems - e0 : d->ce;
        if (h->offset != e0 * d->isz || (uint64_t)h->length != nel * d->isz)
            return -1;
        if (d->bitmap[i])
            return 0;
        const char *at = d->base + (d->runs[0] + e0) * d->isz;
        if ((const char *)h->payload != at || d->nruns != 1)
            copy_elems(d, e0, e0 + nel, h->payload);    /* (landed: in place already) */
        d->bitmap[i] = 1;
        d->have++;
        p->last_d = d;
        p->last_c = i;
        if (d->have == d->nchunks)
            p->ended = 1;
        else
            p->streaming = 1;
        if (add_range(d, i, i + 1) < 0 || mark_dirty(p, d) < 0)
            return -2;
        return 1;
    }
    if (h->tag != d->nchunks || h->offset != d->nelems * d->isz)
        return -1;
    if (d->eos_seen)
        return 0;
    d->eos_seen = d->eos_pending = 1;
    p->ended = 1;
    if (mark_dirty(p, d) < 0)
        return -2;
    return 1;
}

/* The MAC of header ``hdr`` (44 bytes, then its 16-byte MAC) over it and ``pay``. */
static int mac_ok2(Placer *p, const uint8_t *hdr, const uint8_t *pay, size_t npay) {
    B2 s = p->mac0;
    uint8_t out[MAC_NBYTES];
    b2_update(&s, hdr, HDR_NBYTES);
    b2_update(&s, pay, npay);
    b2_final(&s, out);
    uint8_t diff = 0;
    for (int i = 0; i < MAC_NBYTES; i++)
        diff |= out[i] ^ hdr[HDR_NBYTES + i];
    return diff == 0;
}



/* One datagram: 1 consumed (placed or a duplicate), 0 to hand up, 2 placed and also to hand
 * up (a stream still holding datagrams for local ranks that have not opened it), -2 memory. */
static int handle_parsed(Placer *p, Hdr h, const uint8_t *hdr, int mac_checked);

static int handle_one(Placer *p, const uint8_t *data, size_t n) {
    Hdr h;
    p->c_datagrams++;
    if (parse_fields(data, n, p->keyed, &h) < 0)
        return 0;
    return handle_parsed(p, h, data, 0);
}

/* ``h`` parsed from header bytes ``hdr`` (its payload at h.payload, maybe elsewhere: a
 * datagram landed in place); ``mac_checked``: its MAC verified already. */
static int handle_parsed(Placer *p, Hdr h, const uint8_t *hdr, int mac_checked) {
    size_t k = p->nbuckets ? key_hash(h.comm, h.seq, h.src, h.stream) & (p->nbuckets - 1) : 0;
    Dest *first = NULL;
    for (Dest *d = p->nbuckets ? p->buckets[k] : NULL; d; d = d->next)
        if (d->comm == h.comm && d->seq == h.seq && d->src == h.src && d->stream == h.stream) {
            first = d;
            break;
        }
    if (!first)
        return 0;
    if (p->keyed && !mac_checked && !mac_ok2(p, hdr, h.payload, h.length)) {
        p->c_bad_mac++;
        return 0;
    }
    int placed = 0, dup = 0, hold = 0;
    for (Dest *d = first; d; d = d->next) {
        if (d->comm != h.comm || d->seq != h.seq || d->src != h.src || d->stream != h.stream)
            continue;
        int r = place(p, d, &h);
        if (r == -2)
            return -2;
        if (r == 1)
            placed = 1;
        else if (r == 0)
            dup = 1;
        hold |= d->hold;
    }
    if (!placed && !dup)
        return 0;
    p->c_consumed++;
    p->c_consumed_nbytes += h.length;
    if (placed) {
        if (h.kind == K_DATA) {
            p->c_placed++;
            p->c_placed_nbytes += h.length;
        } else {
            p->c_eos++;
        }
    } else if (h.kind == K_DATA) {
        p->c_duplicates++;
    } else {
        p->c_duplicate_eos++;
    }
    return hold ? 2 : 1;
}

/* ------------------------------------------------------------------------------------------
 * Placer: Python side
 */
static int Placer_init(Placer *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"key", NULL};
    Py_buffer key = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|z*", names, &key))
        return -1;
    if (key.buf && key.len > 64) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "a BLAKE2b key is at most 64 bytes");
        return -1;
    }
    self->keyed = key.buf != NULL && key.len > 0;
    b2_init_key(&self->mac0, self->keyed ? key.buf : NULL, self->keyed ? (size_t)key.len : 0,
                MAC_NBYTES);
    if (key.buf)
        PyBuffer_Release(&key);
    if (!self->slots) {
        self->slots = PyMem_Malloc((size_t)BATCH * SLOT_NBYTES);
        self->scratch = PyMem_Malloc((size_t)BATCH * SLOT_NBYTES);
        if (!self->slots || !self->scratch) {
            PyErr_NoMemory();
            return -1;
        }
    }
    self->land_segs = 1;
    return 0;
}

static void Placer_dealloc(Placer *self) {
    for (size_t i = 0; i < self->nbuckets; i++) {
        Dest *d = self->buckets[i];
        while (d) {
            Dest *next = d->next;
            dest_free(d);
            d = next;
        }
    }
    PyMem_Free(self->buckets);
    PyMem_Free(self->dirty);
    PyMem_Free(self->slots);
    PyMem_Free(self->scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int not_busy(Placer *p) {
    if (p->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Placer used from two threads at once");
        return -1;
    }
    return 0;
}

static PyObject *Placer_open(Placer *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"handle", "comm", "seq", "src", "stream", "sig", "buffer",
                            "base_nbytes", "runs", "itemsize", "chunk_elems", "nchunks",
                            "nelems", NULL};
    long long handle;
    unsigned int comm, seq, src, stream, sig;
    PyObject *bufobj;
    Py_ssize_t base;
    Py_buffer runs = {0};
    unsigned long long isz, ce, nchunks, nelems;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LIIIIIOny*KKKK", names, &handle, &comm, &seq,
                                     &src, &stream, &sig, &bufobj, &base, &runs, &isz, &ce,
                                     &nchunks, &nelems))
        return NULL;
    if (not_busy(self) < 0) {
        PyBuffer_Release(&runs);
        return NULL;
    }
    Dest *d = PyMem_Calloc(1, sizeof(Dest));
    if (!d) {
        PyBuffer_Release(&runs);
        return PyErr_NoMemory();
    }
    const char *why = NULL;
    if (PyObject_GetBuffer(bufobj, &d->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&runs);
        PyMem_Free(d);
        return NULL;
    }
    size_t nruns = (size_t)runs.len / 16;
    if (runs.len % 16 || nruns == 0)
        why = "runs must be packed int64 (start, end) element pairs, at least one";
    else if (isz == 0 || isz > (1u << 20) || ce == 0 || ce > (1ull << 32))
        why = "itemsize and chunk_elems out of range";
    else if (base < 0 || base > d->view.len)
        why = "base offset outside the buffer";
    else if (nelems > (1ull << 40) || nchunks != (nelems + ce - 1) / ce)
        why = "nchunks must be ceil(nelems / chunk_elems)";
    if (!why) {
        d->runs = PyMem_Malloc(nruns * 2 * sizeof(uint64_t));
        d->prefix = PyMem_Malloc((nruns + 1) * sizeof(uint64_t));
        d->bitmap = PyMem_Calloc(nchunks ? nchunks : 1, 1);
        if (!d->runs || !d->prefix || !d->bitmap) {
            PyBuffer_Release(&runs);
            dest_free(d);
            return PyErr_NoMemory();
        }
        const int64_t *r = runs.buf;
        uint64_t total = 0, room = (uint64_t)(d->view.len - base) / isz;
        for (size_t i = 0; i < nruns && !why; i++) {
            int64_t a = r[2 * i], b = r[2 * i + 1];
            if (a < 0 || b < a || (uint64_t)b > room)
                why = "an element run lies outside the buffer";
            d->runs[2 * i] = (uint64_t)a;
            d->runs[2 * i + 1] = (uint64_t)b;
            d->prefix[i] = total;
            total += (uint64_t)(b - a);
        }
        d->prefix[nruns] = total;
        if (!why && total != nelems)
            why = "the runs do not hold nelems elements";
    }
    PyBuffer_Release(&runs);
    if (why) {
        dest_free(d);
        PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    if (find_handle(self, handle)) {
        dest_free(d);
        PyErr_Format(PyExc_ValueError, "handle %lld is open already", handle);
        return NULL;
    }
    d->handle = handle;
    d->comm = comm;
    d->seq = seq;
    d->src = src;
    d->stream = stream;
    d->sig = sig;
    d->base = (char *)d->view.buf + base;
    d->nruns = nruns;
    d->isz = isz;
    d->ce = ce;
    d->nchunks = nchunks;
    d->nelems = nelems;
    if (self->ndests + 1 > self->nbuckets && grow_buckets(self) < 0) {
        dest_free(d);
        return NULL;
    }
    size_t k = key_hash(comm, seq, src, stream) & (self->nbuckets - 1);
    d->next = self->buckets[k];
    self->buckets[k] = d;
    self->ndests++;
    Py_RETURN_NONE;
}

static PyObject *Placer_close(Placer *self, PyObject *arg) {
    long long handle = PyLong_AsLongLong(arg);
    if (handle == -1 && PyErr_Occurred())
        return NULL;
    if (not_busy(self) < 0)
        return NULL;
    for (size_t i = 0; i < self->nbuckets; i++) {
        for (Dest **pp = &self->buckets[i]; *pp; pp = &(*pp)->next) {
            Dest *d = *pp;
            if (d->handle != handle)
                continue;
            *pp = d->next;
            if (d->dirty)
                for (size_t j = 0; j < self->ndirty; j++)
                    if (self->dirty[j] == d) {
                        self->dirty[j] = self->dirty[--self->ndirty];
                        break;
                    }
            for (int c = 0; c < NCURSORS; c++)
                if (self->cursors[c].d == d)
                    self->cursors[c].d = NULL;
            dest_free(d);
            self->ndests--;
            Py_RETURN_TRUE;
        }
    }
    Py_RETURN_FALSE;
}

static PyObject *Placer_set_hold(Placer *self, PyObject *args) {
    long long handle;
    int on;
    if (!PyArg_ParseTuple(args, "Lp", &handle, &on))
        return NULL;
    Dest *d = find_handle(self, handle);
    if (!d) {
        PyErr_Format(PyExc_KeyError, "no open stream %lld", handle);
        return NULL;
    }
    d->hold = on;
    Py_RETURN_NONE;
}

/* Recovered bytes [offset, offset + len) of an open stream: placed like chunks; returns the
 * chunk range (c0, c1) they covered, or None when they do not cover whole chunks of it. */
static PyObject *Placer_write(Placer *self, PyObject *args) {
    long long handle;
    unsigned long long offset;
    Py_buffer pay;
    if (!PyArg_ParseTuple(args, "LKy*", &handle, &offset, &pay))
        return NULL;
    if (not_busy(self) < 0) {
        PyBuffer_Release(&pay);
        return NULL;
    }
    Dest *d = find_handle(self, handle);
    if (!d) {
        PyBuffer_Release(&pay);
        PyErr_Format(PyExc_KeyError, "no open stream %lld", handle);
        return NULL;
    }
    uint64_t cb = d->ce * d->isz, nbytes = d->nelems * d->isz, n = (uint64_t)pay.len;
    uint64_t end = offset + n;
    if (n == 0 || offset % cb || end > nbytes || end < offset || (end != nbytes && end % cb)) {
        PyBuffer_Release(&pay);
        Py_RETURN_NONE;
    }
    copy_elems(d, offset / d->isz, end / d->isz, pay.buf);
    PyBuffer_Release(&pay);
    uint64_t c0 = offset / cb, c1 = (end + cb - 1) / cb;
    for (uint64_t i = c0; i < c1; i++)
        if (!d->bitmap[i]) {
            d->bitmap[i] = 1;
            d->have++;
        }
    return Py_BuildValue("(KK)", (unsigned long long)c0, (unsigned long long)c1);
}

/* The reports of every stream that placed or saw its EOS since the last call:
 * [(handle, ranges bytes of uint64 (c0, c1) pairs, eos)]. */
static PyObject *take_progress(Placer *p) {
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    for (size_t j = 0; j < p->ndirty; j++) {
        Dest *d = p->dirty[j];
        PyObject *ranges = PyBytes_FromStringAndSize((const char *)d->ranges,
                                                     (Py_ssize_t)(d->nranges * 16));
        PyObject *t = ranges ? Py_BuildValue("(LNO)", d->handle, ranges,
                                             d->eos_pending ? Py_True : Py_False) : NULL;
        if (!t || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(t);
        d->nranges = 0;
        d->eos_pending = 0;
        d->dirty = 0;
    }
    p->ndirty = 0;
    return out;
}

static int append_up(PyObject *up, const uint8_t *data, size_t n, int placed) {
    PyObject *b = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)n);
    if (!b)
        return -1;
    PyObject *t = Py_BuildValue("(NO)", b, placed ? Py_True : Py_False);
    if (!t)
        return -1;
    int r = PyList_Append(up, t);
    Py_DECREF(t);
    return r;
}

/* Placer.feed(data): one datagram from memory (held datagrams, tests, the fuzzer). Returns
 * (progress, up, consumed, consumed_nbytes, duplicates, duplicate_eos) like recv. */
static PyObject *Placer_feed(Placer *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (not_busy(self) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    unsigned long long dup0 = self->c_duplicates, n0 = self->c_consumed,
        nb0 = self->c_consumed_nbytes, de0 = self->c_duplicate_eos;
    int r = handle_one(self, b.buf, (size_t)b.len);
    PyObject *up = PyList_New(0);
    if (r == -2) {
        PyErr_NoMemory();
    } else if (up && r != 1) {
        self->c_up++;
        if (append_up(up, b.buf, (size_t)b.len, r == 2) < 0)
            Py_CLEAR(up);
    }
    PyBuffer_Release(&b);
    if (r == -2 || !up) {
        Py_XDECREF(up);
        return NULL;
    }
    PyObject *prog = take_progress(self);
    if (!prog) {
        Py_DECREF(up);
        return NULL;
    }
    return Py_BuildValue("(NNKKKK)", prog, up, self->c_consumed - n0,
                         self->c_consumed_nbytes - nb0, self->c_duplicates - dup0,
                         self->c_duplicate_eos - de0);
}

static double mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

#define MAX_WATCH 256

/* Sleep ``us`` microseconds (no GIL held), or until one of the ``n`` watched descriptors is
 * readable (other work for the caller: a peer's message, a command); 1 after a full nap, 0
 * when there is no time left or something else wants the caller. */
static int nap(double us, const struct pollfd *watch, int n) {
    if (us < 1)
        return 0;
    struct timespec ts = {(time_t)(us / 1e6), (long)((us - (time_t)(us / 1e6) * 1e6) * 1e3)};
    if (n == 0) {
        nanosleep(&ts, NULL);
        return 1;
    }
    struct pollfd pf[MAX_WATCH];
    memcpy(pf, watch, (size_t)n * sizeof(struct pollfd));
    return ppoll(pf, (nfds_t)n, &ts, NULL) == 0;
}

/* -- landing: datagrams read straight into their place -----------------------------------
 *
 * A socket's datagrams mostly come in order from one stream (the per-root groups of the
 * offload workers; one broadcast), so the next ones are predicted from the last chunk placed
 * (a cursor per socket), and recvmmsg scatters each message into [header slot, the predicted
 * chunk's place] pairs (one pair per datagram a GRO buffer holds lately), then an overflow
 * slot. A datagram that is what was predicted (header checks, signature, geometry and MAC)
 * is then placed with no copy of ours; any other is gathered out of where it fell into
 * scratch and handled like a datagram read into a slot, after every landed one of the batch
 * is settled (so no placement overwrites bytes not yet gathered). Only chunks not held are
 * predicted, and a chunk is marked held only once verified: bytes that fell into an unheld
 * chunk's place unchecked are overwritten by that chunk before its stream can complete. */

static Cursor *cursor_of(Placer *p, int fd, int make) {
    Cursor *free_one = NULL;
    for (int i = 0; i < NCURSORS; i++) {
        if (p->cursors[i].d && p->cursors[i].fd == fd)
            return &p->cursors[i];
        if (!p->cursors[i].d && !free_one)
            free_one = &p->cursors[i];
    }
    if (!make)
        return NULL;
    if (!free_one)
        free_one = &p->cursors[(unsigned)fd % NCURSORS];    /* forget one */
    free_one->fd = fd;
    return free_one;
}

static uint64_t chunk_nbytes(Dest *d, uint64_t c) {
    uint64_t e0 = c * d->ce;
    return (d->nelems - e0 < d->ce ? d->nelems - e0 : d->ce) * d->isz;
}

/* Lay out message i's buffers: predicted datagrams, then the slot. */
static void plan_message(Placer *p, int i, Dest *d, uint64_t c0, size_t hlen) {
    struct iovec *iov = p->iov[i];
    int k = 0, nseg = 0;
    if (d && d->nruns == 1) {
        for (int s = 0; s < p->land_segs; s++) {
            uint64_t c = c0 + (uint64_t)s;
            if (c >= d->nchunks || d->bitmap[c])
                break;
            uint64_t nb = chunk_nbytes(d, c);
            iov[k].iov_base = p->hdrs[i][s];
            iov[k++].iov_len = hlen;
            iov[k].iov_base = d->base + (d->runs[0] + c * d->ce) * d->isz;
            iov[k++].iov_len = (size_t)nb;
            p->plan[i].seg_nbytes[s] = (uint32_t)nb;
            nseg++;
            if (nb < d->ce * d->isz)
                break;                          /* the stream's last chunk */
        }
    }
    iov[k].iov_base = p->slots + (size_t)i * SLOT_NBYTES;
    iov[k++].iov_len = SLOT_NBYTES;
    p->plan[i].d = nseg ? d : NULL;
    p->plan[i].c0 = c0;
    p->plan[i].nseg = nseg;
    memset(&p->msgs[i].msg_hdr, 0, sizeof(struct msghdr));
    p->msgs[i].msg_hdr.msg_iov = iov;
    p->msgs[i].msg_hdr.msg_iovlen = (size_t)k;
    if (p->gro) {
        p->msgs[i].msg_hdr.msg_control = p->cmsg[i];
        p->msgs[i].msg_hdr.msg_controllen = sizeof(p->cmsg[i]);
    }
}

/* Copy bytes [off, off + n) of message i (as scattered over its iovecs) to dst. */
static void gather(Placer *p, int i, size_t off, size_t n, uint8_t *dst) {
    struct msghdr *mh = &p->msgs[i].msg_hdr;
    size_t pos = 0;
    for (size_t k = 0; k < mh->msg_iovlen && n; k++) {
        size_t len = mh->msg_iov[k].iov_len;
        if (off < pos + len) {
            size_t at = off - pos, take = len - at < n ? len - at : n;
            memcpy(dst, (uint8_t *)mh->msg_iov[k].iov_base + at, take);
            dst += take;
            off += take;
            n -= take;
        }
        pos += len;
    }
}

static int note_up(Placer *p, const uint8_t *ptr, size_t len, int placed) {
    if (p->nup >= sizeof(p->up) / sizeof(p->up[0])) {
        p->c_up_lost++;                     /* bounded: a flood of tiny GRO segments */
        return 0;
    }
    p->up[p->nup].ptr = ptr;
    p->up[p->nup].len = (uint32_t)len;
    p->up[p->nup].placed = placed;
    p->nup++;
    return 0;
}

/* One recvmmsg batch and its handling; the datagrams to hand up are noted in p->up (valid
 * until the next batch). Returns the messages read (0: none waiting), -2 on a memory error.
 * No GIL. */
static int read_batch(Placer *p, int fd, int vlen) {
    size_t hlen = HDR_NBYTES + (p->keyed ? MAC_NBYTES : 0);
    Cursor *cu = p->landing && !p->land_pause ? cursor_of(p, fd, 0) : NULL;
    if (p->land_pause)
        p->land_pause--;
    if (cu && p->land_segs > 1)
        vlen = 1;       /* GRO buffers hold varying counts: predict each from the last */
    unsigned long long landed0 = p->c_landed, missed0 = p->c_land_missed;
    for (int i = 0; i < vlen; i++)
        plan_message(p, i, cu ? cu->d : NULL,
                     cu ? cu->next + (uint64_t)i * (uint64_t)p->land_segs : 0, hlen);
    int n = recvmmsg(fd, p->msgs, (unsigned)vlen, MSG_DONTWAIT, NULL);
    p->c_syscalls++;
    if (n <= 0)
        return 0;                   /* EAGAIN: drained; other errors: the engine's timers */
    size_t nscratch = 0;            /* gathered bytes in p->scratch */
    uint32_t (*missed)[3] = p->missed;     /* message, scratch offset, length */
    size_t nmissed = 0;
    int most_segs = 1;
    p->last_d = NULL;
    /* phase 1: landed datagrams settled; those that missed gathered out */
    for (int i = 0; i < n; i++) {
        size_t len = p->msgs[i].msg_len, seg = len;
        if (p->gro) {
            struct msghdr *mh = &p->msgs[i].msg_hdr;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c))
                if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                    int gs;
                    memcpy(&gs, CMSG_DATA(c), sizeof(int));
                    if (gs > 0 && (size_t)gs < len) {
                        seg = (size_t)gs;
                        p->c_gro_buffers++;
                    }
                }
        }
        if (seg && (int)((len + seg - 1) / seg) > most_segs)
            most_segs = (int)((len + seg - 1) / seg);
        if (!p->plan[i].nseg)
            continue;                       /* read into its slot: phase 2 */
        Dest *d = p->plan[i].d;
        size_t pos = 0;                     /* where predicted datagram s begins */
        int s = 0;
        for (size_t off = 0; off < len; off += seg, s++) {
            size_t m = len - off < seg ? len - off : seg;
            if (s < p->plan[i].nseg && off == pos && m == hlen + p->plan[i].seg_nbytes[s]) {
                uint64_t c = p->plan[i].c0 + (uint64_t)s;
                const uint8_t *hdr = p->hdrs[i][s];
                uint8_t *at = (uint8_t *)p->msgs[i].msg_hdr.msg_iov[2 * s + 1].iov_base;
                Hdr h;
                if (parse_fields(hdr, m, p->keyed, &h) == 0 && h.kind == K_DATA
                    && h.comm == d->comm && h.seq == d->seq && h.src == d->src
                    && h.stream == d->stream && h.tag == c
                    && (!p->keyed || mac_ok2(p, hdr, at, h.length))) {
                    h.payload = at;
                    p->c_datagrams++;
                    int r = handle_parsed(p, h, hdr, 1);
                    if (r == -2)
                        return -2;
                    if (r == 1 || r == 2) {
                        p->c_landed++;
                        if (r == 2) {           /* a holding stream: hand a copy up */
                            if (nscratch + m > (size_t)BATCH * SLOT_NBYTES)
                                p->c_up_lost++;
                            else {
                                gather(p, i, off, m, p->scratch + nscratch);
                                note_up(p, p->scratch + nscratch, m, 1);
                                nscratch += m;
                            }
                        }
                        pos += m;
                        continue;
                    }
                    p->c_datagrams--;           /* counted again in phase 2 */
                }
            }
            if (s < p->plan[i].nseg)
                pos += hlen + p->plan[i].seg_nbytes[s];
            if (nscratch + m > (size_t)BATCH * SLOT_NBYTES) {
                p->c_up_lost++;
                continue;
            }
            gather(p, i, off, m, p->scratch + nscratch);
            missed[nmissed][0] = (uint32_t)i;
            missed[nmissed][1] = (uint32_t)nscratch;
            missed[nmissed++][2] = (uint32_t)m;
            nscratch += m;
            p->c_land_missed++;
        }
    }
    /* phase 2: datagrams read into slots, and those gathered, in the order they came */
    size_t mj = 0;
    for (int i = 0; i < n; i++) {
        for (; mj < nmissed && missed[mj][0] == (uint32_t)i; mj++) {
            const uint8_t *b = p->scratch + missed[mj][1];
            int r = handle_one(p, b, missed[mj][2]);
            if (r == -2)
                return -2;
            if (r != 1)
                note_up(p, b, missed[mj][2], r == 2);
        }
        if (p->plan[i].nseg)
            continue;
        uint8_t *buf = p->slots + (size_t)i * SLOT_NBYTES;
        size_t len = p->msgs[i].msg_len, seg = len;
        if (p->gro) {
            struct msghdr *mh = &p->msgs[i].msg_hdr;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c))
                if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                    int gs;
                    memcpy(&gs, CMSG_DATA(c), sizeof(int));
                    if (gs > 0 && (size_t)gs < len)
                        seg = (size_t)gs;
                }
        }
        for (size_t off = 0; off < len; off += seg) {
            size_t m = len - off < seg ? len - off : seg;
            int r = handle_one(p, buf + off, m);
            if (r == -2)
                return -2;
            if (r != 1)
                note_up(p, buf + off, m, r == 2);
        }
    }
    /* the next batch expects the chunk after the last one placed; a batch that mostly
     * missed (streams interleaved on the socket) reads into slots for a while: a miss
     * costs a copy more than a slot does */
    if (p->landing) {
        if (p->c_land_missed - missed0 > p->c_landed - landed0)
            p->land_pause = 8;
        p->land_segs = most_segs < LAND_SEGS ? most_segs : LAND_SEGS;
        if (p->last_d) {
            Cursor *c = cursor_of(p, fd, 1);
            c->d = p->last_d;
            c->next = p->last_c + 1;
        }
    }
    return n;
}

/* Placer.recv(fd, max_datagrams, linger_us=0, gap_us=0): read and handle up to max
 * datagrams; returns (progress, up, consumed, consumed_nbytes, duplicates, duplicate_eos):
 * the streams' reports, [(datagram bytes, placed)] for the engine (placed: a holding
 * stream's copy, already written for the open ranks), the datagrams (and their payload
 * bytes) this call consumed, and how many of those were duplicate chunks and repeated EOS,
 * dropped.
 *
 * Without linger it stops when the socket runs dry. With linger_us, while a stream is
 * mid-way (chunks placed, none completed, no EOS seen), it naps gap_us (without the GIL)
 * and reads what came meanwhile, up to linger_us in all, and stops at a nap that brought
 * nothing or that a descriptor of ``watch`` (the caller's other input) cut short: a paced
 * stream trickles in, and a wake-up per datagram (the caller's loop, or a poll here) costs
 * more than the datagram. */
static PyObject *Placer_recv(Placer *self, PyObject *args) {
    int fd;
    Py_ssize_t max;
    double linger_us = 0, gap_us = 0;
    PyObject *watch_obj = NULL;
    if (!PyArg_ParseTuple(args, "in|ddO", &fd, &max, &linger_us, &gap_us, &watch_obj))
        return NULL;
    if (not_busy(self) < 0)
        return NULL;
    struct pollfd watch[MAX_WATCH];
    int nwatch = 0;
    if (watch_obj && watch_obj != Py_None) {
        PyObject *seq = PySequence_Fast(watch_obj, "watch: a sequence of file descriptors");
        if (!seq)
            return NULL;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq) && nwatch < MAX_WATCH; i++) {
            long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
            watch[nwatch].fd = (int)v;
            watch[nwatch].events = POLLIN;
            watch[nwatch++].revents = 0;
        }
        Py_DECREF(seq);
    }
    PyObject *up = PyList_New(0);
    if (!up)
        return NULL;
    Py_ssize_t total = 0;
    unsigned long long dup0 = self->c_duplicates, n0 = self->c_consumed,
        nb0 = self->c_consumed_nbytes, de0 = self->c_duplicate_eos;
    double t0 = 0;
    self->ended = self->streaming = 0;
    while (total < max) {
        int vlen = (int)(max - total < BATCH ? max - total : BATCH), n;
        self->busy = 1;
        self->nup = 0;
        Py_BEGIN_ALLOW_THREADS
        n = read_batch(self, fd, vlen);
        if (n == 0 && total > 0 && linger_us > 0 && self->streaming && !self->ended) {
            /* a fixed nap, not a wake-up per datagram: what arrives meanwhile is read in
             * one batch (interrupt moderation, as NICs do it) */
            double left = linger_us - (mono_us() - t0);
            if (nap(left < gap_us ? left : gap_us, watch, nwatch))
                n = read_batch(self, fd, vlen);
        }
        Py_END_ALLOW_THREADS
        self->busy = 0;
        if (n == -2) {
            Py_DECREF(up);
            return PyErr_NoMemory();
        }
        for (size_t j = 0; j < self->nup; j++) {
            const uint8_t *b = self->up[j].ptr;
            self->c_up++;
            if (append_up(up, b, self->up[j].len, self->up[j].placed) < 0) {
                Py_DECREF(up);
                return NULL;
            }
        }
        if (n == 0)
            break;
        if (total == 0)
            t0 = mono_us();
        total += n;
    }
    PyObject *prog = take_progress(self);
    if (!prog) {
        Py_DECREF(up);
        return NULL;
    }
    return Py_BuildValue("(NNKKKK)", prog, up, self->c_consumed - n0,
                         self->c_consumed_nbytes - nb0, self->c_duplicates - dup0,
                         self->c_duplicate_eos - de0);
}

static PyObject *Placer_set_gro(Placer *self, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    int on = 1;
    if (setsockopt(fd, SOL_UDP, UDP_GRO, &on, sizeof(on)) == 0) {
        self->gro = 1;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyObject *Placer_set_landing(Placer *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    if (not_busy(self) < 0)
        return NULL;
    self->landing = on;
    Py_RETURN_NONE;
}

static PyObject *Placer_counters(Placer *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsKsKsKsn}", "datagrams", self->c_datagrams,
                         "placed", self->c_placed, "placed_nbytes", self->c_placed_nbytes,
                         "duplicates", self->c_duplicates, "up", self->c_up,
                         "bad_mac", self->c_bad_mac, "syscalls", self->c_syscalls,
                         "gro_buffers", self->c_gro_buffers, "eos", self->c_eos,
                         "up_lost", self->c_up_lost, "duplicate_eos", self->c_duplicate_eos,
                         "landed", self->c_landed, "land_missed", self->c_land_missed,
                         "open", (Py_ssize_t)self->ndests);
}

static PyObject *Placer_have(Placer *self, PyObject *arg) {
    long long handle = PyLong_AsLongLong(arg);
    if (handle == -1 && PyErr_Occurred())
        return NULL;
    Dest *d = find_handle(self, handle);
    if (!d) {
        PyErr_Format(PyExc_KeyError, "no open stream %lld", handle);
        return NULL;
    }
    return Py_BuildValue("(KK)", (unsigned long long)d->have, (unsigned long long)d->nchunks);
}

static PyMethodDef Placer_methods[] = {
    {"open", (PyCFunction)(void (*)(void))Placer_open, METH_VARARGS | METH_KEYWORDS,
     "open(handle, comm, seq, src, stream, sig, buffer, base_nbytes, runs, itemsize, "
     "chunk_elems, nchunks, nelems): place this stream's chunks into buffer from now on"},
    {"close", (PyCFunction)Placer_close, METH_O, "close(handle): write nothing more there"},
    {"set_hold", (PyCFunction)Placer_set_hold, METH_VARARGS,
     "set_hold(handle, on): also hand up (placed) the stream's datagrams"},
    {"write", (PyCFunction)Placer_write, METH_VARARGS,
     "write(handle, offset, payload): recovered bytes; (c0, c1) or None"},
    {"feed", (PyCFunction)Placer_feed, METH_O, "feed(datagram): (progress, up, consumed, consumed_nbytes, duplicates, duplicate_eos)"},
    {"recv", (PyCFunction)Placer_recv, METH_VARARGS,
     "recv(fd, max_datagrams, linger_us=0, gap_us=0, watch=()): (progress, up, consumed, "
     "consumed_nbytes, duplicates, duplicate_eos)"},
    {"set_gro", (PyCFunction)Placer_set_gro, METH_O,
     "set_gro(fd): ask for UDP GRO on that socket; True if the kernel took it"},
    {"set_landing", (PyCFunction)Placer_set_landing, METH_O,
     "set_landing(on): read datagrams straight into their predicted place"},
    {"counters", (PyCFunction)Placer_counters, METH_NOARGS, "what was read, placed, handed up"},
    {"have", (PyCFunction)Placer_have, METH_O, "have(handle): (chunks held, nchunks)"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject PlacerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "polycast.runtime.transport._dgram.Placer",
    .tp_basicsize = sizeof(Placer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The open multicast streams of one process and their placement.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Placer_init,
    .tp_dealloc = (destructor)Placer_dealloc,
    .tp_methods = Placer_methods,
};

/* ------------------------------------------------------------------------------------------
 * Sending
 */
static int gso_broken;                /* the kernel refused UDP_SEGMENT once: plain sendmmsg */

/* send(fd, (addr, port), datagrams, gso=True): datagrams is a list of (header, payload or
 * None). Returns how many were handed to the kernel or lost to it (ENOBUFS and the like:
 * fire and forget, the protocol recovers); fewer when the socket's buffer is full (EAGAIN:
 * send the rest when it is writable). */
static PyObject *dgram_send(PyObject *mod, PyObject *args) {
    int fd, gso = 1;
    const char *host;
    int port;
    PyObject *items;
    if (!PyArg_ParseTuple(args, "i(si)O!|p", &fd, &host, &port, &PyList_Type, &items, &gso))
        return NULL;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "not an IPv4 address: %s", host);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items), done = 0;
    if (n == 0)
        return PyLong_FromLong(0);
    Py_buffer *views = PyMem_Calloc((size_t)n * 2, sizeof(Py_buffer));
    struct iovec *iov = PyMem_Calloc((size_t)n * 2, sizeof(struct iovec));
    size_t *dlen = PyMem_Calloc((size_t)n, sizeof(size_t));
    if (!views || !iov || !dlen) {
        PyMem_Free(views);
        PyMem_Free(iov);
        PyMem_Free(dlen);
        return PyErr_NoMemory();
    }
    Py_ssize_t held = 0;
    int bad = 0;
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        PyObject *t = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
            PyErr_SetString(PyExc_TypeError, "datagrams are (header, payload) tuples");
            bad = 1;
            break;
        }
        for (int j = 0; j < 2; j++) {
            PyObject *o = PyTuple_GET_ITEM(t, j);
            if (o == Py_None) {
                iov[2 * i + j].iov_base = NULL;
                iov[2 * i + j].iov_len = 0;
                continue;
            }
            if (PyObject_GetBuffer(o, &views[2 * i + j], PyBUF_SIMPLE) < 0) {
                bad = 1;
                break;
            }
            held = 2 * i + j + 1;
            iov[2 * i + j].iov_base = views[2 * i + j].buf;
            iov[2 * i + j].iov_len = (size_t)views[2 * i + j].len;
        }
        dlen[i] = iov[2 * i].iov_len + iov[2 * i + 1].iov_len;
    }
    if (!bad) {
        struct mmsghdr msgs[SEND_BATCH];
        char ctl[SEND_BATCH][CMSG_SPACE(sizeof(uint16_t))];
        Py_BEGIN_ALLOW_THREADS
        while (done < n) {
            int m = 0;
            Py_ssize_t at = done, counts[SEND_BATCH];
            while (at < n && m < SEND_BATCH) {
                /* a GSO group: datagrams of one size (the last may be shorter) */
                Py_ssize_t k = 1;
                size_t tot = dlen[at];
                if (gso && !gso_broken)
                    while (at + k < n && k < GSO_MAX_SEGMENTS && dlen[at + k] <= dlen[at]
                           && tot + dlen[at + k] <= GSO_MAX_NBYTES
                           && dlen[at + k - 1] == dlen[at]) {
                        tot += dlen[at + k];
                        k++;
                    }
                struct msghdr *mh = &msgs[m].msg_hdr;
                memset(mh, 0, sizeof(*mh));
                mh->msg_name = &sa;
                mh->msg_namelen = sizeof(sa);
                mh->msg_iov = &iov[2 * at];
                mh->msg_iovlen = (size_t)(2 * k);
                if (k > 1) {
                    mh->msg_control = ctl[m];
                    mh->msg_controllen = sizeof(ctl[m]);
                    struct cmsghdr *c = CMSG_FIRSTHDR(mh);
                    c->cmsg_level = SOL_UDP;
                    c->cmsg_type = UDP_SEGMENT;
                    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                    uint16_t segsz = (uint16_t)dlen[at];
                    memcpy(CMSG_DATA(c), &segsz, sizeof(segsz));
                }
                counts[m] = k;
                at += k;
                m++;
            }
            int r = sendmmsg(fd, msgs, (unsigned)m, MSG_DONTWAIT);
            if (r < 0) {
                int e = errno;
                if (e == EAGAIN || e == EWOULDBLOCK)
                    break;
                if (e == EINTR)
                    continue;
                if ((e == EINVAL || e == EIO || e == ENOPROTOOPT) && counts[0] > 1
                    && !gso_broken) {
                    gso_broken = 1;         /* this kernel has no UDP GSO here: retry plain */
                    continue;
                }
                done += counts[0];          /* lost (ENOBUFS...): fire and forget */
                continue;
            }
            for (int i = 0; i < r; i++)
                done += counts[i];
            if (r < m)                      /* the next one would block or failed: ask again */
                continue;
        }
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < held; i++)
        if (views[i].obj)
            PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(iov);
    PyMem_Free(dlen);
    if (bad)
        return NULL;
    return PyLong_FromSsize_t(done);
}

/* mac(key, header, payload): the 16-byte MAC engine/wire.py computes (tests check both). */
static PyObject *dgram_mac(PyObject *mod, PyObject *args) {
    Py_buffer key, a, b;
    if (!PyArg_ParseTuple(args, "y*y*y*", &key, &a, &b))
        return NULL;
    if (key.len > 64) {
        PyBuffer_Release(&key);
        PyBuffer_Release(&a);
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "a BLAKE2b key is at most 64 bytes");
        return NULL;
    }
    B2 s;
    uint8_t out[MAC_NBYTES];
    b2_init_key(&s, key.buf, (size_t)key.len, MAC_NBYTES);
    b2_update(&s, a.buf, (size_t)a.len);
    b2_update(&s, b.buf, (size_t)b.len);
    b2_final(&s, out);
    PyBuffer_Release(&key);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return PyBytes_FromStringAndSize((const char *)out, MAC_NBYTES);
}

static PyObject *dgram_gso_available(PyObject *mod, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(!gso_broken);
}

static PyMethodDef module_methods[] = {
    {"send", dgram_send, METH_VARARGS, "send(fd, (addr, port), [(header, payload)], gso=True)"},
    {"mac", dgram_mac, METH_VARARGS, "mac(key, header, payload): BLAKE2b-128"},
    {"gso_available", dgram_gso_available, METH_NOARGS, "False once the kernel refused GSO"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_dgram",
                                       "The multicast datagram path in C.", -1,
                                       module_methods};

PyMODINIT_FUNC PyInit__dgram(void) {
    if (PyType_Ready(&PlacerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&PlacerType);
    if (PyModule_AddObject(m, "Placer", (PyObject *)&PlacerType) < 0) {
        Py_DECREF(&PlacerType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "BATCH", BATCH);
    return m;
}
