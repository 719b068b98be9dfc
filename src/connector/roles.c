/*
 * roles.c -- which role module serves an instance-wide call: a table by mode (READ, WRITE) and role
 * (producer, consumer). pdl_instance_abandon goes to the role that gives a transfer up -- a READ decode
 * (pull.c: failed releases on its lanes), a WRITE decode (push_recv.c: failed releases), a WRITE
 * prefill (push.c: failed write_done) --, and WRITE mode's reaper and destroy to both of its roles and
 * the park they share (push_park.c). So the role files need not call each other; they meet here.
 */
#include <pthread.h>

#include "connector/push.h"

typedef pdl_status_t (*abandon_fn)(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                   pdl_error_t *err);

typedef struct role_entry {
    const char *name;
    abandon_fn abandon; /* NULL: the role has nothing to abandon (why) */
    const char *why;
    const char *sends; /* what an abandon sends, for the log */
} role_entry_t;

/* [read_mode][role == PDL_ROLE_CONSUMER] */
static const role_entry_t ROLES[2][2] = {
    [0][0] = {"WRITE producer", pdl__push_abandon_producer, NULL, "failed write_done"},
    [0][1] = {"WRITE consumer", pdl__recv_abandon, NULL, "failed releases"},
    [1][0] = {"READ producer", NULL,
              "a READ-mode producer has nothing to abandon (it holds only what it prefilled, until the consumer "
              "releases it)",
              NULL},
    [1][1] = {"READ consumer", pdl__pull_abandon, NULL, "failed releases"},
};

static const role_entry_t *role_of(const pdl_instance_t *inst)
{
    return &ROLES[inst->cfg.conn.read_mode ? 1 : 0][inst->cfg.conn.role == PDL_ROLE_CONSUMER ? 1 : 0];
}

pdl_status_t pdl_instance_abandon(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                  pdl_error_t *err)
{
    if (inst == NULL || params == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "abandon: missing argument");
    if (params->transfer_id[0] == '\0')
        return pdl_error_set(err, PDL_ERR_INVALID, "abandon: kv_transfer_params.transfer_id is missing");
    const role_entry_t *e = role_of(inst);
    if (e->abandon == NULL)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED, "abandon %s: %s", params->transfer_id, e->why);
    pdl_status_t st = e->abandon(inst, params, request_id, err);
    if (st == PDL_OK) {
        PDL_CTR_ADD(pdl__rank_first(inst), transfers_abandoned, 1);
        pdl_debug("abandon %s (%s): %s queued", params->transfer_id, e->name, e->sends);
    }
    return st;
}

void pdl__push_reap(pdl_rank_t *r)
{
    if (r->inst->cfg.conn.read_mode)
        return;
    pdl__push_reap_shares(r);
    pdl__park_reap(r);
    pdl__recv_reap(r);
}

void pdl__push_free_all(pdl_instance_t *inst)
{
    pdl__push_free_pushes(inst);
    pdl__park_free_all(inst);
    pdl__recv_orphan_all(inst);
    pthread_mutex_destroy(&inst->push_mu);
    pthread_cond_destroy(&inst->push_cv);
}
