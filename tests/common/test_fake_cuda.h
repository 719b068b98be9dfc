/*
 * test_fake_cuda.h -- open the test CUDA driver (src/engine/cudadrv_fake.c) in a test's child process:
 * PDLINK_TEST_CUDA_FAKE=1, and with `latency_us` (not NULL) streams that hold their copies back that
 * long, as a GPU finishes copies after the calls that queued them. Needs engine/cudadrv.h.
 */
#ifndef PDL_TEST_FAKE_CUDA_H
#define PDL_TEST_FAKE_CUDA_H

#include <stdio.h>
#include <stdlib.h>

/* *drv opened with a context current; 0, or 2 with the reason on stderr (a setup failure). */
static inline int tfc_open(const char *latency_us, pdl_cudadrv_t **drv)
{
    setenv("PDLINK_TEST_CUDA_FAKE", "1", 1);
    if (latency_us != NULL)
        setenv("PDLINK_TEST_CUDA_FAKE_LATENCY_US", latency_us, 1);
    pdl_error_t err;
    if (pdl__cudadrv_open("test", "test", drv, &err) != PDL_OK || pdl__cudadrv_ctx(*drv, "test", &err) != PDL_OK) {
        fprintf(stderr, "the test driver: %s\n", err.msg);
        return 2;
    }
    return 0;
}

#endif
