/*
 * run_router.h -- which router `pdlink run` puts in front of the nodes: its own pdlink-router, or the
 * real vllm-router (the Rust router of the seed's deployment, installed from PyPI into the project venv
 * by scripts/install-deps) with the seed's exact flags.
 *
 * The two differ where `pdlink run` looks at them: vllm-router lists no discovered instance anywhere
 * (its /workers and /list_workers show the static registry, empty in discovery mode, and /health
 * answers 200 before anything registered), so registration is read from the line it logs for each new
 * instance; it serves /metrics only on --prometheus-port; its --log-level says "warning" where pdlink
 * says "warn".
 */
#ifndef PDL_CLI_RUN_ROUTER_H
#define PDL_CLI_RUN_ROUTER_H

#include <stdbool.h>
#include <stddef.h>

#include "pdlink/status.h"

typedef struct pdl_run_router {
    bool real;          /* vllm-router (true) or pdlink-router (false) */
    char exe[4096 + 64];
} pdl_run_router_t;

/*
 * Resolve `--router` (NULL or "pdlink": exe_dir/pdlink-router; "vllm-router": $PDLINK_VLLM_ROUTER, else
 * the project venv's exe_dir/../.venv/bin/vllm-router, else vllm-router on $PATH; anything else: a path
 * to a router executable, real unless its file name is pdlink-router). On failure the message names
 * the value and every place looked at.
 */
pdl_status_t pdl_run_router_resolve(const char *spec, const char *exe_dir, pdl_run_router_t *out,
                                    pdl_error_t *err);

/*
 * argv (heap strings, NULL-terminated, at most cap-1 entries) of the router: the seed's command for
 * the real one (--vllm-pd-disaggregation --kv-connector moriio --vllm-discovery-address H:P --policy
 * consistent_hash --prefill-policy consistent_hash --decode-policy consistent_hash), pdlink-router's
 * usual one otherwise. `log_level` is pdlink's spelling. Returns the number of entries, -1 on overflow.
 */
int pdl_run_router_argv(const pdl_run_router_t *r, char **argv, int cap, const char *host, int port,
                        int disc_port, int prom_port, const char *policy, const char *log_level);

/*
 * Count the instances vllm-router logged as added ("Add Prefill [HTTP:<addr>" / "Add Decode [HTTP:"),
 * each http address once (a re-registration after expiry logs the line again). -1 if the log cannot
 * be read.
 */
int pdl_run_router_log_count(const char *log_path, bool prefill);

/*
 * One instance's registration as vllm-router logged it: the number of "Remove Prefill/Decode
 * [HTTP:<http_addr>" lines (it drops an instance whose pings stopped for 5 s, e.g. a stopped process, and
 * adds it again at its next ping), and in *listed_p whether its last Add/Remove line is an Add. -1 if
 * the log cannot be read.
 */
int pdl_run_router_log_state(const char *log_path, bool prefill, const char *http_addr, bool *listed_p);

#endif /* PDL_CLI_RUN_ROUTER_H */
