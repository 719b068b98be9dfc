/*
 * tcp_raw_testutil.h -- a raw client of the tcp engine's data port for the engine tests (header-only,
 * static, cmocka asserts): dial it as an outsider would, and read one response frame.
 */
#ifndef PDL_TEST_TCP_RAW_TESTUTIL_H
#define PDL_TEST_TCP_RAW_TESTUTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>

#include "engine/tcp_wire.h"

/* A connection to 127.0.0.1:port from local address `src` (host order; 0 = the kernel's choice). */
static inline int raw_dial(uint16_t port, uint32_t src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (src != 0) {
        struct sockaddr_in me = {.sin_family = AF_INET};
        me.sin_addr.s_addr = htonl(src);
        assert_int_equal(bind(fd, (struct sockaddr *)&me, sizeof(me)), 0);
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Read one response: its header must carry the response magic (and `tag`, unless tag < 0); its message
 * (failed) or payload (ok) goes to buf, NUL-terminated, with its length in *got. Returns the status. */
static inline int32_t raw_response(int fd, int64_t tag, uint8_t *buf, size_t cap, uint64_t *got)
{
    uint8_t rh[PDL_TCP_RESP_HDR];
    assert_int_equal(recv(fd, rh, sizeof(rh), MSG_WAITALL), (ssize_t)sizeof(rh));
    pdl_tcp_resp_t rr;
    pdl_tcp_resp_decode(rh, &rr);
    assert_int_equal(rr.magic, PDL_TCP_RESP_MAGIC);
    if (tag >= 0)
        assert_int_equal(rr.tag, (uint64_t)tag);
    uint64_t n = rr.status ? rr.msg_len : rr.payload_len;
    assert_true(n < cap);
    if (n)
        assert_int_equal(recv(fd, buf, n, MSG_WAITALL), (ssize_t)n);
    buf[n] = 0;
    *got = n;
    return rr.status;
}

#endif /* PDL_TEST_TCP_RAW_TESTUTIL_H */
