/*
 * test_connector_multiproc.c -- producer and consumer instances in separate processes over the tcp
 * engine (SPEC §5), and a producer that dies after the handshake: the next pull fails cleanly (load
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
#include <sys/wait.h>

#include <cmocka.h>

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
    return json_loads(buf, 0, NULL);
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

int main(void)
{
    const char *lvl = getenv("PDLINK_LOG_LEVEL");
    if (lvl && pdl_log_level_parse(lvl) >= 0)
        pdl_log_set_level((pdl_log_level_t)pdl_log_level_parse(lvl));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(multiproc_tcp_and_dead_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
