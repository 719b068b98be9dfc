/*
 * upstream.c -- pooled libcurl legs driven by the calling thread (see upstream.h for the design).
 *
 * Response headers are collected by the header callback; a status line starts a new set, so the
 * headers of an interim "100 Continue" never leak into the final response. The body goes into a
 * growable buffer that the reader drains from rpos; it is compacted once fully drained.
 */
#include "router/upstream.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/buf.h"
#include "common/clock.h"
#include "common/log.h"

struct pdl_upstream {
    pthread_mutex_t mu;
    pdl_leg_t **idle;
    size_t nidle, max_idle;
    const atomic_bool *stop;
};

pdl_status_t pdl_upstream_create(size_t max_idle, const atomic_bool *stop, pdl_upstream_t **up_p)
{
    pdl_upstream_t *up = calloc(1, sizeof(*up));
    if (up == NULL)
        return PDL_ERR_NOMEM;
    up->idle = calloc(max_idle ? max_idle : 1, sizeof(*up->idle));
    if (up->idle == NULL) {
        free(up);
        return PDL_ERR_NOMEM;
    }
    pthread_mutex_init(&up->mu, NULL);
    up->max_idle = max_idle;
    up->stop = stop;
    *up_p = up;
    return PDL_OK;
}

static void leg_clear_exchange(pdl_leg_t *leg)
{
    curl_slist_free_all(leg->req_headers);
    leg->req_headers = NULL;
    free(leg->req_body);
    leg->req_body = NULL;
    leg->req_len = 0;
    for (size_t i = 0; i < leg->nheaders; i++)
        free(leg->headers[i]);
    leg->nheaders = 0;
    leg->status = 0;
    leg->headers_done = false;
    leg->len = leg->rpos = 0;
    leg->done = false;
    leg->got_byte = false;
    leg->timed_out = false;
    leg->start_ms = leg->first_byte_ms = 0;
    leg->overflow = false;
    leg->result = CURLE_OK;
    leg->errbuf[0] = '\0';
}

static void leg_destroy(pdl_leg_t *leg)
{
    if (leg == NULL)
        return;
    if (leg->cur_multi != NULL)
        curl_multi_remove_handle(leg->cur_multi, leg->easy);
    leg_clear_exchange(leg);
    if (leg->easy)
        curl_easy_cleanup(leg->easy);
    if (leg->own_multi)
        curl_multi_cleanup(leg->own_multi);
    free(leg->buf);
    free(leg);
}

void pdl_upstream_destroy(pdl_upstream_t *up)
{
    if (up == NULL)
        return;
    for (size_t i = 0; i < up->nidle; i++)
        leg_destroy(up->idle[i]);
    free(up->idle);
    pthread_mutex_destroy(&up->mu);
    free(up);
}

pdl_leg_t *pdl_leg_acquire(pdl_upstream_t *up)
{
    pdl_leg_t *leg = NULL;
    pthread_mutex_lock(&up->mu);
    if (up->nidle > 0)
        leg = up->idle[--up->nidle];
    pthread_mutex_unlock(&up->mu);
    if (leg != NULL)
        return leg;
    leg = calloc(1, sizeof(*leg));
    if (leg == NULL)
        return NULL;
    leg->easy = curl_easy_init();
    leg->own_multi = curl_multi_init();
    if (leg->easy == NULL || leg->own_multi == NULL) {
        leg_destroy(leg);
        return NULL;
    }
    /* A few idle connections per leg: it usually talks to the same instance again. */
    curl_multi_setopt(leg->own_multi, CURLMOPT_MAXCONNECTS, 4L);
    return leg;
}

void pdl_leg_release(pdl_upstream_t *up, pdl_leg_t *leg)
{
    if (leg == NULL)
        return;
    if (leg->cur_multi != NULL) {
        /* An unfinished transfer's connection is closed here, which makes vLLM abort the request. */
        curl_multi_remove_handle(leg->cur_multi, leg->easy);
        leg->cur_multi = NULL;
    }
    leg_clear_exchange(leg);
    if (leg->cap > (1u << 20)) { /* do not keep a large prefill body's buffer in the pool */
        free(leg->buf);
        leg->buf = NULL;
        leg->cap = 0;
    }
    pthread_mutex_lock(&up->mu);
    if (up->nidle < up->max_idle) {
        up->idle[up->nidle++] = leg;
        leg = NULL;
    }
    pthread_mutex_unlock(&up->mu);
    leg_destroy(leg);
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    pdl_leg_t *leg = userdata;
    size_t n = size * nmemb;
    leg->got_byte = true;
    if (leg->rpos == leg->len)
        leg->rpos = leg->len = 0;
    if (leg->collect && leg->len + n > PDL_LEG_MAX_COLLECT) {
        leg->overflow = true;
        return 0; /* makes curl fail the transfer with CURLE_WRITE_ERROR */
    }
    if (leg->len + n > leg->cap) {
        if (leg->rpos > 0) {
            memmove(leg->buf, leg->buf + leg->rpos, leg->len - leg->rpos);
            leg->len -= leg->rpos;
            leg->rpos = 0;
        }
        if (!pdl_buf_reserve(&leg->buf, &leg->cap, leg->len + n, 16384))
            return 0;
    }
    memcpy(leg->buf + leg->len, ptr, n);
    leg->len += n;
    /* The first body byte means the headers are complete even if the blank line was not seen. */
    leg->headers_done = true;
    return n;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    pdl_leg_t *leg = userdata;
    size_t n = size * nmemb;
    size_t l = n;
    leg->got_byte = true;
    while (l > 0 && (ptr[l - 1] == '\r' || ptr[l - 1] == '\n'))
        l--;
    if (l >= 5 && strncmp(ptr, "HTTP/", 5) == 0) {
        for (size_t i = 0; i < leg->nheaders; i++)
            free(leg->headers[i]);
        leg->nheaders = 0;
        return n;
    }
    if (l == 0) {
        long code = 0;
        curl_easy_getinfo(leg->easy, CURLINFO_RESPONSE_CODE, &code);
        if (code >= 200) {
            leg->status = code;
            leg->headers_done = true;
        }
        return n;
    }
    if (leg->nheaders < PDL_LEG_MAX_HEADERS) {
        char *h = strndup(ptr, l);
        if (h != NULL)
            leg->headers[leg->nheaders++] = h;
    }
    return n;
}

pdl_status_t pdl_leg_start(pdl_leg_t *leg, CURLM *multi, const char *method, const char *url, const char *body,
                           size_t body_len, const char *const *headers, size_t nheaders, bool collect,
                           const pdl_leg_timeouts_t *t, pdl_error_t *err)
{
    leg_clear_exchange(leg);
    size_t ul = strlen(url);
    if (ul >= sizeof(leg->url))
        return pdl_error_set(err, PDL_ERR_INVALID, "url of %zu bytes is too long", ul);
    memcpy(leg->url, url, ul + 1);
    leg->collect = collect;
    CURL *e = leg->easy;
    curl_easy_reset(e);
    curl_easy_setopt(e, CURLOPT_URL, leg->url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    /* curl's 0 means its own 300 s default for the connect timeout, and "none" for the total. */
    long connect_ms = t == NULL ? 10000L : t->connect_s > 0 ? (long)t->connect_s * 1000L : 24L * 3600 * 1000;
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, t != NULL ? (long)t->total_s * 1000L : 0L);
    leg->start_ms = pdl__clock_now_ms();
    leg->first_byte_ms = t != NULL ? (uint64_t)t->first_byte_s * 1000 : 0;
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, leg);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, leg);
    curl_easy_setopt(e, CURLOPT_PRIVATE, leg);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, leg->errbuf);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    struct curl_slist *sl = NULL;
    for (size_t i = 0; i < nheaders; i++) {
        struct curl_slist *n = curl_slist_append(sl, headers[i]);
        if (n == NULL)
            goto err_nomem;
        sl = n;
    }
    if (strcmp(method, "POST") == 0) {
        /* Without this curl sends "Expect: 100-continue" for bodies over 1 KiB and waits for it. */
        struct curl_slist *n = curl_slist_append(sl, "Expect:");
        if (n == NULL)
            goto err_nomem;
        sl = n;
        leg->req_body = malloc(body_len ? body_len : 1);
        if (leg->req_body == NULL)
            goto err_nomem;
        memcpy(leg->req_body, body, body_len);
        leg->req_len = body_len;
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, leg->req_body);
    } else {
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    }
    leg->req_headers = sl;
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, sl);
    leg->cur_multi = multi ? multi : leg->own_multi;
    CURLMcode mc = curl_multi_add_handle(leg->cur_multi, e);
    if (mc != CURLM_OK) {
        leg->cur_multi = NULL;
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "%s: curl_multi_add_handle: %s", url, curl_multi_strerror(mc));
    }
    return PDL_OK;
err_nomem:
    curl_slist_free_all(sl);
    return pdl_error_set(err, PDL_ERR_NOMEM, "%s: out of memory building the request", url);
}

static int drain_info(CURLM *multi)
{
    int finished = 0, left = 0;
    CURLMsg *msg;
    while ((msg = curl_multi_info_read(multi, &left)) != NULL) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        pdl_leg_t *leg = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&leg);
        if (leg == NULL)
            continue;
        leg->done = true;
        leg->result = msg->data.result;
        long code = 0;
        curl_easy_getinfo(leg->easy, CURLINFO_RESPONSE_CODE, &code);
        leg->status = code;
        leg->headers_done = true;
        finished++;
    }
    return finished;
}

void pdl_leg_step(CURLM *multi, int timeout_ms)
{
    int running = 0;
    curl_multi_perform(multi, &running);
    if (drain_info(multi) > 0)
        return;
    curl_multi_poll(multi, NULL, 0, timeout_ms, NULL);
    curl_multi_perform(multi, &running);
    drain_info(multi);
}

static bool stopping(const pdl_upstream_t *up) { return up->stop != NULL && atomic_load(up->stop); }

/* Fail a leg still without a response byte at its first-byte deadline; curl has no such timeout. Closing
 * its connection tells the instance the request is gone (vLLM aborts it). */
static void first_byte_check(pdl_leg_t *leg)
{
    if (leg->done || leg->got_byte || leg->first_byte_ms == 0 || leg->cur_multi == NULL ||
        pdl__clock_since(pdl__clock_now_ms(), leg->start_ms) < leg->first_byte_ms)
        return;
    curl_multi_remove_handle(leg->cur_multi, leg->easy);
    leg->cur_multi = NULL;
    leg->done = true;
    leg->headers_done = true;
    leg->timed_out = true;
    leg->status = 0;
    leg->result = CURLE_OPERATION_TIMEDOUT;
    snprintf(leg->errbuf, sizeof(leg->errbuf), "no response within %llu s (first-byte timeout)",
             (unsigned long long)(leg->first_byte_ms / 1000));
}

static void mark_timeout(pdl_leg_t *leg)
{
    if (leg->done && leg->result == CURLE_OPERATION_TIMEDOUT)
        leg->timed_out = true;
}

pdl_status_t pdl_leg_wait(pdl_upstream_t *up, CURLM *multi, pdl_leg_t **legs, const bool *headers_only, size_t n)
{
    for (;;) {
        bool all = true;
        for (size_t i = 0; i < n; i++) {
            bool ready = legs[i]->done || (headers_only && headers_only[i] && legs[i]->headers_done);
            all = all && ready;
        }
        if (all) {
            for (size_t i = 0; i < n; i++)
                mark_timeout(legs[i]);
            return PDL_OK;
        }
        if (stopping(up))
            return PDL_ERR_BAD_STATE;
        pdl_leg_step(multi, 200);
        for (size_t i = 0; i < n; i++)
            first_byte_check(legs[i]);
    }
}

long pdl_leg_read(pdl_upstream_t *up, pdl_leg_t *leg, char *dst, size_t max, bool *eof)
{
    *eof = false;
    while (leg->rpos == leg->len && !leg->done) {
        if (stopping(up))
            return -1;
        pdl_leg_step(leg->cur_multi, 200);
        first_byte_check(leg);
    }
    mark_timeout(leg);
    size_t avail = leg->len - leg->rpos;
    if (avail == 0) {
        *eof = true;
        return 0;
    }
    size_t n = avail < max ? avail : max;
    memcpy(dst, leg->buf + leg->rpos, n);
    leg->rpos += n;
    return (long)n;
}

bool pdl_leg_ok(const pdl_leg_t *leg)
{
    return leg->done && leg->result == CURLE_OK && leg->status >= 200 && leg->status < 300;
}

const char *pdl_leg_header(const pdl_leg_t *leg, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i < leg->nheaders; i++) {
        const char *h = leg->headers[i];
        if (strncasecmp(h, name, nl) == 0 && h[nl] == ':') {
            const char *v = h + nl + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            return v;
        }
    }
    return NULL;
}

const char *pdl_leg_error(pdl_leg_t *leg)
{
    if (leg->result != CURLE_OK) {
        if (leg->overflow)
            return "response body too large";
        return leg->errbuf[0] ? leg->errbuf : curl_easy_strerror(leg->result);
    }
    return "non-2xx status";
}
