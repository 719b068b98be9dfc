/*
 * synth.c -- the deterministic synthetic model (see synth.h for what it computes and why).
 *
 * All hashing is splitmix64 (a fast, well-mixed 64-bit finaliser): the expected bytes of a row are the
 * splitmix64 stream seeded by mix(prefix hash of its token, its coordinates), 8 bytes per step. A row's
 * digest contribution is a rotate-xor hash over its bytes in 8 independent lanes (word i feeds lane
 * i % 8), so one 64-byte vector advances all eight and the chain costs two one-cycle operations.
 *
 * Cost: this is the node's own work on every request (prefill writes the whole KV of the prompt, the
 * decode reads all of it back), on the same cores as the transfer it is there to check, so it must not
 * dominate. One pass per row does everything: prefill generates, stores and hashes the words (the
 * prefill never re-reads what it wrote); verify generates, compares and hashes (the expected row is never
 * materialised; a mismatching row is re-examined byte by byte, which only happens on a failure). On CPUs
 * with AVX-512 (F + DQ: 64-bit multiplies) a runtime-dispatched kernel does 8 words per instruction and
 * writes whole cache lines with streaming stores; elsewhere the portable kernel runs the same 8 lanes in
 * scalar registers. Both give identical bytes
 * and digests (tests/integration/test_node_synth.c compares them).
 */
#include "node/synth.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdlink/layout.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SYNTH_HAVE_AVX512 1
#else
#define SYNTH_HAVE_AVX512 0
#endif

#define GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Rotate left; r in [0, 63] (r = 0 is the identity, without an undefined 64-bit shift). */
static inline uint64_t rotl64(uint64_t x, unsigned r) { return (x << (r & 63u)) | (x >> ((64u - r) & 63u)); }
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
        uint32_t tok = pdl_synth_word_token(text + start, i - start);
        h = mix64(h ^ ((uint64_t)tok * GOLDEN) ^ ((uint64_t)n << 48));
        out->tokens[n] = tok;
        out->prefix[n++] = h;
    }
    out->n = n;
    return PDL_OK;
}

pdl_status_t pdl_synth_from_ids(uint64_t seed, const uint32_t *ids, size_t n, pdl_synth_prompt_t *out,
                                pdl_error_t *err)
{
    memset(out, 0, sizeof(*out));
    out->tokens = malloc((n ? n : 1) * sizeof(uint32_t));
    out->prefix = malloc((n ? n : 1) * sizeof(uint64_t));
    if (out->tokens == NULL || out->prefix == NULL) {
        pdl_synth_prompt_free(out);
        return pdl_error_set(err, PDL_ERR_NOMEM, "tokenizer: out of memory for a %zu-token prompt", n);
    }
    /* The same chain as pdl_synth_tokenize, with the first id in BOS's place: [BOS, ids of the words]
     * hashes exactly like the text of those words. */
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        h = i == 0 ? mix64(seed ^ ((uint64_t)ids[0] * GOLDEN)) : mix64(h ^ ((uint64_t)ids[i] * GOLDEN) ^ ((uint64_t)i << 48));
        out->tokens[i] = ids[i];
        out->prefix[i] = h;
    }
    out->n = n;
    return PDL_OK;
}

uint32_t pdl_synth_word_token(const char *word, size_t len)
{
    return 100u + (uint32_t)(fnv1a64(word, len) % 50000u);
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

/* ---- row kernels -------------------------------------------------------------------------------
 * Word i (8 bytes, i from 0) of a row seeded `seed` is mix64(seed + (i + 1) * GOLDEN); a last partial
 * word takes the low bytes of the next value. Words are independent of each other, so 8 of them are
 * computed at once. The row hash runs 8 lanes: lane j starts at HASH_INIT ^ len ^ j * GOLDEN and takes
 * words j, j+8, ... as h = rotl(h, 5) ^ w (two one-cycle operations: the chain never waits on a
 * multiply); a partial last word (zero-padded) goes to lane (len / 8) % 8; the lanes are folded by
 * rotation (lane j by 8j) and the result mixed once. Any single changed byte changes the hash: every
 * step is a bijection of the lane for fixed input, and the fold and the mix are bijective per lane. */

#define LANES 8
#define HASH_INIT 0x243f6a8885a308d3ull

static inline void lanes_init(uint64_t h[LANES], size_t len)
{
    for (unsigned j = 0; j < LANES; j++)
        h[j] = HASH_INIT ^ (uint64_t)len ^ ((uint64_t)j * GOLDEN);
}

static inline uint64_t hstep(uint64_t h, uint64_t w) { return rotl64(h, 5) ^ w; }

static inline uint64_t lanes_final(const uint64_t h[LANES])
{
    uint64_t r = 0;
    for (unsigned j = 0; j < LANES; j++)
        r ^= rotl64(h[j], 8 * j);
    return mix64(r);
}

/* The low `rem` bytes of a generated value, zero-padded: the partial last word. */
static inline uint64_t tail_word(uint64_t gen, size_t rem)
{
    uint64_t t = 0;
    memcpy(&t, &gen, rem);
    return t;
}

static uint64_t fill_hash_scalar(uint8_t *dst, size_t len, uint64_t seed)
{
    uint64_t h[LANES];
    lanes_init(h, len);
    size_t words = len / 8, i = 0;
    for (; i + LANES <= words; i += LANES)
        for (unsigned j = 0; j < LANES; j++) {
            uint64_t w = mix64(seed + (i + j + 1) * GOLDEN);
            memcpy(dst + (i + j) * 8, &w, 8);
            h[j] = hstep(h[j], w);
        }
    for (; i < words; i++) {
        uint64_t w = mix64(seed + (i + 1) * GOLDEN);
        memcpy(dst + i * 8, &w, 8);
        h[i % LANES] = hstep(h[i % LANES], w);
    }
    size_t rem = len % 8;
    if (rem) {
        uint64_t t = tail_word(mix64(seed + (words + 1) * GOLDEN), rem);
        memcpy(dst + words * 8, &t, rem);
        h[words % LANES] = hstep(h[words % LANES], t);
    }
    return lanes_final(h);
}

static uint64_t check_hash_scalar(const uint8_t *src, size_t len, uint64_t seed, bool *bad)
{
    uint64_t h[LANES];
    lanes_init(h, len);
    uint64_t diff = 0;
    size_t words = len / 8, i = 0;
    for (; i + LANES <= words; i += LANES)
        for (unsigned j = 0; j < LANES; j++) {
            uint64_t w;
            memcpy(&w, src + (i + j) * 8, 8);
            diff |= w ^ mix64(seed + (i + j + 1) * GOLDEN);
            h[j] = hstep(h[j], w);
        }
    for (; i < words; i++) {
        uint64_t w;
        memcpy(&w, src + i * 8, 8);
        diff |= w ^ mix64(seed + (i + 1) * GOLDEN);
        h[i % LANES] = hstep(h[i % LANES], w);
    }
    size_t rem = len % 8;
    if (rem) {
        uint64_t t = 0;
        memcpy(&t, src + words * 8, rem);
        diff |= t ^ tail_word(mix64(seed + (words + 1) * GOLDEN), rem);
        h[words % LANES] = hstep(h[words % LANES], t);
    }
    *bad = diff != 0;
    return lanes_final(h);
}

#if SYNTH_HAVE_AVX512
#define AVX512 __attribute__((target("avx512f,avx512dq")))

/* Per-lane constants: (j + 1) * GOLDEN (the first chunk's counter offsets) and j * GOLDEN. */
static const uint64_t lane_ctr[LANES] = {1 * GOLDEN, 2 * GOLDEN, 3 * GOLDEN, 4 * GOLDEN,
                                         5 * GOLDEN, 6 * GOLDEN, 7 * GOLDEN, 8 * GOLDEN};
static const uint64_t lane_init[LANES] = {0 * GOLDEN, 1 * GOLDEN, 2 * GOLDEN, 3 * GOLDEN,
                                          4 * GOLDEN, 5 * GOLDEN, 6 * GOLDEN, 7 * GOLDEN};
static const uint64_t lane_fold[LANES] = {0, 8, 16, 24, 32, 40, 48, 56};

AVX512 static inline __m512i mix64_v(__m512i z)
{
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)),
                           _mm512_set1_epi64((long long)0xbf58476d1ce4e5b9ull));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)),
                           _mm512_set1_epi64((long long)0x94d049bb133111ebull));
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

AVX512 static inline __m512i hstep_v(__m512i h, __m512i w) { return _mm512_xor_si512(_mm512_rol_epi64(h, 5), w); }

AVX512 static inline __m512i h_init(size_t len)
{
    return _mm512_xor_si512(_mm512_set1_epi64((long long)(HASH_INIT ^ (uint64_t)len)), _mm512_loadu_si512(lane_init));
}

/* Fold the lanes and mix, with the partial last word (if any) stepped into its lane first. */
AVX512 static inline uint64_t h_final(__m512i h, size_t words, size_t rem, uint64_t tail)
{
    if (rem) {
        __mmask8 m = (__mmask8)(1u << (words % LANES));
        h = _mm512_mask_mov_epi64(h, m, hstep_v(h, _mm512_set1_epi64((long long)tail)));
    }
    h = _mm512_rolv_epi64(h, _mm512_loadu_si512(lane_fold));
    __m256i x = _mm256_xor_si256(_mm512_castsi512_si256(h), _mm512_extracti64x4_epi64(h, 1));
    __m128i y = _mm_xor_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    return mix64((uint64_t)_mm_cvtsi128_si64(y) ^ (uint64_t)_mm_extract_epi64(y, 1));
}

AVX512 static uint64_t fill_hash_avx512(uint8_t *dst, size_t len, uint64_t seed)
{
    __m512i h = h_init(len);
    __m512i ctr = _mm512_add_epi64(_mm512_set1_epi64((long long)seed), _mm512_loadu_si512(lane_ctr));
    const __m512i step = _mm512_set1_epi64((long long)(GOLDEN * LANES));
    size_t words = len / 8, i = 0;
    if (((uintptr_t)dst & 63u) == 0) {
        /* Whole cache lines: non-temporal stores. Nothing on this core reads the prompt's KV again (the
         * consumer reads it from another process), and a normal store would first read every line from
         * memory (measured here: 7.7 GB/s with stores, 13 GB/s streaming, into KV not touched lately).
         * pdl_synth_prefill_kernel fences once at the end. */
        for (; i + LANES <= words; i += LANES) {
            __m512i w = mix64_v(ctr);
            _mm512_stream_si512((void *)(dst + i * 8), w);
            h = hstep_v(h, w);
            ctr = _mm512_add_epi64(ctr, step);
        }
    }
    for (; i + LANES <= words; i += LANES) {
        __m512i w = mix64_v(ctr);
        _mm512_storeu_si512(dst + i * 8, w);
        h = hstep_v(h, w);
        ctr = _mm512_add_epi64(ctr, step);
    }
    if (i < words) {
        __mmask8 m = (__mmask8)((1u << (words - i)) - 1u);
        __m512i w = mix64_v(ctr);
        _mm512_mask_storeu_epi64(dst + i * 8, m, w);
        h = _mm512_mask_mov_epi64(h, m, hstep_v(h, w));
    }
    size_t rem = len % 8;
    uint64_t t = 0;
    if (rem) {
        t = tail_word(mix64(seed + (words + 1) * GOLDEN), rem);
        memcpy(dst + words * 8, &t, rem);
    }
    return h_final(h, words, rem, t);
}

AVX512 static uint64_t check_hash_avx512(const uint8_t *src, size_t len, uint64_t seed, bool *bad)
{
    __m512i h = h_init(len);
    __m512i ctr = _mm512_add_epi64(_mm512_set1_epi64((long long)seed), _mm512_loadu_si512(lane_ctr));
    __m512i diff = _mm512_setzero_si512();
    const __m512i step = _mm512_set1_epi64((long long)(GOLDEN * LANES));
    size_t words = len / 8, i = 0;
    for (; i + LANES <= words; i += LANES) {
        __m512i w = _mm512_loadu_si512(src + i * 8);
        diff = _mm512_or_si512(diff, _mm512_xor_si512(w, mix64_v(ctr)));
        h = hstep_v(h, w);
        ctr = _mm512_add_epi64(ctr, step);
    }
    if (i < words) {
        __mmask8 m = (__mmask8)((1u << (words - i)) - 1u);
        __m512i w = _mm512_maskz_loadu_epi64(m, src + i * 8);
        diff = _mm512_or_si512(diff, _mm512_maskz_xor_epi64(m, w, mix64_v(ctr)));
        h = _mm512_mask_mov_epi64(h, m, hstep_v(h, w));
    }
    bool any = _mm512_test_epi64_mask(diff, diff) != 0;
    size_t rem = len % 8;
    uint64_t t = 0;
    if (rem) {
        memcpy(&t, src + words * 8, rem);
        any |= (t ^ tail_word(mix64(seed + (words + 1) * GOLDEN), rem)) != 0;
    }
    *bad = any;
    return h_final(h, words, rem, t);
}
/* Order the streaming stores before whatever publishes the KV (a hold, a lock, a socket write). */
AVX512 static void store_fence(void) { _mm_sfence(); }
#undef AVX512
#endif

typedef struct kernels {
    uint64_t (*fill)(uint8_t *dst, size_t len, uint64_t seed);
    uint64_t (*check)(const uint8_t *src, size_t len, uint64_t seed, bool *bad);
} kernels_t;

bool pdl_synth_kernel_available(pdl_synth_kernel_t k)
{
    switch (k) {
    case PDL_SYNTH_KERNEL_AUTO:
    case PDL_SYNTH_KERNEL_SCALAR: return true;
    case PDL_SYNTH_KERNEL_AVX512:
#if SYNTH_HAVE_AVX512
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
#else
        return false;
#endif
    }
    return false;
}

/* The kernels for `k`; AUTO (and an unavailable choice) picks the fastest this CPU runs. */
static kernels_t kernels_for(pdl_synth_kernel_t k)
{
#if SYNTH_HAVE_AVX512
    if (k != PDL_SYNTH_KERNEL_SCALAR && pdl_synth_kernel_available(PDL_SYNTH_KERNEL_AVX512))
        return (kernels_t){fill_hash_avx512, check_hash_avx512};
#endif
    (void)k;
    return (kernels_t){fill_hash_scalar, check_hash_scalar};
}

uint64_t pdl_synth_row_fill(uint8_t *dst, size_t len, uint64_t row_seed, pdl_synth_kernel_t k)
{
    kernels_t kn = kernels_for(k);
    uint64_t h = kn.fill(dst, len, row_seed);
#if SYNTH_HAVE_AVX512
    if (kn.fill == fill_hash_avx512)
        store_fence();
#endif
    return h;
}

uint64_t pdl_synth_row_check(const uint8_t *src, size_t len, uint64_t row_seed, pdl_synth_kernel_t k, bool *bad)
{
    return kernels_for(k).check(src, len, row_seed, bad);
}

/* ---- whole prompts ------------------------------------------------------------------------------ */

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

/* A row's contribution to the digest: its hash bound to its global coordinates. */
static inline uint64_t row_term(uint64_t row_hash, uint64_t ck, size_t t)
{
    return mix64(row_hash ^ ck ^ ((uint64_t)t * GOLDEN));
}

static uint64_t digest_final(const pdl_synth_prompt_t *p, uint64_t sum)
{
    return mix64(sum ^ ((uint64_t)p->n * GOLDEN) ^ (p->n ? p->prefix[p->n - 1] : 0));
}

uint64_t pdl_synth_prefill_kernel(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p,
                                  const uint32_t *blocks, pdl_synth_kernel_t kernel)
{
    (void)seed; /* the seed is already folded into every prefix hash */
    kernels_t kn = kernels_for(kernel);
    int tp = pdl_node_kv_tp_size(kv);
    int layers = pdl_node_kv_num_layers(kv);
    uint64_t sum = 0;
    for (int r = 0; r < tp; r++) {
        const pdl_kv_geometry_t *g = pdl_node_kv_geometry(kv, r);
        uint64_t row_len = (uint64_t)g->head_dim * g->elem_size;
        int halves = pdl_layout_num_halves(g);
        int first = 0, count = 0;
        pdl_node_kv_heads(kv, r, &first, &count);
        for (int h = 0; h < count; h++) {
            int owner = lowest_holder(kv, r, first + h);
            for (int l = 0; l < layers; l++) {
                uint8_t *base = pdl_node_kv_layer(kv, r, l);
                for (int s = 0; s < halves; s++) {
                    uint64_t ck = coord_key(l, s, first + h);
                    for (size_t t = 0; t < p->n; t++) {
                        uint32_t blk = blocks[t / g->block_size];
                        uint32_t tib = (uint32_t)(t % g->block_size);
                        uint64_t rh = kn.fill(base + pdl_synth_row_offset(g, blk, s, h, tib, row_len), (size_t)row_len,
                                              mix64(p->prefix[t] ^ ck));
                        if (owner)
                            sum += row_term(rh, ck, t);
                    }
                }
            }
        }
    }
#if SYNTH_HAVE_AVX512
    if (kn.fill == fill_hash_avx512)
        store_fence();
#endif
    return digest_final(p, sum);
}

uint64_t pdl_synth_prefill(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p, const uint32_t *blocks)
{
    return pdl_synth_prefill_kernel(kv, seed, p, blocks, PDL_SYNTH_KERNEL_AUTO);
}

/* Slow path for a row that failed the check: count and name the differing bytes. */
static void count_mismatch(const uint8_t *row, size_t row_len, uint64_t row_seed, int r, int l, int halves, int s,
                           int head, size_t t, uint32_t blk, pdl_synth_part_t *out)
{
    uint8_t expect[512];
    uint64_t bad = 0;
    for (size_t off = 0; off < row_len; off += sizeof(expect)) {
        /* The stream is addressable by word index, so regenerate it piece by piece. */
        size_t n = row_len - off < sizeof(expect) ? row_len - off : sizeof(expect);
        for (size_t i = 0; i < n; i += 8) {
            uint64_t w = mix64(row_seed + ((off + i) / 8 + 1) * GOLDEN);
            memcpy(expect + i, &w, n - i < 8 ? n - i : 8);
        }
        for (size_t i = 0; i < n; i++)
            bad += row[off + i] != expect[i];
    }
    if (out->mismatched_bytes == 0)
        snprintf(out->first_mismatch, sizeof(out->first_mismatch),
                 "rank %d layer %d %s head %d token %zu (block %u): %llu of %llu bytes differ", r, l,
                 halves == 1 ? "latent" : (s == 0 ? "K" : "V"), head, t, blk, (unsigned long long)bad,
                 (unsigned long long)row_len);
    out->mismatched_bytes += bad;
}

void pdl_synth_verify_rank(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p, const uint32_t *blocks,
                           int r, pdl_synth_kernel_t kernel, pdl_synth_part_t *out)
{
    (void)seed;
    memset(out, 0, sizeof(*out));
    kernels_t kn = kernels_for(kernel);
    int layers = pdl_node_kv_num_layers(kv);
    const pdl_kv_geometry_t *g = pdl_node_kv_geometry(kv, r);
    uint64_t row_len = (uint64_t)g->head_dim * g->elem_size;
    int halves = pdl_layout_num_halves(g);
    int first = 0, count = 0;
    pdl_node_kv_heads(kv, r, &first, &count);
    uint64_t sum = 0;
    for (int h = 0; h < count; h++) {
        int owner = lowest_holder(kv, r, first + h);
        for (int l = 0; l < layers; l++) {
            const uint8_t *base = pdl_node_kv_layer(kv, r, l);
            for (int s = 0; s < halves; s++) {
                uint64_t ck = coord_key(l, s, first + h);
                for (size_t t = 0; t < p->n; t++) {
                    uint32_t blk = blocks[t / g->block_size];
                    uint32_t tib = (uint32_t)(t % g->block_size);
                    const uint8_t *row = base + pdl_synth_row_offset(g, blk, s, h, tib, row_len);
                    uint64_t row_seed = mix64(p->prefix[t] ^ ck);
                    bool bad = false;
                    uint64_t rh = kn.check(row, (size_t)row_len, row_seed, &bad);
                    out->verified_bytes += row_len;
                    if (bad)
                        count_mismatch(row, (size_t)row_len, row_seed, r, l, halves, s, first + h, t, blk, out);
                    if (owner)
                        sum += row_term(rh, ck, t);
                }
            }
        }
    }
    out->sum = sum;
    out->done = true;
}

void pdl_synth_check_combine(const pdl_synth_prompt_t *p, const pdl_synth_part_t *parts, int n,
                             pdl_synth_check_t *out)
{
    memset(out, 0, sizeof(*out));
    uint64_t sum = 0;
    for (int r = 0; r < n; r++) {
        out->verified_bytes += parts[r].verified_bytes;
        if (parts[r].mismatched_bytes != 0 && out->mismatched_bytes == 0)
            snprintf(out->first_mismatch, sizeof(out->first_mismatch), "%s", parts[r].first_mismatch);
        out->mismatched_bytes += parts[r].mismatched_bytes;
        sum += parts[r].sum; /* the digest sum commutes, so per-rank partial sums add up */
    }
    out->digest = digest_final(p, sum);
}

void pdl_synth_verify_kernel(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p, const uint32_t *blocks,
                             pdl_synth_kernel_t kernel, pdl_synth_check_t *out)
{
    int tp = pdl_node_kv_tp_size(kv);
    pdl_synth_part_t *parts = calloc((size_t)tp, sizeof(*parts));
    if (parts == NULL) {
        memset(out, 0, sizeof(*out));
        snprintf(out->first_mismatch, sizeof(out->first_mismatch), "verify: out of memory");
        out->mismatched_bytes = 1;
        return;
    }
    for (int r = 0; r < tp; r++)
        pdl_synth_verify_rank(kv, seed, p, blocks, r, kernel, &parts[r]);
    pdl_synth_check_combine(p, parts, tp, out);
    free(parts);
}

void pdl_synth_verify(pdl_node_kv_t *kv, uint64_t seed, const pdl_synth_prompt_t *p, const uint32_t *blocks,
                      pdl_synth_check_t *out)
{
    pdl_synth_verify_kernel(kv, seed, p, blocks, PDL_SYNTH_KERNEL_AUTO, out);
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
