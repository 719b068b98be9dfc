/*
 * buf.h -- growing a byte buffer by doubling, for the programs' body buffers (HTTP request bodies, curl
 * responses, relayed upstream bodies).
 */
#ifndef PDL_APP_BUF_H
#define PDL_APP_BUF_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Make the malloc'd buffer *buf_p (capacity *cap_p, may be NULL/0) hold at least `need` bytes, doubling
 * from first_cap or the current capacity so that n appends cost O(n) copies in all. Returns false when
 * memory runs out (or need overflows when doubled); the buffer and *cap_p are then unchanged.
 */
bool pdl_buf_reserve(char **buf_p, size_t *cap_p, size_t need, size_t first_cap);

#endif /* PDL_APP_BUF_H */
