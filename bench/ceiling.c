/*
 * ceiling.c -- memcpy and TCP-stream ceilings (see ceiling.h for what is measured and why).
 */
#include "ceiling.h"

#include "common/clock.h"
#include "common/copy.h" /* the streaming copy shm uses: the ceiling takes the faster of it and memcpy */

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) { return (double)pdl__clock_now_ns() * 1e-9; }

void *pdl_ceiling_alloc(size_t bytes)
{
    if (bytes == 0)
        return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* First touch here is several times slower than later passes (docs/benchmarks.md#this-machine): fault
     * everything in now, outside any timing. */
    for (size_t o = 0; o < bytes; o += 4096)
        ((volatile char *)p)[o] = 1;
    return p;
}

void pdl_ceiling_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes);
}

/* ---------------------------------------------------------------- memcpy */

struct pdl_ceiling_memcpy {
    int threads;
    pthread_t *tid;
    pthread_barrier_t start, end;
    /* job, published before `start` and read after it (the barrier orders the accesses) */
    uint8_t *dst;
    const uint8_t *src;
    size_t bytes;
    int stream; /* use the streaming copy instead of memcpy */
    int quit;
};

static void copy_part(pdl_ceiling_memcpy_t *c, int idx)
{
    size_t part = (c->bytes / (size_t)c->threads + 63) & ~(size_t)63;
    size_t off = part * (size_t)idx;
    if (off >= c->bytes)
        return;
    size_t n = c->bytes - off < part ? c->bytes - off : part;
    if (c->stream)
        pdl__copy_stream(c->dst + off, c->src + off, n);
    else
        memcpy(c->dst + off, c->src + off, n);
}

typedef struct helper_arg {
    pdl_ceiling_memcpy_t *c;
    int idx;
} helper_arg_t;

static void *helper(void *arg)
{
    helper_arg_t a = *(helper_arg_t *)arg;
    free(arg);
    for (;;) {
        pthread_barrier_wait(&a.c->start);
        if (a.c->quit)
            break;
        copy_part(a.c, a.idx);
        pthread_barrier_wait(&a.c->end);
    }
    return NULL;
}

pdl_ceiling_memcpy_t *pdl_ceiling_memcpy_create(int threads)
{
    if (threads < 1 || threads > 64)
        return NULL;
    pdl_ceiling_memcpy_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->threads = threads;
    c->tid = calloc((size_t)threads, sizeof(pthread_t));
    pthread_barrier_init(&c->start, NULL, (unsigned)threads);
    pthread_barrier_init(&c->end, NULL, (unsigned)threads);
    for (int i = 1; i < threads; i++) {
        helper_arg_t *a = malloc(sizeof(*a));
        a->c = c;
        a->idx = i;
        pthread_create(&c->tid[i], NULL, helper, a);
    }
    return c;
}

static void copy_once(pdl_ceiling_memcpy_t *c, uint8_t *dst, const uint8_t *src, size_t bytes)
{
    if (c->threads == 1 || bytes < PDL_CEILING_SPLIT_MIN) {
        if (c->stream)
            pdl__copy_stream(dst, src, bytes);
        else
            memcpy(dst, src, bytes);
        return;
    }
    c->dst = dst;
    c->src = src;
    c->bytes = bytes;
    pthread_barrier_wait(&c->start);
    copy_part(c, 0);
    pthread_barrier_wait(&c->end);
}

double pdl_ceiling_memcpy_run(pdl_ceiling_memcpy_t *c, void *dst, const void *src, size_t bytes, int reps)
{
    if (c == NULL || bytes == 0 || reps < 1)
        return -1;
    double best = 0;
    /* glibc memcpy, and for copies larger than the caches also the streaming copy: the ceiling is the
     * faster of the two (glibc picks its fast large-copy path only above a size it derives from cache
     * sizes this VM does not report, so either may win; see src/common/copy.c). */
    size_t per_thread = c->threads == 1 || bytes < PDL_CEILING_SPLIT_MIN ? bytes : bytes / (size_t)c->threads;
    int modes = per_thread >= PDL_COPY_STREAM_MIN_CHUNK && pdl__copy_stream_ok() ? 2 : 1;
    for (int m = 0; m < modes; m++) {
        c->stream = m;
        copy_once(c, dst, src, bytes); /* warm-up, not timed */
        double t0 = now_s();
        for (int r = 0; r < reps; r++)
            copy_once(c, dst, src, bytes);
        double t = now_s() - t0;
        /* Keep the compiler from treating the copies as dead. */
        __asm__ __volatile__("" : : "r"(dst) : "memory");
        double g = (double)bytes * reps / t / 1e9;
        if (g > best)
            best = g;
    }
    c->stream = 0;
    return best;
}

void pdl_ceiling_memcpy_destroy(pdl_ceiling_memcpy_t *c)
{
    if (c == NULL)
        return;
    if (c->threads > 1) {
        c->quit = 1;
        pthread_barrier_wait(&c->start);
        for (int i = 1; i < c->threads; i++)
            pthread_join(c->tid[i], NULL);
    }
    pthread_barrier_destroy(&c->start);
    pthread_barrier_destroy(&c->end);
    free(c->tid);
    free(c);
}

double pdl_ceiling_memcpy_gbps(size_t bytes, int threads, int reps)
{
    uint8_t *a = pdl_ceiling_alloc(bytes), *b = pdl_ceiling_alloc(bytes);
    pdl_ceiling_memcpy_t *c = pdl_ceiling_memcpy_create(threads);
    double r = -1;
    if (a && b && c)
        r = pdl_ceiling_memcpy_run(c, a, b, bytes, reps);
    pdl_ceiling_memcpy_destroy(c);
    pdl_ceiling_free(a, bytes);
    pdl_ceiling_free(b, bytes);
    return r;
}

/* ---------------------------------------------------------------- TCP stream */

#define WARM_PER_STREAM (16u << 20)
#define RECV_CHUNK (256u << 10)

struct pdl_ceiling_tcp {
    int streams;
    int *tx_fd, *rx_fd; /* connected pairs: stream i sends on tx_fd[i] and receives on rx_fd[i] */
};

typedef struct stream {
    int fd;
    uint8_t *buf;
    size_t buf_len, write_size;
    size_t warm, bytes;    /* untimed, then timed bytes */
    pthread_barrier_t *go; /* all threads; crossed after the warm-up */
    int rc;
} stream_t;

static int move(int fd, uint8_t *buf, size_t buf_len, size_t chunk, size_t total, int sending)
{
    size_t done = 0, pos = 0;
    while (done < total) {
        size_t n = total - done < chunk ? total - done : chunk;
        if (pos + n > buf_len)
            pos = 0;
        ssize_t r = sending ? send(fd, buf + pos, n, MSG_NOSIGNAL) : recv(fd, buf + pos, n, MSG_WAITALL);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        done += (size_t)r;
        pos += (size_t)r;
    }
    return 0;
}

static void *sender(void *arg)
{
    stream_t *s = arg;
    s->rc = move(s->fd, s->buf, s->buf_len, s->write_size, s->warm, 1);
    pthread_barrier_wait(s->go);
    if (s->rc == 0)
        s->rc = move(s->fd, s->buf, s->buf_len, s->write_size, s->bytes, 1);
    return NULL;
}

static void *receiver(void *arg)
{
    stream_t *s = arg;
    /* Reads of RECV_CHUNK: one huge MSG_WAITALL read keeps the socket locked while it copies and
     * delays window updates (measured in src/engine/tcp.c); the ceiling must not handicap itself. */
    size_t rc = s->write_size < RECV_CHUNK ? s->write_size : RECV_CHUNK;
    s->rc = move(s->fd, s->buf, s->buf_len, rc, s->warm, 0);
    pthread_barrier_wait(s->go);
    if (s->rc == 0)
        s->rc = move(s->fd, s->buf, s->buf_len, rc, s->bytes, 0);
    return NULL;
}

void pdl_ceiling_tcp_destroy(pdl_ceiling_tcp_t *t)
{
    if (t == NULL)
        return;
    for (int i = 0; i < t->streams; i++) {
        if (t->tx_fd[i] >= 0)
            close(t->tx_fd[i]);
        if (t->rx_fd[i] >= 0)
            close(t->rx_fd[i]);
    }
    free(t->tx_fd);
    free(t->rx_fd);
    free(t);
}

pdl_ceiling_tcp_t *pdl_ceiling_tcp_create(const char *host, int streams, const char *cc)
{
    if (streams < 1 || streams > 64)
        return NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, "0", &hints, &ai) != 0) {
        fprintf(stderr, "tcp ceiling: cannot resolve %s\n", host);
        return NULL;
    }
    int lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (lfd < 0 || bind(lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(lfd, 64) != 0 ||
        getsockname(lfd, (struct sockaddr *)&ss, &sl) != 0) {
        fprintf(stderr, "tcp ceiling: listen on %s: %s\n", host, strerror(errno));
        if (lfd >= 0)
            close(lfd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    pdl_ceiling_tcp_t *t = calloc(1, sizeof(*t));
    if (t == NULL || (t->tx_fd = malloc((size_t)streams * sizeof(int))) == NULL ||
        (t->rx_fd = malloc((size_t)streams * sizeof(int))) == NULL) {
        if (t)
            free(t->tx_fd);
        free(t);
        close(lfd);
        return NULL;
    }
    t->streams = streams;
    for (int i = 0; i < streams; i++)
        t->tx_fd[i] = t->rx_fd[i] = -1;
    for (int i = 0; i < streams; i++) {
        int cfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        t->tx_fd[i] = cfd;
        if (cfd < 0 || connect(cfd, (struct sockaddr *)&ss, sl) != 0 ||
            (t->rx_fd[i] = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0) {
            fprintf(stderr, "tcp ceiling: connect to %s: %s\n", host, strerror(errno));
            goto fail;
        }
        int one = 1;
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(t->rx_fd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (cc != NULL && cc[0] != '\0' &&
            (setsockopt(cfd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) != 0 ||
             setsockopt(t->rx_fd[i], IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) != 0)) {
            fprintf(stderr, "tcp ceiling: congestion control %s: %s\n", cc, strerror(errno));
            goto fail;
        }
    }
    close(lfd);
    return t;
fail:
    close(lfd);
    pdl_ceiling_tcp_destroy(t);
    return NULL;
}

double pdl_ceiling_tcp_run(pdl_ceiling_tcp_t *t, void *dst, const void *src, size_t buf_bytes, size_t total_bytes,
                           size_t write_size)
{
    if (t == NULL || dst == NULL || src == NULL || write_size == 0 || total_bytes == 0)
        return -1;
    int n = t->streams;
    size_t slice = buf_bytes / (size_t)n & ~(size_t)4095;
    if (slice < write_size)
        return -1;
    /* One untimed pass over each stream's slice (at most 16 MiB) right before the timed bytes: it
     * warms the buffers as the engine's warm-up batches warm its own (docs/benchmarks.md#this-machine), and keeps the
     * connection's window and congestion state as grown as a busy engine connection's. */
    size_t warm = slice < WARM_PER_STREAM ? slice : WARM_PER_STREAM;
    stream_t *tx = calloc((size_t)n, sizeof(*tx)), *rx = calloc((size_t)n, sizeof(*rx));
    pthread_t *tt = calloc((size_t)n * 2, sizeof(pthread_t));
    double result = -1;
    pthread_barrier_t go;
    if (tx == NULL || rx == NULL || tt == NULL)
        goto out;
    pthread_barrier_init(&go, NULL, (unsigned)n * 2 + 1);
    for (int i = 0; i < n; i++) {
        size_t share = total_bytes / (size_t)n + (i == 0 ? total_bytes % (size_t)n : 0);
        tx[i] = (stream_t){t->tx_fd[i], (uint8_t *)src + (size_t)i * slice, slice, write_size, warm, share, &go, 0};
        rx[i] = (stream_t){t->rx_fd[i], (uint8_t *)dst + (size_t)i * slice, slice, write_size, warm, share, &go, 0};
        pthread_create(&tt[2 * i], NULL, sender, &tx[i]);
        pthread_create(&tt[2 * i + 1], NULL, receiver, &rx[i]);
    }
    pthread_barrier_wait(&go);
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        pthread_join(tt[2 * i + 1], NULL); /* the receivers finish last */
    double secs = now_s() - t0;
    int ok = 1;
    for (int i = 0; i < n; i++) {
        pthread_join(tt[2 * i], NULL);
        if (tx[i].rc || rx[i].rc)
            ok = 0;
    }
    pthread_barrier_destroy(&go);
    if (ok)
        result = (double)total_bytes / secs / 1e9;
    else
        fprintf(stderr, "tcp ceiling: stream failed: %s\n", strerror(errno));
out:
    free(tx);
    free(rx);
    free(tt);
    return result;
}

double pdl_ceiling_tcp_gbps(const char *host, size_t total_bytes, size_t write_size, int streams)
{
    if (streams < 1 || streams > 64 || write_size == 0 || total_bytes == 0)
        return -1;
    size_t buf_len = 64u << 20;
    if (buf_len > total_bytes / (size_t)streams + write_size)
        buf_len = total_bytes / (size_t)streams + write_size;
    return pdl_ceiling_tcp_gbps_buf(host, total_bytes, write_size, streams, buf_len);
}

double pdl_ceiling_tcp_gbps_buf(const char *host, size_t total_bytes, size_t write_size, int streams,
                                size_t buf_len)
{
    return pdl_ceiling_tcp_gbps_cc(host, total_bytes, write_size, streams, buf_len, NULL);
}

double pdl_ceiling_tcp_gbps_cc(const char *host, size_t total_bytes, size_t write_size, int streams,
                               size_t buf_len, const char *cc)
{
    if (streams < 1 || streams > 64 || write_size == 0 || total_bytes == 0)
        return -1;
    /* Each stream gets a slice of at least one write, page-aligned. */
    size_t slice = ((buf_len / (size_t)streams < write_size ? write_size : buf_len / (size_t)streams) + 4095) &
                   ~(size_t)4095;
    size_t len = slice * (size_t)streams;
    pdl_ceiling_tcp_t *t = pdl_ceiling_tcp_create(host, streams, cc);
    uint8_t *src = pdl_ceiling_alloc(len), *dst = pdl_ceiling_alloc(len);
    double r = -1;
    /* A fresh connection first moves 16 MiB per stream untimed (slow start, window autotuning). */
    if (t && src && dst && pdl_ceiling_tcp_run(t, dst, src, len, (size_t)WARM_PER_STREAM * (size_t)streams, write_size) > 0)
        r = pdl_ceiling_tcp_run(t, dst, src, len, total_bytes, write_size);
    pdl_ceiling_tcp_destroy(t);
    pdl_ceiling_free(src, len);
    pdl_ceiling_free(dst, len);
    return r;
}

bool pdl_ceiling_is_memcpy(const char *backend)
{
    if (strcmp(backend, "shm") == 0)
        return true;
    if (strcmp(backend, "ucx") != 0)
        return false;
    const char *tls = getenv("UCX_TLS");
    if (tls == NULL || tls[0] == '\0' || tls[0] == '^') /* UCX's default (or an exclusion list): sm on one host */
        return true;
    /* UCX's names for its intra-host transports and the aliases that include them. */
    static const char *const sm[] = {"all", "sm", "shm", "mm", "posix", "sysv", "cma", "knem", "xpmem"};
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", tls);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save))
        for (size_t i = 0; i < sizeof(sm) / sizeof(sm[0]); i++)
            if (strcmp(t, sm[i]) == 0)
                return true;
    return false;
}
