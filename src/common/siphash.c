/*
 * siphash.c -- SipHash-2-4 (see siphash.h), written from the description in the SipHash paper.
 *
 * The state is four 64-bit words initialised from the key halves k0, k1 (little-endian) XORed with
 * four ASCII constants. The message is consumed in 8-byte little-endian words m: v3 ^= m, two rounds,
 * v0 ^= m. The last word holds the remaining 0..7 bytes in its low bytes and the message length mod
 * 256 in its top byte, so messages that differ only in trailing zero bytes hash differently. Then
 * v2 ^= 0xff, four rounds, and the result is v0 ^ v1 ^ v2 ^ v3.
 */
#include "common/siphash.h"

static inline uint64_t rotl64(uint64_t x, unsigned r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* One SipRound: two add-rotate-xor half rounds on (v0, v1) and (v2, v3), then cross over. */
static inline void sip_round(uint64_t v[4])
{
    v[0] += v[1];
    v[1] = rotl64(v[1], 13) ^ v[0];
    v[0] = rotl64(v[0], 32);
    v[2] += v[3];
    v[3] = rotl64(v[3], 16) ^ v[2];
    v[0] += v[3];
    v[3] = rotl64(v[3], 21) ^ v[0];
    v[2] += v[1];
    v[1] = rotl64(v[1], 17) ^ v[2];
    v[2] = rotl64(v[2], 32);
}

static inline void sip_absorb(uint64_t v[4], uint64_t m)
{
    v[3] ^= m;
    sip_round(v);
    sip_round(v);
    v[0] ^= m;
}

uint64_t pdl__siphash24(const uint8_t key[PDL_SIPHASH_KEY_LEN], const void *msg, size_t len)
{
    const uint8_t *p = msg;
    uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    uint64_t v[4] = {
        k0 ^ 0x736f6d6570736575ull, /* "somepseu" */
        k1 ^ 0x646f72616e646f6dull, /* "dorandom" */
        k0 ^ 0x6c7967656e657261ull, /* "lygenera" */
        k1 ^ 0x7465646279746573ull, /* "tedbytes" */
    };
    size_t whole = len & ~(size_t)7;
    for (size_t i = 0; i < whole; i += 8)
        sip_absorb(v, load_le64(p + i));
    uint64_t last = (uint64_t)(len & 0xff) << 56;
    for (size_t i = whole; i < len; i++)
        last |= (uint64_t)p[i] << (8 * (i - whole));
    sip_absorb(v, last);
    v[2] ^= 0xff;
    for (int r = 0; r < 4; r++)
        sip_round(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}
