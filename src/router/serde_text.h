/*
 * serde_text.h -- the request text vllm-router hashes for consistent_hash, reproduced.
 *
 * vllm-router parses a completion or chat body into its typed request struct and hashes
 * serde_json::to_string of that struct (docs/vllm-router.md#dispatch), not the client's bytes. That
 * text has the struct's field order, its defaulted booleans always present (echo, no_stop_trim,
 * ignore_eos, skip_special_tokens, …), f32 fields widened to f64 and printed shortest (0.7 →
 * 0.699999988079071), chat messages re-serialised per role (unknown message keys dropped), and every
 * unknown top-level key appended in the client's order. Reproducing it is what lets pdlink-router pick
 * the same prefill and decode worker as vllm-router for the same request (tests/pypi/test_hash_parity.py
 * checks this against the real router, request by request).
 *
 * Field lists and rules are those of vllm-router 0.1.17 (src/protocols/spec.rs CompletionRequest and
 * ChatCompletionRequest), confirmed byte for byte against the bodies that wheel forwards.
 */
#ifndef PDL_ROUTER_SERDE_TEXT_H
#define PDL_ROUTER_SERDE_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/*
 * The serde text of `body` as a /v1/chat/completions (chat) or /v1/completions request, malloc'ed and
 * NUL-terminated, its length in *len. NULL when the body holds something vllm-router would refuse or
 * that this does not reproduce (a non-integer max_tokens, a message content of an unknown shape, …):
 * the caller then hashes its own serialisation, a stable but different ring position.
 */
char *pdl_rt_serde_text(const json_t *body, bool chat, size_t *len);

/* f64 `v` as serde_json prints it: "1.0", "0.699999988079071", "0.00001", "9.999999747378752e-6", "1e+16". */
void pdl_rt_serde_f64(double v, char *out, size_t cap);

#endif /* PDL_ROUTER_SERDE_TEXT_H */
