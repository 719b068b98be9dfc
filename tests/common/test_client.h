/*
 * test_client.h -- TCP clients with a source address of the test's choosing. Loopback answers on all of
 * 127/8, so a test has as many client addresses as it needs (127.0.0.2, 127.0.0.3, ...) to exercise
 * per-address limits and trust lists. Needs cmocka included first.
 */
#ifndef PDL_TEST_CLIENT_H
#define PDL_TEST_CLIENT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

/* A connection from `from` to 127.0.0.1:port, or -1 when the connect fails (a refusing or paused
 * listener). Making the socket and binding it to `from` must work: that is asserted. */
static inline int tcl_try_connect_from(const char *from, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, from, &a.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    struct sockaddr_in s = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &s.sin_addr);
    if (connect(fd, (struct sockaddr *)&s, sizeof(s)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The same, and the connect must succeed too (asserted). */
static inline int tcl_connect_from(const char *from, int port)
{
    int fd = tcl_try_connect_from(from, port);
    assert_true(fd >= 0);
    return fd;
}

#endif
