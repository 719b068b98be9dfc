/*
 * run_http.c -- HTTP client side of `pdlink run` (see run_http.h).
 *
 * The workload runs on one thread with a curl multi handle: at most `concurrency` easy handles are
 * attached; each finished one is replaced by the next request in index order, so the request order
 * and the mix are the same in every run. A request's clock starts when its handle is attached (not
 * when it was queued), and its TTFT is the moment the first body byte arrives in the write callback:
 * for a streaming request that is the first SSE chunk relayed by the router, for a non-streaming one
 * the start of the whole body. Responses are bounded (RUN_BODY_MAX) because the peer is a program
 * under test: a runaway body fails that request instead of eating the machine's memory.
 */
#include "cli/run_http.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/buf.h"
#include "common/log.h"
#include "router/router.h"
#include "common/clock.h"

enum { RUN_BODY_MAX = 16 << 20, RUN_LEG_MAX = 128 };

typedef struct body_buf {
    char *p;
    size_t len, cap;
    bool overflow;
    uint64_t first_byte_ns;
} body_buf_t;

static size_t body_write(char *data, size_t size, size_t nmemb, void *userp)
{
    body_buf_t *b = userp;
    size_t n = size * nmemb;
    if (b->first_byte_ns == 0 && n > 0)
        b->first_byte_ns = pdl__clock_now_ns();
    if (b->len + n > RUN_BODY_MAX) {
        b->overflow = true;
        return 0; /* makes libcurl fail the transfer with CURLE_WRITE_ERROR */
    }
    if (!pdl_buf_reserve(&b->p, &b->cap, b->len + n + 1, 4096))
        return 0;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

void pdl_run_req_clear(pdl_run_req_t *r)
{
    free(r->text);
    r->text = NULL;
    r->done = false;
    r->ok = false;
    r->http_code = 0;
    r->error[0] = '\0';
    r->ttft_ms = -1;
    r->total_ms = 0;
    r->start_ns = r->end_ns = 0;
    r->prefill[0] = r->decode[0] = '\0';
}

/* The text of choices[0] of one completion object: .text, or .message.content, or .delta.content. */
static const char *choice_text(json_t *root, bool *has_choice)
{
    json_t *choices = json_object_get(root, "choices");
    *has_choice = false;
    if (!json_is_array(choices) || json_array_size(choices) == 0)
        return NULL;
    json_t *c0 = json_array_get(choices, 0);
    if (!json_is_object(c0))
        return NULL;
    *has_choice = true;
    json_t *t = json_object_get(c0, "text");
    if (json_is_string(t))
        return json_string_value(t);
    json_t *m = json_object_get(c0, "message");
    if (!json_is_object(m))
        m = json_object_get(c0, "delta");
    if (json_is_object(m)) {
        json_t *content = json_object_get(m, "content");
        if (json_is_string(content))
            return json_string_value(content);
    }
    return NULL;
}

static bool text_append(char **acc, size_t *len, const char *s)
{
    size_t n = strlen(s);
    char *np = realloc(*acc, *len + n + 1);
    if (np == NULL)
        return false;
    memcpy(np + *len, s, n + 1);
    *acc = np;
    *len += n;
    return true;
}

static void error_excerpt(char *dst, size_t dstlen, const char *what, const char *s, size_t len)
{
    /* Bodies from the peer are shown as excerpts, with control characters flattened. */
    char ex[121];
    size_t k = 0;
    for (size_t i = 0; i < len && k < sizeof(ex) - 1; i++)
        ex[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : ' ';
    ex[k] = '\0';
    snprintf(dst, dstlen, "%s: %s%s", what, ex, len > k ? "..." : "");
}

char *pdl_run_response_text(const char *body, size_t len, bool stream, pdl_error_t *err)
{
    if (!stream) {
        json_error_t je;
        json_t *root = json_loadb(body, len, 0, &je);
        if (root == NULL) {
            char m[200];
            error_excerpt(m, sizeof(m), "response is not JSON", body, len);
            pdl_error_set(err, PDL_ERR_PARSE, "%s (%s)", m, je.text);
            return NULL;
        }
        bool has_choice;
        const char *t = choice_text(root, &has_choice);
        char *out = t ? strdup(t) : NULL;
        if (t == NULL)
            pdl_error_set(err, PDL_ERR_PARSE, "response has no choices[0].text or choices[0].message.content");
        json_decref(root);
        return out;
    }
    char *acc = strdup("");
    size_t acc_len = 0;
    bool done = false;
    size_t pos = 0;
    while (acc != NULL && pos < len && !done) {
        const char *line = body + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - line) : len - pos;
        pos += ll + (nl ? 1 : 0);
        if (ll > 0 && line[ll - 1] == '\r')
            ll--;
        if (ll < 5 || strncmp(line, "data:", 5) != 0)
            continue; /* blank separators, comments, other SSE fields */
        const char *payload = line + 5;
        size_t pl = ll - 5;
        while (pl > 0 && (*payload == ' ' || *payload == '\t')) {
            payload++;
            pl--;
        }
        if (pl == 6 && strncmp(payload, "[DONE]", 6) == 0) {
            done = true;
            break;
        }
        json_error_t je;
        json_t *ev = json_loadb(payload, pl, 0, &je);
        if (ev == NULL) {
            char m[200];
            error_excerpt(m, sizeof(m), "SSE event is not JSON", payload, pl);
            pdl_error_set(err, PDL_ERR_PARSE, "%s", m);
            free(acc);
            return NULL;
        }
        if (json_object_get(ev, "error") != NULL) {
            char *dump = json_dumps(json_object_get(ev, "error"), JSON_COMPACT);
            char m[200];
            error_excerpt(m, sizeof(m), "error event in stream", dump ? dump : "?", dump ? strlen(dump) : 1);
            pdl_error_set(err, PDL_ERR_PARSE, "%s", m);
            free(dump);
            json_decref(ev);
            free(acc);
            return NULL;
        }
        bool has_choice;
        const char *t = choice_text(ev, &has_choice);
        if (t != NULL && !text_append(&acc, &acc_len, t)) {
            json_decref(ev);
            free(acc);
            pdl_error_set(err, PDL_ERR_NOMEM, "out of memory collecting the stream");
            return NULL;
        }
        json_decref(ev);
    }
    if (acc == NULL) {
        pdl_error_set(err, PDL_ERR_NOMEM, "out of memory collecting the stream");
        return NULL;
    }
    if (!done) {
        free(acc);
        pdl_error_set(err, PDL_ERR_PARSE, "stream ended without `data: [DONE]` (%zu bytes received)", len);
        return NULL;
    }
    return acc;
}

pdl_status_t pdl_run_http_get(const char *url, long timeout_ms, long *code_p, char **body_p, pdl_error_t *err)
{
    CURL *h = curl_easy_init();
    if (h == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "curl_easy_init failed");
    body_buf_t b = {0};
    char ebuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    *code_p = code;
    if (rc != CURLE_OK) {
        free(b.p);
        if (body_p)
            *body_p = NULL;
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "GET %s: %s", url, ebuf[0] ? ebuf : curl_easy_strerror(rc));
    }
    if (b.p == NULL)
        b.p = strdup("");
    if (body_p)
        *body_p = b.p;
    else
        free(b.p);
    return PDL_OK;
}

/* One in-flight request: its easy handle, headers and body buffer. */
typedef struct slot {
    CURL *h;
    struct curl_slist *hdrs;
    body_buf_t b;
    pdl_run_req_t *req;
    uint64_t start_ns;
    char url[512];
    char leg[RUN_LEG_MAX]; /* the router's failed-leg header, "" when absent */
} slot_t;

/* The error message inside a JSON body: error.message (vLLM, pdlink-node), error as a string, or message. */
static const char *json_error_message(json_t *root)
{
    json_t *e = json_object_get(root, "error");
    if (json_is_object(e))
        e = json_object_get(e, "message");
    if (!json_is_string(e))
        e = json_object_get(root, "message");
    return json_is_string(e) ? json_string_value(e) : NULL;
}

void pdl_run_failure_describe(char *dst, size_t cap, long status, const char *leg, const char *body, size_t len)
{
    char where[160] = "";
    if (leg != NULL && leg[0] != '\0') {
        /* "prefill 127.0.0.1:8100" -> " from the prefill leg (127.0.0.1:8100)" */
        const char *sp = strchr(leg, ' ');
        if (sp != NULL)
            snprintf(where, sizeof(where), " from the %.*s leg (%s)", (int)(sp - leg), leg, sp + 1);
        else
            snprintf(where, sizeof(where), " from the %s leg", leg);
    }
    /* The router wraps a prefill's body in text ("Prefill server error 500: {...}"): look at the JSON
     * from the first '{' too, and keep the text before it. */
    const char *brace = len > 0 ? memchr(body, '{', len) : NULL;
    json_t *root = brace ? json_loadb(brace, len - (size_t)(brace - body), 0, NULL) : NULL;
    const char *msg = root ? json_error_message(root) : NULL;
    char m[240];
    if (msg != NULL) {
        int pre = (int)(brace - body);
        snprintf(m, sizeof(m), "%.*s%s", pre > 120 ? 120 : pre, body, msg);
        for (char *q = m; *q; q++)
            if ((unsigned char)*q < 0x20)
                *q = ' ';
    } else {
        error_excerpt(m, sizeof(m), "body", body, len);
    }
    json_decref(root);
    snprintf(dst, cap, "HTTP %ld%s: %s", status, where, m);
}

/* If header line data[0, n) is `name` (with its colon), its value into dst[cap]. */
static void header_take(const char *data, size_t n, const char *name, char *dst, size_t cap)
{
    size_t nl = strlen(name);
    if (n <= nl || strncasecmp(data, name, nl) != 0)
        return;
    size_t a = nl, e = n;
    while (a < e && (data[a] == ' ' || data[a] == '\t'))
        a++;
    while (e > a && (data[e - 1] == '\r' || data[e - 1] == '\n'))
        e--;
    snprintf(dst, cap, "%.*s", (int)(e - a), data + a);
}

/* Response headers of a workload request: keeps the router's failed-leg header and the instances it
 * names as having served the request. */
static size_t header_write(char *data, size_t size, size_t nmemb, void *userp)
{
    slot_t *s = userp;
    size_t n = size * nmemb;
    header_take(data, n, PDL_RT_FAILED_LEG_HEADER ":", s->leg, sizeof(s->leg));
    header_take(data, n, PDL_RT_PREFILL_HEADER ":", s->req->prefill, sizeof(s->req->prefill));
    header_take(data, n, PDL_RT_DECODE_HEADER ":", s->req->decode, sizeof(s->req->decode));
    return n;
}

static void slot_finish(slot_t *s, CURLcode rc, const char *ebuf)
{
    pdl_run_req_t *r = s->req;
    uint64_t now = pdl__clock_now_ns();
    r->done = true;
    r->start_ns = s->start_ns;
    r->end_ns = now;
    r->total_ms = (double)(now - s->start_ns) / 1e6;
    r->ttft_ms = s->b.first_byte_ns ? (double)(s->b.first_byte_ns - s->start_ns) / 1e6 : -1.0;
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &r->http_code);
    if (rc != CURLE_OK) {
        snprintf(r->error, sizeof(r->error), "%s", s->b.overflow ? "response larger than 16 MiB"
                                                   : (ebuf[0] ? ebuf : curl_easy_strerror(rc)));
    } else if (r->http_code != 200) {
        pdl_run_failure_describe(r->error, sizeof(r->error), r->http_code, s->leg, s->b.p ? s->b.p : "", s->b.len);
    } else {
        pdl_error_t e;
        pdl_error_clear(&e);
        r->text = pdl_run_response_text(s->b.p ? s->b.p : "", s->b.len, r->stream, &e);
        if (r->text != NULL)
            r->ok = true;
        else
            snprintf(r->error, sizeof(r->error), "%s", e.msg);
    }
}

static void slot_release(CURLM *m, slot_t *s)
{
    if (s->h != NULL) {
        curl_multi_remove_handle(m, s->h);
        curl_easy_cleanup(s->h);
    }
    curl_slist_free_all(s->hdrs);
    free(s->b.p);
    memset(s, 0, sizeof(*s));
}

pdl_status_t pdl_run_load_drive(const pdl_run_load_t *ld, pdl_run_req_t *reqs, int n, pdl_error_t *err)
{
    int conc = ld->concurrency < 1 ? 1 : ld->concurrency;
    if (conc > n)
        conc = n > 0 ? n : 1;
    CURLM *m = curl_multi_init();
    if (m == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "curl_multi_init failed");
    curl_multi_setopt(m, CURLMOPT_MAX_HOST_CONNECTIONS, (long)conc);
    slot_t *slots = calloc((size_t)conc, sizeof(*slots));
    char (*ebufs)[CURL_ERROR_SIZE] = calloc((size_t)conc, CURL_ERROR_SIZE);
    if (slots == NULL || ebufs == NULL) {
        free(slots);
        free(ebufs);
        curl_multi_cleanup(m);
        return pdl_error_set(err, PDL_ERR_NOMEM, "out of memory for %d request slots", conc);
    }
    for (int i = 0; i < n; i++)
        pdl_run_req_clear(&reqs[i]);

    pdl_status_t st = PDL_OK;
    int next = 0, done = 0, active = 0;
    while (done < n) {
        /* Fill free slots in index order. */
        for (int k = 0; k < conc && next < n; k++) {
            slot_t *s = &slots[k];
            if (s->h != NULL)
                continue;
            pdl_run_req_t *r = &reqs[next++];
            s->req = r;
            s->h = curl_easy_init();
            if (s->h == NULL) {
                st = pdl_error_set(err, PDL_ERR_NOMEM, "curl_easy_init failed");
                goto out;
            }
            snprintf(s->url, sizeof(s->url), "%s%s", ld->base_url, r->chat ? "/v1/chat/completions" : "/v1/completions");
            s->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
            /* No "Expect: 100-continue" round trip for bodies over 1 KiB. */
            s->hdrs = curl_slist_append(s->hdrs, "Expect:");
            ebufs[k][0] = '\0';
            curl_easy_setopt(s->h, CURLOPT_URL, s->url);
            curl_easy_setopt(s->h, CURLOPT_POSTFIELDS, r->body);
            curl_easy_setopt(s->h, CURLOPT_HTTPHEADER, s->hdrs);
            curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, body_write);
            curl_easy_setopt(s->h, CURLOPT_WRITEDATA, &s->b);
            curl_easy_setopt(s->h, CURLOPT_HEADERFUNCTION, header_write);
            curl_easy_setopt(s->h, CURLOPT_HEADERDATA, (void *)s);
            curl_easy_setopt(s->h, CURLOPT_TIMEOUT_MS, ld->timeout_ms);
            curl_easy_setopt(s->h, CURLOPT_NOSIGNAL, 1L);
            curl_easy_setopt(s->h, CURLOPT_NOPROXY, "*");
            curl_easy_setopt(s->h, CURLOPT_ERRORBUFFER, ebufs[k]);
            curl_easy_setopt(s->h, CURLOPT_PRIVATE, (void *)s);
            s->start_ns = pdl__clock_now_ns();
            curl_multi_add_handle(m, s->h);
            active++;
        }
        int running = 0;
        CURLMcode mc = curl_multi_perform(m, &running);
        if (mc != CURLM_OK) {
            st = pdl_error_set(err, PDL_ERR_TRANSPORT, "curl_multi_perform: %s", curl_multi_strerror(mc));
            goto out;
        }
        CURLMsg *msg;
        int left = 0;
        bool finished_any = false;
        while ((msg = curl_multi_info_read(m, &left)) != NULL) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            slot_t *s = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
            if (s == NULL)
                continue;
            slot_finish(s, msg->data.result, ebufs[s - slots]);
            slot_release(m, s);
            active--;
            done++;
            finished_any = true;
        }
        if (ld->tick != NULL && !ld->tick(ld->tick_ctx, done, n)) {
            st = pdl_error_set(err, PDL_ERR_BAD_STATE, "workload aborted after %d of %d requests", done, n);
            goto out;
        }
        if (!finished_any && active > 0)
            curl_multi_poll(m, NULL, 0, 50, NULL);
    }
out:
    for (int k = 0; k < conc; k++)
        slot_release(m, &slots[k]);
    free(slots);
    free(ebufs);
    curl_multi_cleanup(m);
    return st;
}
