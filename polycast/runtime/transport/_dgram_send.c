/* Sending: datagrams with one sendmmsg, datagrams of one size grouped into UDP GSO sends
 * (UDP_SEGMENT) where the kernel takes it — a list of them (send), or chunks of a stream
 * whose headers (and MACs) are built here (send_chunks). */
#include "_dgram.h"

static int gso_broken;                /* the kernel refused UDP_SEGMENT once: plain sendmmsg */

static int sockaddr_of(const char *host, int port, struct sockaddr_in *sa) {
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "not an IPv4 address: %s", host);
        return -1;
    }
    return 0;
}

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}


/* Send n datagrams, datagram i being iovecs 2i and 2i+1 (header, payload) of dlen[i] bytes:
 * sendmmsg, consecutive datagrams of one size grouped into GSO sends. Returns how many left
 * or were lost (fire and forget); stops at EAGAIN. No GIL needed. */
static Py_ssize_t send_pairs(int fd, struct sockaddr_in *sa, struct iovec *iov,
                             const size_t *dlen, Py_ssize_t n, int gso) {
    Py_ssize_t done = 0;
    struct mmsghdr msgs[SEND_BATCH];
    char ctl[SEND_BATCH][CMSG_SPACE(sizeof(uint16_t))];
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
            mh->msg_name = sa;
            mh->msg_namelen = sizeof(*sa);
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
    return done;
}

/* send(fd, (addr, port), datagrams, gso=True): datagrams is a list of (header, payload or
 * None). Returns how many were handed to the kernel or lost to it (ENOBUFS and the like:
 * fire and forget, the protocol recovers); fewer when the socket's buffer is full (EAGAIN:
 * send the rest when it is writable). */
PyObject *dgram_send(PyObject *mod, PyObject *args) {
    int fd, gso = 1;
    const char *host;
    int port;
    PyObject *items;
    if (!PyArg_ParseTuple(args, "i(si)O!|p", &fd, &host, &port, &PyList_Type, &items, &gso))
        return NULL;
    struct sockaddr_in sa;
    if (sockaddr_of(host, port, &sa) < 0)
        return NULL;
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
        Py_BEGIN_ALLOW_THREADS
        done = send_pairs(fd, &sa, iov, dlen, n, gso);
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

#define CHUNKS_PER_CALL 1024

/* send_chunks(fd, (addr, port), key, comm, seq, src, sig, stream, buffer, runs, itemsize,
 * chunk_elems, nelems, c0, c1, gso=True): chunks [c0, c1) of this rank's stream as the
 * engine's MCAST_DATA datagrams would carry them (engine/mcast.py's _start_mcast, wire.py's
 * header; with ``key`` each with its BLAKE2b MAC): chunk i is the stream's elements
 * [i*chunk_elems, ...) of ``buffer``'s element ``runs`` (packed int64 pairs). At most 1024
 * per call; returns how many left (or were lost: fire and forget), fewer when the socket's
 * buffer is full. */
PyObject *dgram_send_chunks(PyObject *mod, PyObject *args) {
    int fd, port, gso = 1;
    const char *host;
    Py_buffer key = {0}, buf = {0}, runs = {0};
    unsigned int comm, seq, src, sig, stream;
    unsigned long long isz, ce, nelems, c0, c1;
    if (!PyArg_ParseTuple(args, "i(si)z*IIIIIy*y*KKKKK|p", &fd, &host, &port, &key, &comm,
                          &seq, &src, &sig, &stream, &buf, &runs, &isz, &ce, &nelems, &c0,
                          &c1, &gso))
        return NULL;
    struct sockaddr_in sa;
    const char *why = NULL;
    size_t nruns = (size_t)runs.len / 16;
    const int64_t *r = runs.buf;
    uint64_t total = 0;
    if (sockaddr_of(host, port, &sa) < 0)
        why = "";
    else if (key.buf && key.len > 64)
        why = "a BLAKE2b key is at most 64 bytes";
    else if (runs.len % 16 || nruns == 0 || isz == 0 || ce == 0)
        why = "runs must be int64 pairs; itemsize and chunk_elems > 0";
    else if (isz > 64 || ce > 65536 / isz)
        why = "a chunk is at most one datagram (64 KiB) of items of at most 64 bytes";
    for (size_t i = 0; i < nruns && !why; i++) {
        if (r[2 * i] < 0 || r[2 * i + 1] < r[2 * i]
            || (uint64_t)r[2 * i + 1] * isz > (uint64_t)buf.len)
            why = "an element run lies outside the buffer";
        total += (uint64_t)(r[2 * i + 1] - r[2 * i]);
    }
    if (!why && (total != nelems || c1 < c0 || c1 > (nelems + ce - 1) / ce))
        why = "the runs do not hold nelems elements, or the chunks are not the stream's";
    if (why) {
        PyBuffer_Release(&key);
        PyBuffer_Release(&buf);
        PyBuffer_Release(&runs);
        if (*why)
            PyErr_SetString(PyExc_ValueError, why);
        return NULL;
    }
    Py_ssize_t n = (Py_ssize_t)(c1 - c0 < CHUNKS_PER_CALL ? c1 - c0 : CHUNKS_PER_CALL), done = 0;
    size_t hlen = HDR_NBYTES + (key.buf && key.len ? MAC_NBYTES : 0);
    uint64_t cb = ce * isz;
    uint8_t *hdrs = PyMem_Malloc((size_t)n * hlen + 1);
    uint8_t *flat = nruns > 1 ? PyMem_Malloc((size_t)(n * cb) + 1) : NULL;
    struct iovec *iov = PyMem_Malloc(((size_t)n * 2 + 1) * sizeof(struct iovec));
    size_t *dlen = PyMem_Malloc(((size_t)n + 1) * sizeof(size_t));
    PyObject *result = NULL;
    if (!hdrs || !iov || !dlen || (nruns > 1 && !flat)) {
        PyErr_NoMemory();
        goto out;
    }
    Py_BEGIN_ALLOW_THREADS
    B2 mac0;
    if (hlen > HDR_NBYTES)
        b2_init_key(&mac0, key.buf, (size_t)key.len, MAC_NBYTES);
    for (Py_ssize_t k = 0; k < n; k++) {
        uint64_t c = c0 + (uint64_t)k, e0 = c * ce;
        uint64_t nel = nelems - e0 < ce ? nelems - e0 : ce, nb = nel * isz;
        const uint8_t *pay;
        if (nruns == 1) {
            pay = (const uint8_t *)buf.buf + ((uint64_t)r[0] + e0) * isz;
        } else {                        /* the chunk's elements across runs, made contiguous */
            uint8_t *dst = flat + (size_t)k * cb;
            uint64_t pos = 0, want = e0, left = nel;
            for (size_t i = 0; i < nruns && left; i++) {
                uint64_t len = (uint64_t)(r[2 * i + 1] - r[2 * i]);
                if (want >= pos + len) {
                    pos += len;
                    continue;
                }
                uint64_t at = want - pos, take = len - at < left ? len - at : left;
                memcpy(dst, (const uint8_t *)buf.buf + ((uint64_t)r[2 * i] + at) * isz,
                       (size_t)(take * isz));
                dst += take * isz;
                want += take;
                left -= take;
                pos += len;
            }
            pay = flat + (size_t)k * cb;
        }
        uint8_t *h = hdrs + (size_t)k * hlen;
        memset(h, 0, HDR_NBYTES);
        h[0] = MAGIC >> 8;
        h[1] = MAGIC & 0xFF;
        h[2] = VERSION;
        h[3] = K_DATA;
        h[4] = hlen > HDR_NBYTES ? F_MAC : 0;
        put32(h + 8, comm);
        put32(h + 12, seq);
        put32(h + 16, src);
        put32(h + 20, (uint32_t)c);
        put32(h + 24, stream);
        put32(h + 28, (uint32_t)((e0 * isz) >> 32));
        put32(h + 32, (uint32_t)(e0 * isz));
        put32(h + 36, (uint32_t)nb);
        put32(h + 40, sig);
        if (hlen > HDR_NBYTES) {
            B2 st = mac0;
            b2_update(&st, h, HDR_NBYTES);
            b2_update(&st, pay, (size_t)nb);
            b2_final(&st, h + HDR_NBYTES);
        }
        iov[2 * k].iov_base = h;
        iov[2 * k].iov_len = hlen;
        iov[2 * k + 1].iov_base = (void *)pay;
        iov[2 * k + 1].iov_len = (size_t)nb;
        dlen[k] = hlen + (size_t)nb;
    }
    done = send_pairs(fd, &sa, iov, dlen, n, gso);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(done);
out:
    PyMem_Free(hdrs);
    PyMem_Free(flat);
    PyMem_Free(iov);
    PyMem_Free(dlen);
    PyBuffer_Release(&key);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&runs);
    return result;
}

PyObject *dgram_gso_available(PyObject *mod, PyObject *ignored) {
    return PyBool_FromLong(!gso_broken);
}

