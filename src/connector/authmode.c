/*
 * authmode.c -- an instance's authenticated mode (auth_key_file; docs/security.md): the cluster key,
 * the ZAP handler of the instance's ZeroMQ context, and which rank a refusal is counted on.
 *
 * The sockets themselves are made CURVE servers (service.c: the handshake and notify ROUTERs) and
 * clients (service.c: the discovery ping; handshake.c; sender.c) where they are created, with
 * pdl_curve_server / pdl_curve_client, which do nothing in compatible mode. The tcp engines get the key
 * through pdl_engine_config_t.auth (rank.c) and challenge every data connection themselves.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connector/internal.h"

pdl_status_t pdl__authmode_load(pdl_instance_t *inst, pdl_error_t *err)
{
    const pdl_connector_config_t *c = &inst->cfg.conn;
    if (c->auth_key_file[0] == '\0')
        return PDL_OK;
    /* ucx moves KV with UCX's own connections, which pdlink cannot challenge: refuse rather than run a
     * cluster whose control plane is authenticated and whose data plane is open. */
    if (c->backend == PDL_BACKEND_UCX)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "kv_connector_extra_config.auth_key_file: backend ucx cannot authenticate its data "
                             "connections; use backend tcp (or shm on one host) in authenticated mode");
    pdl_status_t st = pdl_auth_load(c->auth_key_file, &inst->auth, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "kv_connector_extra_config");
    return PDL_OK;
}

void pdl__authmode_domain(const pdl_rank_t *r, const char *what, char *buf, size_t cap)
{
    snprintf(buf, cap, "rank %d %s", r->rank, what);
}

/* ZAP handler thread: a refused connection counts on the rank its domain names. */
static void count_refusal(void *arg, const char *domain, const char *address)
{
    pdl_instance_t *inst = arg;
    (void)address;
    int rank = -1;
    if (sscanf(domain, "rank %d", &rank) != 1 || rank < 0 || rank >= inst->tp)
        rank = 0;
    atomic_fetch_add(&inst->zap_refused[rank], 1);
}

pdl_status_t pdl__authmode_start(pdl_instance_t *inst, pdl_error_t *err)
{
    if (inst->auth == NULL)
        return PDL_OK;
    inst->zap_refused = calloc((size_t)inst->tp, sizeof(*inst->zap_refused));
    if (inst->zap_refused == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "instance: out of memory (ZAP counters)");
    char who[PDL_WIRE_HOST_MAX + 32];
    snprintf(who, sizeof(who), "instance %s", inst->engine_id);
    return pdl_curve_zap_start(inst->zctx, inst->auth, who, count_refusal, inst, &inst->zap, err);
}

void pdl__authmode_stop(pdl_instance_t *inst)
{
    pdl_curve_zap_stop(inst->zap);
    inst->zap = NULL;
}

void pdl__authmode_free(pdl_instance_t *inst)
{
    pdl_auth_free(inst->auth);
    inst->auth = NULL;
    free((void *)inst->zap_refused);
    inst->zap_refused = NULL;
}
