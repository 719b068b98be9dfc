/*
 * synth.h -- the deterministic synthetic model of pdlink-node.
 *
 * Tokenizer: a BOS token, then one token per whitespace-separated word (id from a hash of the word).
 * Prefill: every KV "row" -- one (layer, K/V half, global head, token) -- gets head_dim*elem_size bytes
 *   that are a function of the model seed, the row's coordinates and a rolling hash of the whole token
 *   prefix up to that token. Each TP rank writes only the heads it holds, at the offsets its layout gives.
 *   A byte that is wrong, missing, misplaced (wrong block, head, token, half or layer) or stale therefore
 *   never matches.
 * Verify: recompute every expected row of the prompt on every rank and compare; count verified and
 *   mismatched bytes and name the first bad (rank, layer, half, head, token).
 * Digest: a sum over the rows of the prompt in global coordinates, each row hashed from its bytes; a
 *   replicated head counts once (only the lowest rank holding it contributes). The sum is commutative
 *   over rows with global coordinates mixed in, so it is independent of the TP layout and of the order
 *   ranks are visited: a P/D pair and a single node of any TP size agree. Prefill computes it from the
 *   bytes as it writes them (one pass, no read-back); verify from the bytes it reads.
 * Generate: token i = f(digest, tokens before it) over a small fixed vocabulary of words, so a shorter
 *   max_tokens gives a prefix of a longer one.
 */
#ifndef PDL_NODE_SYNTH_H
#define PDL_NODE_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node/kvstore.h"
#include "pdlink/status.h"

#define PDL_SYNTH_BOS 1u

typedef struct pdl_synth_prompt {
    uint32_t *tokens;     /* n token ids, tokens[0] == BOS */
    uint64_t *prefix;     /* prefix[t]: rolling hash of tokens[0..t] and the seed */
    size_t n;
} pdl_synth_prompt_t;

/* Tokenize `text` (not necessarily NUL-terminated). PDL_ERR_NOMEM only. */
pdl_status_t pdl_synth_tokenize(uint64_t seed, const char *text, size_t len, pdl_synth_prompt_t *out,
                                pdl_error_t *err);
void pdl_synth_prompt_free(pdl_synth_prompt_t *p);
/* A prompt given as token ids (vLLM's token-id prompts), used as they are: with ids[0] == BOS and the
 * ids of the words (pdl_synth_word_token) it equals the text prompt of those words. n >= 1. */
pdl_status_t pdl_synth_from_ids(uint64_t seed, const uint32_t *ids, size_t n, pdl_synth_prompt_t *out,
                                pdl_error_t *err);
/* The token id of one word of a text prompt. */
uint32_t pdl_synth_word_token(const char *word, size_t len);

/* Blocks a prompt of n tokens needs: ceil(n / block_size). */
size_t pdl_synth_blocks_needed(size_t n_tokens, int block_size);

/* Row kernels: a portable one and, where the CPU has it, AVX-512 (F+DQ). They give identical results;
 * AUTO picks the fastest available one. The explicit choices exist for tests and benchmarks. */
typedef enum pdl_synth_kernel {
    PDL_SYNTH_KERNEL_AUTO = 0,
    PDL_SYNTH_KERNEL_SCALAR = 1,
    PDL_SYNTH_KERNEL_AVX512 = 2,
} pdl_synth_kernel_t;

bool pdl_synth_kernel_available(pdl_synth_kernel_t k);

/* One row: write the `len` bytes seeded `row_seed` and return the row's hash (fill), or compare the
 * bytes at `src` with them, set *bad on any difference, and return the hash of the bytes read (check). */
uint64_t pdl_synth_row_fill(uint8_t *dst, size_t len, uint64_t row_seed, pdl_synth_kernel_t k);
uint64_t pdl_synth_row_check(const uint8_t *src, size_t len, uint64_t row_seed, pdl_synth_kernel_t k, bool *bad);

/* Write the prompt's KV into `blocks` (ceil(n/block_size) ids) on every rank; returns the digest of
 * what it wrote (equal to the digest pdl_synth_verify computes from the same KV). */
uint64_t pdl_synth_prefill(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p, const uint32_t *blocks);
uint64_t pdl_synth_prefill_kernel(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p,
                                  const uint32_t *blocks, pdl_synth_kernel_t kernel);

typedef struct pdl_synth_check {
    uint64_t verified_bytes;
    uint64_t mismatched_bytes;
    uint64_t digest;
    char first_mismatch[200]; /* "" when none */
} pdl_synth_check_t;

/* One rank's share of a verification: its bytes and its part of the digest sum. */
typedef struct pdl_synth_part {
    uint64_t verified_bytes;
    uint64_t mismatched_bytes;
    uint64_t sum;
    bool done;                /* set by pdl_synth_verify_rank */
    char first_mismatch[200];
} pdl_synth_part_t;

/* Verify rank r's share (any thread; ranks are independent, so they can be checked concurrently). */
void pdl_synth_verify_rank(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p, const uint32_t *blocks,
                           int r, pdl_synth_kernel_t kernel, pdl_synth_part_t *out);
/* The whole check from every rank's part (parts[r] for r < n = TP size); the first mismatch named is the
 * lowest rank's, as pdl_synth_verify names it. */
void pdl_synth_check_combine(const pdl_synth_prompt_t *p, const pdl_synth_part_t *parts, int n,
                             pdl_synth_check_t *out);

/* Verify every byte of the prompt's KV on every rank and compute the digest. */
void pdl_synth_verify(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p, const uint32_t *blocks,
                      pdl_synth_check_t *out);
void pdl_synth_verify_kernel(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p, const uint32_t *blocks,
                             pdl_synth_kernel_t kernel, pdl_synth_check_t *out);

/* Offset of the row of (local head h, token tib of the block) inside a layer region, from the rank's own
 * geometry; half is 0 for K and 1 for V. Inline because the prefill and verify loops call it per row, and
 * a test uses it to corrupt one chosen byte. */
static inline uint64_t pdl_synth_row_offset(const pdl_kv_geometry_t *g, uint32_t block, int half, int h,
                                            uint32_t tib, uint64_t row_len)
{
    uint64_t idx = g->order == PDL_KV_HND ? (uint64_t)h * g->block_size + tib : (uint64_t)tib * g->num_heads + h;
    return pdl_layout_half_offset(g, block, half) + idx * row_len;
}

/* Generate n tokens from a digest (ids index the vocabulary). */
void pdl_synth_generate(uint64_t digest, size_t n, uint32_t *out);
/* The word of a generated token id (never NULL). */
const char *pdl_synth_word(uint32_t id);

#endif /* PDL_NODE_SYNTH_H */
