/*
 * test_pattern.h -- the byte pattern the engine tests fill and check regions with: byte `off` of the
 * stream `seed` (a splitmix64 word per 8 bytes), so a byte that lands at the wrong offset, from the wrong
 * region or from a stale transfer differs from what the check expects.
 */
#ifndef PDL_TEST_PATTERN_H
#define PDL_TEST_PATTERN_H

#include <stddef.h>
#include <stdint.h>

static inline uint8_t tp_byte(uint64_t seed, uint64_t off)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + (off >> 3) + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (uint8_t)(z >> ((off & 7) * 8));
}

#endif
