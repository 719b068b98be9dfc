/*
 * auth.h -- the cluster secret of authenticated mode and the keys derived from it (docs/security.md).
 *
 * Layer: common. One secret, in a key file every member of a pdlink-only cluster shares (nodes through
 * kv_connector_extra_config's `auth_key_file`, pdlink-router through --auth-key-file), turns on:
 *   - ZeroMQ CURVE on the handshake, notify and discovery sockets, with ONE cluster key pair derived
 *     from the secret (pdl_auth_curve_keys): every member is a CURVE server and client under it, and a
 *     ZAP handler inside the connector admits only clients that prove they hold its secret half;
 *   - a challenge-response on every tcp data connection (pdl_auth_mac over both sides' nonces and the
 *     engine the initiator dialled), before any READ or WRITE is served.
 *
 * Derivation (libsodium, BLAKE2b throughout):
 *   master     = crypto_generichash(32, "pdlink auth v1" || secret)
 *   CURVE sk   = crypto_kdf_derive_from_key(32, 1, "pdlcurve", master); pk = crypto_scalarmult_base(sk)
 *   data key   = crypto_kdf_derive_from_key(32, 2, "pdl_data", master)
 *   MAC        = HMAC-SHA-256 (crypto_auth_hmacsha256) under the data key of label || parts...,
 *                each part preceded by its length (u32 LE), so no two part lists give the same input.
 * Knowing a derived key tells nothing about the secret or about the other derived keys.
 *
 * The handle is immutable after load and may be shared by any number of threads; the secret itself is
 * wiped as soon as the keys are derived, and the keys when the handle is freed.
 */
#ifndef PDLINK_AUTH_H
#define PDLINK_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PDL_AUTH_SECRET_MIN 32   /* bytes a key file must hold (after trailing white space is cut) */
#define PDL_AUTH_SECRET_MAX 4096 /* bytes read at most; a longer file is refused */
#define PDL_AUTH_KEY_LEN 32      /* CURVE keys, MACs and nonces */

typedef struct pdl_auth pdl_auth_t;

/*
 * Load the secret from `path` and derive the keys. The file must be a regular file, not readable or
 * writable by others (mode & 0006 == 0: `chmod 600`), and hold PDL_AUTH_SECRET_MIN..PDL_AUTH_SECRET_MAX
 * bytes once trailing white space (a final newline) is cut; its bytes are the secret as they are (so
 * `head -c 48 /dev/urandom | base64 > key` works). Every failure names the path and what to do:
 * PDL_ERR_INVALID (NULL or empty path or out, not a regular file, world-accessible, too short or too
 * long), PDL_ERR_SYSTEM (open/read failed: strerror), PDL_ERR_NOMEM. On success *out is the caller's
 * (pdl_auth_free).
 */
pdl_status_t pdl_auth_load(const char *path, pdl_auth_t **out, pdl_error_t *err);
/* The same from a secret in memory (tests, embedding programs); `len` as for a file's contents. */
pdl_status_t pdl_auth_from_secret(const void *secret, size_t len, pdl_auth_t **out, pdl_error_t *err);
/* Wipe and free; NULL is fine. */
void pdl_auth_free(pdl_auth_t *auth);

/* The cluster CURVE key pair (binary, 32 bytes each), for ZMQ_CURVE_* socket options. */
const uint8_t *pdl_auth_curve_public(const pdl_auth_t *auth);
const uint8_t *pdl_auth_curve_secret(const pdl_auth_t *auth);

/*
 * HMAC-SHA-256 under the data key of `label` (a NUL-terminated domain separator, e.g. "data-server")
 * and `n` parts (parts[i] of lens[i] bytes; a part may be NULL when its length is 0) into out.
 * pdl_auth_verify recomputes it and compares in constant time.
 */
void pdl_auth_mac(const pdl_auth_t *auth, const char *label, const void *const *parts, const size_t *lens, size_t n,
                  uint8_t out[PDL_AUTH_KEY_LEN]);
bool pdl_auth_verify(const pdl_auth_t *auth, const char *label, const void *const *parts, const size_t *lens,
                     size_t n, const uint8_t mac[PDL_AUTH_KEY_LEN]);
/* PDL_AUTH_KEY_LEN unpredictable bytes (a fresh nonce). Cannot fail. */
void pdl_auth_nonce(uint8_t out[PDL_AUTH_KEY_LEN]);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_AUTH_H */
