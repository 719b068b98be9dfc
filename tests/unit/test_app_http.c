/*
 * test_app_http.c -- the libmicrohttpd glue shared by pdlink-node and pdlink-router (src/app/http.c),
 * over loopback with libcurl: the handler sees the whole body, a body over max_body arrives as
 * too_large (and the handler's 413 reaches the client), request headers are readable, X-Request-Id is
 * set on replies, a streamed body is pulled through the reader with the given headers and its free
 * function runs once, and a host that does not resolve is an error naming the flag.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "app/http.h"

typedef struct stream_state {
    int chunks_left;
    atomic_int *freed;
} stream_state_t;

#define SMALL_LIMITS                                                                                             \
    {.idle_timeout_s = 60, .max_connections = 16, .threads = 1, .workers = 4, .body_budget = 1 << 20}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream_state_t *s = cls;
    if (s->chunks_left == 0)
        return PDL_HTTP_STREAM_END;
    s->chunks_left--;
    return (ssize_t)snprintf(buf, max, "data: %d\n\n", s->chunks_left);
}

static void stream_free(void *cls)
{
    stream_state_t *s = cls;
    atomic_fetch_add(s->freed, 1);
    free(s);
}

static int handler(void *cls, const pdl_http_request_t *req)
{
    atomic_int *freed = cls;
    if (req->too_large)
        return pdl_http_replyf(req->conn, 413, "too large");
    if (strcmp(req->url, "/echo") == 0) {
        const char *rid = pdl_http_header(req, "x-request-id");
        return pdl_http_reply(req->conn, 200, "text/x-test", req->body, req->len, rid);
    }
    if (strcmp(req->url, "/json") == 0)
        return pdl_http_reply_json(req->conn, 201, json_pack("{s:s, s:I}", "method", req->method, "len",
                                                             (json_int_t)req->len), NULL);
    if (strcmp(req->url, "/stream") == 0) {
        stream_state_t *s = calloc(1, sizeof(*s));
        s->chunks_left = 3;
        s->freed = freed;
        const char *const headers[] = {"Content-Type: text/event-stream", "X-Extra:  spaced", "bad header"};
        return pdl_http_reply_stream(req->conn, 200, PDL_HTTP_SIZE_UNKNOWN, stream_read, s, stream_free, headers, 3);
    }
    return pdl_http_replyf(req->conn, 404, "no route %s %s", req->method, req->url);
}

typedef struct fetched {
    long status;
    char body[4096];
    size_t len;
    char headers[4096];
    size_t hlen;
} fetched_t;

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    fetched_t *f = ud;
    size_t k = size * n;
    if (f->len + k < sizeof(f->body)) {
        memcpy(f->body + f->len, p, k);
        f->len += k;
        f->body[f->len] = '\0';
    }
    return k;
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
    fetched_t *f = ud;
    size_t k = size * n;
    if (f->hlen + k < sizeof(f->headers)) {
        memcpy(f->headers + f->hlen, p, k);
        f->hlen += k;
        f->headers[f->hlen] = '\0';
    }
    return k;
}

static void fetch(int port, const char *path, const char *post, const char *header, fetched_t *f)
{
    memset(f, 0, sizeof(*f));
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
    CURL *e = curl_easy_init();
    assert_non_null(e);
    struct curl_slist *h = header ? curl_slist_append(NULL, header) : NULL;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, f);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L);
    if (post != NULL)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, post);
    assert_int_equal(curl_easy_perform(e), CURLE_OK);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &f->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
}

static void serves_bodies_headers_and_streams(void **state)
{
    (void)state;
    atomic_int freed = 0;
    const pdl_http_params_t p = {.host = "127.0.0.1", .port = 0, .what = "--host", .max_body = 16,
                                 .limits = SMALL_LIMITS, .handler = handler, .cls = &freed};
    pdl_http_t *http = NULL;
    int port = 0;
    pdl_error_t err;
    assert_int_equal(pdl_http_start(&p, &http, &port, &err), PDL_OK);
    assert_true(port > 0);
    fetched_t f;

    fetch(port, "/echo", "0123456789abcdef", "X-Request-Id: r-1", &f); /* exactly max_body */
    assert_int_equal(f.status, 200);
    assert_string_equal(f.body, "0123456789abcdef");
    assert_non_null(strstr(f.headers, "X-Request-Id: r-1\r\n"));
    assert_non_null(strstr(f.headers, "Content-Type: text/x-test\r\n"));

    fetch(port, "/echo", "0123456789abcdefg", NULL, &f); /* one byte over */
    assert_int_equal(f.status, 413);
    assert_string_equal(f.body, "too large");

    fetch(port, "/json", NULL, NULL, &f);
    assert_int_equal(f.status, 201);
    assert_string_equal(f.body, "{\"method\":\"GET\",\"len\":0}");

    fetch(port, "/stream", NULL, NULL, &f);
    assert_int_equal(f.status, 200);
    assert_string_equal(f.body, "data: 2\n\ndata: 1\n\ndata: 0\n\n");
    assert_non_null(strstr(f.headers, "X-Extra: spaced\r\n"));
    assert_null(strstr(f.headers, "bad header"));

    fetch(port, "/nowhere", "x", NULL, &f);
    assert_int_equal(f.status, 404);
    assert_string_equal(f.body, "no route POST /nowhere");

    pdl_http_stop(http);
    assert_int_equal(atomic_load(&freed), 1);
}

static void unresolvable_host_names_the_flag(void **state)
{
    (void)state;
    const pdl_http_params_t p = {.host = "no-such-host.invalid", .port = 0, .what = "--prometheus-host",
                                 .max_body = 16, .limits = SMALL_LIMITS, .handler = handler};
    pdl_http_t *http = NULL;
    int port = 0;
    pdl_error_t err;
    assert_int_equal(pdl_http_start(&p, &http, &port, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "--prometheus-host 'no-such-host.invalid': cannot resolve"));
    assert_null(http);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(serves_bodies_headers_and_streams),
        cmocka_unit_test(unresolvable_host_names_the_flag),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
