/*
 * run_ceiling.c -- same-run ceilings for `pdlink run` (see run_ceiling.h).
 *
 * Why the care: on these VMs first-touch memory runs at ~0.3 GB/s and memory left idle for a few
 * seconds is several times slower on its next pass (reference/machine.md §0), so every buffer is
 * written once (fault) and copied once (warm) right before the timed loop, and all threads start
 * together behind a gate so the wall time covers exactly the timed work.
 */
#include "cli/run_ceiling.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pdlink/log.h"

enum { CEIL_MAX_THREADS = 64, CEIL_CHUNK = 1 << 20 };

/*
 * A start gate instead of a pthread barrier: a thread that fails before the gate must not leave the
 * others (or the timing thread) waiting for an arrival that never comes.
 */
typedef struct gate {
    atomic_int ready;
    atomic_bool go;
} gate_t;

static void gate_arrive_and_wait(gate_t *g)
{
    atomic_fetch_add(&g->ready, 1);
    while (!atomic_load(&g->go))
        sched_yield();
}

/* Wait until `n` threads arrived, then open the gate; returns the start time. */
static uint64_t gate_open(gate_t *g, int n)
{
    while (atomic_load(&g->ready) < n)
        sched_yield();
    uint64_t t0 = pdl_now_ns();
    atomic_store(&g->go, true);
    return t0;
}

typedef struct mc_arg {
    gate_t *gate;
    size_t buf, bytes;
    int fail;
    uint64_t end_ns;
} mc_arg_t;

static void *mc_thread(void *p)
{
    mc_arg_t *a = p;
    char *src = malloc(a->buf), *dst = malloc(a->buf);
    if (src == NULL || dst == NULL) {
        a->fail = 1;
        gate_arrive_and_wait(a->gate);
        free(src);
        free(dst);
        return NULL;
    }
    memset(src, 0x5a, a->buf);
    memset(dst, 0xa5, a->buf);
    memcpy(dst, src, a->buf);
    gate_arrive_and_wait(a->gate); /* warm; wait for the start */
    size_t left = a->bytes;
    while (left > 0) {
        size_t n = left < a->buf ? left : a->buf;
        memcpy(dst, src, n);
        /* Keep the copy from being optimised away or reordered past the clock read. */
        __asm__ __volatile__("" : : "r"(dst) : "memory");
        left -= n;
    }
    a->end_ns = pdl_now_ns();
    free(src);
    free(dst);
    return NULL;
}

pdl_status_t pdl_run_ceiling_memcpy(int threads, size_t buf_bytes, size_t total_bytes, double *gbps_p,
                                    pdl_error_t *err)
{
    if (threads < 1 || threads > CEIL_MAX_THREADS || buf_bytes == 0 || total_bytes == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "memcpy ceiling: %d threads, %zu-byte buffers", threads, buf_bytes);
    gate_t gate = {0};
    mc_arg_t args[CEIL_MAX_THREADS];
    pthread_t tids[CEIL_MAX_THREADS];
    int started = 0;
    for (int i = 0; i < threads; i++) {
        args[i] = (mc_arg_t){.gate = &gate, .buf = buf_bytes, .bytes = total_bytes / (size_t)threads};
        if (pthread_create(&tids[i], NULL, mc_thread, &args[i]) != 0)
            break;
        started++;
    }
    uint64_t t0 = gate_open(&gate, started), t1 = t0;
    int fail = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(tids[i], NULL);
        fail |= args[i].fail;
        if (args[i].end_ns > t1)
            t1 = args[i].end_ns;
    }
    if (started < threads)
        return pdl_error_set(err, PDL_ERR_SYSTEM, "memcpy ceiling: pthread_create failed after %d threads", started);
    if (fail)
        return pdl_error_set(err, PDL_ERR_NOMEM, "memcpy ceiling: cannot allocate 2 x %zu bytes", buf_bytes);
    size_t copied = (total_bytes / (size_t)threads) * (size_t)threads;
    *gbps_p = t1 > t0 ? (double)copied / (double)(t1 - t0) : 0.0;
    return PDL_OK;
}

typedef struct tcp_arg {
    int fd;
    size_t warm, bytes;
    gate_t *gate;
    int fail;
    uint64_t end_ns;
} tcp_arg_t;

static int io_all(int fd, char *buf, size_t n, int writing)
{
    while (n > 0) {
        ssize_t r = writing ? send(fd, buf, n, MSG_NOSIGNAL) : recv(fd, buf, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        buf += r;
        n -= (size_t)r;
    }
    return 0;
}

static void *tcp_writer(void *p)
{
    tcp_arg_t *a = p;
    char *buf = malloc(CEIL_CHUNK);
    if (buf != NULL)
        memset(buf, 0x3c, CEIL_CHUNK);
    else
        a->fail = 1;
    for (size_t done = 0; buf != NULL && done < a->warm + a->bytes;) {
        if (done == a->warm)
            gate_arrive_and_wait(a->gate);
        size_t n = CEIL_CHUNK;
        if (done < a->warm && a->warm - done < n)
            n = a->warm - done;
        if (done >= a->warm && a->warm + a->bytes - done < n)
            n = a->warm + a->bytes - done;
        if (io_all(a->fd, buf, n, 1) != 0) {
            a->fail = 1;
            break;
        }
        done += n;
    }
    if (a->fail && !atomic_load(&a->gate->go))
        gate_arrive_and_wait(a->gate); /* failed before the gate: still arrive, so the timer starts */
    free(buf);
    return NULL;
}

static void *tcp_reader(void *p)
{
    tcp_arg_t *a = p;
    char *buf = malloc(CEIL_CHUNK);
    if (buf != NULL)
        memset(buf, 0, CEIL_CHUNK);
    else
        a->fail = 1;
    size_t total = a->warm + a->bytes;
    for (size_t done = 0; buf != NULL && done < total;) {
        size_t n = total - done < CEIL_CHUNK ? total - done : CEIL_CHUNK;
        ssize_t r = recv(a->fd, buf, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            a->fail = 1;
            break;
        }
        done += (size_t)r;
    }
    a->end_ns = pdl_now_ns();
    if (a->fail)
        shutdown(a->fd, SHUT_RDWR); /* unblock the writer of this stream */
    free(buf);
    return NULL;
}

static int tcp_pair(int fds[2])
{
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sa);
    if (bind(l, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(l, 1) != 0 ||
        getsockname(l, (struct sockaddr *)&sa, &sl) != 0) {
        close(l);
        return -1;
    }
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (c >= 0)
            close(c);
        close(l);
        return -1;
    }
    int s = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    close(l);
    if (s < 0) {
        close(c);
        return -1;
    }
    fds[0] = c;
    fds[1] = s;
    return 0;
}

pdl_status_t pdl_run_ceiling_tcp(int threads, size_t total_bytes, double *gbps_p, pdl_error_t *err)
{
    if (threads < 1 || threads > CEIL_MAX_THREADS / 2 || total_bytes == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "tcp ceiling: %d streams", threads);
    int fds[CEIL_MAX_THREADS / 2][2];
    int opened = 0;
    for (; opened < threads; opened++)
        if (tcp_pair(fds[opened]) != 0)
            break;
    if (opened < threads) {
        int e = errno;
        for (int i = 0; i < opened; i++) {
            close(fds[i][0]);
            close(fds[i][1]);
        }
        return pdl_error_set(err, PDL_ERR_SYSTEM, "tcp ceiling: loopback connection: %s", strerror(e));
    }
    gate_t gate = {0};
    tcp_arg_t wa[CEIL_MAX_THREADS / 2], ra[CEIL_MAX_THREADS / 2];
    pthread_t wt[CEIL_MAX_THREADS / 2], rt[CEIL_MAX_THREADS / 2];
    size_t per = total_bytes / (size_t)threads;
    size_t warm = 64u << 20;
    for (int i = 0; i < threads; i++) {
        wa[i] = (tcp_arg_t){.fd = fds[i][0], .warm = warm, .bytes = per, .gate = &gate};
        ra[i] = (tcp_arg_t){.fd = fds[i][1], .warm = warm, .bytes = per, .gate = &gate};
        pthread_create(&rt[i], NULL, tcp_reader, &ra[i]);
        pthread_create(&wt[i], NULL, tcp_writer, &wa[i]);
    }
    /* The writers reach the gate once their warm-up bytes are sent; the clock starts then. */
    uint64_t t0 = gate_open(&gate, threads), t1 = t0;
    int fail = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(wt[i], NULL);
        pthread_join(rt[i], NULL);
        fail |= wa[i].fail | ra[i].fail;
        if (ra[i].end_ns > t1)
            t1 = ra[i].end_ns;
        close(fds[i][0]);
        close(fds[i][1]);
    }
    if (fail)
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "tcp ceiling: a loopback stream failed");
    *gbps_p = t1 > t0 ? (double)(per * (size_t)threads) / (double)(t1 - t0) : 0.0;
    return PDL_OK;
}
