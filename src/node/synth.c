/*
 * synth.c -- the deterministic synthetic model (see synth.h for what it computes and why).
 *
 * All hashing is splitmix64 (a fast, well-mixed 64-bit finaliser): the expected bytes of a row are the
 * splitmix64 stream seeded by mix(prefix hash of its token, its coordinates), 8 bytes per step. For
 * llama-3.1-8b in bf16 that is 32 steps per 256-byte row, about 16k steps per token over all ranks, so a
 * few hundred tokens fill or verify in milliseconds.
 */
#include "node/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdlink/layout.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t fnv1a64(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static inline int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

pdl_status_t pdl_synth_tokenize(uint64_t seed, const char *text, size_t len, pdl_synth_prompt_t *out,
                                pdl_error_t *err)
{
    memset(out, 0, sizeof(*out));
    /* Upper bound: BOS + one token per two bytes (a word and a separator). */
    size_t cap = 1 + len / 2 + 1;
    out->tokens = malloc(cap * sizeof(uint32_t));
    out->prefix = malloc(cap * sizeof(uint64_t));
    if (out->tokens == NULL || out->prefix == NULL) {
        pdl_synth_prompt_free(out);
        return pdl_error_set(err, PDL_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte prompt", len);
    }
    size_t n = 0;
    uint64_t h = mix64(seed ^ (PDL_SYNTH_BOS * GOLDEN));
    out->tokens[n] = PDL_SYNTH_BOS;
    out->prefix[n++] = h;
    size_t i = 0;
    while (i < len) {
        while (i < len && is_space(text[i]))
            i++;
        size_t start = i;
        while (i < len && !is_space(text[i]))
            i++;
        if (i == start)
            break;
        uint32_t tok = 100u + (uint32_t)(fnv1a64(text + start, i - start) % 50000u);
        h = mix64(h ^ ((uint64_t)tok * GOLDEN) ^ ((uint64_t)n << 48));
        out->tokens[n] = tok;
        out->prefix[n++] = h;
    }
    out->n = n;
    return PDL_OK;
}

void pdl_synth_prompt_free(pdl_synth_prompt_t *p)
{
    free(p->tokens);
    free(p->prefix);
    memset(p, 0, sizeof(*p));
}

size_t pdl_synth_blocks_needed(size_t n_tokens, int block_size)
{
    return (n_tokens + (size_t)block_size - 1) / (size_t)block_size;
}

/* Coordinates of a row, without the token: mixed once per (layer, half, head). */
static inline uint64_t coord_key(int layer, int half, int head)
{
    return mix64(((uint64_t)(uint32_t)layer << 40) ^ ((uint64_t)(uint32_t)half << 36) ^ (uint64_t)(uint32_t)head ^
                 0x50444c494e4bull);
}

static void fill_row(uint8_t *dst, size_t len, uint64_t row_seed)
{
    size_t words = len / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w = mix64(row_seed + (i + 1) * GOLDEN);
        memcpy(dst + i * 8, &w, 8);
    }
    if (len % 8) {
        uint64_t w = mix64(row_seed + (words + 1) * GOLDEN);
        memcpy(dst + words * 8, &w, len % 8);
    }
}

static uint64_t hash_row(const uint8_t *src, size_t len)
{
    uint64_t h = 0x243f6a8885a308d3ull ^ len;
    size_t words = len / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w;
        memcpy(&w, src + i * 8, 8);
        h = rotl64(h ^ w, 29) * GOLDEN;
    }
    for (size_t i = words * 8; i < len; i++)
        h = rotl64(h ^ src[i], 29) * GOLDEN;
    return mix64(h);
}

/* Offset of row (local head h, token t) inside a layer region, from the rank's own geometry. */
static inline uint64_t row_offset(const pdl_kv_geometry_t *g, uint32_t block, int half, int h, uint32_t tib,
                                  uint64_t row_len)
{
    uint64_t idx = g->order == PDL_KV_HND ? (uint64_t)h * g->block_size + tib : (uint64_t)tib * g->num_heads + h;
    return pdl_layout_half_offset(g, block, half) + idx * row_len;
}

void pdl_synth_prefill(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p, const uint32_t *blocks)
{
    (void)seed; /* the seed is already folded into every prefix hash */
    int tp = pdl_node_kv_tp_size(kv);
    int layers = pdl_node_kv_num_layers(kv);
    for (int r = 0; r < tp; r++) {
        const pdl_kv_geometry_t *g = pdl_node_kv_geometry(kv, r);
        uint64_t row_len = (uint64_t)g->head_dim * g->elem_size;
        int halves = pdl_layout_num_halves(g);
        int first = 0, count = 0;
        pdl_node_kv_heads(kv, r, &first, &count);
        for (int l = 0; l < layers; l++) {
            uint8_t *base = pdl_node_kv_layer(kv, r, l);
            for (int s = 0; s < halves; s++)
                for (int h = 0; h < count; h++) {
                    uint64_t ck = coord_key(l, s, first + h);
                    for (size_t t = 0; t < p->n; t++) {
                        uint32_t blk = blocks[t / g->block_size];
                        uint32_t tib = (uint32_t)(t % g->block_size);
                        fill_row(base + row_offset(g, blk, s, h, tib, row_len), row_len, mix64(p->prefix[t] ^ ck));
                    }
                }
        }
    }
}

/* True when no rank below r holds global head `head` (replicated heads count once). */
static int lowest_holder(pdl_node_kv_t *kv, int r, int head)
{
    for (int q = 0; q < r; q++) {
        int f = 0, c = 0;
        pdl_node_kv_heads(kv, q, &f, &c);
        if (head >= f && head < f + c)
            return 0;
    }
    return 1;
}

void pdl_synth_verify(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p, const uint32_t *blocks,
                      pdl_synth_check_t *out)
{
    (void)seed;
    memset(out, 0, sizeof(*out));
    int tp = pdl_node_kv_tp_size(kv);
    int layers = pdl_node_kv_num_layers(kv);
    uint64_t sum = 0;
    uint8_t *expect = NULL;
    size_t expect_cap = 0;
    for (int r = 0; r < tp; r++) {
        const pdl_kv_geometry_t *g = pdl_node_kv_geometry(kv, r);
        uint64_t row_len = (uint64_t)g->head_dim * g->elem_size;
        if (row_len > expect_cap) {
            uint8_t *nb = realloc(expect, row_len);
            if (nb == NULL) {
                snprintf(out->first_mismatch, sizeof(out->first_mismatch), "verify: out of memory");
                out->mismatched_bytes = 1;
                free(expect);
                return;
            }
            expect = nb;
            expect_cap = row_len;
        }
        int halves = pdl_layout_num_halves(g);
        int first = 0, count = 0;
        pdl_node_kv_heads(kv, r, &first, &count);
        for (int h = 0; h < count; h++) {
            int owner = lowest_holder(kv, r, first + h);
            for (int l = 0; l < layers; l++) {
                const uint8_t *base = pdl_node_kv_layer(kv, r, l);
                for (int s = 0; s < halves; s++) {
                    uint64_t ck = coord_key(l, s, first + h);
                    for (size_t t = 0; t < p->n; t++) {
                        uint32_t blk = blocks[t / g->block_size];
                        uint32_t tib = (uint32_t)(t % g->block_size);
                        const uint8_t *row = base + row_offset(g, blk, s, h, tib, row_len);
                        fill_row(expect, row_len, mix64(p->prefix[t] ^ ck));
                        out->verified_bytes += row_len;
                        if (memcmp(row, expect, row_len) != 0) {
                            uint64_t bad = 0;
                            for (uint64_t i = 0; i < row_len; i++)
                                bad += row[i] != expect[i];
                            if (out->mismatched_bytes == 0)
                                snprintf(out->first_mismatch, sizeof(out->first_mismatch),
                                         "rank %d layer %d %s head %d token %zu (block %u): %llu of %llu bytes differ",
                                         r, l, halves == 1 ? "latent" : (s == 0 ? "K" : "V"), first + h, t, blk,
                                         (unsigned long long)bad, (unsigned long long)row_len);
                            out->mismatched_bytes += bad;
                        }
                        if (owner)
                            sum += mix64(hash_row(row, row_len) ^ ck ^ ((uint64_t)t * GOLDEN));
                    }
                }
            }
        }
    }
    free(expect);
    out->digest = mix64(sum ^ ((uint64_t)p->n * GOLDEN) ^ (p->n ? p->prefix[p->n - 1] : 0));
}

static const char *const vocab[] = {
    "the",    "of",     "and",    "to",     "in",     "a",      "is",     "that",   "for",    "it",     "as",
    "with",   "was",    "on",     "be",     "by",     "at",     "this",   "from",   "or",     "which",  "an",
    "are",    "but",    "not",    "have",   "one",    "were",   "all",    "their",  "when",   "there",  "can",
    "more",   "other",  "time",   "some",   "two",    "three",  "four",   "five",   "six",    "seven",  "eight",
    "nine",   "ten",    "number", "answer", "total",  "each",   "then",   "so",     "apples", "train",  "miles",
    "hours",  "cost",   "dollars", "left",  "equals", "plus",   "minus",  "times",  "therefore",
};

#define VOCAB_SIZE (sizeof(vocab) / sizeof(vocab[0]))

void pdl_synth_generate(uint64_t digest, size_t n, uint32_t *out)
{
    uint64_t state = digest;
    for (size_t i = 0; i < n; i++) {
        state = mix64(state + GOLDEN * (i + 1));
        out[i] = (uint32_t)(state % VOCAB_SIZE);
        state ^= (uint64_t)out[i] << 17;
    }
}

const char *pdl_synth_word(uint32_t id) { return id < VOCAB_SIZE ? vocab[id] : "<unk>"; }
