/*
 * test_router_concurrency.c -- 200 concurrent streaming completions through pdlink-router, all
 * complete with their own tokens and "data: [DONE]". The client is one curl multi handle holding
 * every request open at once; the decode worker paces its chunks so that the streams overlap.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "router_harness.h"

#define NSTREAMS 200

typedef struct stream {
    rh_resp_t r;
    char body[128];
} stream_t;

static void two_hundred_concurrent_streams_complete(void **state)
{
    (void)state;
    rh_router_t r;
    assert_true(rh_router_start(&r, "--policy", "round_robin", NULL));
    rh_fake_t p, d;
    assert_true(rh_fake_start(&p, "P", r.disc, "--tp", "8", NULL));
    assert_true(rh_fake_start(&d, "D", r.disc, "--tp", "8", "--handshake-port", "7301", NULL));
    assert_true(rh_wait_status(r.http, "/health", 200));
    assert_true(rh_fake_control(&d, "{\"chunk_delay_ms\": 20, \"n_chunks\": 10}"));

    stream_t *s = calloc(NSTREAMS, sizeof(*s));
    CURLM *m = curl_multi_init();
    curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)NSTREAMS);
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/completions", r.http);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    for (int i = 0; i < NSTREAMS; i++) {
        snprintf(s[i].body, sizeof(s[i].body), "{\"prompt\":\"stream %d\",\"max_tokens\":10,\"stream\":true}", i);
        s[i].r.body = calloc(1, 1);
        CURL *e = curl_easy_init();
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, s[i].body);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, rh_on_body);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &s[i].r);
        curl_easy_setopt(e, CURLOPT_PRIVATE, &s[i]);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 120000L);
        curl_multi_add_handle(m, e);
    }
    int running = 1, done = 0;
    while (running) {
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left)) != NULL) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            stream_t *st = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&st);
            st->r.rc = msg->data.result;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &st->r.status);
            curl_multi_remove_handle(m, msg->easy_handle);
            curl_easy_cleanup(msg->easy_handle);
            done++;
        }
        if (running)
            curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    assert_int_equal(done, NSTREAMS);
    int ok = 0;
    for (int i = 0; i < NSTREAMS; i++) {
        /* Each stream carries its own request id, 10 token events and the terminator. */
        size_t events = 0;
        for (const char *q = s[i].r.body; (q = strstr(q, "data: ")) != NULL; q += 6)
            events++;
        bool good = s[i].r.rc == CURLE_OK && s[i].r.status == 200 && events == 11 &&
                    s[i].r.len > 14 && strcmp(s[i].r.body + s[i].r.len - 14, "data: [DONE]\n\n") == 0;
        if (!good)
            fprintf(stderr, "stream %d: rc %d status %ld events %zu\n", i, (int)s[i].r.rc, s[i].r.status, events);
        ok += good;
        rh_resp_free(&s[i].r);
    }
    assert_int_equal(ok, NSTREAMS);
    /* Every decode leg got its own request id: the worker saw 200 distinct ones. */
    json_t *dr = rh_fake_requests(&d);
    assert_int_equal(json_array_size(dr), NSTREAMS);
    json_t *ids = json_object();
    size_t i;
    json_t *rec;
    json_array_foreach(dr, i, rec)
    {
        json_object_set_new(ids, json_string_value(json_object_get(json_object_get(rec, "headers"), "x-request-id")),
                            json_true());
    }
    assert_int_equal(json_object_size(ids), NSTREAMS);
    json_decref(ids);
    json_decref(dr);
    assert_int_equal((int)rh_metric(r.http, "vllm_router_pd_requests_total{route=\"/v1/completions\"}"), NSTREAMS);
    assert_int_equal((int)rh_metric(r.http, "vllm_router_pd_active_requests"), 0);
    curl_slist_free_all(h);
    curl_multi_cleanup(m);
    free(s);
    assert_int_equal(rh_stop(r.pid, SIGTERM), 0);
    rh_stop(p.pid, SIGKILL);
    rh_stop(d.pid, SIGKILL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_hundred_concurrent_streams_complete),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rh_cleanup();
    return rc;
}
