/*
 * resolve.c -- the peer resolver: what a request names, vetted once for every role (resolve.h).
 */
#include <stdio.h>
#include <string.h>

#include "connector/internal.h"
#include "connector/resolve.h"

const char *pdl__role_name(pdl_role_t role) { return role == PDL_ROLE_PRODUCER ? "producer" : "consumer"; }

void pdl__numeric_host(const char *host, char out[64])
{
    if (pdl__host_numeric(host, false, out, 64) != 0)
        out[0] = '\0';
}

void pdl__numeric_host_of_name(const char *name, char out[64])
{
    char host[PDL_WIRE_HOST_MAX + 16];
    snprintf(host, sizeof(host), "%s", name[0] == '[' ? name + 1 : name);
    char *end = name[0] == '[' ? strchr(host, ']') : strrchr(host, ':');
    if (end)
        *end = '\0';
    pdl__numeric_host(host, out);
}

void pdl__peer_name(char *buf, size_t cap, const char *host, int port)
{
    snprintf(buf, cap, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

bool pdl__sent_by(const char *sender, const char *expected)
{
    return sender == NULL || sender[0] == '\0' || expected[0] == '\0' || strcmp(sender, expected) == 0;
}

pdl_status_t pdl__resolve_vet_host(pdl_instance_t *inst, const char *host, const char *what, const char *transfer_id,
                                   pdl_role_t peer_role, pdl_error_t *err)
{
    if (pdl__trust_host(&inst->trusted, host))
        return PDL_OK;
    PDL_CTR_ADD(pdl__rank_first(inst), untrusted_refused, 1);
    return pdl_error_set(err, PDL_ERR_DENIED, "%s %s: %s host %.200s is not in trusted_hosts (%.200s)", what,
                         transfer_id, pdl__role_name(peer_role), host, inst->cfg.conn.trusted_hosts);
}

/* Host and port bases: the params' remote address when complete, else the request id's part. */
static pdl_status_t endpoint_of(const pdl_kv_params_t *params, const char *request_id, pdl_role_t peer_role,
                                const char *what, pdl_peer_addr_t *pa, pdl_error_t *err)
{
    if (params->remote_host[0] && params->remote_handshake_port > 0 && params->remote_notify_port > 0) {
        snprintf(pa->host, sizeof(pa->host), "%s", params->remote_host);
        pa->hs_base = params->remote_handshake_port;
        pa->notify_base = params->remote_notify_port;
        return PDL_OK;
    }
    bool producer = peer_role == PDL_ROLE_PRODUCER;
    pdl_zmq_addr_t za;
    pdl_error_t e;
    if (request_id == NULL ||
        pdl_wire_parse_request_id(request_id, producer ? &za : NULL, producer ? NULL : &za, &e) != PDL_OK)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "%s %s: no %s address: kv_transfer_params lacks remote_host/remote_handshake_port/"
                             "remote_notify_port and the request id %s",
                             what, params->transfer_id, pdl__role_name(peer_role), request_id ? e.msg : "is absent");
    snprintf(pa->host, sizeof(pa->host), "%s", za.host);
    pa->hs_base = za.handshake_port;
    pa->notify_base = za.notify_port;
    return PDL_OK;
}

/* The peer's TP and DP rank, checked against ours and against the port space. */
static pdl_status_t shape_of(const pdl_instance_t *inst, const pdl_kv_params_t *params, const char *what,
                             pdl_peer_addr_t *pa, pdl_error_t *err)
{
    const char *tid = params->transfer_id;
    bool disagree = false;
    pa->tp = pdl_kv_params_peer_tp(params, inst->tp, &disagree);
    if (disagree)
        pdl_warn("%s %s: kv_transfer_params remote_tp_size %d and tp_size %d disagree; using %d", what, tid,
                 params->remote_tp_size, params->tp_size, pa->tp);
    pa->dp = params->remote_dp_rank >= 0 ? params->remote_dp_rank : 0;
    const char *peer = pdl__role_name(pa->role);
    const char *ours = pdl__role_name(pa->role == PDL_ROLE_PRODUCER ? PDL_ROLE_CONSUMER : PDL_ROLE_PRODUCER);
    if (pa->tp < 1 || pa->tp > PDL_TOPO_MAX_TP)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s %s: %s TP %d: invalid size (1 to %d)", what, tid, peer, pa->tp,
                             PDL_TOPO_MAX_TP);
    int dummy;
    pdl_error_t e;
    if (pdl_topo_map_rank(0, inst->tp, pa->tp, &dummy, &e) != PDL_OK)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s %s: %s TP %d with %s TP %d: %s", what, tid, peer, pa->tp, ours,
                             inst->tp, e.msg);
    long top = (long)pa->dp * pa->tp + pa->tp;
    if (pa->hs_base < 1 || pa->hs_base + top > 65536 || pa->notify_base < 1 || pa->notify_base + top > 65536)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s %s: %s ports %d/%d + %ld ranks exceed 65535", what, tid, peer,
                             pa->hs_base, pa->notify_base, top);
    return PDL_OK;
}

pdl_status_t pdl__resolve_peer(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               pdl_role_t peer_role, const char *what, pdl_peer_addr_t *out, pdl_error_t *err)
{
    memset(out, 0, sizeof(*out));
    out->role = peer_role;
    pdl_status_t st = endpoint_of(params, request_id, peer_role, what, out, err);
    if (st == PDL_OK)
        st = shape_of(inst, params, what, out, err);
    if (st == PDL_OK)
        st = pdl__resolve_vet_host(inst, out->host, what, params->transfer_id, peer_role, err);
    if (st != PDL_OK)
        return st;
    snprintf(out->engine_id, sizeof(out->engine_id), "%s:%d", out->host, out->hs_base);
    snprintf(out->claimed_id, sizeof(out->claimed_id), "%s", params->remote_engine_id);
    pdl__numeric_host(out->host, out->ip);
    return PDL_OK;
}

pdl_status_t pdl__resolve_hold_consumer(pdl_instance_t *inst, const char *transfer_id, const char *request_id,
                                        char *consumer, size_t cap, pdl_error_t *err)
{
    consumer[0] = '\0';
    pdl_zmq_addr_t da;
    if (request_id == NULL || pdl_wire_parse_request_id(request_id, NULL, &da, NULL) != PDL_OK)
        return PDL_OK;
    pdl_status_t st = pdl__resolve_vet_host(inst, da.host, "hold", transfer_id, PDL_ROLE_CONSUMER, err);
    if (st != PDL_OK)
        return st;
    pdl__peer_name(consumer, cap, da.host, da.handshake_port);
    return PDL_OK;
}
