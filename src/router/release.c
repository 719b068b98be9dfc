/* release.c -- failed-status releases to a prefill whose decode leg failed (see release.h). */
#include "router/release.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "connector/curve.h"
#include "common/log.h"
#include "wire/params_json.h"
#include "pdlink/topo.h"
#include "pdlink/wire.h"

/* Long enough to connect to a live prefill on a busy host; short enough not to hold up shutdown. */
#define RELEASE_LINGER_MS 1000

struct pdl_rt_release {
    void *zctx;
    const pdl_auth_t *auth;
};

pdl_status_t pdl_rt_release_create(const pdl_auth_t *auth, pdl_rt_release_t **rel_p, pdl_error_t *err)
{
    pdl_rt_release_t *rel = calloc(1, sizeof(*rel));
    if (rel == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "releases: out of memory");
    rel->auth = auth;
    rel->zctx = zmq_ctx_new();
    if (rel->zctx == NULL) {
        free(rel);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "releases: zmq_ctx_new: %s", zmq_strerror(errno));
    }
    *rel_p = rel;
    return PDL_OK;
}

void pdl_rt_release_destroy(pdl_rt_release_t *rel)
{
    if (rel == NULL)
        return;
    zmq_ctx_term(rel->zctx);
    free(rel);
}

/* Queue one encoded release on a fresh DEALER to tcp://host:port; false (logged) when it cannot. */
static bool send_one(pdl_rt_release_t *rel, const char *host, int port, const pdl_bytes_t *b, const char *what)
{
    char ep[PDL_WIRE_HOST_MAX + 32];
    bool v6 = strchr(host, ':') != NULL;
    snprintf(ep, sizeof(ep), v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", host, port);
    void *s = zmq_socket(rel->zctx, ZMQ_DEALER);
    if (s == NULL) {
        pdl_warn("%s to %s: zmq_socket: %s", what, ep, zmq_strerror(errno));
        return false;
    }
    int linger = RELEASE_LINGER_MS, one = 1;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    if (v6)
        zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof(one));
    pdl_error_t e;
    if (pdl_curve_client(s, rel->auth, &e) != PDL_OK) {
        pdl_warn("%s to %s: %s", what, ep, e.msg);
        zmq_close(s);
        return false;
    }
    bool ok = zmq_connect(s, ep) == 0 && zmq_send(s, b->data, b->len, ZMQ_DONTWAIT) == (int)b->len;
    if (!ok)
        pdl_warn("%s to %s: %s", what, ep, zmq_strerror(errno));
    zmq_close(s); /* the message is delivered in the background, within the linger */
    return ok;
}

int pdl_rt_release_send(pdl_rt_release_t *rel, const json_t *kv_params, const char *zmq_address,
                        const char *request_id)
{
    if (!json_is_object(kv_params))
        return 0;
    pdl_kv_params_t p;
    pdl_error_t e;
    pdl_error_clear(&e);
    if (pdl_kv_params_from_json(kv_params, &p, &e) != PDL_OK) {
        pdl_warn("request %s: prefill %s returned kv_transfer_params the router cannot read (%s): its blocks "
                 "stay held until its reaper frees them",
                 request_id, zmq_address, e.msg);
        pdl_kv_params_clear(&p);
        return 0;
    }
    pdl_kv_params_clear(&p); /* only the scalar fields are used */
    if (p.transfer_id[0] == '\0')
        return 0; /* nothing held: the prefill returned no transfer */
    char host[PDL_WIRE_HOST_MAX + 1];
    int notify = p.remote_notify_port;
    snprintf(host, sizeof(host), "%s", p.remote_host);
    if (host[0] == '\0' || notify <= 0) {
        pdl_zmq_addr_t za;
        if (zmq_address == NULL || pdl_wire_parse_zmq_address(zmq_address, &za, NULL) != PDL_OK) {
            pdl_warn("request %s: no notify address for transfer %s (params lack it, prefill address '%s'): its "
                     "blocks stay held until the prefill's reaper frees them",
                     request_id, p.transfer_id, zmq_address ? zmq_address : "");
            return 0;
        }
        snprintf(host, sizeof(host), "%s", za.host);
        notify = za.notify_port;
    }
    int tp = p.tp_size > 0 ? p.tp_size : p.remote_tp_size > 0 ? p.remote_tp_size : 1;
    int dp = p.remote_dp_rank >= 0 ? p.remote_dp_rank : 0;
    int sent = 0;
    for (int g = 0; g < tp; g++) {
        pdl_msg_t m;
        pdl_msg_init(&m, PDL_MSG_RELEASE);
        snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", p.transfer_id);
        m.consumer_tp_size = 1; /* as the one consumer rank each producer rank expects a release from */
        m.consumer_tp_rank = 0;
        m.status = PDL_RELEASE_FAILED;
        m.producer_tp_size = tp;
        m.producer_tp_rank = g;
        pdl_bytes_t b = {0};
        char what[PDL_WIRE_ID_MAX + 96];
        snprintf(what, sizeof(what), "release of transfer %s (producer rank %d/%d)", p.transfer_id, g, tp);
        int off = pdl_topo_port_offset(dp, tp, g);
        if (off < 0 || notify + off > 65535)
            pdl_warn("%s: no notify port (base %d, DP rank %d)", what, notify, dp);
        else if (pdl_wire_encode_msg(&m, &b, &e) != PDL_OK)
            pdl_warn("%s: not encoded: %s", what, e.msg);
        else if (send_one(rel, host, notify + off, &b, what))
            sent++;
        pdl_bytes_free(&b);
        pdl_msg_clear(&m);
    }
    pdl_info("request %s: decode failed; sent failed-status releases of transfer %s to %d of %d ranks of prefill "
             "%s notify port %d+",
             request_id, p.transfer_id, sent, tp, host, notify);
    return sent;
}
