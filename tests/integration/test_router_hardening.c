/*
 * test_router_hardening.c -- pdlink-router against hostile clients and peers
 * (docs/router.md#deadlines-and-listener-limits), black-box over loopback:
 *
 * - trickle_cut_by_deadlines: 56 connections from 2 addresses trickling their headers or their body,
 *   one byte per 200 ms (the idle timeout never fires), are all shut down once the header or body
 *   deadline passes, and counted; another client is still answered.
 * - budget_counts_bytes_received_per_client: connections declaring a large Content-Length and sending a
 *   little hold only what they sent, so another client's body is still accepted; one address that really
 *   sends past its share of --max-payload-in-flight is refused (503) while another address is not.
 * - headers_refused_before_the_body: Expect: 100-continue with a length over --max-payload-size gets 413,
 *   not "100 Continue"; the default limit is the nodes' 16 MiB; two Content-Length headers get 400.
 * - rogue_ping_cannot_repoint_a_worker: a registration naming a live worker's http_address from another
 *   source address is dropped and counted; the worker's own source may still change it.
 * - discovery_port_is_capped: 600 connections to the discovery port of a router at ulimit -n 256 leave
 *   /health answered, are shed by pauses (counted), and a real registration still gets through.
 * - prefill_deadline_fails_fast: a prefill that does not answer fails its request with 504 naming the
 *   prefill leg after --prefill-first-byte-timeout, instead of hanging the client.
 *
 * Every wait has a generous deadline that only bounds a failure; assertions are on statuses and counters.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "router_harness.h"
#include "test_client.h"


static void send_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        assert_true(n > 0);
        buf += n;
        len -= (size_t)n;
    }
}

/* True once the peer closed fd (EOF or reset), polling for up to ms; a reply's bytes are skipped. */
static bool closed_within(int fd, int ms)
{
    long long end = rh_now_ms() + ms;
    char buf[4096];
    while (rh_now_ms() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            return true;
    }
    return false;
}

/* Read the status line's code of the first response on fd (0 when none came before the deadline). */
static int read_status(int fd, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    while (rh_now_ms() < end && len + 1 < cap) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fd, out + len, cap - 1 - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        out[len] = '\0';
        if (strstr(out, "\r\n\r\n") != NULL && (strstr(out, "Content-Length: 0") || strstr(out, "}") ||
                                                 strncmp(out, "HTTP/1.1 100", 12) == 0))
            break;
    }
    int code = 0;
    if (sscanf(out, "HTTP/1.%*d %d", &code) != 1)
        return 0;
    return code;
}

static double metric_or_zero(int port, const char *series)
{
    double v = rh_metric(port, series);
    return v < 0 ? 0 : v;
}

/* ---- deadlines ---------------------------------------------------------------------------------------- */

static void trickle_cut_by_deadlines(void **state)
{
    (void)state;
    enum { N = 56 };
    rh_router_t r;
    /* The idle timeout is far beyond the test: only the deadlines can close the trickling connections. */
    assert_true(rh_router_start(&r, "--http-idle-timeout", "600", "--http-header-timeout", "1", "--http-body-timeout",
                                "2", NULL));
    int fds[N];
    bool closed[N];
    for (int i = 0; i < N; i++) {
        fds[i] = tcl_connect_from(i % 2 ? "127.0.0.2" : "127.0.0.3", r.http);
        closed[i] = false;
        if (i < N / 2) { /* headers, slowly */
            send_all(fds[i], "POST /v1/completions HTTP/1.1\r\nHost: r\r\n", 41);
        } else { /* complete headers, then a body slowly */
            static const char h[] = "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                                    "Content-Length: 1000000\r\n\r\n{";
            send_all(fds[i], h, sizeof(h) - 1);
        }
    }
    /* One byte per connection every 200 ms, each one resetting libmicrohttpd's idle timer. */
    int left = N;
    long long end = rh_now_ms() + 60000;
    while (left > 0 && rh_now_ms() < end) {
        for (int i = 0; i < N; i++) {
            if (closed[i])
                continue;
            const char *b = i < N / 2 ? "X" : " ";
            if (send(fds[i], b, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN) {
                closed[i] = true;
                left--;
            } else if (closed_within(fds[i], 1)) {
                closed[i] = true;
                left--;
            }
        }
        rh_msleep(200);
    }
    assert_int_equal(left, 0);
    assert_true(metric_or_zero(r.http, "pdlink_router_http_deadline_closed_total") >= N);
    assert_int_equal(rh_status(r.http, "/health"), 503); /* answered: no workers registered */
    for (int i = 0; i < N; i++)
        close(fds[i]);
    assert_int_equal(rh_stop(r.pid, SIGTERM), 0);
}

/* ---- the payload budget -------------------------------------------------------------------------------- */

/* POST `len` bytes of a JSON-ish body on a new connection from `from` declaring `declared` bytes; sends only
 * `send_n` of them. Returns the fd. */
static int post_partial(const char *from, int port, size_t declared, size_t send_n)
{
    int fd = tcl_connect_from(from, port);
    char h[256];
    int hl = snprintf(h, sizeof(h),
                      "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      declared);
    send_all(fd, h, (size_t)hl);
    /* '{"prompt":"x"' then spaces: with a closing '}' a valid request, which without workers gets 503
     * "No workers available" -- proof that it got past the budget. */
    static const char head[] = "{\"prompt\":\"x\"";
    char *body = malloc(send_n + sizeof(head));
    assert_non_null(body);
    memset(body, ' ', send_n);
    memcpy(body, head, send_n < sizeof(head) - 1 ? send_n : sizeof(head) - 1);
    send_all(fd, body, send_n);
    free(body);
    return fd;
}

/* The body of a complete request that is valid JSON: '{' spaces '}'. */
static int post_complete(const char *from, int port, size_t len, char *resp, size_t cap)
{
    int fd = post_partial(from, port, len, len - 1);
    send_all(fd, "}", 1);
    int code = read_status(fd, resp, cap);
    close(fd);
    return code;
}

static void budget_counts_bytes_received_per_client(void **state)
{
    (void)state;
    rh_router_t r;
    /* Budget 4 MB, bodies up to 1 MB: one address's share is max(4 MB / 8, 1 MB) = 1 MB. */
    assert_true(rh_router_start(&r, "--max-payload-in-flight", "4000000", "--max-payload-size", "1000000",
                                "--http-body-timeout", "600", NULL));
    /* Four connections from two addresses announce 999,999 bytes each and send 100: before, the declared
     * lengths were charged up front and these four took the whole budget. */
    int stall[4];
    for (int i = 0; i < 4; i++)
        stall[i] = post_partial(i % 2 ? "127.0.0.2" : "127.0.0.3", r.http, 999999, 100);
    char resp[8192];
    int code = post_complete("127.0.0.4", r.http, 200000, resp, sizeof(resp));
    assert_int_equal(code, 503);
    assert_null(strstr(resp, "payload_budget_exhausted"));
    assert_non_null(strstr(resp, "No workers available")); /* it got past the budget to dispatch */

    /* Address .5 really sends 900,000 bytes and stalls; its next 200,000-byte body passes its 1 MB share
     * (refused, 503), while the same body from address .6 is still taken. */
    int big = post_partial("127.0.0.5", r.http, 999999, 900000);
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    while (metric_or_zero(r.http, "pdlink_router_http_body_bytes") < 900000 && rh_now_ms() < end)
        rh_msleep(20);
    assert_true(metric_or_zero(r.http, "pdlink_router_http_body_bytes") >= 900000);
    code = post_complete("127.0.0.5", r.http, 200000, resp, sizeof(resp));
    assert_int_equal(code, 503);
    assert_non_null(strstr(resp, "payload_budget_exhausted"));
    code = post_complete("127.0.0.6", r.http, 200000, resp, sizeof(resp));
    assert_int_equal(code, 503);
    assert_non_null(strstr(resp, "No workers available"));
    close(big);
    for (int i = 0; i < 4; i++)
        close(stall[i]);
    assert_int_equal(rh_stop(r.pid, SIGTERM), 0);
}

/* ---- refused at the headers ------------------------------------------------------------------------------ */

static void headers_refused_before_the_body(void **state)
{
    (void)state;
    rh_router_t r;
    assert_true(rh_router_start(&r, NULL));
    char resp[8192];
    /* Over the default limit, the nodes' 16 MiB, with Expect: the answer is 413, and no "100 Continue". */
    int fd = tcl_connect_from("127.0.0.1", r.http);
    static const char expect[] = "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                                 "Content-Length: 16777217\r\nExpect: 100-continue\r\n\r\n";
    send_all(fd, expect, sizeof(expect) - 1);
    assert_int_equal(read_status(fd, resp, sizeof(resp)), 413);
    assert_non_null(strstr(resp, "payload_too_large"));
    assert_null(strstr(resp, "100 Continue"));
    close(fd);
    /* At the limit it is read: 16 MiB with Expect gets "100 Continue". */
    fd = tcl_connect_from("127.0.0.1", r.http);
    static const char at[] = "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                             "Content-Length: 16777216\r\nExpect: 100-continue\r\n\r\n";
    send_all(fd, at, sizeof(at) - 1);
    assert_int_equal(read_status(fd, resp, sizeof(resp)), 100);
    close(fd);
    /* Two Content-Length headers: 400, counted. */
    fd = tcl_connect_from("127.0.0.1", r.http);
    static const char dup[] = "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                              "Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}";
    send_all(fd, dup, sizeof(dup) - 1);
    assert_int_equal(read_status(fd, resp, sizeof(resp)), 400);
    assert_non_null(strstr(resp, "more than one Content-Length header"));
    close(fd);
    assert_int_equal((int)metric_or_zero(r.http, "pdlink_router_http_refused_headers_total"), 1);
    assert_int_equal(rh_stop(r.pid, SIGTERM), 0);
}

/* ---- discovery ---------------------------------------------------------------------------------------- */

/* A DEALER whose connection leaves from source address `from` (libzmq's "tcp://src:0;dst:port"). */
static bool dealer_from(rh_dealer_t *d, const char *from, int disc_port)
{
    char ep[96];
    snprintf(ep, sizeof(ep), "tcp://%s:0;127.0.0.1:%d", from, disc_port);
    d->ctx = zmq_ctx_new();
    d->sock = zmq_socket(d->ctx, ZMQ_DEALER);
    int linger = 2000;
    zmq_setsockopt(d->sock, ZMQ_LINGER, &linger, sizeof(linger));
    return zmq_connect(d->sock, ep) == 0;
}

static const char *worker_zmq(int http_port, const char *role, const char *http, char *out, size_t cap)
{
    json_t *w = rh_get_json(http_port, "/workers");
    json_t *e = w ? rh_worker(w, role, http) : NULL;
    snprintf(out, cap, "%s", e ? json_string_value(json_object_get(e, "zmq_address")) : "");
    json_decref(w);
    return out;
}

static void rogue_ping_cannot_repoint_a_worker(void **state)
{
    (void)state;
    rh_router_t r;
    assert_true(rh_router_start(&r, NULL));
    rh_dealer_t real, rogue;
    assert_true(dealer_from(&real, "127.0.0.1", r.disc));
    assert_true(dealer_from(&rogue, "127.0.0.7", r.disc));
    const char *real_zmq = "host:127.0.0.1,handshake:6301,notify:61005";
    assert_true(rh_send_g2(&real, "P", "127.0.0.1:8100", real_zmq, 1, 2, "READ"));
    assert_true(rh_wait_metric_ge(r.http, "vllm_router_discovery_total{kind=\"registrations\"}", 1));
    /* The rogue names the same http_address with its own zmq_address: dropped and counted. */
    assert_true(rh_send_g2(&rogue, "P", "127.0.0.1:8100", "host:127.0.0.7,handshake:1,notify:2", 1, 2, "READ"));
    assert_true(rh_wait_metric_ge(r.http, "vllm_router_discovery_total{kind=\"hijack_refused\"}", 1));
    char z[256];
    assert_string_equal(worker_zmq(r.http, "prefill", "127.0.0.1:8100", z, sizeof(z)), real_zmq);
    /* The worker's own source may change it (a restart with other ports). */
    const char *moved = "host:127.0.0.1,handshake:6311,notify:61015";
    assert_true(rh_send_g2(&real, "P", "127.0.0.1:8100", moved, 1, 2, "READ"));
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    while (strcmp(worker_zmq(r.http, "prefill", "127.0.0.1:8100", z, sizeof(z)), moved) != 0 && rh_now_ms() < end)
        rh_msleep(20);
    assert_string_equal(z, moved);
    assert_int_equal((int)rh_metric(r.http, "vllm_router_discovery_total{kind=\"hijack_refused\"}"), 1);
    rh_dealer_close(&real);
    rh_dealer_close(&rogue);
    assert_int_equal(rh_stop(r.pid, SIGTERM), 0);
}

static void discovery_port_is_capped(void **state)
{
    (void)state;
    enum { N = 600 };
    if (access("/usr/bin/prlimit", X_OK) != 0)
        skip();
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < N + 200)
        skip();
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? 4096 : rl.rlim_max;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
    /* The router raises its soft limit to the hard one: prlimit sets both. */
    char bin[600], pf[400], log[400];
    snprintf(bin, sizeof(bin), "%s/pdlink-router", rh_env("PDLINK_BUILD_DIR", "."));
    snprintf(pf, sizeof(pf), "%s/capped.ports", rh_dir());
    snprintf(log, sizeof(log), "%s/capped.log", rh_dir());
    char *argv[] = {"/usr/bin/prlimit", "--nofile=256:256", "--", bin, "--vllm-pd-disaggregation", "--kv-connector",
                    "moriio", "--vllm-discovery-address", "127.0.0.1:0", "--host", "127.0.0.1", "--port", "0",
                    "--prometheus-port", "0", "--port-file", pf, NULL};
    pid_t pid = rh_spawn(argv, log);
    char *ports = rh_wait_file(pf, pid);
    assert_non_null(ports);
    int http = 0, disc = 0, prom = 0;
    assert_int_equal(sscanf(ports, "http=%d discovery=%d prometheus=%d", &http, &disc, &prom), 3);
    free(ports);
    static int fds[N];
    int opened = 0;
    for (int i = 0; i < N; i++) /* once the port pauses, connects are refused until it is back */
        opened += (fds[i] = tcl_try_connect_from("127.0.0.8", disc)) >= 0;
    (void)opened; /* how many got in before the first pause depends on how fast libzmq accepted */
    /* Past its share the port pauses (dropping its connections) instead of taking the process' last
     * descriptors: /health stays answered. */
    assert_true(rh_wait_metric_ge(http, "vllm_router_discovery_total{kind=\"listener_pauses\"}", 1));
    assert_int_equal(rh_status(http, "/health"), 503);
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    /* A real registration still arrives (the DEALER reconnects once the port is back). */
    rh_dealer_t d;
    assert_true(rh_dealer_open(&d, disc));
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    bool registered = false;
    while (!registered && rh_now_ms() < end) {
        rh_send_g2(&d, "P", "127.0.0.1:8100", "host:127.0.0.1,handshake:6301,notify:61005", 1, 1, "READ");
        rh_send_g2(&d, "D", "127.0.0.1:8200", "host:127.0.0.1,handshake:7301,notify:62005", 1, 1, "READ");
        registered = rh_status(http, "/health") == 200;
        if (!registered)
            rh_msleep(100);
    }
    assert_true(registered);
    rh_dealer_close(&d);
    assert_int_equal(rh_stop(pid, SIGTERM), 0);
}

/* ---- leg deadlines -------------------------------------------------------------------------------------- */

static void prefill_deadline_fails_fast(void **state)
{
    (void)state;
    rh_router_t r;
    assert_true(rh_router_start(&r, "--prefill-first-byte-timeout", "1", NULL));
    rh_fake_t p, d;
    assert_true(rh_fake_start(&p, "P", r.disc, NULL));
    assert_true(rh_fake_start(&d, "D", r.disc, NULL));
    assert_true(rh_wait_status(r.http, "/health", 200));
    /* The prefill hangs (a paused process, a stuck engine) far longer than the deadline. */
    assert_true(rh_fake_control(&p, "{\"delay_ms\": 600000}"));
    rh_resp_t c = rh_http(r.http, "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":2}");
    assert_int_equal(c.status, 504);
    assert_non_null(strstr(c.failed_leg, "prefill 127.0.0.1:"));
    assert_non_null(strstr(c.body, "Prefill server timeout"));
    rh_resp_free(&c);
    assert_int_equal((int)rh_metric(r.http, "vllm_router_pd_errors_total{error_type=\"prefill_timeout\"}"), 1);
    assert_int_equal(rh_stop(r.pid, SIGTERM), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(trickle_cut_by_deadlines),
        cmocka_unit_test(budget_counts_bytes_received_per_client),
        cmocka_unit_test(headers_refused_before_the_body),
        cmocka_unit_test(rogue_ping_cannot_repoint_a_worker),
        cmocka_unit_test(discovery_port_is_capped),
        cmocka_unit_test(prefill_deadline_fails_fast),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rh_cleanup();
    return rc;
}
