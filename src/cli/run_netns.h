/*
 * run_netns.h -- network namespaces for `pdlink run --netns`: each instance of a cluster in its own
 * namespace, all joined by veth pairs to one bridge in the caller's namespace, so the instances talk
 * over a real (virtual) network path with their own addresses: the "two hosts" case on one machine.
 *
 * Needs CAP_NET_ADMIN (root) and the `ip` tool (iproute2). Everything created is named after the
 * caller's pid (pdlr<pid>-<i>, pdlb<pid>) and removed by pdl_run_netns_destroy.
 */
#ifndef PDL_CLI_RUN_NETNS_H
#define PDL_CLI_RUN_NETNS_H

#include "pdlink/status.h"

typedef struct pdl_run_netns pdl_run_netns_t;

/* Create `count` namespaces (1..60) on a fresh bridge; `log_path` collects the `ip` commands' output. */
pdl_status_t pdl_run_netns_create(int count, const char *log_path, pdl_run_netns_t **ns_p, pdl_error_t *err);

/* The IPv4 address of namespace i ("10.213.x.(i+2)"), and an fd for setns(2). */
const char *pdl_run_netns_ip(const pdl_run_netns_t *ns, int i);
int pdl_run_netns_fd(const pdl_run_netns_t *ns, int i);

/* Remove every namespace and the bridge; NULL is fine. */
void pdl_run_netns_destroy(pdl_run_netns_t *ns);

/* An error naming what is missing if this process cannot create namespaces (not root, no `ip`). */
pdl_status_t pdl_run_netns_check(pdl_error_t *err);

#endif
