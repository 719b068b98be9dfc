/*
 * test_auth.c -- authenticated mode's key file and derived keys (src/common/auth.c): what a key file
 * must be (present, a regular file, not world-accessible, long enough), that the derivation depends on
 * the secret and nothing else, that a MAC verifies only under the same secret, label and parts; and
 * that this libzmq can do CURVE at all.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cmocka.h>

#include "pdlink/auth.h"
#include "pdlink/connector.h"

static const char k_secret[] = "0123456789abcdef0123456789abcdef-cluster-A";

/* A key file in a fresh temporary directory with `text` and `mode`; the path goes to buf. */
static void write_key(char *buf, size_t cap, const char *text, mode_t mode)
{
    char dir[] = "/tmp/pdl_test_auth_XXXXXX";
    assert_non_null(mkdtemp(dir));
    snprintf(buf, cap, "%s/key", dir);
    FILE *f = fopen(buf, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(buf, mode), 0);
}

static void remove_key(const char *path)
{
    unlink(path);
    char dir[256];
    snprintf(dir, sizeof(dir), "%s", path);
    *strrchr(dir, '/') = '\0';
    rmdir(dir);
}

static void key_file_rules(void **state)
{
    (void)state;
    char path[256];
    pdl_error_t e;
    pdl_auth_t *a = NULL;

    assert_int_equal(pdl_auth_load("/nonexistent/pdlink.key", &a, &e), PDL_ERR_SYSTEM);
    assert_non_null(strstr(e.msg, "/nonexistent/pdlink.key"));
    assert_null(a);

    write_key(path, sizeof(path), k_secret, 0644);
    assert_int_equal(pdl_auth_load(path, &a, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, path));
    assert_non_null(strstr(e.msg, "chmod 600"));
    remove_key(path);

    write_key(path, sizeof(path), "too short\n", 0600);
    assert_int_equal(pdl_auth_load(path, &a, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, path));
    assert_non_null(strstr(e.msg, "bytes"));
    remove_key(path);

    /* 31 bytes and a newline: the newline is not secret material. */
    write_key(path, sizeof(path), "0123456789012345678901234567890\n", 0600);
    assert_int_equal(pdl_auth_load(path, &a, &e), PDL_ERR_INVALID);
    remove_key(path);

    /* Group access is refused too (the group's other members could join the cluster), with the mode. */
    static const mode_t group_modes[] = {0640, 0660, 0620, 0610};
    for (size_t i = 0; i < sizeof(group_modes) / sizeof(group_modes[0]); i++) {
        char mode[8];
        snprintf(mode, sizeof(mode), "%04o", (unsigned)group_modes[i]);
        write_key(path, sizeof(path), k_secret, group_modes[i]);
        assert_int_equal(pdl_auth_load(path, &a, &e), PDL_ERR_INVALID);
        assert_null(a);
        assert_non_null(strstr(e.msg, path));
        assert_non_null(strstr(e.msg, mode));
        assert_non_null(strstr(e.msg, "its group"));
        remove_key(path);
    }

    write_key(path, sizeof(path), k_secret, 0400); /* read-only for the owner is fine */
    assert_int_equal(pdl_auth_load(path, &a, &e), PDL_OK);
    assert_non_null(a);
    remove_key(path);

    /* The file's key equals the same secret given in memory, with or without its newline. */
    pdl_auth_t *b = NULL;
    char nl[sizeof(k_secret) + 1];
    snprintf(nl, sizeof(nl), "%s\n", k_secret);
    assert_int_equal(pdl_auth_from_secret(nl, strlen(nl), &b, NULL), PDL_OK);
    assert_memory_equal(pdl_auth_curve_public(a), pdl_auth_curve_public(b), PDL_AUTH_KEY_LEN);
    assert_memory_equal(pdl_auth_curve_secret(a), pdl_auth_curve_secret(b), PDL_AUTH_KEY_LEN);
    pdl_auth_free(a);
    pdl_auth_free(b);

    assert_int_equal(pdl_auth_load("/", &a, &e), PDL_ERR_INVALID); /* a directory */
    assert_int_equal(pdl_auth_load("", &a, &e), PDL_ERR_INVALID);
    pdl_auth_free(NULL);
}

static void derivation_and_macs(void **state)
{
    (void)state;
    pdl_auth_t *a = NULL, *b = NULL;
    assert_int_equal(pdl_auth_from_secret(k_secret, strlen(k_secret), &a, NULL), PDL_OK);
    char other[sizeof(k_secret)];
    memcpy(other, k_secret, sizeof(other));
    other[0] ^= 1;
    assert_int_equal(pdl_auth_from_secret(other, strlen(other), &b, NULL), PDL_OK);
    assert_memory_not_equal(pdl_auth_curve_public(a), pdl_auth_curve_public(b), PDL_AUTH_KEY_LEN);
    assert_memory_not_equal(pdl_auth_curve_public(a), pdl_auth_curve_secret(a), PDL_AUTH_KEY_LEN);

    uint8_t n1[PDL_AUTH_KEY_LEN], n2[PDL_AUTH_KEY_LEN];
    pdl_auth_nonce(n1);
    pdl_auth_nonce(n2);
    assert_memory_not_equal(n1, n2, sizeof(n1));

    const void *parts[] = {"engine-1", n1, n2};
    size_t lens[] = {8, sizeof(n1), sizeof(n2)};
    uint8_t mac[PDL_AUTH_KEY_LEN];
    pdl_auth_mac(a, "data-client", parts, lens, 3, mac);
    assert_true(pdl_auth_verify(a, "data-client", parts, lens, 3, mac));
    assert_false(pdl_auth_verify(b, "data-client", parts, lens, 3, mac)); /* another secret */
    assert_false(pdl_auth_verify(a, "data-server", parts, lens, 3, mac)); /* another label: no reflection */
    const void *swapped[] = {"engine-1", n2, n1};
    assert_false(pdl_auth_verify(a, "data-client", swapped, lens, 3, mac));
    /* Part boundaries are part of the input. */
    const void *moved[] = {"engine-", n1, n2};
    size_t mlens[] = {7, sizeof(n1), sizeof(n2)};
    assert_false(pdl_auth_verify(a, "data-client", moved, mlens, 3, mac));
    mac[5] ^= 0x10;
    assert_false(pdl_auth_verify(a, "data-client", parts, lens, 3, mac));
    pdl_auth_free(a);
    pdl_auth_free(b);
}

/* kv_connector_extra_config's keys: auth_key_file (a path; absent = compatible mode) and
 * scrub_freed_blocks (off unless set). */
static void config_keys(void **state)
{
    (void)state;
    pdl_connector_config_t c;
    pdl_connector_config_defaults(&c);
    assert_string_equal(c.auth_key_file, "");
    assert_false(c.scrub_freed_blocks);
    pdl_error_t e;
    assert_int_equal(pdl_connector_config_from_extra("{\"auth_key_file\": \"/etc/pdlink/cluster.key\", "
                                                     "\"scrub_freed_blocks\": \"true\"}", &c, &e), PDL_OK);
    assert_string_equal(c.auth_key_file, "/etc/pdlink/cluster.key");
    assert_true(c.scrub_freed_blocks);
    assert_int_equal(pdl_connector_config_from_extra("{\"auth_key_file\": 7}", &c, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "auth_key_file"));
}

/* Authenticated mode needs libzmq built with CURVE (Debian's libzmq5 is, through libsodium). */
static void zmq_has_curve(void **state)
{
    (void)state;
    assert_true(zmq_has("curve"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(key_file_rules),
        cmocka_unit_test(derivation_and_macs),
        cmocka_unit_test(config_keys),
        cmocka_unit_test(zmq_has_curve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
