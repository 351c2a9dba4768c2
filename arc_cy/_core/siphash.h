/* SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit hash, the
 * recording's id of an offload key (arc_cy/_record.py has the same in
 * Python, tests/test_record.py holds both to the paper's vectors). */
#ifndef ARC_SIPHASH_H
#define ARC_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

#define ARC_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define ARC_SIPROUND                                                         \
    do {                                                                     \
        v0 += v1; v1 = ARC_ROTL(v1, 13); v1 ^= v0; v0 = ARC_ROTL(v0, 32);    \
        v2 += v3; v3 = ARC_ROTL(v3, 16); v3 ^= v2;                           \
        v0 += v3; v3 = ARC_ROTL(v3, 21); v3 ^= v0;                           \
        v2 += v1; v1 = ARC_ROTL(v1, 17); v1 ^= v2; v2 = ARC_ROTL(v2, 32);    \
    } while (0)

static inline uint64_t arc_load_le64(const uint8_t *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16
        | (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40
        | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

/* SipHash-2-4 of the len bytes at data, under the key (k0, k1): the key's
 * first and last 8 bytes, little-endian. */
static inline uint64_t arc_siphash24(const char *data, size_t len,
                                     uint64_t k0, uint64_t k1)
{
    const uint8_t *in = (const uint8_t *)data;
    const uint8_t *end = in + len - (len % 8);
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    uint64_t m, b = (uint64_t)len << 56;
    for (; in != end; in += 8) {
        m = arc_load_le64(in);
        v3 ^= m;
        ARC_SIPROUND;
        ARC_SIPROUND;
        v0 ^= m;
    }
    for (size_t k = 0; k < (len & 7); k++)
        b |= (uint64_t)in[k] << (8 * k);
    v3 ^= b;
    ARC_SIPROUND;
    ARC_SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    ARC_SIPROUND;
    ARC_SIPROUND;
    ARC_SIPROUND;
    ARC_SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* The decimal digits of v at out (at most 20), returning how many: two
 * digits a division. */
static inline int arc_decimal(uint64_t v, char *out)
{
    static const char pairs[201] =
        "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
        "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
        "8081828384858687888990919293949596979899";
    char tmp[20];
    int n = 20, k;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        tmp[--n] = pairs[2 * r + 1];
        tmp[--n] = pairs[2 * r];
    }
    if (v >= 10) {
        tmp[--n] = pairs[2 * v + 1];
        tmp[--n] = pairs[2 * v];
    } else {
        tmp[--n] = (char)('0' + v);
    }
    for (k = n; k < 20; k++)
        out[k - n] = tmp[k];
    return 20 - n;
}

#endif /* ARC_SIPHASH_H */
