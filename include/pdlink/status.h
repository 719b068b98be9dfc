/*
 * status.h -- pdlink's status codes and the error record every fallible call fills.
 *
 * Layer: common, below every other layer; it includes nothing of pdlink and allocates nothing.
 *
 * One table (PDL_STATUS_MAP) makes the enum, the names and the default messages, so they cannot drift
 * apart. Success is 0, "in progress" is 1, every failure is negative. A function that fails fills an
 * optional pdl_error_t with a message a user can act on (which key, which peer, which value); callers
 * pass the status up and do not rewrite the message. `err` may be NULL wherever a function takes one:
 * the status is still returned, only the message is lost.
 * Functions that return -1 or NULL instead of a status say so in their own comment.
 */
#ifndef PDLINK_STATUS_H
#define PDLINK_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The codes, and what each means across pdlink:
 *   OK            success.
 *   INPROGRESS    not a failure: an asynchronous operation has not finished yet (pdl_batch_poll), or a
 *                 wait's own timeout passed first (pdl_batch_wait, pdl_pull_wait, pdl_recv_wait).
 *   ERR_INVALID   the caller passed something wrong: a NULL pointer, a value out of range, or an
 *                 encoder given a field it may not send. Retrying the same call cannot succeed.
 *   ERR_NOT_FOUND the named thing (remote engine, registration, transfer) is not known, or not any more.
 *   ERR_TRANSPORT the connection to a peer failed in a way other than the peer leaving.
 *   ERR_BAD_STATE the object cannot do this now (a session broken earlier, a batch cancelled, a remote
 *                 engine already added with another descriptor).
 *   ERR_TIMEOUT   an operation's own deadline passed and it failed (a handshake, transfer_timeout).
 *   ERR_PEER_GONE the peer closed its connection, exited, or was removed.
 *   ERR_NOMEM     an allocation failed.
 *   ERR_PARSE     bytes or text from outside (a peer, a router, a request) are malformed.
 *   ERR_UNSUPPORTED well-formed, but something pdlink does not do (e.g. shm between two hosts).
 *   ERR_MISMATCH  the peer is well-formed but incompatible (another descriptor version, backend or
 *                 geometry).
 *   ERR_SYSTEM    a system call failed; the message names the call and strerror(errno).
 *   ERR_DENIED    the peer is not allowed to do this: no grant covers the access, the peer is not a
 *                 trusted host, or it claims an identity its address does not have (docs/security.md).
 */
#define PDL_STATUS_MAP(XX)                                                    \
    XX(OK, 0, "success")                                                      \
    XX(INPROGRESS, 1, "in progress")                                          \
    XX(ERR_INVALID, -1, "invalid arguments")                                  \
    XX(ERR_NOT_FOUND, -2, "not found")                                        \
    XX(ERR_TRANSPORT, -3, "transport error")                                  \
    XX(ERR_BAD_STATE, -4, "bad state")                                        \
    XX(ERR_TIMEOUT, -5, "timeout")                                            \
    XX(ERR_PEER_GONE, -6, "peer gone")                                        \
    XX(ERR_NOMEM, -7, "out of memory")                                        \
    XX(ERR_PARSE, -8, "malformed input")                                      \
    XX(ERR_UNSUPPORTED, -9, "unsupported")                                    \
    XX(ERR_MISMATCH, -10, "incompatible peer")                                \
    XX(ERR_SYSTEM, -11, "system call failed")                                 \
    XX(ERR_DENIED, -12, "permission denied")

typedef enum pdl_status {
#define PDL_STATUS_ENUM_(name, val, msg) PDL_##name = (val),
    PDL_STATUS_MAP(PDL_STATUS_ENUM_)
#undef PDL_STATUS_ENUM_
} pdl_status_t;

/* Large enough for a message naming two peers, a key and two values. */
#define PDL_ERR_MSG_LEN 320

/*
 * The error record: `status` is the status the failing function returned, `msg` its message, always
 * NUL-terminated (a longer message is truncated, never overflowed). The caller owns the record (usually
 * on the stack) and need not initialise it: a function that fails writes both fields. Read it only after
 * a failure; after a success its content is unspecified.
 */
typedef struct pdl_error {
    pdl_status_t status;
    char msg[PDL_ERR_MSG_LEN];
} pdl_error_t;

/*
 * The "PDL_ERR_TIMEOUT" style name of a status, or "PDL_UNKNOWN" for a value outside the table. Never
 * NULL; the string is static and must not be freed. Thread-safe.
 */
const char *pdl_status_name(pdl_status_t st);

/*
 * The default one-line description of a status ("peer gone"), or "unknown status" for a value outside
 * the table. Never NULL; static, not to be freed. Thread-safe.
 */
const char *pdl_status_string(pdl_status_t st);

/*
 * Fill `err` (if not NULL) with `st` and a printf-style message, and return `st`, so a failure reads
 * `return pdl_error_set(err, PDL_ERR_INVALID, "decode TP %d is not a multiple of prefill TP %d", d, p);`
 * A message longer than PDL_ERR_MSG_LEN - 1 bytes is truncated. With err NULL nothing is formatted.
 * `fmt` must not be NULL. Cannot fail.
 */
pdl_status_t pdl_error_set(pdl_error_t *err, pdl_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* pdl_error_set with a va_list, for functions that take their own format arguments. Returns `st`. */
pdl_status_t pdl_error_vset(pdl_error_t *err, pdl_status_t st, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/*
 * Prepend printf-style context to the message already in `err` ("<context>: <old message>"), so a caller
 * adds what it was doing without hiding the callee's reason, and return `st` (the callee's failure):
 * `return pdl_error_prefix(err, st, "peer %s", who);`. The status in err is left as the callee set it;
 * a NULL err is ignored (st is still returned). The message is truncated to PDL_ERR_MSG_LEN - 1 bytes.
 */
pdl_status_t pdl_error_prefix(pdl_error_t *err, pdl_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reset `err` to PDL_OK with an empty message; a NULL err is ignored. Cannot fail. */
void pdl_error_clear(pdl_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_STATUS_H */
