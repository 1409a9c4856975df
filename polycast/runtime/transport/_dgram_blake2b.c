/* BLAKE2b (RFC 7693), keyed, any digest length up to 64: the datagrams' MAC is 16 bytes of
 * it (engine/wire.py uses hashlib's; tests/test_dgram.py checks they agree). */
#include "_dgram.h"

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

void b2_update(B2 *s, const uint8_t *in, size_t n) {
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
void b2_init_key(B2 *s, const uint8_t *key, size_t keylen, size_t outlen) {
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

void b2_final(B2 *s, uint8_t *out) {
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

