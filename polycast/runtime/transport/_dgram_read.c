/* Reading: recvmmsg batches (UDP GRO buffers split), landing datagrams straight into their
 * predicted place, and the nap a read takes while a stream trickles in. No GIL here. */
#include "_dgram.h"

double mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}


/* Sleep ``us`` microseconds (no GIL held), or until one of the ``n`` watched descriptors is
 * readable (other work for the caller: a peer's message, a command); 1 after a full nap, 0
 * when there is no time left or something else wants the caller. */
int nap(double us, const struct pollfd *watch, int n) {
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

/* An earlier datagram of this batch that missed (or was read into a slot) claims the same
 * chunk: the later one that landed must not be settled first (arrival order decides
 * between datagrams that differ). */
static int claimed(Placer *p, size_t nclaims, const Hdr *h) {
    for (size_t j = 0; j < nclaims; j++) {
        const Hdr *c = &p->claims[j];
        if (c->kind == K_DATA && c->tag == h->tag && c->comm == h->comm && c->seq == h->seq
            && c->src == h->src && c->stream == h->stream)
            return 1;
    }
    return 0;
}

/* Note what a datagram of the batch that is placed in phase 2 claims to be. */
static void claim(Placer *p, size_t *nclaims, const uint8_t *data, size_t n) {
    if (*nclaims < sizeof(p->claims) / sizeof(p->claims[0])
        && parse_fields(data, n, p->keyed, &p->claims[*nclaims]) == 0
        && p->claims[*nclaims].kind == K_DATA)
        (*nclaims)++;
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

/* The datagram size of message i: a GRO buffer's segment size, else its length. */
static size_t segment_nbytes(Placer *p, int i) {
    size_t len = p->msgs[i].msg_len;
    if (!p->gro)
        return len;
    struct msghdr *mh = &p->msgs[i].msg_hdr;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c))
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
            int gs;
            memcpy(&gs, CMSG_DATA(c), sizeof(int));
            if (gs > 0 && (size_t)gs < len)
                return (size_t)gs;
        }
    return len;
}

/* One recvmmsg batch and its handling; the datagrams to hand up are noted in p->up (valid
 * until the next batch). Returns the messages read (0: none waiting), -2 on a memory error.
 * No GIL. */
int read_batch(Placer *p, int fd, int vlen) {
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
    size_t nmissed = 0, nclaims = 0;
    int most_segs = 1;
    p->last_d = NULL;
    /* phase 1: landed datagrams settled; those that missed gathered out */
    for (int i = 0; i < n; i++) {
        size_t len = p->msgs[i].msg_len, seg = segment_nbytes(p, i);
        if (seg < len)
            p->c_gro_buffers++;
        if (seg && (int)((len + seg - 1) / seg) > most_segs)
            most_segs = (int)((len + seg - 1) / seg);
        if (!p->plan[i].nseg) {             /* read into its slot: placed in phase 2 */
            for (size_t off = 0; off < len; off += seg)
                claim(p, &nclaims, p->slots + (size_t)i * SLOT_NBYTES + off,
                      len - off < seg ? len - off : seg);
            continue;
        }
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
                    && h.stream == d->stream && h.tag == c && !claimed(p, nclaims, &h)
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
            claim(p, &nclaims, p->scratch + nscratch, m);
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
        size_t len = p->msgs[i].msg_len, seg = segment_nbytes(p, i);
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
        /* once the kernel coalesces (GRO), plan every message for a full buffer: the
         * count per buffer follows the sender's timing, and a buffer fuller than planned
         * spills into the slot, misses, and pauses landing */
        if (most_segs > 1)
            p->land_segs = LAND_SEGS;
        if (p->last_d) {
            Cursor *c = cursor_of(p, fd, 1);
            c->d = p->last_d;
            c->next = p->last_c + 1;
        }
    }
    return n;
}

