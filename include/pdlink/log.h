/*
 * log.h -- leveled logging on stderr, and a rate limiter for "log once per kind" warnings.
 *
 * The log level is the one process-wide setting in pdlink (like a syslog mask): programs set it once
 * from --log-level or PDLINK_LOG_LEVEL before starting threads. Everything else lives in handles.
 * PDL_LOG checks the level before formatting, so disabled debug lines cost one load and a compare.
 * Each line reads "2026-12-02T14:21:40.123Z pdlink[pid] warn: message".
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

/* Parse "error|warn|warning|info|debug|trace" (case-insensitive); returns -1 if unknown. */
int pdl_log_level_parse(const char *s);

void pdl_log_set_level(pdl_log_level_t lvl);
pdl_log_level_t pdl_log_get_level(void);

/* Name shown in each line (default "pdlink"); the string must outlive the process' logging. */
void pdl_log_set_ident(const char *ident);

bool pdl_log_enabled(pdl_log_level_t lvl);
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
 * Rate limiter: allows at most `burst` events per `interval_ms`; the rest are counted as suppressed
 * and reported with the next allowed event. Embed one per kind of event; thread-safe (atomics).
 */
typedef struct pdl_ratelimit {
    uint32_t interval_ms;
    uint32_t burst;
    _Atomic uint64_t window_start_ms;
    _Atomic uint32_t in_window;
    _Atomic uint64_t suppressed;
} pdl_ratelimit_t;

#define PDL_RATELIMIT_INIT(interval_ms_, burst_) {(interval_ms_), (burst_), 0, 0, 0}

void pdl_ratelimit_init(pdl_ratelimit_t *rl, uint32_t interval_ms, uint32_t burst);

/* True if this event may be logged; *suppressed_out gets the count skipped since the last allowed one. */
bool pdl_ratelimit_allow(pdl_ratelimit_t *rl, uint64_t *suppressed_out);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_LOG_H */
