/*
 * main.c -- pdlink-router: parse the command line, start the router, wait for SIGTERM/SIGINT.
 *
 * Signals are blocked in every thread and taken synchronously with sigwait() here, so no handler
 * runs inside a worker thread and shutdown is an ordinary function call. Exit status: 0 after a
 * clean shutdown, 2 on a usage error, 1 when the router cannot start (e.g. a port in use).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/resource.h>

#include <curl/curl.h>

#include "common/log.h"
#include "common/ports.h"
#include "router/router.h"

static void raise_fd_limit(void)
{
    /* Every stream holds a client socket and a backend socket; the default soft limit is often 1024. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static int write_port_file(const char *path, const pdl_router_t *rt)
{
    char tmp[1100];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "http=%d discovery=%d prometheus=%d\n", rt->http_port, rt->disc_port, rt->prom_port);
    if (fclose(f) != 0)
        return -1;
    return rename(tmp, path); /* atomic, so a reader never sees half a file */
}

int main(int argc, char **argv)
{
    pdl_log_set_ident("pdlink-router");
    const char *env = getenv("PDLINK_LOG_LEVEL");
    if (env != NULL && pdl_log_level_parse(env) >= 0)
        pdl_log_set_level((pdl_log_level_t)pdl_log_level_parse(env));

    pdl_router_config_t cfg;
    pdl_router_config_init(&cfg);
    pdl_error_t err;
    pdl_error_clear(&err);
    if (pdl_router_config_parse(&cfg, argc, argv, &err) != PDL_OK) {
        fprintf(stderr, "pdlink-router: %s\n\n", err.msg);
        pdl_router_help(stderr);
        return 2;
    }
    if (cfg.help) {
        pdl_router_help(stdout);
        return 0;
    }
    if (cfg.log_level >= 0)
        pdl_log_set_level((pdl_log_level_t)cfg.log_level);

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        pdl_error("curl_global_init failed");
        return 1;
    }

    /* Port 0 (what the tests use) is chosen by the kernel at bind time; only a configured port can be
     * taken by another process's outgoing connection first. */
    if (cfg.port > 0)
        pdl_ports_warn_ephemeral("--port", cfg.port, cfg.port);
    if (cfg.discovery_port > 0)
        pdl_ports_warn_ephemeral("--vllm-discovery-address", cfg.discovery_port, cfg.discovery_port);
    if (cfg.prometheus_port > 0)
        pdl_ports_warn_ephemeral("--prometheus-port", cfg.prometheus_port, cfg.prometheus_port);
    pdl_router_t *rt = NULL;
    if (pdl_router_create(&cfg, &rt, &err) != PDL_OK) {
        pdl_error("cannot start: %s", err.msg);
        curl_global_cleanup();
        return 1;
    }
    pdl_info("listening on http://%s:%d (discovery tcp://%s:%d, %s/%s policies)", cfg.host, rt->http_port,
             cfg.discovery_host, rt->disc_port, pdl_policy_kind_name(cfg.prefill_policy),
             pdl_policy_kind_name(cfg.decode_policy));
    if (rt->prom_port >= 0)
        pdl_info("prometheus metrics on http://%s:%d/metrics", cfg.prometheus_host, rt->prom_port);
    if (cfg.port_file[0] != '\0' && write_port_file(cfg.port_file, rt) != 0)
        pdl_warn("cannot write the port file %s: %m", cfg.port_file);

    int sig = 0;
    sigwait(&set, &sig);
    pdl_info("received signal %d; shutting down", sig);
    pdl_router_stop(rt);
    pdl_router_destroy(rt);
    curl_global_cleanup();
    return 0;
}
