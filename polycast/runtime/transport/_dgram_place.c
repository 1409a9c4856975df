/* The header checks (as engine/wire.py's parse_datagram), the open streams and placement
 * into them: what a datagram of an open stream does to its buffer and bitmap. */
#include "_dgram.h"

/* ------------------------------------------------------------------------------------------
 * The header
 */

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) << 32 | rd32(p + 4); }

/* What parse_datagram (engine/wire.py) accepts, minus the MAC check (done only for datagrams
 * this module would consume); 0 or -1. ``keyed``: the job has a secret. */
int parse_fields(const uint8_t *d, size_t n, int keyed, Hdr *h) {
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




void dest_free(Dest *d) {
    if (d->view.obj)
        PyBuffer_Release(&d->view);
    PyMem_Free(d->runs);
    PyMem_Free(d->prefix);
    PyMem_Free(d->bitmap);
    PyMem_Free(d->ranges);
    PyMem_Free(d);
}

int grow_buckets(Placer *p) {
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

Dest *find_handle(Placer *p, long long handle) {
    for (size_t i = 0; i < p->nbuckets; i++)
        for (Dest *d = p->buckets[i]; d; d = d->next)
            if (d->handle == handle)
                return d;
    return NULL;
}

int add_range(Dest *d, uint64_t c0, uint64_t c1) {
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

int mark_dirty(Placer *p, Dest *d) {
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
void copy_elems(Dest *d, uint64_t e0, uint64_t e1, const uint8_t *src) {
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
int place(Placer *p, Dest *d, const Hdr *h) {
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
int mac_ok2(Placer *p, const uint8_t *hdr, const uint8_t *pay, size_t npay) {
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

int handle_one(Placer *p, const uint8_t *data, size_t n) {
    Hdr h;
    p->c_datagrams++;
    if (parse_fields(data, n, p->keyed, &h) < 0)
        return 0;
    return handle_parsed(p, h, data, 0);
}

/* ``h`` parsed from header bytes ``hdr`` (its payload at h.payload, maybe elsewhere: a
 * datagram landed in place); ``mac_checked``: its MAC verified already. */
int handle_parsed(Placer *p, Hdr h, const uint8_t *hdr, int mac_checked) {
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

