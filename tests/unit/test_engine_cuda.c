/*
 * test_engine_cuda.c -- the cuda backend where there is no GPU (CI): engine creation refuses with
 * PDL_ERR_UNSUPPORTED and says why, and the descriptor fields device memory adds (memory type, CUDA IPC
 * handle and offset) survive encode/decode and are checked. The GPU paths run in tools/gpu-check.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/backend.h"
#include "pdlink/engine.h"

static pdl_status_t create(pdl_engine_t **e, pdl_error_t *err)
{
    pdl_engine_config_t cfg = {.key = "decode:tp0", .backend = PDL_BACKEND_CUDA, .qp_per_transfer = 1,
                               .num_workers = 2};
    *e = NULL;
    return pdl_engine_create(&cfg, e, err);
}

static void test_refused_without_driver(void **state)
{
    (void)state;
    assert_int_equal(pdl_backend_parse("cuda"), PDL_BACKEND_CUDA);
    assert_string_equal(pdl_backend_name(PDL_BACKEND_CUDA), "cuda");
    setenv("PDLINK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    pdl_engine_t *e;
    pdl_error_t err;
    assert_int_equal(create(&e, &err), PDL_ERR_UNSUPPORTED);
    assert_null(e);
    assert_non_null(strstr(err.msg, "engine decode:tp0: backend cuda: no CUDA driver: dlopen(/nonexistent/libcuda.so.1)"));
    assert_non_null(strstr(err.msg, "needs an NVIDIA GPU and its driver"));
    unsetenv("PDLINK_LIBCUDA");
    /* The real driver name: refused the same way on a host without one. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL && (h = dlopen("libcuda.so.1", RTLD_NOW)) == NULL) {
        assert_int_equal(create(&e, &err), PDL_ERR_UNSUPPORTED);
        assert_non_null(strstr(err.msg, "no CUDA driver: dlopen(libcuda.so.1)"));
    } else {
        dlclose(h);
    }
}

static void test_device_descriptor_fields(void **state)
{
    (void)state;
    pdl_rmem_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    assert_non_null(a);
    assert_non_null(b);
    strcpy(a->engine_key, "prefill:tp1");
    a->id = 0x1234567890abcdefull;
    a->size = 256u << 20;
    a->kind = PDL_MEM_USER;
    a->addr = 0x7f0000200000ull;
    a->fd = -1;
    a->pid = 4242;
    a->slot = 17;
    a->type = PDL_MEM_TYPE_CUDA;
    a->ipc_len = PDL_CUDA_IPC_HANDLE;
    for (int i = 0; i < PDL_CUDA_IPC_HANDLE; i++)
        a->ipc[i] = (uint8_t)(i * 37 + 1);
    a->ipc_off = 3u << 20;
    pdl_bytes_t out = {0};
    pdl_error_t err;
    assert_int_equal(pdl__mem_desc_encode(a, &out, &err), PDL_OK);
    assert_int_equal(pdl__mem_desc_unpack(out.data, out.len, b, &err), PDL_OK);
    assert_int_equal(b->type, PDL_MEM_TYPE_CUDA);
    assert_int_equal(b->ipc_len, PDL_CUDA_IPC_HANDLE);
    assert_memory_equal(b->ipc, a->ipc, PDL_CUDA_IPC_HANDLE);
    assert_int_equal(b->ipc_off, a->ipc_off);
    assert_int_equal(b->id, a->id);
    assert_int_equal(b->size, a->size);
    assert_int_equal(b->addr, a->addr);
    assert_int_equal(b->slot, a->slot);
    pdl_bytes_free(&out);

    /* Host memory: no device fields written, host read back. */
    a->type = PDL_MEM_TYPE_HOST;
    a->ipc_len = 0;
    a->ipc_off = 0;
    assert_int_equal(pdl__mem_desc_encode(a, &out, &err), PDL_OK);
    assert_null(memmem(out.data, out.len, "mem_type", 8));
    assert_null(memmem(out.data, out.len, "ipc", 3));
    assert_int_equal(pdl__mem_desc_unpack(out.data, out.len, b, &err), PDL_OK);
    assert_int_equal(b->type, PDL_MEM_TYPE_HOST);
    assert_int_equal(b->ipc_len, 0);
    pdl_bytes_free(&out);

    /* A type this pdlink does not know, and a handle of the wrong size, are malformed. */
    a->type = (pdl_mem_type_t)7;
    assert_int_equal(pdl__mem_desc_encode(a, &out, &err), PDL_OK);
    assert_int_equal(pdl__mem_desc_unpack(out.data, out.len, b, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "unknown memory type 7"));
    pdl_bytes_free(&out);
    a->type = PDL_MEM_TYPE_CUDA;
    a->ipc_len = 10;
    assert_int_equal(pdl__mem_desc_encode(a, &out, &err), PDL_OK);
    assert_int_equal(pdl__mem_desc_unpack(out.data, out.len, b, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "'ipc' must be 64 bytes"));
    pdl_bytes_free(&out);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_without_driver),
        cmocka_unit_test(test_device_descriptor_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
