/*
 * run_http.h -- the HTTP client side of `pdlink run`: one-shot GETs (/health, /workers, /metrics) and
 * the workload driver that keeps C completion requests in flight against one base URL with libcurl's
 * multi interface, timing each one's first body byte (TTFT) and extracting the generated text from
 * an OpenAI-style response (streaming: the concatenated SSE deltas).
 */
#ifndef PDL_CLI_RUN_HTTP_H
#define PDL_CLI_RUN_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"

/* One workload request and, after pdl_run_load_drive, its outcome. */
typedef struct pdl_run_req {
    /* input, owned by the caller */
    int index;
    bool stream;
    bool chat;                 /* /v1/chat/completions instead of /v1/completions */
    const char *body;          /* JSON body */
    /* outcome, owned by the request (pdl_run_req_clear frees it) */
    bool done;
    bool ok;                   /* HTTP 200 and a well-formed response with text */
    long http_code;
    char *text;                /* generated text, NULL unless ok */
    char error[400];           /* why not ok */
    double ttft_ms;            /* request start → first body byte; < 0 if none arrived */
    double total_ms;
    uint64_t start_ns, end_ns; /* pdl__clock_now_ns() when it was sent and when it ended */
    /* The instances pdlink-router chose ("host:port" of their HTTP servers, its X-Pdlink-Prefill /
     * X-Pdlink-Decode headers), "" when the answer named none (another router, a failure before the
     * workers were chosen). */
    char prefill[128], decode[128];
} pdl_run_req_t;

/* Free the outcome of a request and mark it not done. */
void pdl_run_req_clear(pdl_run_req_t *r);

/*
 * Called between polls (about every 50 ms and after each completion) with the number of finished
 * requests; return false to abort the load (in-flight requests are cancelled and left not done).
 */
typedef bool (*pdl_run_tick_fn)(void *ctx, int done, int total);

typedef struct pdl_run_load {
    const char *base_url;      /* "http://127.0.0.1:30000" */
    int concurrency;           /* requests in flight, >= 1 */
    long timeout_ms;           /* per request */
    pdl_run_tick_fn tick;      /* may be NULL */
    void *tick_ctx;
} pdl_run_load_t;

/*
 * Send every request of reqs[0..n) (in index order, `concurrency` at a time) and record outcomes.
 * PDL_OK when all finished (each ok or not), PDL_ERR_BAD_STATE when the tick aborted the load,
 * another error when libcurl could not be set up.
 */
pdl_status_t pdl_run_load_drive(const pdl_run_load_t *ld, pdl_run_req_t *reqs, int n, pdl_error_t *err);

/*
 * GET `url`; *code_p gets the HTTP status (0 when no response), *body_p a NUL-terminated malloc'ed body
 * (may be NULL if the caller does not want it). PDL_ERR_TRANSPORT with libcurl's message when there is
 * no response.
 */
pdl_status_t pdl_run_http_get(const char *url, long timeout_ms, long *code_p, char **body_p, pdl_error_t *err);

/*
 * Why a request failed, for the report, into dst: "HTTP <status> from the <leg> leg (<worker>):
 * <message>" when the router named the failed leg (its X-Pdlink-Failed-Leg header, e.g. "prefill
 * 127.0.0.1:8100"; `leg` NULL or "" when absent), else "HTTP <status>: <message>". The message is the
 * body's error.message (or error, or message) when the body, or the JSON after the router's text
 * ("Request processing failed: Prefill server error 500: {...}"), has one; else an excerpt of the body.
 */
void pdl_run_failure_describe(char *dst, size_t cap, long status, const char *leg, const char *body, size_t len);

/*
 * Extract the generated text from a complete response body: a JSON completion (choices[0].text or
 * choices[0].message.content) or, when `stream`, an SSE body (concatenating choices[0].text or
 * choices[0].delta.content of every `data:` event up to `data: [DONE]`, which must be present).
 * Returns a malloc'ed string, or NULL with a reason in err.
 */
char *pdl_run_response_text(const char *body, size_t len, bool stream, pdl_error_t *err);

#endif
