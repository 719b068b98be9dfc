/*
 * test_connector_multiproc.c -- producer and consumer instances in separate processes over the tcp
 * engine (docs/protocol.md#read-flow), and a producer that dies after the handshake: the next pull fails cleanly (load
 * error, peer evicted), nothing hangs, and a later pull fails at the handshake.
 *
 * The producer child sends its kv_transfer_params (JSON lines) and, once the first transfer's fan-in
 * completed, its per-rank counters over a pipe. The parent pulls, verifies every byte, then kills the
 * child with SIGKILL and pulls the second transfer.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "pdlink/pull_hook.h"
#include "test_connector_util.h"

#define NBLK 3
#define TOTAL 16
#define P 2
#define D 4

static void write_line(int fd, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    size_t n = strlen(s);
    s = realloc(s, n + 2);
    s[n] = '\n';
    s[n + 1] = '\0';
    ssize_t w = write(fd, s, n + 1);
    (void)w;
    free(s);
}

static json_t *read_line(FILE *f)
{
    char buf[8192];
    if (fgets(buf, sizeof(buf), f) == NULL)
        return NULL;
    return json_loads(buf, JSON_DECODE_ANY, NULL);
}

static bool one_held(void *arg) { return pdl_instance_held_transfers((pdl_instance_t *)arg) <= 1; }

static void child_main(int wfd)
{
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, P, &g, TOTAL, PDL_BACKEND_TCP, 60, NULL);
    if (p == NULL)
        _exit(3);
    for (int t = 1; t <= 2; t++) {
        uint32_t ids[NBLK];
        char tid[16];
        snprintf(tid, sizeof(tid), "mp-%d", t);
        if (pdl_instance_alloc_blocks(p, NBLK, ids, NULL) != PDL_OK)
            _exit(4);
        tc_fill(p, 8, false, ids, NBLK, (uint32_t)(10 + t)); /* the KV is final before the hold */
        if (pdl_instance_hold(p, tid, ids, NBLK, NULL) != PDL_OK)
            _exit(4);
        pdl_kv_params_t kp;
        if (pdl_instance_params(p, tid, ids, NBLK, &kp, NULL) != PDL_OK)
            _exit(4);
        json_t *j = pdl_kv_params_to_json(&kp);
        pdl_kv_params_clear(&kp);
        write_line(wfd, j);
        json_decref(j);
    }
    if (!tc_wait_for(one_held, p, 60000))
        _exit(5);
    json_t *c = json_array();
    for (int r = 0; r < P; r++) {
        pdl_rank_counters_t k;
        pdl_instance_counters(p, r, &k, NULL);
        json_array_append_new(c, json_pack("{s:I,s:I,s:I}", "transfers", (json_int_t)k.transfers, "received",
                                           (json_int_t)k.releases_received, "handshakes", (json_int_t)k.handshakes));
    }
    write_line(wfd, c);
    json_decref(c);
    for (;;)
        pause(); /* until the parent kills us: a crash, no clean shutdown */
}

static void tweak_consumer(pdl_instance_config_t *c)
{
    c->conn.handshake_timeout_s = 1.0;
    c->conn.transfer_timeout_s = 10.0;
}

static void multiproc_tcp_and_dead_peer(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed parent */
        close(fds[0]);
        child_main(fds[1]);
        _exit(0);
    }
    close(fds[1]);
    FILE *in = fdopen(fds[0], "r");
    json_t *p1 = read_line(in), *p2 = read_line(in);
    assert_non_null(p1);
    assert_non_null(p2);
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, D, &g, TOTAL, PDL_BACKEND_TCP, 60, tweak_consumer);
    assert_non_null(c);

    pdl_kv_params_t kp;
    pdl_kv_params_init(&kp);
    assert_int_equal(pdl_kv_params_from_json(p1, &kp, NULL), PDL_OK);
    uint32_t lb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, lb, NULL), PDL_OK);
    pdl_pull_t *pull;
    pdl_error_t e;
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, lb, NBLK, &pull, &e), PDL_OK);
    if (pdl_pull_wait(pull, 60000, &e) != PDL_OK)
        fail_msg("pull across processes: %s", e.msg);
    pdl_pull_free(pull);
    pdl_kv_params_clear(&kp);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, lb, NBLK, 11, &checked), 0);
    /* layers x K/V x block_len of a D4 rank (4 tokens x 2 heads x 8 dims x 2 bytes) x blocks x ranks */
    assert_int_equal(checked, (uint64_t)2 * 2 * (4 * 2 * 8 * 2) * NBLK * D);

    /* the producer process counted the fan-in of mp-1 on both ranks: expected(2, 4) = 2 each */
    json_t *cnt = read_line(in);
    assert_non_null(cnt);
    for (int r = 0; r < P; r++) {
        json_t *k = json_array_get(cnt, (size_t)r);
        assert_int_equal(json_integer_value(json_object_get(k, "transfers")), 1);
        assert_int_equal(json_integer_value(json_object_get(k, "received")), 2);
        assert_int_equal(json_integer_value(json_object_get(k, "handshakes")), 2);
    }
    json_decref(cnt);
    assert_int_equal(TC_SUM(c, releases_sent), 4);

    /* the producer dies; the consumer still has its handshake and sessions cached */
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    pdl_kv_params_init(&kp);
    assert_int_equal(pdl_kv_params_from_json(p2, &kp, NULL), PDL_OK);
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, lb, NBLK, &pull, &e), PDL_OK);
    pdl_status_t st = pdl_pull_wait(pull, 60000, &e);
    assert_int_not_equal(st, PDL_OK);
    printf("pull from a dead producer: %s (%s)\n", pdl_status_name(st), e.msg);
    pdl_pull_free(pull);
    assert_int_equal(TC_SUM(c, read_failures), D);
    /* again: the peer was evicted, so this time the handshake itself fails */
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, lb, NBLK, &pull, &e), PDL_OK);
    assert_int_not_equal(pdl_pull_wait(pull, 60000, &e), PDL_OK);
    assert_non_null(strstr(e.msg, "handshake"));
    pdl_pull_free(pull);
    assert_int_equal(TC_SUM(c, read_failures), 2 * D);
    pdl_kv_params_clear(&kp);
    json_decref(p1);
    json_decref(p2);
    fclose(in);
    pdl_instance_destroy(c);
}

/* ---- a decode killed mid-pull, then restarted ------------------------------------------------------ */

/*
 * Decode TP2 reading from a prefill TP1 (each decode rank reads its head and releases producer rank 0,
 * which expects 2 releases). The decode is killed with one transfer half-released: rank 0 read and
 * released it, rank 1's share is queued behind a hook that never returns (a lane runs its jobs in
 * order). No timing decides that state. The prefill (defer_timeout 600 s) must free the hold through
 * its consumer-gone watch (consumer_gone_timeout 1 s), and a decode restarted on the same ports must
 * serve its first request, every byte verified.
 *
 * Both decode processes are forked before the parent starts a thread; the second waits on a pipe for
 * the first one's ports.
 */
#define KD 2 /* decode TP */
#define KP 1 /* prefill TP */
#define KHEADS 2

static int kd_hs, kd_nt; /* the ports the restarted decode binds */

static void at_ports(pdl_instance_config_t *c)
{
    c->conn.handshake_port = kd_hs;
    c->conn.notify_port = kd_nt;
}

typedef struct kd_hook {
    int wfd;
    const char *label;
    int block_rank; /* this rank's hook never returns; -1: none */
} kd_hook_t;

static void kd_hook_fn(void *arg, int rank)
{
    kd_hook_t *h = arg;
    json_t *j = json_pack("{s:s,s:i}", "hook", h->label, "rank", rank);
    write_line(h->wfd, j);
    json_decref(j);
    if (rank == h->block_rank)
        for (;;)
            pause(); /* until the parent kills us */
}

static void kd_pull(pdl_instance_t *c, json_t *params, const char *rid, uint32_t *lb, kd_hook_t *h, pdl_pull_t **pull)
{
    pdl_kv_params_t kp;
    pdl_kv_params_init(&kp);
    if (pdl_kv_params_from_json(params, &kp, NULL) != PDL_OK ||
        pdl_instance_pull_hooked(c, &kp, rid, lb, NBLK, kd_hook_fn, h, NULL, pull, NULL) != PDL_OK)
        _exit(6);
    pdl_kv_params_clear(&kp);
}

/* Decode 1: announce its address, pull A (rank 1's hook blocks) and B (rank 0 finishes), wait to die. */
static void kd_first(int wfd, FILE *in)
{
    tc_geo_t g = tc_geo_default(KHEADS);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, KD, &g, TOTAL, PDL_BACKEND_TCP, 60, NULL);
    if (c == NULL)
        _exit(3);
    json_t *me = json_pack("{s:i,s:i,s:s}", "hs", pdl_instance_handshake_port(c, 0), "nt",
                           pdl_instance_notify_port(c, 0), "zmq", pdl_instance_zmq_address(c));
    write_line(wfd, me);
    json_decref(me);
    json_t *a = read_line(in), *b = read_line(in), *rid = read_line(in);
    if (a == NULL || b == NULL || rid == NULL)
        _exit(4);
    static uint32_t la[NBLK], lbb[NBLK];
    if (pdl_instance_alloc_blocks(c, NBLK, la, NULL) != PDL_OK || pdl_instance_alloc_blocks(c, NBLK, lbb, NULL) != PDL_OK)
        _exit(5);
    static kd_hook_t ha = {0, "A", 1}, hb = {0, "B", -1};
    ha.wfd = hb.wfd = wfd;
    pdl_pull_t *pa, *pb;
    kd_pull(c, a, json_string_value(rid), la, &ha, &pa);
    kd_pull(c, b, json_string_value(rid), lbb, &hb, &pb);
    for (;;)
        pause();
}

/* A decode child's consumer: told {hs, nt} on `in` (0: any free ports), it binds those -- the ports of a
 * killed predecessor, taken as soon as they are free -- with backend `be`. Exits the child on failure. */
static pdl_instance_t *kd_consumer(FILE *in, pdl_backend_kind_t be)
{
    json_t *ports = read_line(in);
    if (ports == NULL)
        _exit(3);
    kd_hs = (int)json_integer_value(json_object_get(ports, "hs"));
    kd_nt = (int)json_integer_value(json_object_get(ports, "nt"));
    tc_geo_t g = tc_geo_default(KHEADS);
    pdl_instance_t *c = NULL;
    for (int i = 0; i < 500 && c == NULL; i++) {
        c = tc_instance(PDL_ROLE_CONSUMER, KD, &g, TOTAL, be, 60, kd_hs ? at_ports : NULL);
        if (c == NULL)
            tc_sleep_ms(20);
    }
    if (c == NULL)
        _exit(4);
    return c;
}

/* Pull `params` (kv_transfer_params as JSON) under request id `rid` into c's blocks lb, verify them
 * against the pattern of `seed`, and report {status, msg, checked, bad} on wfd. */
static void kd_pull_report(int wfd, pdl_instance_t *c, const json_t *params, const char *rid, const uint32_t *lb,
                           uint32_t seed)
{
    pdl_kv_params_t kp;
    pdl_kv_params_init(&kp);
    pdl_pull_t *pull = NULL;
    pdl_error_t e;
    pdl_error_clear(&e);
    pdl_status_t st = pdl_kv_params_from_json(params, &kp, &e);
    if (st == PDL_OK)
        st = pdl_instance_pull(c, &kp, rid, lb, NBLK, &pull, &e);
    if (st == PDL_OK)
        st = pdl_pull_wait(pull, 60000, &e);
    uint64_t checked = 0, bad = st == PDL_OK ? tc_verify(c, KHEADS, false, lb, NBLK, seed, &checked) : 0;
    json_t *res = json_pack("{s:s,s:s,s:I,s:I}", "status", pdl_status_name(st), "msg", e.msg, "checked",
                            (json_int_t)checked, "bad", (json_int_t)bad);
    write_line(wfd, res);
    json_decref(res);
    pdl_pull_free(pull);
    pdl_kv_params_clear(&kp);
}

/* Decode 2: on the first one's ports once told; pull C (its first request) and report the bytes. */
static void kd_second(int wfd, FILE *in)
{
    pdl_instance_t *c = kd_consumer(in, PDL_BACKEND_TCP);
    json_t *ready = json_pack("{s:b}", "ready", 1);
    write_line(wfd, ready);
    json_decref(ready);
    json_t *params = read_line(in), *rid = read_line(in);
    if (params == NULL || rid == NULL)
        _exit(5);
    uint32_t lb[NBLK];
    if (pdl_instance_alloc_blocks(c, NBLK, lb, NULL) != PDL_OK)
        _exit(5);
    kd_pull_report(wfd, c, params, json_string_value(rid), lb, 77);
    char q;
    while (read(fileno(in), &q, 1) > 0) {
    }
    pdl_instance_destroy(c);
    _exit(0);
}

typedef struct kid {
    pid_t pid;
    FILE *in;  /* its lines */
    int cmd;   /* our lines to it */
} kid_t;

static kid_t kd_fork(void (*body)(int, FILE *))
{
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    fflush(NULL);
    kid_t k;
    k.pid = fork();
    assert_true(k.pid >= 0);
    if (k.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(up[0]);
        close(down[1]);
        body(up[1], fdopen(down[0], "r"));
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    k.in = fdopen(up[0], "r");
    k.cmd = down[1];
    return k;
}

/* Hold NBLK filled blocks under tid for the decode named in rid; returns the params as JSON. */
static json_t *pz_hold(pdl_instance_t *p, const char *tid, uint32_t *ids, uint32_t seed, const char *rid)
{
    assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, ids, NULL), PDL_OK);
    tc_fill(p, KHEADS, false, ids, NBLK, seed);
    pdl_error_t e;
    if (pdl_instance_hold_for(p, tid, rid, ids, NBLK, &e) != PDL_OK)
        fail_msg("hold_for %s: %s", tid, e.msg);
    pdl_kv_params_t kp;
    assert_int_equal(pdl_instance_params(p, tid, ids, NBLK, &kp, NULL), PDL_OK);
    json_t *j = pdl_kv_params_to_json(&kp);
    pdl_kv_params_clear(&kp);
    return j;
}

static void send_params(pdl_instance_t *p, int fd, const char *tid, uint32_t *ids, uint32_t seed, const char *rid)
{
    json_t *j = pz_hold(p, tid, ids, seed, rid);
    write_line(fd, j);
    json_decref(j);
}

static void send_rid(int fd, const char *rid)
{
    json_t *j = json_string(rid);
    char *s = json_dumps(j, JSON_ENCODE_ANY);
    dprintf(fd, "%s\n", s);
    free(s);
    json_decref(j);
}

static bool none_held(void *arg) { return pdl_instance_held_transfers((pdl_instance_t *)arg) == 0; }

static void watch_fast(pdl_instance_config_t *c) { c->conn.consumer_gone_timeout_s = 1.0; }

static void decode_killed_mid_pull_then_restarted(void **state)
{
    (void)state;
    kid_t d1 = kd_fork(kd_first), d2 = kd_fork(kd_second);
    json_t *me = read_line(d1.in);
    assert_non_null(me);
    tc_geo_t g = tc_geo_default(KHEADS);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, KP, &g, TOTAL, PDL_BACKEND_TCP, 600, watch_fast);
    assert_non_null(p);
    char rid[1024];
    uint8_t uuid[16] = {1, 2, 3};
    assert_true(pdl_wire_format_request_id(pdl_instance_zmq_address(p), json_string_value(json_object_get(me, "zmq")),
                                           uuid, rid, sizeof(rid)) > 0);
    uint32_t a[NBLK], b[NBLK], c[NBLK];
    send_params(p, d1.cmd, "kd-A", a, 1, rid);
    send_params(p, d1.cmd, "kd-B", b, 2, rid);
    send_rid(d1.cmd, rid);
    /* A: both ranks read and released, rank 1 now stuck in its hook; B: rank 0 read and released. */
    bool a1 = false, b0 = false;
    while (!(a1 && b0)) {
        json_t *h = read_line(d1.in);
        assert_non_null(h);
        const char *lab = json_string_value(json_object_get(h, "hook"));
        int rank = (int)json_integer_value(json_object_get(h, "rank"));
        a1 |= strcmp(lab, "A") == 0 && rank == 1;
        b0 |= strcmp(lab, "B") == 0 && rank == 0;
        json_decref(h);
    }
    assert_true(tc_wait_for(one_held, p, 20000)); /* A freed by its releases */
    assert_int_equal(pdl_instance_held_transfers(p), 1); /* B: one of its two releases, never the other */
    uint64_t t_kill = pdl__clock_now_ms();
    kill(d1.pid, SIGKILL);
    int status;
    waitpid(d1.pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    /* The watch frees B (600 s defer_timeout: nothing else could within the bound). */
    assert_true(tc_wait_for(none_held, p, 20000));
    printf("prefill freed the killed decode's hold %llu ms after kill -9\n",
           (unsigned long long)(pdl__clock_now_ms() - t_kill));
    assert_int_equal(TC_GET(p, 0, consumer_gone_freed), 1);
    assert_int_equal(TC_SUM(p, expired), 0);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL);

    /* The decode restarts on the same ports; its first request succeeds, every byte verified. */
    write_line(d2.cmd, me);
    json_t *ready = read_line(d2.in);
    assert_non_null(ready);
    json_decref(ready);
    send_params(p, d2.cmd, "kd-C", c, 77, rid);
    send_rid(d2.cmd, rid);
    json_t *res = read_line(d2.in);
    assert_non_null(res);
    printf("restarted decode's first pull: %s %s\n", json_string_value(json_object_get(res, "status")),
           json_string_value(json_object_get(res, "msg")));
    assert_string_equal(json_string_value(json_object_get(res, "status")), "PDL_OK");
    assert_int_equal(json_integer_value(json_object_get(res, "bad")), 0);
    /* layers x K/V x block_len of a D2 rank (4 tokens x 1 head x 8 dims x 2 bytes) x blocks x ranks */
    assert_int_equal(json_integer_value(json_object_get(res, "checked")), (json_int_t)2 * 2 * (4 * 1 * 8 * 2) * NBLK * KD);
    assert_true(tc_wait_for(none_held, p, 20000)); /* C released by the new decode */
    json_decref(res);
    close(d2.cmd);
    assert_int_equal(waitpid(d2.pid, &status, 0), d2.pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fclose(d1.in);
    fclose(d2.in);
    close(d1.cmd);
    json_decref(me);
    pdl_instance_destroy(p);
}

/* ---- paused peers (a long GC, a stalled host) --------------------------------------------------- */

/*
 * A decode process for the tests below. Its first line says where to bind ({} = anywhere; else the hs
 * and nt ports of a killed predecessor, taken as soon as they are free); it announces {hs, nt, zmq} and
 * then pulls each {"params", "rid", "seed"} it is sent, reporting {status, msg, checked, bad}.
 */
static pdl_backend_kind_t pz_backend = PDL_BACKEND_TCP;

static void pz_decode(int wfd, FILE *in)
{
    pdl_instance_t *c = kd_consumer(in, pz_backend);
    json_t *me = json_pack("{s:i,s:i,s:s}", "hs", pdl_instance_handshake_port(c, 0), "nt",
                           pdl_instance_notify_port(c, 0), "zmq", pdl_instance_zmq_address(c));
    write_line(wfd, me);
    json_decref(me);
    json_t *cmd;
    while ((cmd = read_line(in)) != NULL) {
        uint32_t lb[NBLK];
        if (pdl_instance_alloc_blocks(c, NBLK, lb, NULL) != PDL_OK)
            _exit(5);
        kd_pull_report(wfd, c, json_object_get(cmd, "params"), json_string_value(json_object_get(cmd, "rid")), lb,
                       (uint32_t)json_integer_value(json_object_get(cmd, "seed")));
        pdl_instance_free_blocks(c, lb, NBLK);
        json_decref(cmd);
    }
    pdl_instance_destroy(c);
    _exit(0);
}

static void pz_send_pull(int fd, json_t *params, const char *rid, uint32_t seed)
{
    json_t *j = json_pack("{s:O,s:s,s:i}", "params", params, "rid", rid, "seed", (int)seed);
    write_line(fd, j);
    json_decref(j);
}

static void pz_rid(pdl_instance_t *p, json_t *me, char *rid, size_t cap)
{
    uint8_t uuid[16] = {7, 7, 7};
    assert_true(pdl_wire_format_request_id(pdl_instance_zmq_address(p), json_string_value(json_object_get(me, "zmq")),
                                           uuid, rid, cap) > 0);
}

static void pz_send_empty(int fd)
{
    json_t *j = json_object();
    write_line(fd, j);
    json_decref(j);
}

static void pz_end(kid_t *k)
{
    close(k->cmd);
    int status;
    assert_int_equal(waitpid(k->pid, &status, 0), k->pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fclose(k->in);
}

static void defer_2s(pdl_instance_config_t *c)
{
    c->conn.defer_timeout_s = 2.0;
    c->conn.consumer_gone_timeout_s = 1.0;
}

/*
 * A decode paused while the prefill holds its KV: the hold ends (defer_timeout here), the prefill
 * reuses the blocks for another prompt, the decode resumes and pulls. Its pull must fail: before, on
 * shm it read the other prompt's KV and reported success (tcp refused it: the grant was revoked).
 */
static void paused_decode(pdl_backend_kind_t be)
{
    pz_backend = be;
    kd_hs = kd_nt = 0;
    kid_t d = kd_fork(pz_decode);
    pz_send_empty(d.cmd);
    json_t *me = read_line(d.in);
    assert_non_null(me);
    tc_geo_t g = tc_geo_default(KHEADS);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, KP, &g, TOTAL, be, 600, defer_2s);
    assert_non_null(p);
    char rid[1024];
    pz_rid(p, me, rid, sizeof(rid));
    uint32_t a[NBLK], o[NBLK];
    json_t *params = pz_hold(p, "pz-late", a, 1, rid);
    kill(d.pid, SIGSTOP);
    assert_true(tc_wait_for(none_held, p, 30000)); /* given up while the decode sleeps */
    assert_int_equal(TC_SUM(p, expired), 1);
    assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, o, NULL), PDL_OK); /* another prompt's KV */
    tc_fill(p, KHEADS, false, o, NBLK, 99);
    kill(d.pid, SIGCONT);
    pz_send_pull(d.cmd, params, rid, 1);
    json_t *res = read_line(d.in);
    assert_non_null(res);
    printf("%s: paused decode's late pull: %s (%s), %lld bad bytes\n", pdl_backend_name(be),
           json_string_value(json_object_get(res, "status")), json_string_value(json_object_get(res, "msg")),
           (long long)json_integer_value(json_object_get(res, "bad")));
    assert_string_not_equal(json_string_value(json_object_get(res, "status")), "PDL_OK");
    json_decref(res);
    json_decref(params);
    json_decref(me);
    pz_end(&d);
    pdl_instance_free_blocks(p, o, NBLK);
    pdl_instance_destroy(p);
}

static void paused_decode_shm(void **state)
{
    (void)state;
    paused_decode(PDL_BACKEND_SHM);
}

static void paused_decode_tcp(void **state)
{
    (void)state;
    paused_decode(PDL_BACKEND_TCP);
}

/*
 * A prefill process for the next test: reads the decode's {zmq}, holds a transfer for it (defer 600 s,
 * consumer_gone_timeout 1 s) and sends {params, rid}; then answers each line with {held, gone}.
 */
static void pz_prefill(int wfd, FILE *in)
{
    json_t *dec = read_line(in);
    if (dec == NULL)
        _exit(3);
    tc_geo_t g = tc_geo_default(KHEADS);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, KP, &g, TOTAL, PDL_BACKEND_TCP, 600, watch_fast);
    if (p == NULL)
        _exit(4);
    char rid[1024];
    uint8_t uuid[16] = {9};
    if (pdl_wire_format_request_id(pdl_instance_zmq_address(p), json_string_value(json_object_get(dec, "zmq")), uuid,
                                   rid, sizeof(rid)) <= 0)
        _exit(5);
    uint32_t ids[NBLK];
    json_t *params = pz_hold(p, "pz-live", ids, 5, rid);
    json_t *out = json_pack("{s:o,s:s}", "params", params, "rid", rid);
    write_line(wfd, out);
    json_decref(out);
    json_t *q;
    while ((q = read_line(in)) != NULL) {
        json_decref(q);
        json_t *a = json_pack("{s:I,s:I,s:I}", "held", (json_int_t)pdl_instance_held_transfers(p), "gone",
                              (json_int_t)TC_GET(p, 0, consumer_gone_freed), "idents",
                              (json_int_t)TC_GET(p, 0, watch_identities));
        write_line(wfd, a);
        json_decref(a);
    }
    pdl_instance_destroy(p);
    _exit(0);
}

static json_int_t pz_ask(kid_t *k, const char *what)
{
    pz_send_empty(k->cmd);
    json_t *a = read_line(k->in);
    assert_non_null(a);
    json_int_t v = json_integer_value(json_object_get(a, what));
    json_decref(a);
    return v;
}

/*
 * The prefill is paused (SIGSTOP) for three times consumer_gone_timeout while it holds a live decode's
 * KV. Before, on SIGCONT its watch found "no answer for 1.0 s" -- its own stall -- and freed the hold;
 * the decode's pull failed. Silence is no proof now: the hold stays and the pull succeeds.
 */
static void paused_prefill_keeps_live_holds(void **state)
{
    (void)state;
    kid_t kp = kd_fork(pz_prefill);
    tc_geo_t g = tc_geo_default(KHEADS);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, KD, &g, TOTAL, PDL_BACKEND_TCP, 60, NULL);
    assert_non_null(c);
    json_t *me = json_pack("{s:s}", "zmq", pdl_instance_zmq_address(c));
    write_line(kp.cmd, me);
    json_decref(me);
    json_t *held = read_line(kp.in);
    assert_non_null(held);
    kill(kp.pid, SIGSTOP);
    tc_sleep_ms(3000);
    kill(kp.pid, SIGCONT);
    tc_sleep_ms(1500); /* several watch ticks after the stall */
    json_int_t h = pz_ask(&kp, "held"), gone = pz_ask(&kp, "gone"), idents = pz_ask(&kp, "idents");
    printf("after a 3 s pause of the prefill: %lld held, %lld freed as gone (%lld identities seen)\n", (long long)h,
           (long long)gone, (long long)idents);
    assert_true(idents > 0); /* the decode was watched */
    assert_int_equal(gone, 0);
    assert_int_equal(h, 1);
    pdl_kv_params_t kp2;
    pdl_kv_params_init(&kp2);
    assert_int_equal(pdl_kv_params_from_json(json_object_get(held, "params"), &kp2, NULL), PDL_OK);
    uint32_t lb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, lb, NULL), PDL_OK);
    pdl_pull_t *pull;
    pdl_error_t e;
    assert_int_equal(pdl_instance_pull(c, &kp2, json_string_value(json_object_get(held, "rid")), lb, NBLK, &pull, &e),
                     PDL_OK);
    if (pdl_pull_wait(pull, 60000, &e) != PDL_OK)
        fail_msg("pull after the prefill's pause: %s", e.msg);
    pdl_pull_free(pull);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, KHEADS, false, lb, NBLK, 5, &checked), 0);
    assert_true(checked > 0);
    pdl_kv_params_clear(&kp2);
    for (int i = 0; i < 200 && pz_ask(&kp, "held") != 0; i++)
        tc_sleep_ms(100);
    assert_int_equal(pz_ask(&kp, "held"), 0); /* released by the decode */
    json_decref(held);
    pz_end(&kp);
    pdl_instance_free_blocks(c, lb, NBLK);
    pdl_instance_destroy(c);
}

static void watch_4s(pdl_instance_config_t *c) { c->conn.consumer_gone_timeout_s = 4.0; }

/*
 * A decode paused, killed and restarted on its ports within a probe interval (1 s here) while the
 * prefill holds KV for it, one hold made after the pause began. The restarted process never saw those
 * requests. Before, the hold made during the pause was tied to the new process's identity and stayed
 * until defer_timeout (600 s here); now both end when the new identity answers.
 */
static void paused_decode_killed_restarted(void **state)
{
    (void)state;
    pz_backend = PDL_BACKEND_TCP;
    kd_hs = kd_nt = 0;
    kid_t d1 = kd_fork(pz_decode), d2 = kd_fork(pz_decode);
    pz_send_empty(d1.cmd);
    json_t *me = read_line(d1.in);
    assert_non_null(me);
    tc_geo_t g = tc_geo_default(KHEADS);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, KP, &g, TOTAL, PDL_BACKEND_TCP, 600, watch_4s);
    assert_non_null(p);
    char rid[1024];
    pz_rid(p, me, rid, sizeof(rid));
    uint32_t a[NBLK], b[NBLK];
    json_t *pa = pz_hold(p, "pz-before", a, 1, rid);
    for (int i = 0; i < 200 && TC_GET(p, 0, watch_identities) == 0; i++)
        tc_sleep_ms(50);
    assert_true(TC_GET(p, 0, watch_identities) > 0); /* the watch knows the decode's identity */
    kill(d1.pid, SIGSTOP);
    json_t *pb = pz_hold(p, "pz-during", b, 2, rid);
    tc_sleep_ms(2500); /* probes go unanswered */
    kill(d1.pid, SIGKILL);
    int status;
    waitpid(d1.pid, &status, 0);
    write_line(d2.cmd, me); /* the restart, on the same ports */
    json_t *me2 = read_line(d2.in);
    assert_non_null(me2);
    assert_true(tc_wait_for(none_held, p, 20000));
    printf("holds of the paused, killed decode freed: %llu as gone\n",
           (unsigned long long)TC_GET(p, 0, consumer_gone_freed));
    assert_int_equal(TC_GET(p, 0, consumer_gone_freed), 2);
    assert_int_equal(TC_SUM(p, expired), 0);
    json_decref(pa);
    json_decref(pb);
    json_decref(me);
    json_decref(me2);
    fclose(d1.in);
    close(d1.cmd);
    pz_end(&d2);
    pdl_instance_destroy(p);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(multiproc_tcp_and_dead_peer),
        cmocka_unit_test(decode_killed_mid_pull_then_restarted),
        cmocka_unit_test(paused_decode_shm),
        cmocka_unit_test(paused_decode_tcp),
        cmocka_unit_test(paused_prefill_keeps_live_holds),
        cmocka_unit_test(paused_decode_killed_restarted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
