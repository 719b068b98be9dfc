/*
 * router.c -- build and tear down a pdl_router_t: registry, policies, HTTP client pool, discovery
 * socket and the HTTP listeners, in that order; destroy undoes it in reverse.
 */
#include "router/release.h"
#include "router/router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "common/log.h"

/* Idle legs kept for reuse: enough for a few hundred concurrent streams to keep their connections. */
#define RT_POOL_IDLE 1024

pdl_status_t pdl_router_create(const pdl_router_config_t *cfg, pdl_router_t **rt_p, pdl_error_t *err)
{
    pdl_router_t *rt = calloc(1, sizeof(*rt));
    if (rt == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "out of memory");
    rt->cfg = *cfg;
    atomic_init(&rt->stop, false);
    rt->prom_port = -1;
    uint8_t seed[16];
    pdl_router_uuid4(seed);
    uint64_t s = 0;
    memcpy(&s, seed, sizeof(s));
    pdl_status_t st;
    if (cfg->auth_key_file[0] != '\0' && (st = pdl_auth_load(cfg->auth_key_file, &rt->auth, err)) != PDL_OK) {
        pdl_router_destroy(rt);
        return pdl_error_prefix(err, st, "--auth-key-file");
    }
    if ((st = pdl_rt_apikey_init(&rt->apikey, cfg->api_key, cfg->api_key_hosts, rt->auth != NULL, err)) != PDL_OK) {
        pdl_router_destroy(rt);
        return st;
    }
    if ((st = pdl_registry_create(cfg->worker_ttl_ms, &rt->reg)) != PDL_OK ||
        (st = pdl_rt_metrics_create(&rt->metrics)) != PDL_OK ||
        (st = pdl_policy_create(cfg->prefill_policy, s, &rt->prefill_policy)) != PDL_OK ||
        (st = pdl_policy_create(cfg->decode_policy, s ^ 0x5bd1e995u, &rt->decode_policy)) != PDL_OK ||
        (st = pdl_upstream_create(RT_POOL_IDLE, &rt->stop, &rt->up)) != PDL_OK ||
        (st = pdl_rt_release_create(rt->auth, &rt->rel, err)) != PDL_OK) {
        pdl_router_destroy(rt);
        return pdl_error_set(err, st, "out of memory creating the router");
    }
    if ((st = pdl_discovery_start(rt, cfg->discovery_host, cfg->discovery_port, &rt->disc, &rt->disc_port, err)) !=
            PDL_OK ||
        (st = pdl_server_start(rt, cfg->host, cfg->port, false, &rt->http, &rt->http_port, err)) != PDL_OK) {
        pdl_router_stop(rt);
        pdl_router_destroy(rt);
        return st;
    }
    if (cfg->prometheus_port >= 0 &&
        (st = pdl_server_start(rt, cfg->prometheus_host, cfg->prometheus_port, true, &rt->prom, &rt->prom_port,
                               err)) != PDL_OK) {
        pdl_router_stop(rt);
        pdl_router_destroy(rt);
        return st;
    }
    *rt_p = rt;
    return PDL_OK;
}

void pdl_router_stop(pdl_router_t *rt)
{
    if (rt != NULL)
        atomic_store(&rt->stop, true);
}

void pdl_router_destroy(pdl_router_t *rt)
{
    if (rt == NULL)
        return;
    atomic_store(&rt->stop, true);
    /* HTTP first: connection threads may hold legs and read the registry until they are joined. */
    pdl_http_stop(rt->prom);
    pdl_http_stop(rt->http);
    pdl_discovery_destroy(rt->disc);
    pdl_upstream_destroy(rt->up);
    pdl_rt_release_destroy(rt->rel);
    pdl_policy_destroy(rt->prefill_policy);
    pdl_policy_destroy(rt->decode_policy);
    pdl_rt_metrics_destroy(rt->metrics);
    pdl_registry_destroy(rt->reg);
    pdl_auth_free(rt->auth);
    pdl_rt_apikey_free(&rt->apikey);
    free(rt);
}
