/*
 * log.c -- leveled stderr logging with timestamps, and the event rate limiter.
 *
 * A whole line is formatted into a local buffer and written with one write(2), so lines from
 * concurrent threads and processes sharing a terminal do not interleave.
 */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

static _Atomic int g_level = PDL_LOG_INFO;
static const char *_Atomic g_ident = "pdlink";

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

int pdl_log_level_parse(const char *s)
{
    if (s == NULL)
        return -1;
    if (strcasecmp(s, "warning") == 0)
        return PDL_LOG_WARN;
    for (int i = 0; i < (int)(sizeof(level_names) / sizeof(level_names[0])); i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return i;
    return -1;
}

void pdl_log_set_level(pdl_log_level_t lvl) { atomic_store(&g_level, (int)lvl); }
pdl_log_level_t pdl_log_get_level(void) { return (pdl_log_level_t)atomic_load(&g_level); }
void pdl_log_set_ident(const char *ident) { atomic_store(&g_ident, ident ? ident : "pdlink"); }
bool pdl_log_enabled(pdl_log_level_t lvl) { return (int)lvl <= atomic_load_explicit(&g_level, memory_order_relaxed); }

void pdl_log_write(pdl_log_level_t lvl, const char *fmt, ...)
{
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%d] %s: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                     atomic_load(&g_ident), (int)getpid(), level_names[lvl <= PDL_LOG_TRACE ? lvl : PDL_LOG_TRACE]);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void pdl_ratelimit_init(pdl_ratelimit_t *rl, uint32_t interval_ms, uint32_t burst)
{
    rl->interval_ms = interval_ms;
    rl->burst = burst;
    atomic_store(&rl->window_start_ms, 0);
    atomic_store(&rl->in_window, 0);
    atomic_store(&rl->suppressed, 0);
}

bool pdl_ratelimit_allow(pdl_ratelimit_t *rl, uint64_t *suppressed_out)
{
    uint64_t now = pdl__clock_now_ms();
    uint64_t start = atomic_load(&rl->window_start_ms);
    if (start == 0 || pdl__clock_since(now, start) >= rl->interval_ms) {
        /* One thread wins the window reset; the others fall through and count in the new window. */
        if (atomic_compare_exchange_strong(&rl->window_start_ms, &start, now))
            atomic_store(&rl->in_window, 0);
    }
    if (atomic_fetch_add(&rl->in_window, 1) < rl->burst) {
        uint64_t s = atomic_exchange(&rl->suppressed, 0);
        if (suppressed_out)
            *suppressed_out = s;
        return true;
    }
    atomic_fetch_add(&rl->suppressed, 1);
    if (suppressed_out)
        *suppressed_out = 0;
    return false;
}
