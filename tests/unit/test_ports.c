/*
 * test_ports.c -- port ranges versus the kernel's ephemeral range: parsing ip_local_port_range, overlap
 * at the edges, the safe window on both sides, the warning text (names the key, the ports and the
 * kernel's range), and free ranges found by binding (a held port is never handed out).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/log.h"
#include "app/ports.h"
#include "common/clock.h"

static void test_parse_range(void **state)
{
    (void)state;
    pdl_port_range_t r = {1, 2};
    assert_true(pdl_ports_parse_range("32768\t60999\n", &r));
    assert_int_equal(r.lo, 32768);
    assert_int_equal(r.hi, 60999);
    assert_true(pdl_ports_parse_range("1024 1024", &r));
    assert_int_equal(r.lo, 1024);
    assert_int_equal(r.hi, 1024);
    const char *bad[] = {"", "abc", "5000", "6000 5000", "0 100", "100 70000", "-1 5"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        pdl_port_range_t keep = {7, 8};
        assert_false(pdl_ports_parse_range(bad[i], &keep));
        assert_int_equal(keep.lo, 7); /* untouched on failure */
        assert_int_equal(keep.hi, 8);
    }
    assert_false(pdl_ports_parse_range(NULL, &r));
}

static void test_ephemeral_matches_proc(void **state)
{
    (void)state;
    pdl_port_range_t want = {PDL_PORTS_EPHEMERAL_DEFAULT_LO, PDL_PORTS_EPHEMERAL_DEFAULT_HI};
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f != NULL) {
        assert_int_equal(fscanf(f, "%d %d", &want.lo, &want.hi), 2);
        fclose(f);
    }
    pdl_port_range_t got = pdl_ports_ephemeral();
    assert_int_equal(got.lo, want.lo);
    assert_int_equal(got.hi, want.hi);
}

static void test_overlap_edges(void **state)
{
    (void)state;
    pdl_port_range_t eph = {32768, 60999};
    assert_false(pdl_ports_overlap(32760, 32767, eph));
    assert_true(pdl_ports_overlap(32760, 32768, eph));
    assert_true(pdl_ports_overlap(40000, 40000, eph));
    assert_true(pdl_ports_overlap(60999, 61010, eph));
    assert_false(pdl_ports_overlap(61000, 61010, eph));
    assert_true(pdl_ports_overlap(1, 65535, eph)); /* a range around the whole of it */
    assert_false(pdl_ports_overlap(40001, 40000, eph)); /* empty range */
}

static void test_safe_window(void **state)
{
    (void)state;
    pdl_port_range_t w = pdl_ports_safe_window((pdl_port_range_t){32768, 60999});
    assert_int_equal(w.lo, PDL_PORTS_FLOOR);
    assert_int_equal(w.hi, 32767);
    /* A range reaching down to 1024 leaves only the ports above it. */
    w = pdl_ports_safe_window((pdl_port_range_t){1024, 65000});
    assert_int_equal(w.lo, 65001);
    assert_int_equal(w.hi, 65535);
    /* A low range ending below the floor: everything from the floor up. */
    w = pdl_ports_safe_window((pdl_port_range_t){2000, 5000});
    assert_int_equal(w.lo, PDL_PORTS_FLOOR);
    assert_int_equal(w.hi, 65535);
    /* Nothing left outside it: empty. */
    w = pdl_ports_safe_window((pdl_port_range_t){PDL_PORTS_FLOOR, 65535});
    assert_true(w.lo > w.hi);
}

static void test_warning_text(void **state)
{
    (void)state;
    pdl_port_range_t eph = {32768, 60999};
    char buf[400] = "untouched";
    assert_false(pdl_ports_ephemeral_message(buf, sizeof(buf), "kv_connector_extra_config.handshake_port", 6301, 6308,
                                             eph));
    assert_string_equal(buf, "untouched");
    assert_false(pdl_ports_ephemeral_message(buf, sizeof(buf), "kv_connector_extra_config.notify_port", 61005, 61012,
                                             eph));
    assert_true(pdl_ports_ephemeral_message(buf, sizeof(buf), "kv_connector_extra_config.notify_port", 52812, 52819,
                                            eph));
    assert_non_null(strstr(buf, "kv_connector_extra_config.notify_port"));
    assert_non_null(strstr(buf, "52812-52819"));
    assert_non_null(strstr(buf, "32768-60999"));
    assert_true(pdl_ports_ephemeral_message(buf, sizeof(buf), "--port", 40000, 40000, eph));
    assert_non_null(strstr(buf, "--port: port 40000 is in"));
}

/* A listening socket on 127.0.0.1:port, or -1. */
static int hold_port(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 1) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static void test_picker_skips_held_ports(void **state)
{
    (void)state;
    pdl_port_picker_t pp;
    pdl_port_picker_init(&pp, ((uint64_t)getpid() << 32) ^ pdl__clock_now_ns());
    pdl_port_range_t eph = pdl_ports_ephemeral();
    pdl_error_t err;
    int first = 0;
    assert_int_equal(pdl_port_picker_take(&pp, "127.0.0.1", 8, &first, &err), PDL_OK);
    assert_false(pdl_ports_overlap(first, first + 7, eph));
    assert_true(first >= pp.lo && first + 8 <= pp.hi);

    /* Hold the middle port of a range that is free now: the range reads busy, the picker moves past. */
    int held = hold_port(first + 4);
    assert_true(held >= 0);
    assert_false(pdl_ports_range_free("127.0.0.1", first, 8));
    assert_true(pdl_ports_range_free("127.0.0.1", first, 4));
    pp.cursor = first;
    int again = 0;
    assert_int_equal(pdl_port_picker_take(&pp, "127.0.0.1", 8, &again, &err), PDL_OK);
    assert_true(again > first + 4 || again + 8 <= first); /* never a range holding the busy port */
    close(held);

    /* Successive ranges do not overlap. */
    int next = 0;
    assert_int_equal(pdl_port_picker_take(&pp, "127.0.0.1", 8, &next, &err), PDL_OK);
    assert_true(next >= again + 8 || next + 8 <= again);
}

static void test_picker_refuses_bad_requests(void **state)
{
    (void)state;
    pdl_port_picker_t pp;
    pdl_port_picker_init(&pp, 1);
    pdl_error_t err;
    int first = 0;
    assert_int_equal(pdl_port_picker_take(&pp, "127.0.0.1", 0, &first, &err), PDL_ERR_INVALID);
    assert_int_equal(pdl_port_picker_take(&pp, "127.0.0.1", PDL_PORTS_TAKE_MAX + 1, &first, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "513 ports"));
    assert_int_equal(pdl_port_picker_take(&pp, "localhost", 1, &first, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "'localhost'"));
    assert_false(pdl_ports_range_free("127.0.0.1", 1000, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_range),
        cmocka_unit_test(test_ephemeral_matches_proc),
        cmocka_unit_test(test_overlap_edges),
        cmocka_unit_test(test_safe_window),
        cmocka_unit_test(test_warning_text),
        cmocka_unit_test(test_picker_skips_held_ports),
        cmocka_unit_test(test_picker_refuses_bad_requests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
