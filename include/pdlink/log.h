/*
 * log.h -- the level and name of pdlink's log lines on stderr: what an application embedding pdlink sets.
 *
 * Layer: common. pdlink's layers and programs write their lines through the internal src/common/log.h
 * (the pure layers topo, layout and wire do not log). Nothing here can fail or returns a status;
 * nothing allocates.
 *
 * The log level is the one process-wide setting in pdlink (like a syslog mask): programs set it once
 * from --log-level or PDLINK_LOG_LEVEL before starting threads. Everything else lives in handles.
 * Each line reads "2026-12-02T14:21:40.123Z pdlink[pid] warn: message"
 * (UTC wall-clock time, then the ident set by pdl_log_set_ident) and goes to stderr in one write(2), so
 * lines from concurrent threads and processes do not interleave. Every function here is thread-safe.
 */
#ifndef PDLINK_LOG_H
#define PDLINK_LOG_H

#include <stdbool.h>

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

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_LOG_H */
