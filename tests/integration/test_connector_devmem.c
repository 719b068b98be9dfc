/*
 * test_connector_devmem.c -- an instance whose KV cache is the caller's device memory
 * (pdl_instance_config_t.kv_mem_type), where there is no GPU (CI):
 *
 * - the connector config takes backend "cuda" and its error for an unknown backend names it;
 * - the memory type is checked against the backend before any engine exists (a device region on shm,
 *   ROCm on tcp, backend cuda with host memory, a device type without kv_regions, a bad type), each
 *   with its status and a message naming both;
 * - CUDA memory on tcp (named, or what "rdma" resolved to) where the CUDA driver does not load is
 *   refused once the engine exists, before registration, naming the keys and the remedy (where the
 *   driver loads, test_connector_staged.c moves such KV);
 * - a CUDA-typed config with backend cuda on a host without the CUDA driver fails with
 *   PDL_ERR_UNSUPPORTED and the engine's "no CUDA driver" message, prefixed with the rank, and leaves
 *   its ports free;
 * - no connector path touches the region with the CPU: a PROT_NONE mapping registered as CUDA memory
 *   on a ucx engine that the test hook PDLINK_TEST_UCX_CLAIM_CUDA=1 makes claim CUDA (as
 *   test_engine_devmem.c does for the engine) goes through create, the handshake payloads,
 *   pdl_instance_zero_tail, hold (grants), the release path's free and scrub_freed_blocks, and
 *   destroy, in a child that must not die of a signal.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "test_child.h"
#include "test_connector_util.h"

#define NBLK 8

/* Create c with CUDA KV regions while libcuda cannot load ($PDLINK_LIBCUDA names no file). The region
 * is never dereferenced nor registered: creation stops before registration. Returns create's status;
 * nothing is created. */
static pdl_status_t create_without_driver(pdl_instance_config_t *c, pdl_error_t *e)
{
    uint64_t need = 0;
    assert_int_equal(pdl_instance_kv_region_len(c, 0, &need, NULL), PDL_OK);
    void *regions[1] = {(void *)(uintptr_t)0x7f0000000000ull};
    size_t lens[1] = {(size_t)need};
    c->kv_regions = regions;
    c->kv_region_lens = lens;
    c->kv_mem_type = PDL_MEM_TYPE_CUDA;
    setenv("PDLINK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    pdl_instance_t *inst = NULL;
    pdl_status_t st = pdl_instance_create(c, &inst, e);
    unsetenv("PDLINK_LIBCUDA");
    assert_null(inst);
    c->kv_regions = NULL;
    c->kv_region_lens = NULL;
    return st;
}

/* scrub_freed_blocks in the no-CPU-access child (-DSCRUB=false leaves it out: scrub.c memset kv_ptr
 * before fad766e, and this child died there). */
#ifndef SCRUB
#define SCRUB true
#endif

static void base(pdl_instance_config_t *c, pdl_backend_kind_t backend, int tp)
{
    tc_geo_t g = tc_geo_nhd(8, 2);
    int hs = tp_free_range(2 * tp);
    assert_true(hs > 0);
    tc_config(c, PDL_ROLE_PRODUCER, tp, &g, NBLK, backend, 5, hs, hs + tp);
}

static void config_backend_cuda(void **state)
{
    (void)state;
    pdl_connector_config_t c;
    pdl_error_t e;
    assert_int_equal(pdl_connector_config_parse("{\"kv_connector_extra_config\":{\"backend\":\"cuda\"}}", &c, &e), PDL_OK);
    assert_int_equal(c.backend, PDL_BACKEND_CUDA);
    assert_false(c.backend_mapped_from_rdma);
    assert_int_equal(pdl_connector_config_parse("{\"kv_connector_extra_config\":{\"backend\":\"gpu\"}}", &c, &e),
                     PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "unknown backend \"gpu\""));
    assert_non_null(strstr(e.msg, "\"cuda\""));
}

static void mem_type_checked_before_engines(void **state)
{
    (void)state;
    static uint8_t host[64];
    void *regions[2] = {host, host};
    size_t lens[2] = {sizeof(host), sizeof(host)};
    pdl_instance_config_t c;
    pdl_instance_t *inst = NULL;
    pdl_error_t e;

    /* device memory on shm, whose peers copy with the CPU; ROCm on tcp, which stages CUDA memory only */
    base(&c, PDL_BACKEND_SHM, 2);
    c.kv_regions = regions;
    c.kv_region_lens = lens;
    c.kv_mem_type = PDL_MEM_TYPE_CUDA;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_UNSUPPORTED);
    assert_null(inst);
    assert_string_equal(e.msg, "instance: the KV cache is CUDA memory (kv_mem_type), but "
                               "kv_connector_extra_config.backend shm moves host memory only (its peers copy with the "
                               "CPU); use backend \"tcp\" (staged through host memory, any hosts), \"cuda\" (GPUs of "
                               "one host) or \"ucx\" built with CUDA support");
    c.conn.backend = PDL_BACKEND_TCP;
    c.conn.backend_mapped_from_rdma = false; /* the defaults take no key as "rdma" */
    c.kv_mem_type = PDL_MEM_TYPE_ROCM;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_UNSUPPORTED);
    assert_string_equal(e.msg, "instance: the KV cache is ROCm memory (kv_mem_type), but "
                               "kv_connector_extra_config.backend tcp stages CUDA memory only; use backend \"ucx\" "
                               "built with ROCm support");
    c.conn.backend_mapped_from_rdma = true;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "backend tcp (what \"rdma\" resolved to) stages CUDA memory only"));
    c.conn.backend_mapped_from_rdma = false;

    /* backend cuda with host memory: the caller's, or the instance's own */
    c.conn.backend = PDL_BACKEND_CUDA;
    c.kv_mem_type = PDL_MEM_TYPE_HOST;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_UNSUPPORTED);
    assert_string_equal(e.msg, "kv_connector_extra_config.backend \"cuda\" moves GPU memory only, but the KV cache is "
                               "host memory; use \"tcp\" or \"shm\" for host memory");
    c.kv_regions = NULL;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "host memory (the instance's own: no kv_regions given)"));

    /* a device type needs the caller's regions; an unknown type is refused */
    c.kv_mem_type = PDL_MEM_TYPE_CUDA;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_INVALID);
    assert_string_equal(e.msg, "instance: kv_mem_type CUDA needs kv_regions (the instance allocates host memory only)");
    c.kv_regions = regions;
    c.kv_mem_type = (pdl_mem_type_t)7;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_INVALID);
    assert_string_equal(e.msg, "instance: kv_mem_type 7 is not a memory type");
    assert_null(inst);
}

static void cuda_without_driver(void **state)
{
    (void)state;
    pdl_instance_config_t c;
    base(&c, PDL_BACKEND_CUDA, 1);
    pdl_error_t e;
    assert_int_equal(create_without_driver(&c, &e), PDL_ERR_UNSUPPORTED);
    char want[256];
    snprintf(want, sizeof(want),
             "instance rank 0: engine producer:127.0.0.1:%d:tp0:dp0: backend cuda: no CUDA driver: "
             "dlopen(/nonexistent/libcuda.so.1)",
             c.conn.handshake_port);
    assert_non_null(strstr(e.msg, want));
    assert_non_null(strstr(e.msg, "needs an NVIDIA GPU and its driver"));
    /* nothing left behind: the ports bound before the engine are free again */
    assert_true(tc_port_free(c.conn.handshake_port));
    assert_true(tc_port_free(c.conn.notify_port));
}

/* CUDA KV on tcp (or what "rdma" resolved to) where the driver does not load: refused once the engine
 * says it registers host memory only, before any region is registered, naming the keys and the remedy. */
static void tcp_without_driver(void **state)
{
    (void)state;
    for (int mapped = 0; mapped < 2; mapped++) {
        pdl_instance_config_t c;
        base(&c, PDL_BACKEND_TCP, 1);
        c.conn.backend_mapped_from_rdma = mapped;
        pdl_error_t e;
        assert_int_equal(create_without_driver(&c, &e), PDL_ERR_UNSUPPORTED);
        char want[512];
        snprintf(want, sizeof(want),
                 "instance rank 0: kv_mem_type CUDA with kv_connector_extra_config.backend tcp%s: tcp stages CUDA "
                 "memory through the CUDA driver, which did not load (libcuda.so.1 or $PDLINK_LIBCUDA; "
                 "PDLINK_LOG_LEVEL=debug says why); install the NVIDIA driver, or keep the KV cache in host memory",
                 mapped ? " (what \"rdma\" resolved to)" : "");
        assert_string_equal(e.msg, want);
        assert_true(tc_port_free(c.conn.handshake_port));
        assert_true(tc_port_free(c.conn.notify_port));
    }
}

/* Child: every connector call that may touch KV memory, on PROT_NONE memory typed CUDA. 0 = done
 * (refusals included), 2 = a setup step failed; a signal = the CPU touched the "device" region. */
static int devmem_child(void *arg)
{
    (void)arg;
    setenv("PDLINK_TEST_UCX_CLAIM_CUDA", "1", 1);
    pdl_instance_config_t c;
    base(&c, PDL_BACKEND_UCX, 2);
    c.conn.scrub_freed_blocks = SCRUB;
    void *regions[2];
    size_t lens[2];
    for (int r = 0; r < 2; r++) {
        uint64_t need = 0;
        if (pdl_instance_kv_region_len(&c, r, &need, NULL) != PDL_OK)
            return 2;
        regions[r] = mmap(NULL, (size_t)need, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (regions[r] == MAP_FAILED)
            return 2;
        lens[r] = (size_t)need;
    }
    c.kv_regions = regions;
    c.kv_region_lens = lens;
    c.kv_mem_type = PDL_MEM_TYPE_CUDA;
    pdl_instance_t *inst = NULL;
    pdl_error_t e;
    pdl_status_t st = pdl_instance_create(&c, &inst, &e);
    if (st != PDL_OK) {
        fprintf(stderr, "create on PROT_NONE memory typed CUDA: %s: %s\n", pdl_status_name(st), e.msg);
        return strstr(e.msg, "in use") ? 2 : 0;
    }
    if (pdl_instance_kv_layer(inst, 1, 1) != (uint8_t *)regions[1] + pdl_layout_region_len(pdl_instance_geometry(inst, 1)))
        return 2;
    uint32_t ids[3];
    if (pdl_instance_alloc_blocks(inst, 3, ids, &e) != PDL_OK)
        return 2;
    /* ucx has no device path for zeroing: refused, never a memset */
    st = pdl_instance_zero_tail(inst, ids, 3, 2 * 4 + 1, &e);
    fprintf(stderr, "zero_tail: %s%s%s\n", pdl_status_name(st), st == PDL_OK ? "" : ": ", st == PDL_OK ? "" : e.msg);
    /* free with scrub_freed_blocks: zeroed through the engine */
    pdl_instance_free_blocks(inst, ids, 1);
    /* a hold grants ranges of the region; a release-less hold is freed (and scrubbed) by destroy */
    st = pdl_instance_hold(inst, "devmem-t1", ids + 1, 2, &e);
    fprintf(stderr, "hold: %s\n", pdl_status_name(st));
    pdl_instance_destroy(inst);
    return 0;
}

static void no_cpu_access_to_device_regions(void **state)
{
    (void)state;
    tch_run(devmem_child, NULL, "the child", "a CPU access to a device KV region");
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_backend_cuda),
        cmocka_unit_test(mem_type_checked_before_engines),
        cmocka_unit_test(cuda_without_driver),
        cmocka_unit_test(tcp_without_driver),
        cmocka_unit_test(no_cpu_access_to_device_regions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
