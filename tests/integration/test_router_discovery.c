/*
 * test_router_discovery.c -- pdlink-router's discovery socket and registry, black-box: registration
 * and /health transitions, refresh by http_address, TTL expiry (short hidden --worker-ttl-ms), the
 * cluster transfer-mode lock, G1 registrations, and malformed frames (counted, router alive).
 * Raw frames are sent with a ZeroMQ DEALER as vLLM's MoRIIO connector sends them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "router_harness.h"

static void health_follows_registrations(void **state)
{
    (void)state;
    rh_router_t r;
    assert_true(rh_router_start(&r, NULL));
    assert_int_equal(rh_status(r.http, "/health"), 503);
    assert_int_equal(rh_status(r.http, "/readiness"), 503);
    assert_int_equal(rh_status(r.http, "/liveness"), 200);
    rh_dealer_t d;
    assert_true(rh_dealer_open(&d, r.disc));
    assert_true(rh_send_g2(&d, "P", "10.0.0.1:8100", "host:10.0.0.1,handshake:6301,notify:61005", 1, 4, "READ"));
    assert_true(rh_wait_metric_ge(r.http, "vllm_router_pd_registered_workers{role=\"prefill\"}", 1));
    assert_int_equal(rh_status(r.http, "/health"), 503); /* a prefill alone is not enough */
    assert_true(rh_send_g2(&d, "D", "10.0.0.2:8200", "host:10.0.0.2,handshake:7301,notify:62005", 1, 8, "READ"));
    assert_true(rh_wait_status(r.http, "/health", 200));
    assert_int_equal(rh_status(r.http, "/readiness"), 200);

    json_t *w = rh_get_json(r.http, "/workers");
    assert_non_null(w);
    json_t *p = rh_worker(w, "prefill", "10.0.0.1:8100");
    json_t *dd = rh_worker(w, "decode", "10.0.0.2:8200");
    assert_non_null(p);
    assert_non_null(dd);
    assert_int_equal(json_integer_value(json_object_get(p, "tp_size")), 4);
    assert_int_equal(json_integer_value(json_object_get(dd, "tp_size")), 8);
    assert_string_equal(json_string_value(json_object_get(dd, "zmq_address")),
                        "host:10.0.0.2,handshake:7301,notify:62005");
    assert_string_equal(json_string_value(json_object_get(w, "transfer_mode")), "READ");
    json_decref(w);
    /* The same address again refreshes the one entry (and takes its new zmq_address). */
    assert_true(rh_send_g2(&d, "P", "10.0.0.1:8100", "host:10.0.0.1,handshake:6301,notify:61099", 1, 4, "READ"));
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    bool refreshed = false;
    while (!refreshed && rh_now_ms() < end) {
        w = rh_get_json(r.http, "/workers");
        p = rh_worker(w, "prefill", "10.0.0.1:8100");
        refreshed = p && json_integer_value(json_object_get(p, "registrations")) >= 2;
        if (refreshed) {
            assert_int_equal(json_array_size(json_object_get(w, "prefill")), 1);
            assert_string_equal(json_string_value(json_object_get(p, "zmq_address")),
                                "host:10.0.0.1,handshake:6301,notify:61099");
        }
        json_decref(w);
        if (!refreshed)
            rh_msleep(20);
    }
    assert_true(refreshed);
    rh_dealer_close(&d);
    assert_int_equal(rh_stop(r.pid, SIGTERM), 0);
}

static void registrations_expire_after_ttl(void **state)
{
    (void)state;
    rh_router_t r;
    assert_true(rh_router_start(&r, "--worker-ttl-ms", "300", NULL));
    rh_dealer_t d;
    assert_true(rh_dealer_open(&d, r.disc));
    assert_true(rh_send_g2(&d, "P", "10.0.0.1:8100", "host:10.0.0.1,handshake:6301,notify:61005", 1, 4, "READ"));
    assert_true(rh_send_g2(&d, "D", "10.0.0.2:8200", "host:10.0.0.2,handshake:7301,notify:62005", 1, 8, "READ"));
    /* Registered (possibly only briefly on a loaded machine): the registration counter proves it. */
    assert_true(rh_wait_metric_ge(r.http, "vllm_router_discovery_total{kind=\"registrations\"}", 2));
    /* No more pings: both expire, /health goes back to 503 and the expiry is counted. */
    assert_true(rh_wait_metric_ge(r.http, "vllm_router_discovery_total{kind=\"expired\"}", 2));
    assert_int_equal(rh_status(r.http, "/health"), 503);
    assert_int_equal(rh_nworkers(r.http, "prefill"), 0);
    assert_int_equal(rh_nworkers(r.http, "decode"), 0);
    rh_resp_t c = rh_http(r.http, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2}");
    assert_int_equal(c.status, 503);
    assert_non_null(strstr(c.body, "No workers available via service discovery: 0 prefill, 0 decode"));
    rh_resp_free(&c);
    /* Pinging again brings them back. */
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    bool back = false;
    while (!back && rh_now_ms() < end) {
        rh_send_g2(&d, "P", "10.0.0.1:8100", "host:10.0.0.1,handshake:6301,notify:61005", 1, 4, "READ");
        rh_send_g2(&d, "D", "10.0.0.2:8200", "host:10.0.0.2,handshake:7301,notify:62005", 1, 8, "READ");
        back = rh_status(r.http, "/health") == 200;
        if (!back)
            rh_msleep(30);
    }
    assert_true(back);
    rh_dealer_close(&d);
    assert_int_equal(rh_stop(r.pid, SIGINT), 0);
}

static void transfer_mode_is_locked_by_first_registration(void **state)
{
    (void)state;
    rh_router_t r;
    assert_true(rh_router_start(&r, NULL));
    rh_dealer_t d;
    assert_true(rh_dealer_open(&d, r.disc));
    assert_true(rh_send_g2(&d, "P", "10.0.0.1:8100", "host:10.0.0.1,handshake:6301,notify:61005", 1, 4, "WRITE"));
    assert_true(rh_wait_metric_ge(r.http, "vllm_router_pd_transfer_mode{mode=\"WRITE\"}", 1));
    assert_true(rh_send_g2(&d, "D", "10.0.0.2:8200", "host:10.0.0.2,handshake:7301,notify:62005", 1, 8, "READ"));
    assert_true(rh_wait_metric_ge(r.http, "vllm_router_discovery_total{kind=\"mode_mismatch\"}", 1));
    assert_int_equal(rh_nworkers(r.http, "decode"), 0);
    assert_int_equal(rh_status(r.http, "/health"), 503);
    /* Case-sensitive like vllm-router: "write" is not a transfer mode, so the frame is malformed. */
    assert_true(rh_send_g2(&d, "D", "10.0.0.3:8200", "host:10.0.0.3,handshake:7301,notify:62005", 1, 8, "write"));
    assert_true(rh_wait_metric_ge(r.http, "vllm_router_discovery_malformed_total", 1));
    assert_true(rh_send_g2(&d, "D", "10.0.0.2:8200", "host:10.0.0.2,handshake:7301,notify:62005", 1, 8, "WRITE"));
    assert_true(rh_wait_status(r.http, "/health", 200));
    json_t *w = rh_get_json(r.http, "/workers");
    assert_string_equal(json_string_value(json_object_get(w, "transfer_mode")), "WRITE");
    assert_null(rh_worker(w, "decode", "10.0.0.3:8200"));
    json_decref(w);
    rh_dealer_close(&d);
    assert_int_equal(rh_stop(r.pid, SIGTERM), 0);
}

static void g1_registrations_are_accepted(void **state)
{
    (void)state;
    rh_router_t r;
    assert_true(rh_router_start(&r, NULL));
    rh_dealer_t d;
    assert_true(rh_dealer_open(&d, r.disc));
    assert_true(rh_send_g1(&d, "P", "http://10.0.0.1:8100/v1/completions", 6301, 61005, 4, "READ"));
    assert_true(rh_send_g1(&d, "D", "http://10.0.0.2:8200/v1/completions", 7301, 62005, 8, "READ"));
    assert_true(rh_wait_status(r.http, "/health", 200));
    json_t *w = rh_get_json(r.http, "/workers");
    json_t *p = rh_worker(w, "prefill", "10.0.0.1:8100");
    json_t *dd = rh_worker(w, "decode", "10.0.0.2:8200");
    assert_non_null(p);
    assert_non_null(dd);
    assert_true(json_is_true(json_object_get(p, "g1")));
    assert_string_equal(json_string_value(json_object_get(p, "zmq_address")),
                        "host:10.0.0.1,handshake:6301,notify:61005");
    assert_int_equal(json_integer_value(json_object_get(dd, "tp_size")), 8);
    json_decref(w);
    rh_dealer_close(&d);
    assert_int_equal(rh_stop(r.pid, SIGTERM), 0);
}

static void malformed_frames_are_counted_and_survived(void **state)
{
    (void)state;
    rh_router_t r;
    assert_true(rh_router_start(&r, NULL));
    rh_dealer_t d;
    assert_true(rh_dealer_open(&d, r.disc));
    int sent = 0;
    /* 1: not msgpack at all */
    assert_true(rh_send(&d, "\xc1\xc1\xc1garbage", 10));
    sent++;
    /* 2: msgpack, but an array */
    assert_true(rh_send(&d, "\x93\x01\x02\x03", 4));
    sent++;
    /* 3: a map missing zmq_address and friends */
    assert_true(rh_send(&d, "\x81\xa4type\xa1P", 8));
    sent++;
    /* 4: truncated map */
    assert_true(rh_send(&d, "\x86\xa4type", 6));
    sent++;
    /* 5: empty frame */
    assert_true(rh_send(&d, "", 0));
    sent++;
    /* 6: wrong types (tp_size a string) */
    {
        rh_map_t m;
        rh_map_begin(&m, 6);
        rh_map_str(&m, "type", "P");
        rh_map_str(&m, "http_address", "10.0.0.9:1");
        rh_map_str(&m, "zmq_address", "host:10.0.0.9,handshake:1,notify:2");
        rh_map_int(&m, "dp_size", 1);
        rh_map_str(&m, "tp_size", "four");
        rh_map_str(&m, "transfer_mode", "READ");
        assert_true(rh_map_send(&d, &m));
        sent++;
    }
    /* 7: a multipart message whose first payload part is garbage */
    assert_int_equal(zmq_send(d.sock, "xx", 2, ZMQ_SNDMORE), 2);
    assert_int_equal(zmq_send(d.sock, "yy", 2, 0), 2);
    sent++;
    char series[] = "vllm_router_discovery_malformed_total";
    assert_true(rh_wait_metric_ge(r.http, series, sent));
    assert_int_equal((int)rh_metric(r.http, series), sent);
    /* A frame larger than the router's limit is dropped by libzmq (that peer is disconnected). */
    size_t big = 200000;
    char *buf = calloc(1, big);
    assert_true(rh_send(&d, buf, big));
    free(buf);
    rh_dealer_close(&d);
    /* Still alive and still accepting registrations from a new peer. */
    assert_true(rh_dealer_open(&d, r.disc));
    assert_true(rh_send_g2(&d, "P", "10.0.0.1:8100", "host:10.0.0.1,handshake:6301,notify:61005", 1, 4, "READ"));
    assert_true(rh_send_g2(&d, "D", "10.0.0.2:8200", "host:10.0.0.2,handshake:7301,notify:62005", 1, 8, "READ"));
    assert_true(rh_wait_status(r.http, "/health", 200));
    assert_int_equal(rh_nworkers(r.http, "prefill"), 1);
    rh_dealer_close(&d);
    assert_int_equal(rh_stop(r.pid, SIGTERM), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(health_follows_registrations),
        cmocka_unit_test(registrations_expire_after_ttl),
        cmocka_unit_test(transfer_mode_is_locked_by_first_registration),
        cmocka_unit_test(g1_registrations_are_accepted),
        cmocka_unit_test(malformed_frames_are_counted_and_survived),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rh_cleanup();
    return rc;
}
