/*
 * test_app_http.c -- the libmicrohttpd glue shared by pdlink-node and pdlink-router (src/app/http.c),
 * over loopback with libcurl: the handler sees the whole body, a body over max_body arrives as
 * too_large (and the handler's 413 reaches the client), request headers are readable, X-Request-Id is
 * set on replies, a streamed body is pulled through the reader with the given headers and its free
 * function runs once, and a host that does not resolve is an error naming the flag.
 *
 * Limits: hundreds of idle connections hold no thread and do not keep /health or a POST from being
 * answered, and are closed by the idle timeout (seen by reading EOF on each, with a deadline only as the
 * failure bound); one client past its per-client limit is cut off while another address is still
 * served; a body over the budget is refused while another body is held and accepted once it is freed;
 * a stream whose reader blocks holds a worker, not the polling thread; requests beyond the workers wait
 * for one. In a child with a low RLIMIT_NOFILE, more idle connections than descriptors leave the
 * listener near idle, its log short, and /health answered once they are closed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "app/http.h"
#include "test_client.h"
#include "test_proc.h"

typedef struct stream_state {
    int chunks_left;
    atomic_int *freed;
} stream_state_t;

#define SMALL_LIMITS                                                                                             \
    {.idle_timeout_s = 60, .max_connections = 16, .threads = 1, .workers = 4, .body_budget = 1 << 20}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream_state_t *s = cls;
    if (s->chunks_left == 0)
        return PDL_HTTP_STREAM_END;
    s->chunks_left--;
    return (ssize_t)snprintf(buf, max, "data: %d\n\n", s->chunks_left);
}

static void stream_free(void *cls)
{
    stream_state_t *s = cls;
    atomic_fetch_add(s->freed, 1);
    free(s);
}

/* A door the tests hold shut to keep a handler (or a stream's reader) blocked, and open to release it. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inside; /* handlers or readers waiting at the gate */
    bool open;
} gate_t;

static gate_t g_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false};

static void gate_wait(gate_t *g)
{
    pthread_mutex_lock(&g->mu);
    g->inside++;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    g->inside--;
    pthread_mutex_unlock(&g->mu);
}

/* Wait until n callers are inside the gate (no deadline: ctest's timeout bounds a hang). */
static void gate_until_inside(gate_t *g, int n)
{
    pthread_mutex_lock(&g->mu);
    while (g->inside < n)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_set(gate_t *g, bool open)
{
    pthread_mutex_lock(&g->mu);
    g->open = open;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static ssize_t gated_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)cls;
    if (pos > 0)
        return PDL_HTTP_STREAM_END;
    gate_wait(&g_gate);
    return (ssize_t)snprintf(buf, max, "late");
}

static void no_free(void *cls)
{
    (void)cls;
}

static int handler(void *cls, const pdl_http_request_t *req)
{
    atomic_int *freed = cls;
    if (req->over_budget)
        return pdl_http_replyf(req->conn, 503, "over budget");
    if (strcmp(req->url, "/health") == 0)
        return pdl_http_reply(req->conn, 200, NULL, "", 0, NULL);
    if (strcmp(req->url, "/hold") == 0) {
        gate_wait(&g_gate);
        return pdl_http_replyf(req->conn, 200, "held %zu", req->len);
    }
    if (strcmp(req->url, "/slow-stream") == 0)
        return pdl_http_reply_stream(req->conn, 200, PDL_HTTP_SIZE_UNKNOWN, gated_read, NULL, no_free, NULL, 0);
    if (req->too_large)
        return pdl_http_replyf(req->conn, 413, "too large");
    if (strcmp(req->url, "/echo") == 0) {
        const char *rid = pdl_http_header(req, "x-request-id");
        return pdl_http_reply(req->conn, 200, "text/x-test", req->body, req->len, rid);
    }
    if (strcmp(req->url, "/json") == 0)
        return pdl_http_reply_json(req->conn, 201, json_pack("{s:s, s:I}", "method", req->method, "len",
                                                             (json_int_t)req->len), NULL);
    if (strcmp(req->url, "/stream") == 0) {
        stream_state_t *s = calloc(1, sizeof(*s));
        s->chunks_left = 3;
        s->freed = freed;
        const char *const headers[] = {"Content-Type: text/event-stream", "X-Extra:  spaced", "bad header"};
        return pdl_http_reply_stream(req->conn, 200, PDL_HTTP_SIZE_UNKNOWN, stream_read, s, stream_free, headers, 3);
    }
    return pdl_http_replyf(req->conn, 404, "no route %s %s", req->method, req->url);
}

typedef struct fetched {
    long status;
    char body[4096];
    size_t len;
    char headers[4096];
    size_t hlen;
} fetched_t;

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    fetched_t *f = ud;
    size_t k = size * n;
    if (f->len + k < sizeof(f->body)) {
        memcpy(f->body + f->len, p, k);
        f->len += k;
        f->body[f->len] = '\0';
    }
    return k;
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
    fetched_t *f = ud;
    size_t k = size * n;
    if (f->hlen + k < sizeof(f->headers)) {
        memcpy(f->headers + f->hlen, p, k);
        f->hlen += k;
        f->headers[f->hlen] = '\0';
    }
    return k;
}

static void fetch(int port, const char *path, const char *post, const char *header, fetched_t *f)
{
    memset(f, 0, sizeof(*f));
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
    CURL *e = curl_easy_init();
    assert_non_null(e);
    struct curl_slist *h = header ? curl_slist_append(NULL, header) : NULL;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, f);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L);
    if (post != NULL)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, post);
    assert_int_equal(curl_easy_perform(e), CURLE_OK);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &f->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
}

static void serves_bodies_headers_and_streams(void **state)
{
    (void)state;
    atomic_int freed = 0;
    const pdl_http_params_t p = {.host = "127.0.0.1", .port = 0, .what = "--host", .max_body = 16,
                                 .limits = SMALL_LIMITS, .handler = handler, .refuse = handler, .cls = &freed};
    pdl_http_t *http = NULL;
    int port = 0;
    pdl_error_t err;
    assert_int_equal(pdl_http_start(&p, &http, &port, &err), PDL_OK);
    assert_true(port > 0);
    fetched_t f;

    fetch(port, "/echo", "0123456789abcdef", "X-Request-Id: r-1", &f); /* exactly max_body */
    assert_int_equal(f.status, 200);
    assert_string_equal(f.body, "0123456789abcdef");
    assert_non_null(strstr(f.headers, "X-Request-Id: r-1\r\n"));
    assert_non_null(strstr(f.headers, "Content-Type: text/x-test\r\n"));

    fetch(port, "/echo", "0123456789abcdefg", NULL, &f); /* one byte over */
    assert_int_equal(f.status, 413);
    assert_string_equal(f.body, "too large");

    fetch(port, "/json", NULL, NULL, &f);
    assert_int_equal(f.status, 201);
    assert_string_equal(f.body, "{\"method\":\"GET\",\"len\":0}");

    fetch(port, "/stream", NULL, NULL, &f);
    assert_int_equal(f.status, 200);
    assert_string_equal(f.body, "data: 2\n\ndata: 1\n\ndata: 0\n\n");
    assert_non_null(strstr(f.headers, "X-Extra: spaced\r\n"));
    assert_null(strstr(f.headers, "bad header"));

    fetch(port, "/nowhere", "x", NULL, &f);
    assert_int_equal(f.status, 404);
    assert_string_equal(f.body, "no route POST /nowhere");

    pdl_http_stop(http);
    assert_int_equal(atomic_load(&freed), 1);
}

static void unresolvable_host_names_the_flag(void **state)
{
    (void)state;
    const pdl_http_params_t p = {.host = "no-such-host.invalid", .port = 0, .what = "--prometheus-host",
                                 .max_body = 16, .limits = SMALL_LIMITS, .handler = handler};
    pdl_http_t *http = NULL;
    int port = 0;
    pdl_error_t err;
    assert_int_equal(pdl_http_start(&p, &http, &port, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "--prometheus-host 'no-such-host.invalid': cannot resolve"));
    assert_null(http);
}


/* ---- limits ---------------------------------------------------------------------------------------- */

static int count_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Read until every socket in fds[0, n) has been closed by the server (EOF or reset); returns how many were
 * closed before deadline_ms (only a bound for the failure case). */
static int wait_closed(const int *fds, int n, uint64_t deadline_ms)
{
    struct pollfd *p = calloc((size_t)n, sizeof(*p));
    assert_non_null(p);
    for (int i = 0; i < n; i++)
        p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    int closed = 0;
    while (closed < n && mono_ms() < deadline_ms) {
        int r = poll(p, (nfds_t)n, 200);
        if (r <= 0)
            continue;
        for (int i = 0; i < n; i++) {
            if (p[i].fd < 0 || p[i].revents == 0)
                continue;
            char c;
            ssize_t k = recv(p[i].fd, &c, 1, MSG_DONTWAIT);
            if (k <= 0) {
                closed++;
                p[i].fd = -1;
            }
        }
    }
    free(p);
    return closed;
}

static void idle_connections_hold_no_thread_and_time_out(void **state)
{
    (void)state;
    enum { N = 300 };
    const pdl_http_params_t p = {
        .host = "127.0.0.1", .port = 0, .what = "--host", .max_body = 1024,
        .limits = {.idle_timeout_s = 2, .max_connections = 1024, .max_per_client = N, .threads = 2, .workers = 8,
                   .body_budget = 1 << 20}, /* N from one address: above the default quarter */
        .handler = handler};
    pdl_http_t *http = NULL;
    int port = 0;
    pdl_error_t err;
    assert_int_equal(pdl_http_start(&p, &http, &port, &err), PDL_OK);
    int before = count_threads();
    static int fds[N];
    for (int i = 0; i < N; i++)
        fds[i] = tcl_connect_from("127.0.0.2", port);
    pdl_http_stats_t st;
    do { /* accepted asynchronously; ctest's timeout bounds a failure */
        pdl_http_stats(http, &st);
        usleep(1000);
    } while (st.connections < N);
    fetched_t f;
    fetch(port, "/health", NULL, NULL, &f);
    assert_int_equal(f.status, 200);
    fetch(port, "/echo", "still served", NULL, &f);
    assert_int_equal(f.status, 200);
    assert_string_equal(f.body, "still served");
    pdl_http_stats(http, &st);
    assert_true(st.connections >= N); /* all still held... */
    /* ...by the polling threads: only the one worker the two requests needed was started. A thread per
     * connection would be N more. */
    assert_true(count_threads() <= before + 2);
    assert_true(st.workers >= 1 && st.workers <= 2); /* a second if the first was not idle again yet */
    /* MHD closes each after 2 s of silence; 60 s is only the failure bound. */
    assert_int_equal(wait_closed(fds, N, mono_ms() + 60000), N);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    fetch(port, "/health", NULL, NULL, &f);
    assert_int_equal(f.status, 200);
    pdl_http_stop(http);
}

static void one_client_is_cut_off_at_its_limit(void **state)
{
    (void)state;
    enum { LIMIT = 8, N = 20 };
    const pdl_http_params_t p = {
        .host = "127.0.0.1", .port = 0, .what = "--host", .max_body = 1024,
        .limits = {.idle_timeout_s = 60, .max_connections = 64, .max_per_client = LIMIT, .threads = 1,
                   .workers = 2, .body_budget = 1 << 20},
        .handler = handler};
    pdl_http_t *http = NULL;
    int port = 0;
    pdl_error_t err;
    assert_int_equal(pdl_http_start(&p, &http, &port, &err), PDL_OK);
    int fds[N];
    for (int i = 0; i < N; i++)
        fds[i] = tcl_connect_from("127.0.0.2", port);
    /* The kernel completes every handshake; MHD then closes the ones past the limit at once. */
    assert_int_equal(wait_closed(fds + LIMIT, N - LIMIT, mono_ms() + 30000), N - LIMIT);
    fetched_t f;
    fetch(port, "/health", NULL, NULL, &f); /* another address still gets in */
    assert_int_equal(f.status, 200);
    pdl_http_stats_t st;
    pdl_http_stats(http, &st);
    /* The first LIMIT stay; the fetch's own connection may not be reaped yet. */
    assert_true(st.connections >= LIMIT && st.connections <= LIMIT + 1);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    pdl_http_stop(http);
}

typedef struct bg_fetch {
    int port;
    const char *path, *post;
    fetched_t f;
    pthread_t t;
} bg_fetch_t;

static void *bg_fetch_main(void *arg)
{
    bg_fetch_t *b = arg;
    fetch(b->port, b->path, b->post, NULL, &b->f);
    return NULL;
}

static void bg_start(bg_fetch_t *b, int port, const char *path, const char *post)
{
    b->port = port;
    b->path = path;
    b->post = post;
    assert_int_equal(pthread_create(&b->t, NULL, bg_fetch_main, b), 0);
}

/* True once no request body is charged to the budget; false at deadline_ms from now. */
static bool budget_drains(pdl_http_t *http, int deadline_ms)
{
    for (int waited = 0; waited < deadline_ms; waited += 10) {
        pdl_http_stats_t st;
        pdl_http_stats(http, &st);
        if (st.body_bytes == 0)
            return true;
        usleep(10000);
    }
    return false;
}

static void body_over_budget_is_refused_until_one_is_freed(void **state)
{
    (void)state;
    gate_set(&g_gate, false);
    const pdl_http_params_t p = {
        .host = "127.0.0.1", .port = 0, .what = "--host", .max_body = 100,
        .limits = {.idle_timeout_s = 60, .max_connections = 64, .threads = 1, .workers = 4, .body_budget = 100},
        .handler = handler};
    pdl_http_t *http = NULL;
    int port = 0;
    pdl_error_t err;
    assert_int_equal(pdl_http_start(&p, &http, &port, &err), PDL_OK);
    static const char body60[] = "012345678901234567890123456789012345678901234567890123456789";
    bg_fetch_t held;
    bg_start(&held, port, "/hold", body60);
    gate_until_inside(&g_gate, 1); /* its 60 bytes received are charged while the handler runs */
    pdl_http_stats_t st;
    pdl_http_stats(http, &st);
    assert_int_equal(st.body_bytes, 60);
    fetched_t f;
    fetch(port, "/echo", body60, NULL, &f);
    assert_int_equal(f.status, 503);
    assert_string_equal(f.body, "over budget");
    gate_set(&g_gate, true);
    pthread_join(held.t, NULL);
    assert_int_equal(held.f.status, 200);
    assert_string_equal(held.f.body, "held 60");
    /* A body is uncharged when MHD completes its connection, which may come just after the client has
     * read the answer: wait for it (the deadline only bounds a failure). */
    assert_true(budget_drains(http, 30000));
    fetch(port, "/echo", body60, NULL, &f); /* the budget came back */
    assert_int_equal(f.status, 200);
    assert_true(budget_drains(http, 30000));
    pdl_http_stats(http, &st);
    assert_int_equal(st.refused_body, 1);
    pdl_http_stop(http);
}

static void blocked_streams_and_handlers_hold_workers_not_the_poller(void **state)
{
    (void)state;
    gate_set(&g_gate, false);
    const pdl_http_params_t p = {
        .host = "127.0.0.1", .port = 0, .what = "--host", .max_body = 100,
        .limits = {.idle_timeout_s = 60, .max_connections = 64, .threads = 1, .workers = 3, .body_budget = 1000},
        .handler = handler};
    pdl_http_t *http = NULL;
    int port = 0;
    pdl_error_t err;
    assert_int_equal(pdl_http_start(&p, &http, &port, &err), PDL_OK);
    bg_fetch_t stream, hold, queued;
    bg_start(&stream, port, "/slow-stream", NULL);
    bg_start(&hold, port, "/hold", "x");
    gate_until_inside(&g_gate, 2);
    /* One polling thread, its stream's reader blocked: the third worker still answers. */
    fetched_t f;
    fetch(port, "/health", NULL, NULL, &f);
    assert_int_equal(f.status, 200);
    bg_start(&queued, port, "/hold", "yz");
    gate_until_inside(&g_gate, 3); /* the third worker took it */
    pdl_http_stats_t st;
    pdl_http_stats(http, &st);
    assert_int_equal(st.workers, 3);
    assert_int_equal(st.busy, 3);
    gate_set(&g_gate, true);
    pthread_join(stream.t, NULL);
    pthread_join(hold.t, NULL);
    pthread_join(queued.t, NULL);
    assert_int_equal(stream.f.status, 200);
    assert_string_equal(stream.f.body, "late");
    assert_string_equal(hold.f.body, "held 1");
    assert_string_equal(queued.f.body, "held 2");
    pdl_http_stop(http);
}

static void requests_beyond_the_workers_wait_for_one(void **state)
{
    (void)state;
    gate_set(&g_gate, false);
    const pdl_http_params_t p = {
        .host = "127.0.0.1", .port = 0, .what = "--host", .max_body = 100,
        .limits = {.idle_timeout_s = 1, .max_connections = 64, .threads = 1, .workers = 1, .body_budget = 1000},
        .handler = handler};
    pdl_http_t *http = NULL;
    int port = 0;
    pdl_error_t err;
    assert_int_equal(pdl_http_start(&p, &http, &port, &err), PDL_OK);
    bg_fetch_t first, second;
    bg_start(&first, port, "/hold", "a");
    gate_until_inside(&g_gate, 1);
    bg_start(&second, port, "/echo", "b");
    /* The second waits suspended for the only worker (and is not timed out meanwhile, though the idle
     * timeout is 1 s); it is queued once its body is in. */
    for (;;) {
        pdl_http_stats_t st;
        pdl_http_stats(http, &st);
        if (st.queued == 1)
            break;
        usleep(1000);
    }
    gate_set(&g_gate, true);
    pthread_join(first.t, NULL);
    pthread_join(second.t, NULL);
    assert_string_equal(first.f.body, "held 1");
    assert_int_equal(second.f.status, 200);
    assert_string_equal(second.f.body, "b");
    pdl_http_stop(http);
}

static __attribute__((unused)) void out_of_descriptors_the_listener_idles(void **state)
{
    (void)state;
    enum { NOFILE = 256, N = 300 };
    int portpipe[2], stoppipe[2];
    assert_int_equal(pipe(portpipe), 0);
    assert_int_equal(pipe(stoppipe), 0);
    char logpath[] = "/tmp/test_app_http_log_XXXXXX";
    int logfd = mkstemp(logpath);
    assert_true(logfd >= 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The child: a listener whose process has 256 descriptors, asked for 4096 connections. */
        /* Only the log (as stderr) and the two pipe ends: descriptors inherited from the test process
         * would otherwise fill the 256 numbers the child may use. */
        dup2(logfd, 2);
        dup2(portpipe[1], 3);
        dup2(stoppipe[0], 4);
        portpipe[1] = 3;
        stoppipe[0] = 4;
        for (long fd = 5, max = sysconf(_SC_OPEN_MAX); fd < max; fd++)
            close((int)fd);
        struct rlimit rl = {NOFILE, NOFILE};
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(3);
        const pdl_http_params_t p = {
            .host = "127.0.0.1", .port = 0, .what = "--host", .max_body = 100,
            .limits = {.idle_timeout_s = 3, .max_connections = 4096, .threads = 2, .workers = 4, .body_budget = 1000},
            .handler = handler};
        pdl_http_t *http = NULL;
        int port = 0;
        pdl_error_t err;
        if (pdl_http_start(&p, &http, &port, &err) != PDL_OK)
            _exit(4);
        if (write(portpipe[1], &port, sizeof(port)) != sizeof(port))
            _exit(5);
        char c;
        while (read(stoppipe[0], &c, 1) > 0) {
        }
        pdl_http_stop(http);
        _exit(0);
    }
    close(stoppipe[0]);
    int port = 0;
    assert_int_equal(read(portpipe[0], &port, sizeof(port)), (ssize_t)sizeof(port));
    /* More connections than the child has descriptors, from two addresses so neither client's limit
     * alone refuses them all. Every connect succeeds: the kernel queues what MHD does not accept. */
    static int fds[N];
    for (int i = 0; i < N; i++)
        fds[i] = tcl_connect_from(i % 2 ? "127.0.0.2" : "127.0.0.3", port);
    long t0 = tp_cpu_ticks(pid);
    uint64_t w0 = mono_ms();
    /* All are closed in the end (over a limit at once, the rest by the 3 s idle timeout, the queued ones
     * once accepted and idle in turn); 120 s is only the failure bound. */
    assert_int_equal(wait_closed(fds, N, mono_ms() + 120000), N);
    long ticks = tp_cpu_ticks(pid) - t0;
    uint64_t wall = mono_ms() - w0;
    long hz = sysconf(_SC_CLK_TCK);
    /* A listener spinning on EMFILE burns a whole core: as many ticks as wall time. Idle, a few. */
    assert_true(ticks * 1000 < (long)wall * hz / 4);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    fetched_t f;
    fetch(port, "/health", NULL, NULL, &f);
    assert_int_equal(f.status, 200);
    close(stoppipe[1]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* The log is bounded: the lowered limit, and at most a couple of rate-limited lines. */
    FILE *lf = fopen(logpath, "r");
    assert_non_null(lf);
    int lines = 0, lowered = 0;
    char line[1024];
    while (fgets(line, sizeof(line), lf) != NULL) {
        lines++;
        lowered += strstr(line, "--http-max-connections 4096 lowered to 96") != NULL;
    }
    fclose(lf);
    unlink(logpath);
    close(logfd);
    close(portpipe[0]);
    close(portpipe[1]);
    assert_int_equal(lowered, 1);
    assert_true(lines <= 1 + 2 + (int)(wall / 10000) + 1);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(serves_bodies_headers_and_streams),
        cmocka_unit_test(unresolvable_host_names_the_flag),
        cmocka_unit_test(idle_connections_hold_no_thread_and_time_out),
        cmocka_unit_test(one_client_is_cut_off_at_its_limit),
        cmocka_unit_test(body_over_budget_is_refused_until_one_is_freed),
        cmocka_unit_test(blocked_streams_and_handlers_hold_workers_not_the_poller),
        cmocka_unit_test(requests_beyond_the_workers_wait_for_one),
#if !defined(__SANITIZE_THREAD__)
        /* Forks a child that starts threads; TSan's runtime does not support that in a process that
         * already ran threads (the child hung), so the plain and ASan builds run it. */
        cmocka_unit_test(out_of_descriptors_the_listener_idles),
#endif
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
