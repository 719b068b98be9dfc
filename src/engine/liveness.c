/*
 * liveness.c -- a peer process's liveness through a pidfd proved to name it (liveness.h).
 */
#include "engine/liveness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

uint64_t pdl__proc_start_time(int64_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%" PRId64 "/stat", pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: the fields after it start after the
     * last ')'. Field 3 is the state; the start time is field 22, 19 fields further. */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return 0;
    p++;
    for (int field = 2; field < 21 && p != NULL; field++)
        p = strchr(p + 1, ' ');
    unsigned long long start = 0;
    if (p == NULL || sscanf(p, " %llu", &start) != 1)
        return 0;
    return (uint64_t)start;
}

int pdl__proc_pidfd(int64_t pid, uint64_t start)
{
    if (pid <= 0 || pid > INT_MAX) {
        errno = EINVAL;
        return -1;
    }
    int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0 || start == 0)
        return fd;
    /* Read after the open: if the process named `pid` now started at `start`, it is the one the pidfd
     * names, since a process that took the pid over after that one's death would have started after
     * the descriptor carrying `start` was sent. 0: reaped since the open, gone as well. */
    uint64_t now = pdl__proc_start_time(pid);
    if (now == start)
        return fd;
    close(fd);
    errno = now == 0 ? ESRCH : ESTALE;
    return -1;
}

bool pdl__proc_exited(int pidfd)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* The address `host` as the 16 bytes sock_diag reports for a socket of `family` (IPv4 on an AF_INET6
 * socket is v4-mapped); false when `host` cannot be such an address. */
static bool diag_addr(const char *host, int family, uint8_t out[16])
{
    struct in_addr a4;
    struct in6_addr a6;
    memset(out, 0, 16);
    if (inet_pton(AF_INET, host, &a4) == 1) {
        if (family == AF_INET) {
            memcpy(out, &a4, 4);
        } else {
            out[10] = out[11] = 0xff;
            memcpy(out + 12, &a4, 4);
        }
        return true;
    }
    if (family == AF_INET6 && inet_pton(AF_INET6, host, &a6) == 1) {
        memcpy(out, &a6, 16);
        return true;
    }
    return false;
}

/* Count one family's dump on netlink socket `nl`; -1 with errno on a failure. */
static int diag_count(int nl, int family, uint16_t local_port, const uint8_t want[16])
{
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 r;
    } req = {.nlh = {.nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
                     .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP},
             .r = {.sdiag_family = (uint8_t)family, .sdiag_protocol = IPPROTO_TCP,
                   .idiag_states = 1u << TCP_ESTABLISHED}};
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    if (sendto(nl, &req, sizeof(req), 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0)
        return -1;
    size_t alen = family == AF_INET ? 4 : 16;
    int count = 0;
    for (;;) {
        long buf[8192 / sizeof(long)];
        ssize_t n = recv(nl, buf, sizeof(buf), 0);
        if (n < 0)
            return -1;
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type == NLMSG_DONE)
                return count;
            if (h->nlmsg_type == NLMSG_ERROR) {
                const struct nlmsgerr *e = NLMSG_DATA(h);
                errno = e->error < 0 ? -e->error : EPROTO;
                return -1;
            }
            const struct inet_diag_msg *m = NLMSG_DATA(h);
            if (ntohs(m->id.idiag_sport) == local_port && memcmp(m->id.idiag_dst, want, alen) == 0)
                count++;
        }
    }
}

int pdl__tcp_established(uint16_t local_port, const char *host)
{
    uint8_t a4[16], a6[16];
    bool v4 = diag_addr(host, AF_INET, a4), v6 = diag_addr(host, AF_INET6, a6);
    if (!v4 && !v6) {
        errno = EINVAL;
        return -1;
    }
    int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0)
        return -1;
    struct timeval tv = {0, 100 * 1000}; /* the kernel answers at once; never stall the caller on it */
    setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int total = 0, n = 0;
    if (v4 && (n = diag_count(nl, AF_INET, local_port, a4)) >= 0)
        total += n;
    if (n >= 0 && (n = diag_count(nl, AF_INET6, local_port, a6)) >= 0)
        total += n;
    int en = errno;
    close(nl);
    errno = en;
    return n < 0 ? -1 : total;
}
