/*
 * liveness.c -- a peer process's liveness through a pidfd proved to name it (liveness.h).
 */
#include "engine/liveness.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
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
