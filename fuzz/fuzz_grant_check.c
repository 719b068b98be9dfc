/*
 * fuzz_grant_check.c -- libFuzzer target for the grant check of the tcp server (pdl__grants_check,
 * src/engine/grant.c): a grant's ranges are sorted and merged when added, then each segment of a
 * peer's request (wire form: u64 offset, u64 length) must lie inside one merged range. Property: the
 * answer equals a brute-force one -- every byte of every segment covered by the union of the ranges
 * as given -- for ranges and segments on a small space where the brute force is cheap; the same grant
 * bound to a host serves that host only.
 *
 * Input: byte 0 = number of ranges (mod 9), then 3 bytes per range (u16 offset, u8 length), then 3
 * bytes per segment (u16 offset, u8 length - 1: the server refuses empty segments before this check)
 * to the end.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grant.h"
#include "engine/tcp_wire.h"

#define SPACE (65536 + 256)

static uint8_t covered_map[SPACE];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t nr = data[0] % 9;
    if (size < 1 + 3 * nr)
        return 0;
    pdl_range_t r[8];
    memset(covered_map, 0, sizeof(covered_map));
    size_t good = 0;
    for (size_t i = 0; i < nr; i++) {
        const uint8_t *p = data + 1 + 3 * i;
        uint64_t off = (uint64_t)p[0] | (uint64_t)p[1] << 8, len = p[2];
        if (len == 0)
            continue; /* refused by add: covered by the unit tests */
        r[good++] = (pdl_range_t){off, len};
        memset(covered_map + off, 1, len);
    }
    const uint8_t *s = data + 1 + 3 * nr;
    uint32_t nseg = (uint32_t)((size - 1 - 3 * nr) / 3);
    if (good == 0 || nseg == 0 || nseg > 64)
        return 0;
    uint8_t segs[64 * PDL_TCP_SEG];
    bool want = true;
    for (uint32_t i = 0; i < nseg; i++) {
        uint64_t off = (uint64_t)s[3 * i] | (uint64_t)s[3 * i + 1] << 8, len = (uint64_t)s[3 * i + 2] + 1;
        pdl_tcp_put64(segs + (size_t)i * PDL_TCP_SEG, off);
        pdl_tcp_put64(segs + (size_t)i * PDL_TCP_SEG + 8, len);
        for (uint64_t b = off; b < off + len; b++)
            want &= covered_map[b] != 0;
    }
    pdl_grants_t g;
    pdl__grants_init(&g);
    if (pdl__grants_add(&g, "tx", 1, PDL_GRANT_READ, r, good, NULL) != PDL_OK)
        abort();
    if (pdl__grants_add_to(&g, "tw", 1, PDL_GRANT_WRITE, r, good, "10.0.0.7", NULL) != PDL_OK)
        abort();
    char why[256];
    uint64_t gen = 0;
    bool got = pdl__grants_check(&g, "tx", 2, 1, PDL_GRANT_READ, segs, nseg, "127.0.0.1", &gen, why, sizeof(why));
    if (got != want || (got && gen == 0))
        abort();
    if (pdl__grants_check(&g, "ty", 2, 1, PDL_GRANT_READ, segs, nseg, "127.0.0.1", NULL, why, sizeof(why)) ||
        pdl__grants_check(&g, "tx", 2, 2, PDL_GRANT_READ, segs, nseg, "127.0.0.1", NULL, why, sizeof(why)) ||
        pdl__grants_check(&g, "tx", 2, 1, PDL_GRANT_WRITE, segs, nseg, "127.0.0.1", NULL, why, sizeof(why)))
        abort();
    /* A grant bound to a host serves that host only. */
    if (pdl__grants_check(&g, "tw", 2, 1, PDL_GRANT_WRITE, segs, nseg, "127.0.0.1", NULL, why, sizeof(why)) ||
        pdl__grants_check(&g, "tw", 2, 1, PDL_GRANT_WRITE, segs, nseg, "10.0.0.7", NULL, why, sizeof(why)) != want)
        abort();
    pdl__grants_fini(&g);
    return 0;
}
