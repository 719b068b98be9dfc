/*
 * types.h -- small value types shared by every layer: transfer descriptors and owned byte buffers.
 */
#ifndef PDLINK_TYPES_H
#define PDLINK_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One contiguous copy: `len` bytes between local offset and remote offset of two registered regions. */
typedef struct pdl_desc {
    uint64_t local_off;
    uint64_t remote_off;
    uint64_t len;
} pdl_desc_t;

/* A growable array of descriptors. Zero-initialise, then pdl_descv_push; free with pdl_descv_free. */
typedef struct pdl_descv {
    pdl_desc_t *v;
    size_t n;
    size_t cap;
} pdl_descv_t;

/* Append one descriptor; returns 0, or -1 when memory runs out (the vector is unchanged). */
int pdl_descv_push(pdl_descv_t *dv, uint64_t local_off, uint64_t remote_off, uint64_t len);
void pdl_descv_reset(pdl_descv_t *dv); /* n = 0, keeps the storage */
void pdl_descv_free(pdl_descv_t *dv);

/* Bytes owned by whoever holds the struct; free with pdl_bytes_free (data may be NULL when len == 0). */
typedef struct pdl_bytes {
    uint8_t *data;
    size_t len;
} pdl_bytes_t;

void pdl_bytes_free(pdl_bytes_t *b);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_TYPES_H */
