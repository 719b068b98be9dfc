/*
 * upstream.h -- the router's HTTP client to the instances (libcurl), with keep-alive pooling.
 *
 * A leg is one HTTP exchange with an instance. Each pooled leg owns a curl easy handle bound to its
 * own curl multi handle; the multi keeps the leg's idle keep-alive connections, so a leg taken from
 * the pool reuses a connection to the same instance (libcurl's shared connection cache is not safe
 * across threads, a per-leg multi is). The caller drives a multi with pdl_leg_step() from its own
 * thread: that lets the HTTP server thread of a request pull the decode's bytes exactly when the
 * client is ready for them, with no extra thread per stream. A streamed body is pulled from the
 * socket only when the client has drained the buffer, so one curl_multi_perform round bounds what
 * is buffered per stream. Two legs can run at the same time on
 * one multi (WRITE mode adds the prefill's easy handle to the decode's multi).
 */
#ifndef PDL_ROUTER_UPSTREAM_H
#define PDL_ROUTER_UPSTREAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "pdlink/status.h"

/* A prefill/models response is collected whole; larger bodies fail the leg. */
#define PDL_LEG_MAX_COLLECT (64u << 20)
/* Response headers kept per leg (the rest are dropped). */
#define PDL_LEG_MAX_HEADERS 64

typedef struct pdl_upstream pdl_upstream_t;

/* Deadlines of one leg in seconds, 0 = none. first_byte runs from the start of the request to the first
 * byte of the response (its status line): a prefill's whole answer, a stream's headers. */
typedef struct pdl_leg_timeouts {
    unsigned connect_s, first_byte_s, total_s;
} pdl_leg_timeouts_t;

typedef struct pdl_leg {
    CURL *easy;
    CURLM *own_multi;   /* the multi this leg's connections live in */
    CURLM *cur_multi;   /* the multi it is added to while running (own or another leg's) */
    struct curl_slist *req_headers;
    char *req_body;
    size_t req_len;
    char url[1024];
    bool collect;       /* whole body wanted: no high-water pause, PDL_LEG_MAX_COLLECT cap */
    uint64_t start_ms, first_byte_ms; /* when it started; its first-byte deadline (0 = none) */
    bool got_byte;      /* a response byte (status line or body) arrived */
    bool timed_out;     /* failed by a deadline (connect, first byte or total): result CURLE_OPERATION_TIMEDOUT */
    /* response */
    long status;
    bool headers_done;
    char *headers[PDL_LEG_MAX_HEADERS]; /* "Name: value", final response only */
    size_t nheaders;
    char *buf;
    size_t len, rpos, cap;
    bool done;
    bool overflow;
    CURLcode result;
    char errbuf[CURL_ERROR_SIZE];
} pdl_leg_t;

/* stop is polled while waiting; when it becomes true waits return PDL_ERR_BAD_STATE. */
pdl_status_t pdl_upstream_create(size_t max_idle, const atomic_bool *stop, pdl_upstream_t **up_p);
void pdl_upstream_destroy(pdl_upstream_t *up);

/* Take a leg from the pool (or make one). NULL on out of memory. */
pdl_leg_t *pdl_leg_acquire(pdl_upstream_t *up);
/* Detach from its multi and give the leg back (destroyed when the pool is full). Accepts NULL. */
void pdl_leg_release(pdl_upstream_t *up, pdl_leg_t *leg);

/*
 * Start a request: method "GET" or "POST" (body copied), headers appended to the leg's list
 * ("Name: value"; headers may be NULL), under the deadlines `t` (NULL: a 10 s connect timeout only).
 * The leg is added to `multi` (NULL = its own). A leg past a deadline ends done with result
 * CURLE_OPERATION_TIMEDOUT and timed_out set; its connection is closed.
 */
pdl_status_t pdl_leg_start(pdl_leg_t *leg, CURLM *multi, const char *method, const char *url, const char *body,
                           size_t body_len, const char *const *headers, size_t nheaders, bool collect,
                           const pdl_leg_timeouts_t *t, pdl_error_t *err);

/* One round of I/O on a multi: perform, mark finished legs, wait up to timeout_ms if nothing moved. */
void pdl_leg_step(CURLM *multi, int timeout_ms);

/* Drive until every leg in legs[] is done (collect) -- or, for want_headers[i], has its headers. */
pdl_status_t pdl_leg_wait(pdl_upstream_t *up, CURLM *multi, pdl_leg_t **legs, const bool *headers_only, size_t n);

/*
 * Copy up to max buffered body bytes of a streaming leg, driving it until some are available.
 * Returns the count; 0 with *eof true at the end (check leg->result); -1 when the router stops.
 */
long pdl_leg_read(pdl_upstream_t *up, pdl_leg_t *leg, char *dst, size_t max, bool *eof);

/* True when the exchange completed with a 2xx status. */
bool pdl_leg_ok(const pdl_leg_t *leg);
/* The value of a response header (case-insensitive name), or NULL; points into the leg. */
const char *pdl_leg_header(const pdl_leg_t *leg, const char *name);
/* A message for a failed leg: curl's error text or "status N". */
const char *pdl_leg_error(pdl_leg_t *leg);

#endif /* PDL_ROUTER_UPSTREAM_H */
