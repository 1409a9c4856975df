/* Sending: a list of datagrams with one sendmmsg, datagrams of one size grouped into UDP
 * GSO sends (UDP_SEGMENT) where the kernel takes it. */
#include "_dgram.h"

static int gso_broken;                /* the kernel refused UDP_SEGMENT once: plain sendmmsg */

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

PyObject *dgram_gso_available(PyObject *mod, PyObject *ignored) {
    return PyBool_FromLong(!gso_broken);
}

