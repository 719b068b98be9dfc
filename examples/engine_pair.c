/*
 * engine_pair.c -- the smallest program built against an installed libpdlink: two transfer engines in
 * one process, an "owner" that registers 1 MiB filled with a pattern and a "reader" that pulls it into
 * its own registered buffer with one-sided READs, then checks every byte.
 *
 * It walks the engine's whole lifecycle (include/pdlink/engine.h, reached through pdlink/pdlink.h):
 * create, register, pack the
 * descriptors a peer would receive over the network, add the remote, open a session, post a batch,
 * wait, and tear down in order. Two engines in one process exchange the descriptors directly; in a
 * real deployment they travel in the connector's handshake.
 *
 *   usage: engine_pair [tcp|shm]        (default tcp; exit status 0 when every byte arrived)
 *
 * Built by examples/CMakeLists.txt (find_package(pdlink)) or by hand with pkg-config:
 *   cc engine_pair.c $(pkg-config --cflags --libs pdlink) -o engine_pair
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdlink/pdlink.h>

#define REGION (1u << 20)
#define PIECES 16

static int fail(const char *what, const pdl_error_t *err)
{
    fprintf(stderr, "engine_pair: %s: %s (%s)\n", what, err->msg, pdl_status_name(err->status));
    return 1;
}

static pdl_status_t engine(const char *key, pdl_backend_kind_t backend, pdl_engine_t **e, pdl_error_t *err)
{
    pdl_engine_config_t cfg;
    pdl_engine_config_defaults(&cfg); /* then set fields by name: the struct may grow (pdlink/pdlink.h) */
    cfg.key = key;
    cfg.host = "127.0.0.1";
    cfg.port = 0; /* any free port */
    cfg.backend = backend;
    cfg.qp_per_transfer = 2;
    cfg.num_workers = 2;
    return pdl_engine_create(&cfg, e, err);
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "tcp";
    int backend = pdl_backend_parse(name);
    if (backend < 0) {
        fprintf(stderr, "usage: engine_pair [tcp|shm] (not '%s')\n", name);
        return 2;
    }
    printf("pdlink headers %s, library %s, backend %s\n", PDL_VERSION_STRING, pdl_version_string(),
           pdl_backend_name((pdl_backend_kind_t)backend));
    if (pdl_version_number() / 100 != PDL_VERSION_NUMBER / 100) {
        fprintf(stderr, "engine_pair: built against pdlink %s but runs with %s\n", PDL_VERSION_STRING,
                pdl_version_string());
        return 1;
    }

    int rc = 1;
    pdl_error_t err = {0};
    pdl_engine_t *owner = NULL, *reader = NULL;
    pdl_mem_t *src = NULL, *dst = NULL;
    pdl_bytes_t engine_desc = {0}, mem_desc = {0};
    pdl_session_t *session = NULL;
    pdl_batch_t *batch = NULL;
    uint8_t *out = aligned_alloc(4096, REGION);
    char remote_key[256] = "";
    if (out == NULL)
        return 1;
    memset(out, 0, REGION);

    if (engine("example-owner", (pdl_backend_kind_t)backend, &owner, &err) != PDL_OK ||
        engine("example-reader", (pdl_backend_kind_t)backend, &reader, &err) != PDL_OK) {
        rc = fail("pdl_engine_create", &err);
        goto out;
    }
    /* The owner's memory: allocated by the engine (shm needs memory it can share), then filled. */
    if (pdl_engine_alloc_mem(owner, REGION, &src, &err) != PDL_OK) {
        rc = fail("pdl_engine_alloc_mem", &err);
        goto out;
    }
    uint8_t *in = pdl_mem_ptr(src);
    for (size_t i = 0; i < REGION; i++)
        in[i] = (uint8_t)(i * 31u + 7u);
    if (pdl_engine_register_mem(reader, out, REGION, &dst, &err) != PDL_OK) {
        rc = fail("pdl_engine_register_mem", &err);
        goto out;
    }
    /* What the owner would send to its peer. */
    if (pdl_engine_pack(owner, &engine_desc, &err) != PDL_OK || pdl_mem_pack(src, &mem_desc, &err) != PDL_OK) {
        rc = fail("pack", &err);
        goto out;
    }
    if (pdl_engine_add_remote(reader, engine_desc.data, engine_desc.len, remote_key, sizeof(remote_key), &err) !=
            PDL_OK ||
        pdl_session_open(reader, dst, mem_desc.data, mem_desc.len, &session, &err) != PDL_OK) {
        rc = fail("connect", &err);
        goto out;
    }
    /* The region in PIECES descriptors, read into the same offsets of the reader's buffer. */
    pdl_desc_t d[PIECES];
    for (int i = 0; i < PIECES; i++)
        d[i] = (pdl_desc_t){.local_off = (uint64_t)i * (REGION / PIECES),
                            .remote_off = (uint64_t)i * (REGION / PIECES),
                            .len = REGION / PIECES};
    if (pdl_session_post(session, PDL_OP_READ, d, PIECES, &batch, &err) != PDL_OK) {
        rc = fail("pdl_session_post", &err);
        goto out;
    }
    /* No deadline: a failure (a peer gone, a refused range) ends the batch, not a timer. */
    if (pdl_batch_wait(batch, -1, &err) != PDL_OK) {
        rc = fail("pdl_batch_wait", &err);
        goto out;
    }
    if (memcmp(in, out, REGION) != 0) {
        fprintf(stderr, "engine_pair: the bytes read differ from the owner's\n");
        goto out;
    }
    printf("read %u bytes from %s in %d descriptors over %s: every byte matches\n", REGION, remote_key, PIECES,
           name);
    rc = 0;

out:
    pdl_batch_free(batch);
    pdl_session_close(session);
    if (remote_key[0] != '\0')
        pdl_engine_remove_remote(reader, remote_key, NULL);
    pdl_bytes_free(&engine_desc);
    pdl_bytes_free(&mem_desc);
    if (dst != NULL)
        pdl_engine_deregister_mem(reader, dst);
    if (src != NULL)
        pdl_engine_deregister_mem(owner, src);
    pdl_engine_destroy(reader);
    pdl_engine_destroy(owner);
    free(out);
    return rc;
}
