/*
 * test_engine_ops.c -- the backends' tables of operations (backend.h): every table this build has is
 * accepted by pdl__backend_check (the check pdl_engine_create runs), and a table with a required entry
 * NULL is refused with a message naming the backend and that entry, for both ways a backend runs
 * chunks (run_chunk: shm; submit and drive_chunk: tcp).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "engine/backend.h"

/* ops refused with PDL_ERR_INVALID and a message that names its backend and `entry`. */
static void refused(const pdl_backend_ops_t *ops, const char *entry)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    assert_int_equal(pdl__backend_check(ops, &err), PDL_ERR_INVALID);
    char want[64];
    snprintf(want, sizeof(want), "backend %s: ", ops->name);
    if (strncmp(err.msg, want, strlen(want)) != 0 || strstr(err.msg, entry) == NULL)
        fail_msg("expected '%s...%s', got '%s'", want, entry, err.msg);
}

static void test_builtin_tables_accepted(void **state)
{
    (void)state;
    const pdl_backend_kind_t kinds[] = {PDL_BACKEND_SHM, PDL_BACKEND_TCP, PDL_BACKEND_UCX, PDL_BACKEND_CUDA};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        const pdl_backend_ops_t *ops = pdl__backend_ops(kinds[i]);
        assert_non_null(ops);
        pdl_error_t err;
        pdl_error_clear(&err);
        pdl_status_t st = pdl__backend_check(ops, &err);
        if (ops->unavailable != NULL) { /* ucx in a build without UCX: refused, saying why */
            assert_int_equal(st, PDL_ERR_UNSUPPORTED);
            assert_non_null(strstr(err.msg, ops->unavailable));
            continue;
        }
        if (st != PDL_OK)
            fail_msg("backend %s refused: %s", ops->name, err.msg);
        /* Exactly one way of running chunks: a backend with submit has no run_chunk to stub out. */
        assert_true((ops->run_chunk == NULL) != (ops->submit == NULL));
    }
    assert_null(pdl__backend_ops((pdl_backend_kind_t)99));
}

/* Each required entry of shm's table (the run_chunk way), NULLed on a copy. */
static void test_missing_required_run_chunk_way(void **state)
{
    (void)state;
    const pdl_backend_ops_t *shm = pdl__backend_ops(PDL_BACKEND_SHM);
    assert_non_null(shm->run_chunk);
    pdl_backend_ops_t o = *shm;
    o.remote_add = NULL;
    refused(&o, "remote_add");
    o = *shm;
    o.session_open = NULL;
    refused(&o, "session_open");
    o = *shm;
    o.session_close = NULL;
    refused(&o, "session_close");
    o = *shm;
    o.session_check = NULL;
    refused(&o, "session_check");
    o = *shm;
    o.run_chunk = NULL;
    refused(&o, "run_chunk");
    /* Optional entries may be NULL: the same table without them is accepted. */
    o = *shm;
    o.engine_init = NULL;
    o.engine_fini = NULL;
    o.remote_free = NULL;
    o.session_prefault = NULL;
    o.plan = NULL;
    o.mem_zero = NULL;
    pdl_error_t err;
    assert_int_equal(pdl__backend_check(&o, &err), PDL_OK);
    /* A capability that needs an entry makes that entry required. */
    o.caps |= PDL_BACKEND_CAP_ABORT_BREAKS;
    o.session_kill = NULL;
    refused(&o, "session_kill");
    o = *shm;
    o.caps |= PDL_BACKEND_CAP_ALLOC;
    o.mem_init = NULL;
    refused(&o, "mem_init");
}

/* tcp's table (submit and drive_chunk): drive_chunk is required with submit, and run_chunk beside
 * submit is refused (the engine would never call it). */
static void test_missing_required_submit_way(void **state)
{
    (void)state;
    const pdl_backend_ops_t *tcp = pdl__backend_ops(PDL_BACKEND_TCP);
    assert_non_null(tcp->submit);
    pdl_backend_ops_t o = *tcp;
    o.drive_chunk = NULL;
    refused(&o, "drive_chunk");
    o = *tcp;
    o.submit = NULL;
    o.drive_chunk = NULL;
    o.progress = NULL;
    refused(&o, "run_chunk");
    o = *tcp;
    o.run_chunk = pdl__backend_ops(PDL_BACKEND_SHM)->run_chunk;
    refused(&o, "run_chunk and submit");
    o = *tcp;
    o.session_kill = NULL; /* tcp has PDL_BACKEND_CAP_ABORT_BREAKS */
    refused(&o, "session_kill");
    o = *tcp;
    o.progress = NULL; /* optional: waiters then sleep until a pool thread completes the batch */
    pdl_error_t err;
    assert_int_equal(pdl__backend_check(&o, &err), PDL_OK);
}

/* A table marked unavailable is refused as unsupported with its text, whatever its entries. */
static void test_unavailable(void **state)
{
    (void)state;
    pdl_backend_ops_t o = {.name = "ucx", .unavailable = "built without it"};
    pdl_error_t err;
    assert_int_equal(pdl__backend_check(&o, &err), PDL_ERR_UNSUPPORTED);
    assert_string_equal(err.msg, "backend ucx: built without it");
    o = (pdl_backend_ops_t){.name = NULL};
    assert_int_equal(pdl__backend_check(&o, &err), PDL_ERR_INVALID);
    assert_int_equal(pdl__backend_check(NULL, &err), PDL_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtin_tables_accepted),
        cmocka_unit_test(test_missing_required_run_chunk_way),
        cmocka_unit_test(test_missing_required_submit_way),
        cmocka_unit_test(test_unavailable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
