/* The raw-socket ceiling of a lab (bench/mcast_path.py compiles it with cc at bench time):
 * what plain sockets with the same batched syscalls as polycast's datagram path move in the
 * same namespaces, so every lab figure can be divided by it.
 *
 *   lab_raw mcast RANK NRANKS SENDERS GROUP PORT IFACE NBYTES DGRAM RATE_GBPS TIMEOUT_S
 *       A multicast "allgather" (SENDERS = NRANKS) or "broadcast" (SENDERS = 1): ranks
 *       0..SENDERS-1 each multicast NBYTES in datagrams of DGRAM bytes (sendmmsg, UDP GSO
 *       where the kernel takes it), paced at RATE_GBPS (0: as fast as it goes), then an
 *       end marker; every rank receives every other sender's datagrams (recvmmsg, UDP GRO)
 *       until it holds them all, the markers came, or TIMEOUT_S passed. Prints one JSON
 *       line: bytes and datagrams received, expected, lost, seconds from its start to the
 *       last datagram, CPU seconds.
 *   lab_raw tcpring RANK NRANKS LISTEN_PORT NEXT_ADDR NEXT_PORT NBYTES TIMEOUT_S
 *       A TCP ring: every rank streams NBYTES to its successor while it receives NBYTES from
 *       its predecessor (the link pattern of a ring allgather, with no step dependencies).
 *       Prints one JSON line: bytes sent and received, seconds, CPU seconds.
 *
 * Each datagram starts with (sender u32, index u32, total u32, end flag u32) so receivers
 * count distinct datagrams. Ranks start at once (the caller starts them together and waits a
 * second for the receivers to join before the senders send: a START_DELAY_S sleep).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define BATCH 64
#define SLOT 65536
#define START_DELAY_S 1.0
#define END_MARKERS 20
#define GSO_ROOM 64                   /* datagrams per GSO send at most (the kernel's cap) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec
        + ru.ru_stime.tv_usec * 1e-6;
}

static void sleep_until(double t) {
    double d = t - now_s();
    if (d <= 0)
        return;
    struct timespec ts = {(time_t)d, (long)((d - (time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
}

static void die(const char *what) {
    fprintf(stderr, "lab_raw: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* -- multicast ----------------------------------------------------------------------------- */
struct mc {
    int rank, nranks, senders, port;
    const char *group, *iface;
    uint64_t nbytes;
    uint32_t dgram;
    double rate_gbps, timeout_s;
    int sock;
    struct sockaddr_in dst;
    double t0;
    int gso;
};

static void *mc_send(void *arg) {
    struct mc *m = arg;
    uint32_t pay = m->dgram - 16;
    uint32_t total = (uint32_t)((m->nbytes + pay - 1) / pay);
    sleep_until(m->t0 + START_DELAY_S);
    double start = now_s(), per = m->rate_gbps > 0 ? m->dgram * 8.0 / (m->rate_gbps * 1e9) : 0;
    uint32_t i = 0;
    /* one GSO send carries up to 64 KiB of equal-size datagrams; sendmmsg sends BATCH of
     * those (or of single datagrams where GSO is refused) */
    int per_gso = m->gso ? (int)(65000 / m->dgram) : 1;
    if (per_gso < 1)
        per_gso = 1;
    if (per_gso > GSO_ROOM)
        per_gso = GSO_ROOM;
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    char ctl[BATCH][CMSG_SPACE(sizeof(uint16_t))];
    char *bufs = calloc(BATCH, (size_t)m->dgram * per_gso);
    if (!bufs)
        die("calloc");
    while (i < total) {
        int nm = 0;
        uint32_t first = i;
        while (nm < BATCH && i < total) {
            int k = 0;
            char *b = bufs + (size_t)nm * m->dgram * per_gso;
            while (k < per_gso && i < total) {
                uint32_t *h = (uint32_t *)(b + (size_t)k * m->dgram);
                h[0] = htonl((uint32_t)m->rank);
                h[1] = htonl(i);
                h[2] = htonl(total);
                h[3] = 0;
                k++;
                i++;
            }
            memset(&msgs[nm], 0, sizeof(msgs[nm]));
            iov[nm].iov_base = b;
            iov[nm].iov_len = (size_t)k * m->dgram;
            msgs[nm].msg_hdr.msg_iov = &iov[nm];
            msgs[nm].msg_hdr.msg_iovlen = 1;
            msgs[nm].msg_hdr.msg_name = &m->dst;
            msgs[nm].msg_hdr.msg_namelen = sizeof(m->dst);
            if (k > 1) {
                msgs[nm].msg_hdr.msg_control = ctl[nm];
                msgs[nm].msg_hdr.msg_controllen = sizeof(ctl[nm]);
                struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[nm].msg_hdr);
                c->cmsg_level = SOL_UDP;
                c->cmsg_type = UDP_SEGMENT;
                c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                uint16_t s = (uint16_t)m->dgram;
                memcpy(CMSG_DATA(c), &s, sizeof(s));
            }
            nm++;
        }
        if (per > 0)
            sleep_until(start + first * per);
        int sent = 0;
        while (sent < nm) {
            int r = sendmmsg(m->sock, msgs + sent, (unsigned)(nm - sent), 0);
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                if (errno == ENOBUFS || errno == EAGAIN) {   /* lost: as the runtime does */
                    sent++;
                    continue;
                }
                die("sendmmsg");
            }
            sent += r;
        }
    }
    uint32_t *h = (uint32_t *)bufs;
    h[0] = htonl((uint32_t)m->rank);
    h[1] = htonl(total);
    h[2] = htonl(total);
    h[3] = htonl(1);
    for (int e = 0; e < END_MARKERS; e++) {
        sendto(m->sock, bufs, 16, 0, (struct sockaddr *)&m->dst, sizeof(m->dst));
        usleep(2000);
    }
    free(bufs);
    return NULL;
}

static int mcast_main(int argc, char **argv) {
    if (argc != 12) {
        fprintf(stderr, "usage: lab_raw mcast RANK NRANKS SENDERS GROUP PORT IFACE NBYTES DGRAM "
                        "RATE_GBPS TIMEOUT_S\n");
        return 2;
    }
    struct mc m = {0};
    m.rank = atoi(argv[2]);
    m.nranks = atoi(argv[3]);
    m.senders = atoi(argv[4]);
    m.group = argv[5];
    m.port = atoi(argv[6]);
    m.iface = argv[7];
    m.nbytes = strtoull(argv[8], NULL, 10);
    m.dgram = (uint32_t)atoi(argv[9]);
    m.rate_gbps = atof(argv[10]);
    m.timeout_s = atof(argv[11]);
    if (m.dgram < 32 || m.dgram > 65000 || m.nranks < 1 || m.senders < 1 || m.senders > m.nranks)
        return 2;
    m.t0 = now_s();
    m.sock = socket(AF_INET, SOCK_DGRAM, 0);
    int one = 1, big = 64 << 20;
    setsockopt(m.sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(m.sock, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big));
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)m.port);
    inet_pton(AF_INET, m.group, &a.sin_addr);
    if (bind(m.sock, (struct sockaddr *)&a, sizeof(a)) < 0)
        die("bind");
    struct ip_mreq mr;
    inet_pton(AF_INET, m.group, &mr.imr_multiaddr);
    inet_pton(AF_INET, m.iface, &mr.imr_interface);
    if (setsockopt(m.sock, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mr, sizeof(mr)) < 0)
        die("IP_ADD_MEMBERSHIP");
    setsockopt(m.sock, IPPROTO_IP, IP_MULTICAST_IF, &mr.imr_interface,
               sizeof(mr.imr_interface));
    int ttl = 1, loop = 0;
    setsockopt(m.sock, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof(ttl));
    setsockopt(m.sock, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof(loop));
    int gro = setsockopt(m.sock, SOL_UDP, UDP_GRO, &one, sizeof(one)) == 0;
    m.dst = a;
    int probe = 0;
    m.gso = setsockopt(m.sock, SOL_UDP, UDP_SEGMENT, &probe, sizeof(probe)) == 0;
    pthread_t th;
    int sending = m.rank < m.senders;
    if (sending && pthread_create(&th, NULL, mc_send, &m) != 0)
        die("pthread_create");
    /* receive every other sender's datagrams */
    uint32_t pay = m.dgram - 16;
    uint32_t total = (uint32_t)((m.nbytes + pay - 1) / pay);
    int others = m.senders - (sending ? 1 : 0);
    uint64_t expect = (uint64_t)others * total;
    uint8_t *seen = calloc((size_t)m.senders * total + 1, 1);
    int *ended = calloc((size_t)m.senders, sizeof(int));
    char *slots = malloc((size_t)BATCH * SLOT);
    if (!seen || !ended || !slots)
        die("malloc");
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    char ctl[BATCH][CMSG_SPACE(sizeof(int))];
    uint64_t got = 0, bytes = 0, dups = 0, gro_bufs = 0;
    int nended = 0;
    double first = 0, last = 0, deadline = m.t0 + START_DELAY_S + m.timeout_s;
    double c0 = cpu_s();
    while (got < expect && nended < others && now_s() < deadline) {
        struct pollfd pf = {m.sock, POLLIN, 0};
        if (poll(&pf, 1, 20) <= 0)
            continue;
        for (int i = 0; i < BATCH; i++) {
            iov[i].iov_base = slots + (size_t)i * SLOT;
            iov[i].iov_len = SLOT;
            memset(&msgs[i].msg_hdr, 0, sizeof(struct msghdr));
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = ctl[i];
            msgs[i].msg_hdr.msg_controllen = sizeof(ctl[i]);
        }
        int n = recvmmsg(m.sock, msgs, BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0)
            continue;
        double t = now_s();
        for (int i = 0; i < n; i++) {
            size_t len = msgs[i].msg_len, seg = len;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c;
                 c = CMSG_NXTHDR(&msgs[i].msg_hdr, c))
                if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                    int gs;
                    memcpy(&gs, CMSG_DATA(c), sizeof(gs));
                    if (gs > 0 && (size_t)gs < len) {
                        seg = (size_t)gs;
                        gro_bufs++;
                    }
                }
            for (size_t off = 0; off + 16 <= len; off += seg) {
                uint32_t *h = (uint32_t *)(slots + (size_t)i * SLOT + off);
                uint32_t s = ntohl(h[0]), idx = ntohl(h[1]);
                if ((int)s >= m.senders || (int)s == m.rank)
                    continue;
                if (ntohl(h[3])) {
                    if (!ended[s]) {
                        ended[s] = 1;
                        nended++;
                    }
                    continue;
                }
                if (idx >= total)
                    continue;
                uint8_t *b = &seen[(size_t)s * total + idx];
                if (*b) {
                    dups++;
                    continue;
                }
                *b = 1;
                got++;
                bytes += (len - off < seg ? len - off : seg) - 16;
                if (!first)
                    first = t;
                last = t;
            }
        }
    }
    double cpu_rx = cpu_s() - c0;
    if (sending)
        pthread_join(th, NULL);
    double start = m.t0 + START_DELAY_S;
    printf("{\"mode\": \"mcast\", \"rank\": %d, \"senders\": %d, \"received_datagrams\": %llu, "
           "\"expected_datagrams\": %llu, \"lost_datagrams\": %llu, \"received_bytes\": %llu, "
           "\"duplicates\": %llu, \"seconds\": %.6f, \"first_s\": %.6f, \"cpu_s\": %.4f, "
           "\"cpu_receive_s\": %.4f, \"gro\": %d, \"gro_buffers\": %llu, \"gso\": %d}\n",
           m.rank, m.senders, (unsigned long long)got, (unsigned long long)expect,
           (unsigned long long)(expect - got), (unsigned long long)bytes,
           (unsigned long long)dups, last > 0 ? last - start : 0.0,
           first > 0 ? first - start : 0.0, cpu_s(), cpu_rx, gro,
           (unsigned long long)gro_bufs, m.gso);
    return got == expect ? 0 : 1;
}

/* -- TCP ring ------------------------------------------------------------------------------ */
struct ring_send {
    const char *addr;
    int port;
    uint64_t nbytes;
    double deadline;
    uint64_t sent;
};

static void *ring_sender(void *arg) {
    struct ring_send *s = arg;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)s->port);
    inet_pton(AF_INET, s->addr, &a.sin_addr);
    int fd = -1;
    while (now_s() < s->deadline) {          /* the successor may not listen yet */
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
            break;
        close(fd);
        fd = -1;
        usleep(10000);
    }
    if (fd < 0)
        return NULL;
    char *buf = calloc(1, 1 << 20);
    while (s->sent < s->nbytes && now_s() < s->deadline) {
        uint64_t left = s->nbytes - s->sent;
        ssize_t r = send(fd, buf, left < (1u << 20) ? left : (1u << 20), 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        s->sent += (uint64_t)r;
    }
    free(buf);
    close(fd);
    return NULL;
}

static int tcpring_main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: lab_raw tcpring RANK NRANKS LISTEN_PORT NEXT_ADDR NEXT_PORT "
                        "NBYTES TIMEOUT_S\n");
        return 2;
    }
    int rank = atoi(argv[2]), lport = atoi(argv[4]), nport = atoi(argv[6]);
    uint64_t nbytes = strtoull(argv[7], NULL, 10);
    double timeout = atof(argv[8]), t0 = now_s();
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)lport);
    if (bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(ls, 4) < 0)
        die("listen");
    struct ring_send s = {argv[5], nport, nbytes, t0 + START_DELAY_S + timeout, 0};
    sleep_until(t0 + START_DELAY_S);
    double start = now_s(), c0 = cpu_s();
    pthread_t th;
    if (pthread_create(&th, NULL, ring_sender, &s) != 0)
        die("pthread_create");
    struct pollfd pf = {ls, POLLIN, 0};
    uint64_t got = 0;
    double last = start;
    if (poll(&pf, 1, (int)(timeout * 1000)) > 0) {
        int fd = accept(ls, NULL, NULL);
        char *buf = malloc(1 << 20);
        while (got < nbytes && now_s() < s.deadline) {
            ssize_t r = recv(fd, buf, 1 << 20, 0);
            if (r <= 0)
                break;
            got += (uint64_t)r;
        }
        last = now_s();
        free(buf);
        close(fd);
    }
    pthread_join(th, NULL);
    double end = now_s() > last ? now_s() : last;
    printf("{\"mode\": \"tcpring\", \"rank\": %d, \"sent_bytes\": %llu, \"received_bytes\": %llu, "
           "\"seconds\": %.6f, \"receive_seconds\": %.6f, \"cpu_s\": %.4f}\n", rank,
           (unsigned long long)s.sent, (unsigned long long)got, end - start, last - start,
           cpu_s() - c0);
    return got == nbytes && s.sent == nbytes ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "mcast"))
        return mcast_main(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "tcpring"))
        return tcpring_main(argc, argv);
    fprintf(stderr, "usage: lab_raw mcast ... | lab_raw tcpring ...\n");
    return 2;
}
