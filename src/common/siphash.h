/*
 * siphash.h -- SipHash-2-4, a keyed 64-bit hash for tables indexed by strings that come from peers
 * (internal; not part of the public API).
 *
 * Why keyed: with an unkeyed hash (FNV-1a) and power-of-two buckets, anyone who can choose the strings
 * can compute a set that lands in one bucket and turn every lookup into a list walk. With a secret
 * 128-bit key the bucket of a string cannot be predicted without the key. SipHash is the keyed hash
 * designed for exactly this use (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012).
 */
#ifndef PDL_COMMON_SIPHASH_H
#define PDL_COMMON_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

#define PDL_SIPHASH_KEY_LEN 16

/* SipHash-2-4 of `len` bytes at `msg` under the 16-byte `key`; msg may be NULL when len is 0. */
uint64_t pdl__siphash24(const uint8_t key[PDL_SIPHASH_KEY_LEN], const void *msg, size_t len);

#endif /* PDL_COMMON_SIPHASH_H */
