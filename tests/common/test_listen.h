/*
 * test_listen.h -- where a port listens, asked the way a peer would ask: by connecting to it from
 * another loopback address (bind_all). A bind probe would answer a different question: it
 * also fails for any socket another test happens to hold on that address and port, and CI's TSan run
 * failed on exactly that. Needs cmocka included first.
 */
#ifndef PDL_TEST_LISTEN_H
#define PDL_TEST_LISTEN_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

/* Does something listening on `port` answer on 127.0.0.2? Loopback routes all of 127/8, so a listener
 * on every address does and one on 127.0.0.1 only refuses. */
static inline bool tl_reaches_other_loopback(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(0x7f000002);
    int rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
    int err = errno;
    close(fd);
    if (rc != 0)
        assert_int_equal(err, ECONNREFUSED); /* anything else says nothing about the listener */
    return rc == 0;
}

#endif
