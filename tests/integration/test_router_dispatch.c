/*
 * test_router_dispatch.c -- pdlink-router's request path against fake vLLM workers (fake_vllm.py):
 * the exact prefill and decode legs (bodies, kv_transfer_params, X-Request-Id parsable by the wire
 * parser), READ sequential and WRITE concurrent dispatch, byte-for-byte streaming, error mapping
 * (prefill failure 500 with its body, decode non-2xx passed through, 400 for bad input), client
 * disconnects, /v1/models proxying, and the distribution of the three policies.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "pdlink/wire.h"
#include "router_harness.h"

typedef struct pd {
    rh_router_t r;
    rh_fake_t p[2], d[2];
    int np, nd;
} pd_t;

/* Router with the given policy and np prefill (TP4) + nd decode (TP8) fake workers in mode. */
static void pd_start(pd_t *s, const char *policy, int np, int nd, const char *mode)
{
    memset(s, 0, sizeof(*s));
    assert_true(rh_router_start(&s->r, "--policy", policy, NULL));
    s->np = np;
    s->nd = nd;
    for (int i = 0; i < np; i++)
        assert_true(rh_fake_start(&s->p[i], "P", s->r.disc, "--tp", "4", "--mode", mode, NULL));
    for (int i = 0; i < nd; i++)
        assert_true(rh_fake_start(&s->d[i], "D", s->r.disc, "--tp", "8", "--mode", mode, "--handshake-port", "7301",
                                  "--notify-port", "62005", NULL));
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    while (rh_now_ms() < end &&
           (rh_nworkers(s->r.http, "prefill") != (size_t)np || rh_nworkers(s->r.http, "decode") != (size_t)nd))
        rh_msleep(20);
    assert_int_equal(rh_nworkers(s->r.http, "prefill"), np);
    assert_int_equal(rh_nworkers(s->r.http, "decode"), nd);
    assert_int_equal(rh_status(s->r.http, "/health"), 200);
}

static void pd_stop(pd_t *s)
{
    assert_int_equal(rh_stop(s->r.pid, SIGTERM), 0);
    for (int i = 0; i < s->np; i++)
        rh_stop(s->p[i].pid, SIGKILL);
    for (int i = 0; i < s->nd; i++)
        rh_stop(s->d[i].pid, SIGKILL);
}

static size_t nreq(const rh_fake_t *f)
{
    json_t *a = rh_fake_requests(f);
    size_t n = json_array_size(a);
    json_decref(a);
    return n;
}

static const char *sget(json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

static void read_mode_legs_are_exact(void **state)
{
    (void)state;
    pd_t s;
    pd_start(&s, "round_robin", 1, 1, "READ");
    const char *body = "{\"prompt\":\"hello world\",\"max_tokens\":5,\"min_tokens\":3,\"max_completion_tokens\":5,"
                       "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"temperature\":0}";
    rh_resp_t c = rh_http(s.r.http, "/v1/completions", body);
    assert_int_equal(c.rc, CURLE_OK);
    assert_int_equal(c.status, 200);
    assert_non_null(strstr(c.content_type, "text/event-stream"));

    json_t *pr = rh_fake_requests(&s.p[0]), *dr = rh_fake_requests(&s.d[0]);
    assert_int_equal(json_array_size(pr), 1);
    assert_int_equal(json_array_size(dr), 1);
    json_t *p = json_array_get(pr, 0), *d = json_array_get(dr, 0);
    json_t *pb = json_object_get(p, "body"), *db = json_object_get(d, "body");
    json_t *ph = json_object_get(p, "headers"), *dh = json_object_get(d, "headers");

    /* Prefill leg: docs/vllm-router.md#dispatch (step 4) and #read-dispatch. */
    assert_string_equal(sget(p, "path"), "/v1/completions");
    assert_int_equal(json_integer_value(json_object_get(pb, "max_tokens")), 1);
    assert_int_equal(json_integer_value(json_object_get(pb, "max_completion_tokens")), 1);
    assert_int_equal(json_integer_value(json_object_get(pb, "min_tokens")), 1);
    assert_true(json_is_false(json_object_get(pb, "stream")));
    assert_null(json_object_get(pb, "stream_options"));
    assert_string_equal(sget(pb, "prompt"), "hello world");
    assert_int_equal(json_integer_value(json_object_get(pb, "temperature")), 0);
    json_t *pkv = json_object_get(pb, "kv_transfer_params");
    assert_true(json_is_true(json_object_get(pkv, "do_remote_decode")));
    assert_true(json_is_false(json_object_get(pkv, "do_remote_prefill")));
    assert_true(json_is_null(json_object_get(pkv, "remote_engine_id")));
    assert_true(json_is_null(json_object_get(pkv, "remote_block_ids")));
    assert_int_equal(json_integer_value(json_object_get(pkv, "remote_dp_size")), 1);
    const char *tx = sget(pkv, "transfer_id");
    assert_non_null(tx);
    assert_int_equal(strlen(tx), 35);
    assert_memory_equal(tx, "tx-", 3);
    assert_int_equal(strspn(tx + 3, "0123456789abcdef"), 32);
    assert_string_equal(sget(ph, "content-type"), "application/json");

    /* X-Request-Id: same on both legs, carries both zmq addresses, parsable by the wire layer. */
    const char *rid = sget(ph, "x-request-id");
    assert_non_null(rid);
    assert_string_equal(rid, sget(dh, "x-request-id"));
    pdl_zmq_addr_t pa, da;
    assert_int_equal(pdl_wire_parse_request_id(rid, &pa, &da, NULL), PDL_OK);
    assert_string_equal(pa.host, "127.0.0.1");
    assert_int_equal(pa.handshake_port, 6301);
    assert_int_equal(pa.notify_port, 61005);
    assert_int_equal(da.handshake_port, 7301);
    assert_int_equal(da.notify_port, 62005);
    assert_int_equal(strncmp(rid, "___prefill_addr_host:127.0.0.1,handshake:6301,notify:61005___decode_addr_", 73), 0);

    /* Decode leg: the original body plus the prefill's kv_transfer_params verbatim. */
    assert_int_equal(json_integer_value(json_object_get(db, "max_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(db, "min_tokens")), 3);
    assert_true(json_is_true(json_object_get(db, "stream")));
    assert_true(json_is_true(json_object_get(json_object_get(db, "stream_options"), "include_usage")));
    json_t *presp = json_loads(sget(p, "response"), 0, NULL);
    assert_non_null(presp);
    json_t *want_kv = json_object_get(presp, "kv_transfer_params");
    assert_int_equal(json_integer_value(json_object_get(want_kv, "tp_size")), 4);
    assert_true(json_equal(json_object_get(db, "kv_transfer_params"), want_kv));
    assert_string_equal(sget(json_object_get(db, "kv_transfer_params"), "transfer_id"), tx);

    /* The client got exactly the bytes the decode sent. */
    const char *sent = sget(d, "response");
    assert_int_equal(c.len, strlen(sent));
    assert_memory_equal(c.body, sent, c.len);
    assert_non_null(strstr(c.body, "data: [DONE]\n\n"));
    /* A success names the instances that served it. */
    char served[64];
    snprintf(served, sizeof(served), "127.0.0.1:%d", s.p[0].port);
    assert_string_equal(c.served_prefill, served);
    snprintf(served, sizeof(served), "127.0.0.1:%d", s.d[0].port);
    assert_string_equal(c.served_decode, served);
    json_decref(presp);
    json_decref(pr);
    json_decref(dr);
    rh_resp_free(&c);

    /* Metrics agree. */
    char series[256];
    snprintf(series, sizeof(series), "vllm_router_pd_prefill_requests_total{worker=\"http://127.0.0.1:%d\"}",
             s.p[0].port);
    assert_int_equal((int)rh_metric(s.r.http, series), 1);
    snprintf(series, sizeof(series), "vllm_router_pd_decode_requests_total{worker=\"http://127.0.0.1:%d\"}",
             s.d[0].port);
    assert_int_equal((int)rh_metric(s.r.prom, series), 1); /* also on the separate prometheus port */
    assert_int_equal((int)rh_metric(s.r.http, "vllm_router_pd_requests_total{route=\"/v1/completions\"}"), 1);
    assert_int_equal(
        (int)rh_metric(s.r.http, "vllm_router_pd_request_duration_seconds_count{route=\"/v1/completions\"}"), 1);
    pd_stop(&s);
}

static void chat_and_streaming_pass_through_byte_for_byte(void **state)
{
    (void)state;
    pd_t s;
    pd_start(&s, "consistent_hash", 1, 1, "READ");
    rh_resp_t c = rh_http(s.r.http, "/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4}");
    assert_int_equal(c.status, 200);
    assert_non_null(strstr(c.content_type, "application/json"));
    json_t *dr = rh_fake_requests(&s.d[0]);
    json_t *d = json_array_get(dr, 0);
    assert_string_equal(sget(d, "path"), "/v1/chat/completions");
    assert_int_equal(c.len, strlen(sget(d, "response")));
    assert_memory_equal(c.body, sget(d, "response"), c.len);
    json_decref(dr);
    rh_resp_free(&c);
    json_t *pr = rh_fake_requests(&s.p[0]);
    assert_string_equal(sget(json_array_get(pr, 0), "path"), "/v1/chat/completions");
    json_decref(pr);

    /* A paced SSE stream of 30 chunks arrives intact, chunk boundaries and all. */
    assert_true(rh_fake_control(&s.d[0], "{\"chunk_delay_ms\": 10, \"n_chunks\": 30}"));
    c = rh_http(s.d[0].port, "/_reset", "{}");
    assert_int_equal(c.status, 200);
    rh_resp_free(&c);
    c = rh_http(s.r.http, "/v1/chat/completions",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"stream me\"}],\"max_tokens\":30,\"stream\":true}");
    assert_int_equal(c.status, 200);
    dr = rh_fake_requests(&s.d[0]);
    const char *sent = sget(json_array_get(dr, 0), "response");
    assert_int_equal(c.len, strlen(sent));
    assert_memory_equal(c.body, sent, c.len);
    size_t events = 0;
    for (const char *q = c.body; (q = strstr(q, "data: ")) != NULL; q += 6)
        events++;
    assert_int_equal(events, 31);
    json_decref(dr);
    rh_resp_free(&c);

    /* /v1/models is proxied to a live instance (prefill first). */
    c = rh_http(s.r.http, "/v1/models", NULL);
    assert_int_equal(c.status, 200);
    char owner[64];
    snprintf(owner, sizeof(owner), "fake-P-%d", s.p[0].port);
    assert_non_null(strstr(c.body, owner));
    assert_string_equal(c.failed_leg, ""); /* only failures name a leg */
    rh_resp_free(&c);
    pd_stop(&s);
}

static void prefill_failure_is_500_with_its_body(void **state)
{
    (void)state;
    pd_t s;
    pd_start(&s, "round_robin", 1, 1, "READ");
    assert_true(rh_fake_control(&s.p[0], "{\"fail_status\": 503, \"fail_body\": \"prefill-boom-123\"}"));
    rh_resp_t c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":3,\"stream\":true}");
    assert_int_equal(c.status, 500);
    assert_non_null(strstr(c.body, "Prefill server error 503"));
    assert_non_null(strstr(c.body, "prefill-boom-123"));
    char leg[64];
    snprintf(leg, sizeof(leg), "prefill 127.0.0.1:%d", s.p[0].port);
    assert_string_equal(c.failed_leg, leg);
    assert_string_equal(c.served_prefill, leg + strlen("prefill ")); /* a failure names both too */
    assert_non_null(strstr(c.served_decode, "127.0.0.1:"));
    rh_resp_free(&c);
    assert_int_equal(nreq(&s.d[0]), 0); /* READ: no decode after a failed prefill */
    assert_int_equal((int)rh_metric(s.r.http, "vllm_router_pd_prefill_errors_total"), 1);
    assert_int_equal((int)rh_metric(s.r.http, "vllm_router_pd_errors_total{error_type=\"prefill_error\"}"), 1);

    /* A prefill 4xx (the request is bad) is passed through, status and body, as vllm-router 0.1.17 does. */
    assert_true(rh_fake_control(&s.p[0], "{\"fail_status\": 400, \"fail_body\": \"{\\\"error\\\": \\\"bad-7\\\"}\"}"));
    c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":3}");
    assert_int_equal(c.status, 400);
    assert_string_equal(c.body, "{\"error\": \"bad-7\"}");
    rh_resp_free(&c);
    assert_int_equal(nreq(&s.d[0]), 0);
    assert_int_equal((int)rh_metric(s.r.http, "vllm_router_pd_prefill_errors_total"), 2);

    /* Prefill unreachable (killed): also a 500, router alive. */
    rh_stop(s.p[0].pid, SIGKILL);
    c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":3}");
    assert_int_equal(c.status, 500);
    assert_non_null(strstr(c.body, "Prefill server error"));
    assert_string_equal(c.failed_leg, leg);
    rh_resp_free(&c);
    assert_int_equal(rh_status(s.r.http, "/liveness"), 200);
    s.np = 0;
    pd_stop(&s);
}

static void decode_failure_is_passed_through(void **state)
{
    (void)state;
    pd_t s;
    pd_start(&s, "round_robin", 1, 1, "READ");
    assert_true(rh_fake_control(&s.d[0], "{\"fail_status\": 429, \"fail_body\": \"decode-slow-down\"}"));
    rh_resp_t c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":3}");
    assert_int_equal(c.status, 429);
    assert_int_equal(c.len, strlen("decode-slow-down"));
    assert_memory_equal(c.body, "decode-slow-down", c.len);
    char leg[64];
    snprintf(leg, sizeof(leg), "decode 127.0.0.1:%d", s.d[0].port);
    assert_string_equal(c.failed_leg, leg);
    assert_string_equal(c.served_decode, leg + strlen("decode "));
    rh_resp_free(&c);
    assert_int_equal((int)rh_metric(s.r.http, "vllm_router_pd_decode_errors_total"), 1);

    /* A decode that drops the connection mid-stream: the client sees a broken response, router lives. */
    assert_true(rh_fake_control(&s.d[0], "{\"fail_status\": 0, \"drop_mid_stream\": true, \"n_chunks\": 10}"));
    c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":10,\"stream\":true}");
    assert_int_not_equal(c.rc, CURLE_OK);
    assert_null(strstr(c.body, "[DONE]"));
    rh_resp_free(&c);
    assert_true(rh_wait_metric_ge(s.r.http, "vllm_router_pd_errors_total{error_type=\"decode_error\"}", 2));
    assert_int_equal(rh_status(s.r.http, "/health"), 200);
    pd_stop(&s);
}

static void bad_requests_get_400_naming_the_problem(void **state)
{
    (void)state;
    pd_t s;
    pd_start(&s, "round_robin", 1, 1, "READ");
    static const struct {
        const char *path, *body, *needle;
    } cases[] = {
        {"/v1/completions", "{\"prompt\":\"x\",", "invalid JSON"},
        {"/v1/completions", "", "invalid JSON"},
        {"/v1/completions", "[1,2]", "must be a JSON object"},
        {"/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":\"ten\"}", "max_tokens"},
        {"/v1/completions", "{\"prompt\":\"x\",\"stream\":\"yes\"}", "stream"},
        {"/v1/completions", "{\"max_tokens\":3}", "prompt"},
        {"/v1/completions", "{\"prompt\":\"x\",\"kv_transfer_params\":7}", "kv_transfer_params"},
        {"/v1/chat/completions", "{\"max_tokens\":3}", "messages"},
        {"/v1/completions", "{\"prompt\":\"\\ud800 bad surrogate\"}", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        rh_resp_t c = rh_http(s.r.http, cases[i].path, cases[i].body);
        if (c.status != 400 || strstr(c.body, cases[i].needle) == NULL)
            fprintf(stderr, "case %zu: status %ld body %s\n", i, c.status, c.body);
        assert_int_equal(c.status, 400);
        assert_non_null(strstr(c.body, cases[i].needle));
        assert_string_equal(c.served_prefill, ""); /* refused before any worker was chosen */
        assert_string_equal(c.served_decode, "");
        rh_resp_free(&c);
    }
    rh_resp_t c = rh_http(s.r.http, "/v1/nothing", "{}");
    assert_int_equal(c.status, 404);
    rh_resp_free(&c);
    assert_int_equal(rh_status(s.r.http, "/v1/completions"), 405);
    assert_int_equal(nreq(&s.p[0]), 0);
    assert_int_equal(nreq(&s.d[0]), 0);
    assert_int_equal(rh_status(s.r.http, "/health"), 200);
    pd_stop(&s);
}

static size_t on_abort_after_first(char *p, size_t sz, size_t n, void *ud)
{
    (void)p;
    *(size_t *)ud += sz * n;
    return 0; /* abort the transfer: the client goes away mid-stream */
}

static void client_disconnect_mid_stream_is_survived(void **state)
{
    (void)state;
    pd_t s;
    pd_start(&s, "round_robin", 1, 1, "READ");
    assert_true(rh_fake_control(&s.d[0], "{\"chunk_delay_ms\": 20, \"n_chunks\": 500}"));
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/completions", s.r.http);
    CURL *e = curl_easy_init();
    size_t got = 0;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, "{\"prompt\":\"long\",\"max_tokens\":500,\"stream\":true}");
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_abort_after_first);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &got);
    assert_int_equal(curl_easy_perform(e), CURLE_WRITE_ERROR);
    curl_easy_cleanup(e);
    assert_true(got > 0);
    /* The router notices, counts it and closes the decode connection (the worker's write fails). */
    assert_true(rh_wait_metric_ge(s.r.http, "vllm_router_pd_errors_total{error_type=\"client_disconnected\"}", 1));
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    bool gone = false;
    while (!gone && rh_now_ms() < end) {
        json_t *dr = rh_fake_requests(&s.d[0]);
        gone = json_is_true(json_object_get(json_array_get(dr, 0), "client_gone"));
        json_decref(dr);
        if (!gone)
            rh_msleep(20);
    }
    assert_true(gone);
    assert_int_equal((int)rh_metric(s.r.http, "vllm_router_pd_active_requests"), 0);
    /* And the next request works. */
    assert_true(rh_fake_control(&s.d[0], "{\"chunk_delay_ms\": 0, \"n_chunks\": 3}"));
    rh_resp_t c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"again\",\"max_tokens\":3,\"stream\":true}");
    assert_int_equal(c.status, 200);
    assert_non_null(strstr(c.body, "[DONE]"));
    rh_resp_free(&c);
    pd_stop(&s);
}

static void write_mode_sends_both_legs_at_once(void **state)
{
    (void)state;
    pd_t s;
    pd_start(&s, "round_robin", 1, 1, "WRITE");
    /* The prefill answers only once the decode has received its leg: this passes only if both legs
     * are in flight together (READ dispatch would wait for the prefill forever). */
    char ctl[256];
    snprintf(ctl, sizeof(ctl), "{\"block_until_url\": \"http://127.0.0.1:%d/_requests\"}", s.d[0].port);
    assert_true(rh_fake_control(&s.p[0], ctl));
    rh_resp_t c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"write me\",\"max_tokens\":4,\"stream\":true}");
    assert_int_equal(c.status, 200);
    json_t *pr = rh_fake_requests(&s.p[0]), *dr = rh_fake_requests(&s.d[0]);
    json_t *p = json_array_get(pr, 0), *d = json_array_get(dr, 0);
    assert_int_equal(json_integer_value(json_object_get(p, "status")), 200);
    json_t *pkv = json_object_get(json_object_get(p, "body"), "kv_transfer_params");
    json_t *dkv = json_object_get(json_object_get(d, "body"), "kv_transfer_params");
    assert_true(json_is_true(json_object_get(pkv, "do_remote_decode")));
    assert_int_equal(json_integer_value(json_object_get(pkv, "remote_tp_size")), 8); /* the decode's TP */
    assert_int_equal(json_integer_value(json_object_get(pkv, "remote_dp_size")), 1);
    assert_true(json_is_true(json_object_get(dkv, "do_remote_prefill")));
    assert_true(json_is_false(json_object_get(dkv, "do_remote_decode")));
    assert_int_equal(json_integer_value(json_object_get(dkv, "remote_tp_size")), 4); /* the prefill's TP */
    assert_string_equal(sget(dkv, "transfer_id"), sget(pkv, "transfer_id"));
    assert_string_equal(sget(dkv, "remote_host"), "127.0.0.1");
    assert_int_equal(json_integer_value(json_object_get(dkv, "remote_handshake_port")), 6301);
    assert_int_equal(json_integer_value(json_object_get(dkv, "remote_notify_port")), 61005);
    assert_true(json_is_true(json_object_get(json_object_get(d, "body"), "stream")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(p, "body"), "max_tokens")), 1);
    assert_string_equal(sget(json_object_get(p, "headers"), "x-request-id"),
                        sget(json_object_get(d, "headers"), "x-request-id"));
    const char *sent = sget(d, "response");
    assert_int_equal(c.len, strlen(sent));
    assert_memory_equal(c.body, sent, c.len);
    json_decref(pr);
    json_decref(dr);
    rh_resp_free(&c);

    /* WRITE with a failing prefill: 500, the decode's response is dropped. */
    assert_true(rh_fake_control(&s.p[0], "{\"block_until_url\": \"\", \"fail_status\": 500, \"fail_body\": \"px\"}"));
    c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"write me\",\"max_tokens\":4}");
    assert_int_equal(c.status, 500);
    assert_non_null(strstr(c.body, "Prefill server error 500: px"));
    assert_non_null(strstr(c.failed_leg, "prefill 127.0.0.1:"));
    rh_resp_free(&c);
    pd_stop(&s);
}

/* Which fake of a pair served each request: counts of the two. */
static void counts(const rh_fake_t *f, size_t out[2])
{
    out[0] = nreq(&f[0]);
    out[1] = nreq(&f[1]);
}

static void round_robin_alternates(void **state)
{
    (void)state;
    pd_t s;
    pd_start(&s, "round_robin", 2, 2, "READ");
    for (int i = 1; i <= 6; i++) {
        rh_resp_t c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"same\",\"max_tokens\":2}");
        assert_int_equal(c.status, 200);
        rh_resp_free(&c);
        size_t p[2], d[2];
        counts(s.p, p);
        counts(s.d, d);
        assert_int_equal(p[0] + p[1], i);
        assert_int_equal(d[0] + d[1], i);
        assert_true(p[0] - p[1] + 1 <= 2); /* |p0 - p1| <= 1 after every request: strict alternation */
        assert_true(d[0] - d[1] + 1 <= 2);
    }
    pd_stop(&s);
}

static void consistent_hash_is_stable_per_key(void **state)
{
    (void)state;
    pd_t s;
    pd_start(&s, "consistent_hash", 2, 2, "READ");
    for (int i = 0; i < 6; i++) {
        rh_resp_t c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"same prompt\",\"max_tokens\":2}");
        assert_int_equal(c.status, 200);
        rh_resp_free(&c);
    }
    size_t p[2], d[2];
    counts(s.p, p);
    counts(s.d, d);
    assert_true((p[0] == 6 && p[1] == 0) || (p[0] == 0 && p[1] == 6));
    assert_true((d[0] == 6 && d[1] == 0) || (d[0] == 0 && d[1] == 6));
    /* Different users spread over both workers (40 keys all on one of 2 workers: p < 2^-38). */
    for (int i = 0; i < 40; i++) {
        char body[128];
        snprintf(body, sizeof(body), "{\"prompt\":\"same prompt\",\"max_tokens\":2,\"user\":\"user-%d\"}", i);
        rh_resp_t c = rh_http(s.r.http, "/v1/completions", body);
        assert_int_equal(c.status, 200);
        rh_resp_free(&c);
    }
    size_t p2[2];
    counts(s.p, p2);
    assert_true(p2[0] > p[0] && p2[1] > p[1]);
    pd_stop(&s);
}

static void random_uses_every_worker(void **state)
{
    (void)state;
    pd_t s;
    pd_start(&s, "random", 2, 2, "READ");
    for (int i = 0; i < 40; i++) {
        rh_resp_t c = rh_http(s.r.http, "/v1/completions", "{\"prompt\":\"same\",\"max_tokens\":1}");
        assert_int_equal(c.status, 200);
        rh_resp_free(&c);
    }
    size_t p[2], d[2];
    counts(s.p, p);
    counts(s.d, d);
    assert_int_equal(p[0] + p[1], 40);
    assert_true(p[0] > 0 && p[1] > 0 && d[0] > 0 && d[1] > 0);
    pd_stop(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(read_mode_legs_are_exact),
        cmocka_unit_test(chat_and_streaming_pass_through_byte_for_byte),
        cmocka_unit_test(prefill_failure_is_500_with_its_body),
        cmocka_unit_test(decode_failure_is_passed_through),
        cmocka_unit_test(bad_requests_get_400_naming_the_problem),
        cmocka_unit_test(client_disconnect_mid_stream_is_survived),
        cmocka_unit_test(write_mode_sends_both_legs_at_once),
        cmocka_unit_test(round_robin_alternates),
        cmocka_unit_test(consistent_hash_is_stable_per_key),
        cmocka_unit_test(random_uses_every_worker),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rh_cleanup();
    return rc;
}
