/*
 * log.h (common) -- how pdlink's own code writes log lines, and the rate limiter for "log once per kind"
 * warnings (internal; the public half, level and ident, is include/pdlink/log.h).
 *
 * PDL_LOG checks the level before formatting, so disabled debug lines cost one load and a compare and
 * their arguments are not evaluated. Every function here is thread-safe; nothing allocates.
 */
#ifndef PDL_COMMON_LOG_H
#define PDL_COMMON_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "pdlink/log.h"

/* True when a line at `lvl` would be written; what PDL_LOG tests before formatting anything. */
bool pdl_log_enabled(pdl_log_level_t lvl);
/*
 * Format and write one line at `lvl` unconditionally (use PDL_LOG or pdl_warn... to honour the level).
 * A newline is appended; a line longer than about 2 KiB is truncated. A failed write is ignored.
 */
void pdl_log_write(pdl_log_level_t lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define PDL_LOG(lvl, ...)                                                     \
    do {                                                                      \
        if (pdl_log_enabled(lvl))                                             \
            pdl_log_write((lvl), __VA_ARGS__);                                \
    } while (0)
#define pdl_error(...) PDL_LOG(PDL_LOG_ERROR, __VA_ARGS__)
#define pdl_warn(...) PDL_LOG(PDL_LOG_WARN, __VA_ARGS__)
#define pdl_info(...) PDL_LOG(PDL_LOG_INFO, __VA_ARGS__)
#define pdl_debug(...) PDL_LOG(PDL_LOG_DEBUG, __VA_ARGS__)
#define pdl_trace(...) PDL_LOG(PDL_LOG_TRACE, __VA_ARGS__)

/*
 * Rate limiter: allows at most `burst` events per `interval_ms` (a fixed window that starts at the
 * first event after the previous window ended); the rest are counted as suppressed and reported with
 * the next allowed event. Embed one per kind of event, initialised with PDL_RATELIMIT_INIT or
 * pdl_ratelimit_init; thread-safe (atomics, no lock). burst 0 allows nothing. The _Atomic fields are
 * the limiter's own state: do not touch them.
 */
typedef struct pdl_ratelimit {
    uint32_t interval_ms;
    uint32_t burst;
    _Atomic uint64_t window_start_ms;
    _Atomic uint32_t in_window;
    _Atomic uint64_t suppressed;
} pdl_ratelimit_t;

#define PDL_RATELIMIT_INIT(interval_ms_, burst_) {(interval_ms_), (burst_), 0, 0, 0}

/* Initialise (or reset) `rl`, which must not be NULL. Not atomic as a whole: call it before sharing rl. */
void pdl_ratelimit_init(pdl_ratelimit_t *rl, uint32_t interval_ms, uint32_t burst);

/*
 * True if this event may be logged. *suppressed_out (may be NULL) gets the number of events refused
 * since the last allowed one when true, and 0 when false, so the caller can append "(N suppressed)".
 */
bool pdl_ratelimit_allow(pdl_ratelimit_t *rl, uint64_t *suppressed_out);

#endif /* PDL_COMMON_LOG_H */
