/* shim.c -- the C shim of the pdlink Python package (declared in shim.h): the held-transfer event
 * queue, and the calls that take kv_transfer_params as JSON text. Compiled into pdlink._pdlink with
 * cffi's generated module (_build.py). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "shim.h"
#include "pdlink/log.h"
#include "pdlink/params.h"
#include "pdlink/topo.h"

void pdlpy_log_set_level(int lvl)
{
    pdl_log_set_level((pdl_log_level_t)lvl);
}

/* Held-transfer events wait here, in C, until Python takes them. The connector calls its event function
 * on its own threads -- a rank's service thread among them, which also serves that rank's releases and
 * handshakes -- so that function must not wait for Python's GIL: in a busy interpreter (a vLLM worker
 * running its model) every such wait would stall the rank's control plane. */
typedef struct pdlpy_event {
    struct pdlpy_event *next;
    int ev, rank;
    char tid[];
} pdlpy_event_t;

typedef struct pdlpy_events {
    pthread_mutex_t mu;
    pdlpy_event_t *head, *tail;
    unsigned long dropped; /* events lost to a failed malloc, logged when next taken */
} pdlpy_events_t;

static void pdlpy_events_on(void *arg, pdl_instance_event_t ev, const char *transfer_id, int tp_rank)
{
    pdlpy_events_t *q = arg;
    size_t n = strlen(transfer_id);
    pdlpy_event_t *e = malloc(sizeof(*e) + n + 1);
    pthread_mutex_lock(&q->mu);
    if (e == NULL) {
        q->dropped++;
    } else {
        e->next = NULL;
        e->ev = (int)ev;
        e->rank = tp_rank;
        memcpy(e->tid, transfer_id, n + 1);
        if (q->tail)
            q->tail->next = e;
        else
            q->head = e;
        q->tail = e;
    }
    pthread_mutex_unlock(&q->mu);
}

/* A queue receiving inst's events from now on; NULL without memory. Free it after pdl_instance_destroy. */
pdlpy_events_t *pdlpy_events_attach(pdl_instance_t *inst)
{
    pdlpy_events_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    pthread_mutex_init(&q->mu, NULL);
    pdl_instance_set_event_fn(inst, pdlpy_events_on, q);
    return q;
}

/* The oldest event into ev/rank/tid (cut to cap bytes with its NUL): 1, or 0 when there is none. */
int pdlpy_events_take(pdlpy_events_t *q, int *ev, int *rank, char *tid, size_t cap)
{
    pthread_mutex_lock(&q->mu);
    pdlpy_event_t *e = q->head;
    if (e != NULL) {
        q->head = e->next;
        if (q->head == NULL)
            q->tail = NULL;
    }
    unsigned long dropped = q->dropped;
    q->dropped = 0;
    pthread_mutex_unlock(&q->mu);
    if (dropped > 0)
        fprintf(stderr, "pdlink python: error: %lu held-transfer events lost (out of memory): their blocks are "
                        "freed by pdlink, but a caller waiting for FREED will not see it\n", dropped);
    if (e == NULL)
        return 0;
    *ev = e->ev;
    *rank = e->rank;
    snprintf(tid, cap, "%s", e->tid);
    free(e);
    return 1;
}

void pdlpy_events_free(pdlpy_events_t *q)
{
    if (q == NULL)
        return;
    for (pdlpy_event_t *e = q->head, *next; e != NULL; e = next) {
        next = e->next;
        free(e);
    }
    pthread_mutex_destroy(&q->mu);
    free(q);
}

char *pdlpy_params_json(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n,
                        pdl_error_t *err)
{
    pdl_kv_params_t p;
    if (pdl_instance_params(inst, transfer_id, ids, n, &p, err) != PDL_OK)
        return NULL;
    char *s = pdl_kv_params_format(&p);
    pdl_kv_params_clear(&p);
    if (s == NULL)
        pdl_error_set(err, PDL_ERR_NOMEM, "kv_transfer_params of %s: cannot encode", transfer_id);
    return s;
}

pdl_status_t pdlpy_pull(pdl_instance_t *inst, const char *params_json, const char *request_id,
                        const uint32_t *ids, size_t n, pdl_pull_t **pull_out, pdl_error_t *err)
{
    pdl_kv_params_t p;
    pdl_status_t st = pdl_kv_params_parse(params_json, &p, err);
    if (st == PDL_OK)
        st = pdl_instance_pull(inst, &p, request_id, ids, n, pull_out, err);
    pdl_kv_params_clear(&p);
    return st;
}

/* layers < 0: pdl_instance_push (every layer final); else pdl_instance_push_start and, when layers > 0,
 * pdl_instance_push_layers. A push its consumer had abandoned before it was made is over at once: there
 * is nothing to say final then (NOT_FOUND), and the push itself succeeded. */
pdl_status_t pdlpy_push(pdl_instance_t *inst, const char *params_json, const char *request_id,
                        const uint32_t *ids, size_t n, int layers, pdl_error_t *err)
{
    pdl_kv_params_t p;
    pdl_status_t st = pdl_kv_params_parse(params_json, &p, err);
    if (st == PDL_OK && layers < 0)
        st = pdl_instance_push(inst, &p, request_id, ids, n, err);
    else if (st == PDL_OK)
        st = pdl_instance_push_start(inst, &p, request_id, ids, n, err);
    if (st == PDL_OK && layers > 0) {
        pdl_status_t lst = pdl_instance_push_layers(inst, p.transfer_id, layers, err);
        if (lst != PDL_ERR_NOT_FOUND)
            st = lst;
    }
    pdl_kv_params_clear(&p);
    return st;
}

pdl_status_t pdlpy_expect_push(pdl_instance_t *inst, const char *params_json, const char *request_id,
                               const uint32_t *ids, size_t n, pdl_recv_t **recv_out, pdl_error_t *err)
{
    pdl_kv_params_t p;
    pdl_status_t st = pdl_kv_params_parse(params_json, &p, err);
    if (st == PDL_OK)
        st = pdl_instance_expect_push(inst, &p, request_id, ids, n, recv_out, err);
    pdl_kv_params_clear(&p);
    return st;
}

pdl_status_t pdlpy_abandon(pdl_instance_t *inst, const char *params_json, const char *request_id,
                           pdl_error_t *err)
{
    pdl_kv_params_t p;
    pdl_status_t st = pdl_kv_params_parse(params_json, &p, err);
    if (st == PDL_OK)
        st = pdl_instance_abandon(inst, &p, request_id, err);
    pdl_kv_params_clear(&p);
    return st;
}
