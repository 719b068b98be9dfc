/*
 * types.h -- small value types shared by every layer: transfer descriptors and owned byte buffers.
 *
 * Layer: common, below every other layer. These are plain structs with public fields; the functions
 * here only manage their heap storage (malloc/realloc/free). The one fallible function returns 0 or -1
 * (out of memory) rather than a pdl_status_t, because its only failure needs no message. None of them
 * locks: one thread at a time per struct.
 */
#ifndef PDLINK_TYPES_H
#define PDLINK_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * One contiguous copy: `len` bytes between local offset and remote offset of two registered regions.
 * Offsets are bytes from the start of each region; the engine refuses len 0 and any range that does
 * not lie inside its region.
 */
typedef struct pdl_desc {
    uint64_t local_off;
    uint64_t remote_off;
    uint64_t len;
} pdl_desc_t;

/*
 * A growable array of descriptors. Zero-initialise (`pdl_descv_t dv = {0};`), append with
 * pdl_descv_push, free with pdl_descv_free. `v` holds `n` descriptors in `cap` allocated slots (NULL
 * until the first push); the holder owns it.
 */
typedef struct pdl_descv {
    pdl_desc_t *v;
    size_t n;
    size_t cap;
} pdl_descv_t;

/*
 * Append one descriptor, doubling the storage when full. Returns 0, or -1 when memory runs out (the
 * vector is then unchanged and still valid). `dv` must not be NULL; this holds for the three functions.
 * pdl_descv_reset empties the vector and keeps the storage for reuse; pdl_descv_free frees the storage
 * and leaves the vector zeroed, ready for reuse.
 */
int pdl_descv_push(pdl_descv_t *dv, uint64_t local_off, uint64_t remote_off, uint64_t len);
void pdl_descv_reset(pdl_descv_t *dv); /* n = 0, keeps the storage */
void pdl_descv_free(pdl_descv_t *dv);

/*
 * Bytes owned by whoever holds the struct; free with pdl_bytes_free (data may be NULL when len == 0).
 * Functions that fill one for the caller (encoders, pdl_engine_pack, pdl_mem_pack) allocate `data` with
 * malloc; the caller then owns it.
 */
typedef struct pdl_bytes {
    uint8_t *data;
    size_t len;
} pdl_bytes_t;

/* Free `data` and reset the struct to {NULL, 0}, so a second call is harmless. A NULL b is ignored. */
void pdl_bytes_free(pdl_bytes_t *b);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_TYPES_H */
