/*
 * test_engine_devmem.c -- no pdlink path dereferences device memory with the CPU.
 *
 * There is no GPU in CI, so "device memory" here is memory no CPU access survives: an anonymous
 * PROT_NONE mapping, registered as PDL_MEM_TYPE_CUDA with a ucx engine that the test hook
 * PDLINK_TEST_UCX_CLAIM_CUDA=1 makes claim CUDA support. A READ into it and a WRITE from it from a
 * region UCX maps into this process (pdl_engine_alloc_mem: its shared-memory transports give a
 * ucp_rkey_ptr mapping) are exactly what crashed on the GPU when pdlink copied through that
 * mapping with the CPU. Each case runs in a child; the test fails if the child dies of a signal. What
 * the transport then does with a type it does not support (UCX without CUDA) is its business: the batch
 * may fail, but no byte of the PROT_NONE region may be touched by pdlink.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "pdlink/engine.h"
#include "test_child.h"

#define REGION (1u << 20)

static pdl_engine_t *mk(const char *key)
{
    pdl_engine_config_t cfg = {.key = key, .host = "127.0.0.1", .backend = PDL_BACKEND_UCX, .qp_per_transfer = 1,
                               .num_workers = 2};
    pdl_engine_t *e = NULL;
    pdl_error_t err;
    if (pdl_engine_create(&cfg, &e, &err) != PDL_OK) {
        fprintf(stderr, "create %s: %s\n", key, err.msg);
        _exit(3);
    }
    return e;
}

/* Child: 0 = pdlink refused or the transport finished without a CPU access to the device region,
 * 2 = a setup step failed; a signal = pdlink touched it. */
static int child(void *arg)
{
    pdl_op_t op = *(const pdl_op_t *)arg;
    setenv("PDLINK_TEST_UCX_CLAIM_CUDA", "1", 1);
    pdl_engine_t *owner = mk("devmem:owner"), *ini = mk("devmem:initiator");
    pdl_error_t err;
    if (!(pdl_engine_mem_types(ini) & (1u << PDL_MEM_TYPE_CUDA))) {
        fprintf(stderr, "the test hook did not make the ucx engine claim CUDA\n");
        return 2;
    }
    pdl_mem_t *om = NULL, *dm = NULL;
    if (pdl_engine_alloc_mem(owner, REGION, &om, &err) != PDL_OK) {
        fprintf(stderr, "alloc_mem: %s\n", err.msg);
        return 2;
    }
    void *dev = mmap(NULL, REGION, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dev == MAP_FAILED)
        return 2;
    pdl_status_t st = pdl_engine_register_mem_type(ini, dev, REGION, PDL_MEM_TYPE_CUDA, &dm, &err);
    if (st != PDL_OK) {
        fprintf(stderr, "register PROT_NONE as CUDA: %s (refused: nothing touched)\n", err.msg);
        return 0;
    }
    pdl_bytes_t ed = {0}, md = {0};
    if (pdl_engine_pack(owner, &ed, &err) != PDL_OK ||
        pdl_engine_add_remote(ini, ed.data, ed.len, NULL, 0, &err) != PDL_OK || pdl_mem_pack(om, &md, &err) != PDL_OK) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return 2;
    }
    pdl_session_t *s = NULL;
    st = pdl_session_open(ini, dm, md.data, md.len, &s, &err);
    if (st == PDL_OK) {
        pdl_session_prefault(s, &err);
        pdl_desc_t d[2] = {{0, 0, 4096}, {65536, 131072, 8192}};
        pdl_batch_t *b = NULL;
        st = pdl_session_post(s, op, d, 2, &b, &err);
        if (st == PDL_OK) {
            st = pdl_batch_wait(b, 10000, &err);
            pdl_batch_free(b);
        }
        pdl_session_close(s);
    }
    fprintf(stderr, "%s into/from PROT_NONE device memory: %s%s%s\n", op == PDL_OP_READ ? "READ" : "WRITE",
            pdl_status_name(st), st == PDL_OK ? "" : ": ", st == PDL_OK ? "" : err.msg);
    pdl_bytes_free(&ed);
    pdl_bytes_free(&md);
    pdl_engine_deregister_mem(ini, dm);
    pdl_engine_deregister_mem(owner, om);
    pdl_engine_destroy(ini);
    pdl_engine_destroy(owner);
    return 0;
}

static void run_case(pdl_op_t op)
{
    tch_run(child, &op, op == PDL_OP_READ ? "the READ child" : "the WRITE child", "a CPU access to device memory");
}

static void test_read_into_device_memory(void **state)
{
    (void)state;
    run_case(PDL_OP_READ);
}

static void test_write_from_device_memory(void **state)
{
    (void)state;
    run_case(PDL_OP_WRITE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_into_device_memory),
        cmocka_unit_test(test_write_from_device_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
