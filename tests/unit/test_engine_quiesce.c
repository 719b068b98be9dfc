/*
 * test_engine_quiesce.c -- an ended transfer is quiescent: once pdl_engine_revoke returns, no byte of
 * a request its grant admitted lands in or leaves the region through the tcp server, even when the
 * request is still streaming (issue 37 item 1). The peer is a raw client on the data port, so the test
 * decides exactly how many bytes are on the wire when the grant goes: the revoke strictly happens
 * mid-stream, and nothing depends on timing to pass.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"
#include "engine/cudadrv.h"
#include "engine/grant.h"
#include "engine/stage.h"
#include "engine/tcp_wire.h"
#include "pdlink/engine.h"
#include "tcp_raw_testutil.h"
#include "test_fake_cuda.h"

#define REGION (16u << 20)
#define FIRST (1u << 20) /* bytes sent before the revoke */
#define OLD 0xa5         /* the region's bytes before the transfer */
#define NEW 0x5a         /* the WRITE's payload */
#define REUSED 0xee      /* what the owner puts in the blocks once the grant is gone */

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static pdl_engine_t *owner_open(pdl_mem_t **m)
{
    pdl_engine_config_t oc = {"producer:tp1", "127.0.0.1", 0, PDL_BACKEND_TCP, 1, 1, NULL, false, NULL, NULL};
    pdl_engine_t *e;
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&oc, &e, &err), PDL_OK);
    assert_int_equal(pdl_engine_alloc_mem(e, REGION, m, &err), PDL_OK);
    memset(pdl_mem_ptr(*m), OLD, REGION);
    pdl_mem_guard(*m);
    return e;
}

/* A data connection after its HELLO; rcvbuf > 0 sets a small receive buffer first (so a READ's
 * response cannot all be in flight at once). */
static int hello(uint16_t port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (rcvbuf > 0)
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    const char *key = "producer:tp1";
    uint8_t h[PDL_TCP_REQ_HDR];
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, PDL_TCP_OP_HELLO, 0, 0, 0, strlen(key), 0};
    pdl_tcp_req_encode(h, &r);
    assert_int_equal(send(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    assert_int_equal(send(fd, key, strlen(key), 0), (ssize_t)strlen(key));
    uint8_t buf[64];
    uint64_t got;
    assert_int_equal(raw_response(fd, -1, buf, sizeof(buf), &got), 0);
    return fd;
}

/* Send a request's header, its one segment [0, len) and the grant name (no payload). */
static void send_request(int fd, uint16_t op, uint64_t id, const char *grant, uint64_t len)
{
    uint8_t h[PDL_TCP_REQ_HDR], seg[PDL_TCP_SEG];
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, op, 1, (uint32_t)strlen(grant), id, len, 7};
    pdl_tcp_req_encode(h, &r);
    pdl_tcp_put64(seg, 0);
    pdl_tcp_put64(seg + 8, len);
    assert_int_equal(send(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    assert_int_equal(send(fd, seg, sizeof(seg), 0), (ssize_t)sizeof(seg));
    assert_int_equal(send(fd, grant, strlen(grant), 0), (ssize_t)strlen(grant));
}

static void send_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        assert_true(w > 0);
        p += w;
        n -= (size_t)w;
    }
}

/*
 * The WRITE: a push still streaming when the receiving side gives up. The first MiB lands
 * while the grant lives; the grant is revoked; then the peer sends the other 15 MiB. They are read
 * away, not written: the region, read again after a pause, is what it was when revoke returned, and
 * the request is answered PDL_ERR_DENIED naming the grant (before: status 0, 15 MiB landed). The
 * connection stays in step: a request after it is served.
 */
static void test_late_write_tcp(void **state)
{
    (void)state;
    pdl_mem_t *m;
    pdl_engine_t *e = owner_open(&m);
    uint8_t *reg = pdl_mem_ptr(m);
    pdl_error_t err;
    pdl_range_t all = {0, REGION};
    assert_int_equal(pdl_engine_grant(e, m, "tx-late", PDL_GRANT_WRITE, &all, 1, &err), PDL_OK);
    int fd = hello(pdl_engine_port(e), 0);
    uint8_t *payload = malloc(REGION);
    memset(payload, NEW, REGION);
    send_request(fd, PDL_TCP_OP_WRITE, pdl_mem_id(m), "tx-late", REGION);
    send_all(fd, payload, FIRST);
    /* The server fills the region in order: its last byte of the first MiB says all of it landed. */
    for (int i = 0; i < 10000 && ((volatile uint8_t *)reg)[FIRST - 1] != NEW; i++)
        sleep_ms(1);
    assert_int_equal(reg[FIRST - 1], NEW);
    assert_int_equal(pdl_engine_revoke(e, "tx-late", &err), PDL_OK);
    uint8_t *seen = malloc(REGION);
    memcpy(seen, reg, REGION);
    send_all(fd, payload + FIRST, REGION - FIRST);
    uint8_t msg[PDL_TCP_MAX_MSG + 1];
    uint64_t got;
    assert_int_equal(raw_response(fd, 7, msg, sizeof(msg), &got), PDL_ERR_DENIED);
    assert_non_null(strstr((char *)msg, "grant tx-late was revoked"));
    sleep_ms(100);
    size_t changed = 0;
    for (size_t i = 0; i < REGION; i++)
        changed += reg[i] != seen[i];
    assert_int_equal(changed, 0);
    assert_int_equal(memcmp(reg + FIRST, seen + FIRST, REGION - FIRST), 0);
    /* In step: the same connection's next request, under a new grant of the same name, is served. */
    pdl_range_t one = {0, 4096};
    assert_int_equal(pdl_engine_grant(e, m, "tx-late", PDL_GRANT_WRITE, &one, 1, &err), PDL_OK);
    send_request(fd, PDL_TCP_OP_WRITE, pdl_mem_id(m), "tx-late", 4096);
    send_all(fd, payload, 4096);
    assert_int_equal(raw_response(fd, 7, msg, sizeof(msg), &got), 0);
    assert_int_equal(reg[FIRST + 1], OLD);
    close(fd);
    free(seen);
    free(payload);
    pdl_engine_deregister_mem(e, m);
    pdl_engine_destroy(e);
}

/*
 * The READ side: a response still streaming when the grant goes and the owner reuses the blocks
 * (fills them with REUSED). The peer reads one MiB, the grant is revoked, the blocks are reused, and
 * the peer reads on: the server stops sending and cuts the connection, so no reused byte reaches the
 * peer (before: the whole response came, its tail from the reused blocks). The socket buffers hold
 * what was sent before the revoke, far less than the 16 MiB asked for.
 */
static void test_late_read_tcp(void **state)
{
    (void)state;
    pdl_mem_t *m;
    pdl_engine_t *e = owner_open(&m);
    uint8_t *reg = pdl_mem_ptr(m);
    pdl_error_t err;
    pdl_range_t all = {0, REGION};
    assert_int_equal(pdl_engine_grant(e, m, "tx-read", PDL_GRANT_READ, &all, 1, &err), PDL_OK);
    int fd = hello(pdl_engine_port(e), 65536);
    send_request(fd, PDL_TCP_OP_READ, pdl_mem_id(m), "tx-read", REGION);
    uint8_t rh[PDL_TCP_RESP_HDR];
    assert_int_equal(recv(fd, rh, sizeof(rh), MSG_WAITALL), (ssize_t)sizeof(rh));
    pdl_tcp_resp_t rr;
    pdl_tcp_resp_decode(rh, &rr);
    assert_int_equal(rr.status, 0);
    assert_int_equal(rr.payload_len, REGION);
    uint8_t *buf = malloc(REGION);
    assert_int_equal(recv(fd, buf, FIRST, MSG_WAITALL), (ssize_t)FIRST);
    assert_int_equal(pdl_engine_revoke(e, "tx-read", &err), PDL_OK);
    memset(reg, REUSED, REGION);
    size_t got = FIRST;
    while (got < REGION) {
        ssize_t n = recv(fd, buf + got, REGION - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    size_t reused = 0;
    for (size_t i = 0; i < got; i++)
        reused += buf[i] == REUSED;
    assert_int_equal(reused, 0);
    assert_true(got < REGION);
    close(fd);
    free(buf);
    pdl_engine_deregister_mem(e, m);
    pdl_engine_destroy(e);
}

/* The device region's bytes through the test driver (its memory is PROT_NONE to the CPU). */
static void dev_read(pdl_cudadrv_t *drv, CUdeviceptr d, uint8_t *out, size_t off, size_t len)
{
    assert_int_equal(drv->api.MemcpyDtoHAsync(out, d + off, len, NULL), CUDA_SUCCESS);
}

/*
 * The same push into device memory (the test CUDA driver, src/engine/cudadrv_fake.c): the server
 * receives through staging windows and copies each full one to the device. The first window lands
 * while the grant lives; after the revoke nothing more reaches the device (before: every window did).
 */
static void test_late_write_staged_tcp(void **state)
{
    (void)state;
    pdl_cudadrv_t *drv;
    assert_int_equal(tfc_open(NULL, &drv), 0);
    pdl_engine_config_t oc = {"producer:tp1", "127.0.0.1", 0, PDL_BACKEND_TCP, 1, 1, NULL, false, NULL, NULL};
    pdl_engine_t *e;
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&oc, &e, &err), PDL_OK);
    CUdeviceptr d;
    assert_int_equal(drv->api.MemAlloc(&d, REGION), CUDA_SUCCESS);
    uint8_t *payload = malloc(REGION), *seen = malloc(REGION), *now = malloc(REGION);
    memset(payload, OLD, REGION);
    assert_int_equal(drv->api.MemcpyHtoDAsync(d, payload, REGION, NULL), CUDA_SUCCESS);
    pdl_mem_t *m;
    assert_int_equal(pdl_engine_register_mem_type(e, (void *)(uintptr_t)d, REGION, PDL_MEM_TYPE_CUDA, &m, &err),
                     PDL_OK);
    pdl_mem_guard(m);
    pdl_range_t all = {0, REGION};
    assert_int_equal(pdl_engine_grant(e, m, "tx-dev", PDL_GRANT_WRITE, &all, 1, &err), PDL_OK);
    int fd = hello(pdl_engine_port(e), 0);
    memset(payload, NEW, REGION);
    send_request(fd, PDL_TCP_OP_WRITE, pdl_mem_id(m), "tx-dev", REGION);
    send_all(fd, payload, PDL_STAGE_WINDOW);
    uint8_t last = 0;
    for (int i = 0; i < 10000 && last != NEW; i++) {
        sleep_ms(1);
        dev_read(drv, d, &last, PDL_STAGE_WINDOW - 1, 1);
    }
    assert_int_equal(last, NEW);
    assert_int_equal(pdl_engine_revoke(e, "tx-dev", &err), PDL_OK);
    dev_read(drv, d, seen, 0, REGION);
    send_all(fd, payload + PDL_STAGE_WINDOW, REGION - PDL_STAGE_WINDOW);
    uint8_t msg[PDL_TCP_MAX_MSG + 1];
    uint64_t got;
    assert_int_equal(raw_response(fd, 7, msg, sizeof(msg), &got), PDL_ERR_DENIED);
    assert_non_null(strstr((char *)msg, "grant tx-dev was revoked"));
    sleep_ms(100);
    dev_read(drv, d, now, 0, REGION);
    assert_int_equal(memcmp(now, seen, REGION), 0);
    assert_int_equal(now[REGION - 1], OLD);
    close(fd);
    pdl_engine_deregister_mem(e, m);
    pdl_engine_destroy(e);
    drv->api.MemFree(d);
    pdl__cudadrv_close(drv);
    free(payload);
    free(seen);
    free(now);
}

typedef struct revoker {
    pdl_grants_t *g;
    atomic_bool done;
} revoker_t;

static void *revoke_main(void *arg)
{
    revoker_t *r = arg;
    assert_true(pdl__grants_revoke(r->g, "tx-a"));
    atomic_store(&r->done, true);
    return NULL;
}

/*
 * grant.c alone: a step held under a grant (pdl__grants_enter) keeps pdl__grants_revoke from returning
 * until it is left; a revoked grant admits no step, nor does a new grant of the same name admit the
 * old generation's steps.
 */
static void test_revoke_waits_for_steps(void **state)
{
    (void)state;
    pdl_grants_t g;
    pdl__grants_init(&g);
    pdl_error_t err;
    pdl_range_t r = {0, 4096};
    uint8_t seg[PDL_TCP_SEG];
    pdl_tcp_put64(seg, 0);
    pdl_tcp_put64(seg + 8, 4096);
    char why[128];
    uint64_t gen = 0, gen2 = 0;
    assert_int_equal(pdl__grants_add(&g, "tx-a", 3, PDL_GRANT_WRITE, &r, 1, &err), PDL_OK);
    assert_true(pdl__grants_check(&g, "tx-a", 4, 3, PDL_GRANT_WRITE, seg, 1, "127.0.0.1", &gen, why, sizeof(why)));
    assert_true(gen != 0);
    pdl_grant_t *x;
    assert_true(pdl__grants_enter(&g, "tx-a", 4, gen, &x));
    revoker_t rv = {&g, false};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, revoke_main, &rv), 0);
    sleep_ms(100);
    assert_false(atomic_load(&rv.done)); /* still held */
    pdl__grants_leave(&g, x);
    pthread_join(t, NULL);
    assert_true(atomic_load(&rv.done));
    assert_false(pdl__grants_enter(&g, "tx-a", 4, gen, &x));
    assert_int_equal(pdl__grants_add(&g, "tx-a", 3, PDL_GRANT_WRITE, &r, 1, &err), PDL_OK);
    assert_false(pdl__grants_enter(&g, "tx-a", 4, gen, &x)); /* another grant of that name */
    assert_true(pdl__grants_check(&g, "tx-a", 4, 3, PDL_GRANT_WRITE, seg, 1, "127.0.0.1", &gen2, why, sizeof(why)));
    assert_true(gen2 != gen);
    assert_true(pdl__grants_enter(&g, "tx-a", 4, gen2, &x));
    pdl__grants_leave(&g, x);
    assert_true(pdl__grants_revoke(&g, "tx-a"));
    pdl__grants_fini(&g);
}

int main(void)
{
    pdl_log_set_level(PDL_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_late_write_tcp),
        cmocka_unit_test(test_late_read_tcp),
        cmocka_unit_test(test_late_write_staged_tcp),
        cmocka_unit_test(test_revoke_waits_for_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
