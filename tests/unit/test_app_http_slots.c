/*
 * test_app_http_slots.c -- slowloris from two addresses against the shared HTTP listener (src/app/http.c)
 * with its default per-client connection cap (docs/security.md).
 *
 * - two_addresses_cannot_take_the_slots: a listener of 64 connections with no explicit per-client cap;
 *   127.0.0.2 and 127.0.0.3 each open 32 connections and trickle a header byte now and then. Then 25
 *   requests from 127.0.0.1, one at a time: every one is answered. Before, each address could hold 3/4
 *   of the slots (48), so the two held all 64 and the 25 were refused until the header deadline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "app/http.h"
#include "test_client.h"

static int handler(void *cls, const pdl_http_request_t *req)
{
    (void)cls;
    return pdl_http_reply(req->conn, 200, NULL, "ok", 2, NULL);
}

/* One GET /health from 127.0.0.1 on a fresh connection: true when a 200 came back within 2 s. */
static bool health_from_third_address(int port)
{
    int fd = tcl_try_connect_from("127.0.0.1", port);
    if (fd < 0)
        return false;
    const char *req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    bool ok = send(fd, req, strlen(req), MSG_NOSIGNAL) == (ssize_t)strlen(req);
    char buf[256] = "";
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    ok = ok && poll(&pf, 1, 2000) == 1 && recv(fd, buf, sizeof(buf) - 1, 0) > 0;
    close(fd);
    return ok && strncmp(buf, "HTTP/1.1 200", 12) == 0;
}

static void two_addresses_cannot_take_the_slots(void **state)
{
    (void)state;
    enum { SLOTS = 64, EACH = 32, TRIES = 25 };
    const pdl_http_params_t p = {
        .host = "127.0.0.1", .port = 0, .what = "--host", .max_body = 1024,
        .limits = {.idle_timeout_s = 60, .header_timeout_s = 60, .max_connections = SLOTS, .threads = 1,
                   .workers = 2, .body_budget = 1 << 20},
        .handler = handler};
    pdl_http_t *http = NULL;
    int port = 0;
    pdl_error_t err;
    assert_int_equal(pdl_http_start(&p, &http, &port, &err), PDL_OK);
    int fds[2 * EACH];
    for (int i = 0; i < 2 * EACH; i++) {
        fds[i] = tcl_connect_from(i < EACH ? "127.0.0.2" : "127.0.0.3", port);
        send(fds[i], "GET / HTTP/1.1\r\nX", 17, MSG_NOSIGNAL); /* headers that never end */
    }
    usleep(300 * 1000); /* MHD accepts (and closes past the cap) on its polling thread */
    int answered = 0;
    for (int t = 0; t < TRIES; t++) {
        for (int i = 0; i < 2 * EACH; i++)
            send(fds[i], "y", 1, MSG_NOSIGNAL); /* a trickle: never idle */
        answered += health_from_third_address(port);
    }
    pdl_http_stats_t st;
    pdl_http_stats(http, &st);
    printf("slow connections held %zu of %d slots; %d of %d requests from a third address answered\n",
           (size_t)st.connections, SLOTS, answered, TRIES);
    if (answered != TRIES)
        fail_msg("%d of %d requests from 127.0.0.1 answered while two addresses trickled", answered, TRIES);
    assert_true(st.connections <= SLOTS / 2 + 1);
    for (int i = 0; i < 2 * EACH; i++)
        close(fds[i]);
    pdl_http_stop(http);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_addresses_cannot_take_the_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
