/*
 * status.h -- pdlink's status codes and the error record every fallible call fills.
 *
 * One table (PDL_STATUS_MAP) makes the enum, the names and the default messages, so they cannot drift
 * apart. Success is 0, "in progress" is 1, every failure is negative. A function that fails fills an
 * optional pdl_error_t with a message a user can act on (which key, which peer, which value); callers
 * pass the status up and do not rewrite the message. `err` may always be NULL.
 */
#ifndef PDLINK_STATUS_H
#define PDLINK_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

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
    XX(ERR_SYSTEM, -11, "system call failed")

typedef enum pdl_status {
#define PDL_STATUS_ENUM_(name, val, msg) PDL_##name = (val),
    PDL_STATUS_MAP(PDL_STATUS_ENUM_)
#undef PDL_STATUS_ENUM_
} pdl_status_t;

/* Large enough for a message naming two peers, a key and two values. */
#define PDL_ERR_MSG_LEN 320

typedef struct pdl_error {
    pdl_status_t status;
    char msg[PDL_ERR_MSG_LEN];
} pdl_error_t;

/* "PDL_ERR_TIMEOUT" style name of a status; "PDL_UNKNOWN" for values outside the table. */
const char *pdl_status_name(pdl_status_t st);

/* Default one-line description of a status ("peer gone"). */
const char *pdl_status_string(pdl_status_t st);

/*
 * Fill `err` (if not NULL) with `st` and a printf-style message, and return `st`, so a failure reads
 * `return pdl_error_set(err, PDL_ERR_INVALID, "decode TP %d is not a multiple of prefill TP %d", d, p);`
 */
pdl_status_t pdl_error_set(pdl_error_t *err, pdl_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

pdl_status_t pdl_error_vset(pdl_error_t *err, pdl_status_t st, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Prepend "what: " context to an existing message, keeping its status; returns err->status (or st). */
pdl_status_t pdl_error_prefix(pdl_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reset to PDL_OK with an empty message. */
void pdl_error_clear(pdl_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_STATUS_H */
