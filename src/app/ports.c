/*
 * ports.c -- free TCP port ranges for tests and `pdlink run`, found by binding in the safe window outside
 * the kernel's ephemeral range (see app/ports.h).
 */
#include "app/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

pdl_port_range_t pdl_ports_safe_window(pdl_port_range_t eph)
{
    pdl_port_range_t below = {PDL_PORTS_FLOOR, eph.lo - 1};
    pdl_port_range_t above = {eph.hi + 1 > PDL_PORTS_FLOOR ? eph.hi + 1 : PDL_PORTS_FLOOR, 65535};
    int nbelow = below.hi - below.lo + 1, nabove = above.hi - above.lo + 1;
    return nbelow >= nabove ? below : above;
}

/* A listening socket on host:port, or -1. No SO_REUSEADDR: see pdl_ports_range_free. */
static int probe_open(const struct in_addr *addr, int port)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr = *addr;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 1) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* How many ports from `first` on could be bound, stopping at the first busy one (at most count). */
static int probe_run(const struct in_addr *addr, int first, int count)
{
    int fds[PDL_PORTS_TAKE_MAX];
    int got = 0;
    while (got < count && got < PDL_PORTS_TAKE_MAX && first + got <= 65535) {
        fds[got] = probe_open(addr, first + got);
        if (fds[got] < 0)
            break;
        got++;
    }
    for (int i = 0; i < got; i++)
        close(fds[i]);
    return got;
}

bool pdl_ports_range_free(const char *host, int first, int count)
{
    struct in_addr addr;
    if (count < 1 || count > PDL_PORTS_TAKE_MAX || first < 1 || inet_pton(AF_INET, host, &addr) != 1)
        return false;
    return probe_run(&addr, first, count) == count;
}

void pdl_port_picker_init(pdl_port_picker_t *pp, uint64_t seed)
{
    pdl_port_range_t w = pdl_ports_safe_window(pdl_ports_ephemeral());
    pp->lo = w.lo;
    pp->hi = w.hi + 1;
    if (pp->hi <= pp->lo) {
        pp->cursor = pp->lo;
        return;
    }
    /* splitmix64 finaliser: spreads nearby seeds (consecutive pids) over the window. */
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    pp->cursor = pp->lo + (int)(z % (uint64_t)(pp->hi - pp->lo));
}

pdl_status_t pdl_port_picker_take(pdl_port_picker_t *pp, const char *host, int count, int *first_p,
                                  pdl_error_t *err)
{
    struct in_addr addr;
    if (inet_pton(AF_INET, host, &addr) != 1)
        return pdl_error_set(err, PDL_ERR_INVALID, "free ports: host '%s' is not an IPv4 literal", host);
    if (count < 1 || count > PDL_PORTS_TAKE_MAX || count > pp->hi - pp->lo)
        return pdl_error_set(err, PDL_ERR_INVALID, "free ports: range of %d ports requested (1..%d, window %d-%d)",
                             count, PDL_PORTS_TAKE_MAX, pp->lo, pp->hi - 1);
    int window = pp->hi - pp->lo;
    int tried = 0;
    int start = pp->cursor;
    while (tried < window) {
        if (start + count > pp->hi) {
            tried += pp->hi - start;
            start = pp->lo;
            continue;
        }
        int got = probe_run(&addr, start, count);
        if (got == count) {
            *first_p = start;
            pp->cursor = start + count >= pp->hi ? pp->lo : start + count;
            return PDL_OK;
        }
        /* Skip past the port that was busy. */
        tried += got + 1;
        start += got + 1;
    }
    return pdl_error_set(err, PDL_ERR_NOT_FOUND,
                         "free ports: no %d consecutive free TCP ports on %s in %d-%d (outside the kernel's "
                         "ephemeral range)",
                         count, host, pp->lo, pp->hi - 1);
}
