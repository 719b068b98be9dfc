/*
 * policy.h -- choosing a prefill or a decode instance (docs/vllm-router.md#selection-policies).
 *
 * consistent_hash reproduces vllm-router's ring: 160 virtual nodes per worker url hashed with mcrouter's
 * furc/murmur64a family, the key taken from the body (session/user fields, else the request text), so
 * identical requests always land on the same worker while the set of workers is unchanged.
 * round_robin keeps one counter per policy object; random draws uniformly from a per-object generator.
 * A policy object is thread-safe; prefill and decode each get their own, so they keep separate state.
 */
#ifndef PDL_ROUTER_POLICY_H
#define PDL_ROUTER_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "pdlink/status.h"
#include "router/config.h"

#define PDL_POLICY_VIRTUAL_NODES 160
#define PDL_POLICY_HASH_SEED 4193360111ull

typedef struct pdl_policy pdl_policy_t;

pdl_status_t pdl_policy_create(pdl_policy_kind_t kind, uint64_t random_seed, pdl_policy_t **policy_p);
void pdl_policy_destroy(pdl_policy_t *p);

/*
 * Pick one of n (>= 1) workers given their base urls ("http://ip:port") in a stable order. hash_key
 * is only used by consistent_hash (may be NULL for the others). Returns an index < n.
 */
size_t pdl_policy_pick(pdl_policy_t *p, const char *const *urls, size_t n, const char *hash_key);

/*
 * vllm-router's hash key of a request: "session:<v>" / "user:<v>" from the body's
 * session_params.session_id, user, session_id, user_id (first present wins), else "request:<text>"
 * for a text of at most 100 bytes, else "request_hash:<016x>". Returns a malloc'ed string or NULL.
 */
char *pdl_policy_hash_key(const json_t *body, const char *text, size_t text_len);

uint64_t pdl_policy_murmur64a(const void *data, size_t len, uint64_t seed);
uint32_t pdl_policy_furc_hash(const void *key, size_t len, uint32_t m);
uint64_t pdl_policy_fbi_hash(const void *key, size_t len);

#endif /* PDL_ROUTER_POLICY_H */
