/*
 * router_harness.h -- helpers for the pdlink-router integration tests (header-only, static).
 *
 * Starts pdlink-router and fake_vllm.py workers as child processes on ephemeral ports (each writes
 * its bound ports to a file in a private temp dir), talks HTTP with libcurl, sends raw discovery
 * frames with a ZeroMQ DEALER, and polls for conditions with generous deadlines instead of sleeping
 * for fixed times. Children are killed at exit by rh_cleanup().
 */
#ifndef PDL_TEST_ROUTER_HARNESS_H
#define PDL_TEST_ROUTER_HARNESS_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <msgpack.h>
#include <zmq.h>

extern char **environ;

#define RH_DEADLINE_MS 20000
#define RH_MAX_CHILDREN 64

typedef struct rh_state {
    char dir[256];
    pid_t children[RH_MAX_CHILDREN];
    int nchildren;
    int seq;
} rh_state_t;

static rh_state_t rh_g; /* test-process bookkeeping only (the children to reap at exit) */

static inline void rh_msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline long long rh_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void rh_cleanup(void)
{
    for (int i = 0; i < rh_g.nchildren; i++)
        if (rh_g.children[i] > 0) {
            kill(rh_g.children[i], SIGKILL);
            waitpid(rh_g.children[i], NULL, 0);
            rh_g.children[i] = 0;
        }
    if (rh_g.dir[0] && getenv("RH_KEEP") != NULL) {
        fprintf(stderr, "keeping %s\n", rh_g.dir);
        rh_g.dir[0] = '\0';
    }
    if (rh_g.dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rh_g.dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", rh_g.dir);
        rh_g.dir[0] = '\0';
    }
}

static inline const char *rh_dir(void)
{
    if (!rh_g.dir[0]) {
        snprintf(rh_g.dir, sizeof(rh_g.dir), "/tmp/pdl-router-test-XXXXXX");
        if (mkdtemp(rh_g.dir) == NULL) {
            perror("mkdtemp");
            exit(1);
        }
        atexit(rh_cleanup);
        curl_global_init(CURL_GLOBAL_DEFAULT);
        signal(SIGPIPE, SIG_IGN);
    }
    return rh_g.dir;
}

static inline const char *rh_env(const char *name, const char *fallback)
{
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

/* Spawn argv with stdout+stderr appended to log; returns the pid. */
static inline pid_t rh_spawn(char *const argv[], const char *log)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "posix_spawn %s: %s\n", argv[0], strerror(rc));
        return -1;
    }
    if (rh_g.nchildren < RH_MAX_CHILDREN)
        rh_g.children[rh_g.nchildren++] = pid;
    return pid;
}

/* SIGTERM and wait; returns the exit status (or 128+signal), -1 if it did not exit in time. */
static inline int rh_stop(pid_t pid, int sig)
{
    kill(pid, sig);
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    int st = 0;
    while (rh_now_ms() < end) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            for (int i = 0; i < rh_g.nchildren; i++)
                if (rh_g.children[i] == pid)
                    rh_g.children[i] = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        rh_msleep(10);
    }
    return -1;
}

/* Wait for a file to exist and read it (NUL-terminated, malloc'ed). */
static inline char *rh_wait_file(const char *path, pid_t child)
{
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    while (rh_now_ms() < end) {
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            char *buf = calloc(1, 4096);
            size_t n = fread(buf, 1, 4095, f);
            fclose(f);
            buf[n] = '\0';
            return buf;
        }
        if (child > 0 && waitpid(child, NULL, WNOHANG) == child) {
            fprintf(stderr, "child %d exited before writing %s\n", (int)child, path);
            return NULL;
        }
        rh_msleep(10);
    }
    return NULL;
}

typedef struct rh_router {
    pid_t pid;
    int http, disc, prom;
    char log[300];
} rh_router_t;

/* Start pdlink-router with the required flags plus the NULL-terminated extra args. */
static inline bool rh_router_start(rh_router_t *r, ...)
{
    char bin[600], pf[400], disc[] = "127.0.0.1:0";
    snprintf(bin, sizeof(bin), "%s/pdlink-router", rh_env("PDLINK_BUILD_DIR", "."));
    int id = rh_g.seq++;
    snprintf(pf, sizeof(pf), "%s/router%d.ports", rh_dir(), id);
    snprintf(r->log, sizeof(r->log), "%s/router%d.log", rh_dir(), id);
    char *argv[64] = {bin, "--vllm-pd-disaggregation", "--kv-connector", "moriio", "--vllm-discovery-address",
                      disc, "--host", "127.0.0.1", "--port", "0", "--prometheus-port", "0", "--port-file", pf};
    int n = 14;
    va_list ap;
    va_start(ap, r);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && n < 62)
        argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    r->pid = rh_spawn(argv, r->log);
    char *ports = rh_wait_file(pf, r->pid);
    if (ports == NULL)
        return false;
    int ok = sscanf(ports, "http=%d discovery=%d prometheus=%d", &r->http, &r->disc, &r->prom) == 3;
    free(ports);
    return ok;
}

typedef struct rh_fake {
    pid_t pid;
    int port;
    char log[300];
} rh_fake_t;

/* Start fake_vllm.py --role role registering at the router's discovery port, plus extra args. */
static inline bool rh_fake_start(rh_fake_t *f, const char *role, int disc_port, ...)
{
    char script[600], pf[400], disc[64];
    snprintf(script, sizeof(script), "%s/tests/integration/fake_vllm.py", rh_env("PDLINK_SOURCE_DIR", "."));
    int id = rh_g.seq++;
    snprintf(pf, sizeof(pf), "%s/fake%d.port", rh_dir(), id);
    snprintf(f->log, sizeof(f->log), "%s/fake%d.log", rh_dir(), id);
    snprintf(disc, sizeof(disc), "127.0.0.1:%d", disc_port);
    char *argv[64] = {"/usr/bin/python3", script, "--role", (char *)role, "--port-file", pf, "--ping-ms", "100"};
    int n = 8;
    if (disc_port > 0) {
        argv[n++] = "--discovery";
        argv[n++] = disc;
    }
    va_list ap;
    va_start(ap, disc_port);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && n < 62)
        argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    f->pid = rh_spawn(argv, f->log);
    char *port = rh_wait_file(pf, f->pid);
    if (port == NULL)
        return false;
    f->port = atoi(port);
    free(port);
    return f->port > 0;
}

/* ---- HTTP ------------------------------------------------------------------------------------ */

typedef struct rh_resp {
    long status;
    char *body;
    size_t len;
    char content_type[128];
    char failed_leg[128]; /* the router's X-Pdlink-Failed-Leg header, "" when absent */
    char served_prefill[128], served_decode[128]; /* its X-Pdlink-Prefill / X-Pdlink-Decode, "" when absent */
    CURLcode rc;
} rh_resp_t;

static inline size_t rh_on_body(char *p, size_t s, size_t n, void *ud)
{
    rh_resp_t *r = ud;
    size_t k = s * n;
    char *nb = realloc(r->body, r->len + k + 1);
    if (nb == NULL)
        return 0;
    r->body = nb;
    memcpy(r->body + r->len, p, k);
    r->len += k;
    r->body[r->len] = '\0';
    return k;
}

/* If header line p[0, k) is `name` (lower case, with its colon), its value into dst[cap]. */
static inline void rh_header_take(const char *p, size_t k, const char *name, char *dst, size_t cap)
{
    size_t nl = strlen(name);
    if (k <= nl || strncasecmp(p, name, nl) != 0)
        return;
    size_t a = nl, e = k;
    while (a < e && p[a] == ' ')
        a++;
    while (e > a && (p[e - 1] == '\r' || p[e - 1] == '\n'))
        e--;
    snprintf(dst, cap, "%.*s", (int)(e - a), p + a);
}

static inline size_t rh_on_header(char *p, size_t s, size_t n, void *ud)
{
    rh_resp_t *r = ud;
    size_t k = s * n;
    rh_header_take(p, k, "x-pdlink-failed-leg:", r->failed_leg, sizeof(r->failed_leg));
    rh_header_take(p, k, "x-pdlink-prefill:", r->served_prefill, sizeof(r->served_prefill));
    rh_header_take(p, k, "x-pdlink-decode:", r->served_decode, sizeof(r->served_decode));
    return k;
}

static inline void rh_resp_free(rh_resp_t *r)
{
    free(r->body);
    memset(r, 0, sizeof(*r));
}

/* GET when body is NULL, else POST with Content-Type application/json. */
static inline rh_resp_t rh_http(int port, const char *path, const char *body)
{
    rh_resp_t r = {0};
    r.body = calloc(1, 1);
    char url[512];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
    CURL *e = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 60000L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, rh_on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, rh_on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    if (body != NULL) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    r.rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r.status);
    char *ct = NULL;
    curl_easy_getinfo(e, CURLINFO_CONTENT_TYPE, &ct);
    if (ct)
        snprintf(r.content_type, sizeof(r.content_type), "%s", ct);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return r;
}

static inline json_t *rh_get_json(int port, const char *path)
{
    rh_resp_t r = rh_http(port, path, NULL);
    json_t *j = r.status == 200 ? json_loadb(r.body, r.len, 0, NULL) : NULL;
    rh_resp_free(&r);
    return j;
}

static inline long rh_status(int port, const char *path)
{
    rh_resp_t r = rh_http(port, path, NULL);
    long s = r.status;
    rh_resp_free(&r);
    return s;
}

/* Poll GET path until it returns want_status; true if it did before the deadline. */
static inline bool rh_wait_status(int port, const char *path, long want)
{
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    while (rh_now_ms() < end) {
        if (rh_status(port, path) == want)
            return true;
        rh_msleep(20);
    }
    return false;
}

/* The value of a metric line "name{labels} value" (exact series text before the space), -1 if absent. */
static inline double rh_metric(int port, const char *series)
{
    rh_resp_t r = rh_http(port, "/metrics", NULL);
    double v = -1;
    size_t sl = strlen(series);
    for (char *line = r.body; line && *line;) {
        char *nl = strchr(line, '\n');
        if (strncmp(line, series, sl) == 0 && line[sl] == ' ')
            v = atof(line + sl + 1);
        line = nl ? nl + 1 : NULL;
    }
    rh_resp_free(&r);
    return v;
}

static inline bool rh_wait_metric_ge(int port, const char *series, double want)
{
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    while (rh_now_ms() < end) {
        if (rh_metric(port, series) >= want)
            return true;
        rh_msleep(20);
    }
    return false;
}

/* The fake worker's recorded requests (array). */
static inline json_t *rh_fake_requests(const rh_fake_t *f) { return rh_get_json(f->port, "/_requests"); }

static inline bool rh_fake_control(const rh_fake_t *f, const char *json)
{
    rh_resp_t r = rh_http(f->port, "/_control", json);
    bool ok = r.status == 200;
    rh_resp_free(&r);
    return ok;
}

/* ---- discovery frames ------------------------------------------------------------------------ */

typedef struct rh_dealer {
    void *ctx, *sock;
} rh_dealer_t;

static inline bool rh_dealer_open(rh_dealer_t *d, int disc_port)
{
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", disc_port);
    d->ctx = zmq_ctx_new();
    d->sock = zmq_socket(d->ctx, ZMQ_DEALER);
    int linger = 2000;
    zmq_setsockopt(d->sock, ZMQ_LINGER, &linger, sizeof(linger));
    return zmq_connect(d->sock, ep) == 0;
}

static inline void rh_dealer_close(rh_dealer_t *d)
{
    zmq_close(d->sock);
    zmq_ctx_term(d->ctx);
}

static inline bool rh_send(rh_dealer_t *d, const void *buf, size_t len)
{
    return zmq_send(d->sock, buf, len, 0) == (int)len;
}

static inline void rh_pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* A msgpack map built key by key and sent as one frame: rh_map_begin(&m, number of keys), rh_map_str /
 * rh_map_int per key, then rh_map_send (which frees it, sent or not). */
typedef struct rh_map {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} rh_map_t;

static inline void rh_map_begin(rh_map_t *m, uint32_t nkeys)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
    msgpack_pack_map(&m->pk, nkeys);
}

static inline void rh_map_str(rh_map_t *m, const char *key, const char *value)
{
    rh_pack_str(&m->pk, key);
    rh_pack_str(&m->pk, value);
}

static inline void rh_map_int(rh_map_t *m, const char *key, int value)
{
    rh_pack_str(&m->pk, key);
    msgpack_pack_int(&m->pk, value);
}

static inline bool rh_map_send(rh_dealer_t *d, rh_map_t *m)
{
    bool ok = rh_send(d, m->sb.data, m->sb.size);
    msgpack_sbuffer_destroy(&m->sb);
    return ok;
}

/* Send a G2 registration (as vLLM's _ping does). */
static inline bool rh_send_g2(rh_dealer_t *d, const char *type, const char *http, const char *zmq_addr, int dp,
                              int tp, const char *mode)
{
    rh_map_t m;
    rh_map_begin(&m, 6);
    rh_map_str(&m, "type", type);
    rh_map_str(&m, "http_address", http);
    rh_map_str(&m, "zmq_address", zmq_addr);
    rh_map_int(&m, "dp_size", dp);
    rh_map_int(&m, "tp_size", tp);
    rh_map_str(&m, "transfer_mode", mode);
    return rh_map_send(d, &m);
}

/* Send a G1 registration (original MoRIIO format). */
static inline bool rh_send_g1(rh_dealer_t *d, const char *role, const char *request_address, int hs, int nt, int tp,
                              const char *mode)
{
    rh_map_t m;
    rh_map_begin(&m, 9);
    rh_map_str(&m, "type", "register");
    rh_map_str(&m, "role", role);
    rh_map_str(&m, "index", "0");
    rh_map_str(&m, "request_address", request_address);
    rh_map_int(&m, "handshake_port", hs);
    rh_map_int(&m, "notify_port", nt);
    rh_map_int(&m, "dp_size", 1);
    rh_map_int(&m, "tp_size", tp);
    rh_map_str(&m, "transfer_mode", mode);
    return rh_map_send(d, &m);
}

/* Find an entry of /workers' role array by http_address (borrowed), NULL if absent. */
static inline json_t *rh_worker(json_t *workers, const char *role, const char *http)
{
    json_t *arr = json_object_get(workers, role), *w;
    size_t i;
    json_array_foreach(arr, i, w)
    {
        if (strcmp(json_string_value(json_object_get(w, "http_address")), http) == 0)
            return w;
    }
    return NULL;
}

static inline size_t rh_nworkers(int http_port, const char *role)
{
    json_t *w = rh_get_json(http_port, "/workers");
    size_t n = w ? json_array_size(json_object_get(w, role)) : 0;
    json_decref(w);
    return n;
}

#endif /* PDL_TEST_ROUTER_HARNESS_H */
