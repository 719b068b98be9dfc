/*
 * log.h -- leveled logging on stderr, a rate limiter for "log once per kind" warnings, and the
 * monotonic clock they use.
 *
 * Layer: common. An internal helper of pdlink's layers and programs (the pure layers topo, layout and
 * wire do not log); an application embedding pdlink only needs pdl_log_set_level/pdl_log_set_ident.
 * Nothing here can fail or returns a status; nothing allocates.
 *
 * The log level is the one process-wide setting in pdlink (like a syslog mask): programs set it once
 * from --log-level or PDLINK_LOG_LEVEL before starting threads. Everything else lives in handles.
 * PDL_LOG checks the level before formatting, so disabled debug lines cost one load and a compare and
 * their arguments are not evaluated. Each line reads "2026-12-02T14:21:40.123Z pdlink[pid] warn: message"
 * (UTC wall-clock time, then the ident set by pdl_log_set_ident) and goes to stderr in one write(2), so
 * lines from concurrent threads and processes do not interleave. Every function here is thread-safe.
 */
#ifndef PDLINK_LOG_H
#define PDLINK_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pdl_log_level {
    PDL_LOG_ERROR = 0,
    PDL_LOG_WARN = 1,
    PDL_LOG_INFO = 2,
    PDL_LOG_DEBUG = 3,
    PDL_LOG_TRACE = 4,
} pdl_log_level_t;

/*
 * Parse "error|warn|warning|info|debug|trace" (case-insensitive) into a pdl_log_level_t value; returns
 * -1 for anything else, NULL included.
 */
int pdl_log_level_parse(const char *s);

/*
 * Set / read the process-wide level (default PDL_LOG_INFO): lines at that level and the more severe
 * ones (lower values) are written. A value outside the enum is not checked.
 */
void pdl_log_set_level(pdl_log_level_t lvl);
pdl_log_level_t pdl_log_get_level(void);

/*
 * Name shown in each line (default "pdlink"; NULL restores it). Only the pointer is kept, so the string
 * must stay valid for as long as anything may log (a string literal or argv[0] is fine).
 */
void pdl_log_set_ident(const char *ident);

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

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_LOG_H */
