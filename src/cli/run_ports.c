/*
 * run_ports.c -- free TCP port ranges for a local cluster, found by binding (see run_ports.h).
 *
 * A probe binds without SO_REUSEADDR and listens: that fails on a port with a listener and on a port
 * with connections in TIME_WAIT, both of which would make the child's bind fail or be fragile. The
 * probe sockets of a range are all held until the whole range is proved free, then closed together.
 * There is a window between our close and the child's bind that no probe can close; the random start
 * and the forward-moving cursor make a collision unlikely, and a child that cannot bind dies at
 * start-up, which `pdlink run` reports by name.
 */
#include "cli/run_ports.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { RUN_PORT_MIN = 20000, RUN_PORT_MAX_DEFAULT = 32000, RUN_PORT_RANGE_MAX = 512 };

static int ephemeral_low(void)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    int lo = 0, hi = 0;
    if (f != NULL) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 0;
        fclose(f);
    }
    return lo > RUN_PORT_MIN + 2000 ? lo : RUN_PORT_MAX_DEFAULT;
}

void pdl_run_ports_init(pdl_run_ports_t *pp, uint64_t seed)
{
    pp->lo = RUN_PORT_MIN;
    pp->hi = ephemeral_low();
    /* splitmix64 finaliser: spreads nearby seeds (consecutive pids) over the window. */
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    pp->cursor = pp->lo + (int)(z % (uint64_t)(pp->hi - pp->lo));
}

static int probe_open(const char *host, int port)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 1) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int pdl_run_port_is_free(const char *host, int port)
{
    int fd = probe_open(host, port);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

pdl_status_t pdl_run_ports_take(pdl_run_ports_t *pp, const char *host, int count, int *first_p, pdl_error_t *err)
{
    if (count <= 0 || count > RUN_PORT_RANGE_MAX || count > pp->hi - pp->lo)
        return pdl_error_set(err, PDL_ERR_INVALID, "port range of %d ports requested (1..%d)", count,
                             RUN_PORT_RANGE_MAX);
    int fds[RUN_PORT_RANGE_MAX];
    int window = pp->hi - pp->lo;
    int tried = 0;
    int start = pp->cursor;
    while (tried < window) {
        if (start + count > pp->hi) {
            tried += pp->hi - start;
            start = pp->lo;
            continue;
        }
        int got = 0;
        while (got < count) {
            fds[got] = probe_open(host, start + got);
            if (fds[got] < 0)
                break;
            got++;
        }
        for (int i = 0; i < got; i++)
            close(fds[i]);
        if (got == count) {
            *first_p = start;
            pp->cursor = start + count;
            if (pp->cursor >= pp->hi)
                pp->cursor = pp->lo;
            return PDL_OK;
        }
        /* Skip past the port that was busy. */
        tried += got + 1;
        start += got + 1;
    }
    return pdl_error_set(err, PDL_ERR_NOT_FOUND, "no %d consecutive free TCP ports on %s in %d..%d", count,
                         host, pp->lo, pp->hi - 1);
}
