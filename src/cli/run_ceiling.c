/*
 * run_ceiling.c -- the same-run ceilings of `pdlink run` (docs/benchmarks.md#how-it-is-measured): memcpy for
 * shm (and ucx over shared memory), a loopback TCP stream for tcp, with one thread (one rank's engine) and
 * with one thread per rank of a decode instance. The measurement is bench/ceiling.h's, shared with
 * `pdlink bench` so both commands measure alike.
 */
#include <stdbool.h>

#include "bench/ceiling.h"
#include "cli/run_ctx.h"
#include "common/log.h"

/* The backend's ceiling with `threads` threads (memcpy) or streams (tcp); 0 when it failed. */
double pdl_run_ceiling_with(const run_ctx_t *c, int threads)
{
    double g;
    if (!pdl_ceiling_is_memcpy(c->o.backend))
        g = pdl_ceiling_tcp_gbps("127.0.0.1", (size_t)512 << 20, (size_t)1 << 20, threads);
    else
        g = pdl_ceiling_memcpy_gbps((size_t)32 << 20, threads, 16);
    if (g <= 0) {
        pdl_warn("the %s ceiling with %d thread(s) could not be measured; its ratios are left out",
                 pdl_ceiling_is_memcpy(c->o.backend) ? "memcpy" : "tcp stream", threads);
        return 0;
    }
    return g;
}

/* Pull threads of one decode instance of the topology: its TP size (the largest, if they differ). */
int pdl_run_topo_pull_threads(const pdl_run_topo_t *t)
{
    int m = 0;
    for (int k = 0; k < t->nd; k++)
        m = t->dtp[k] > m ? t->dtp[k] : m;
    return m;
}

double pdl_run_inst_ceiling(const run_ctx_t *c, int threads)
{
    for (int i = 0; i < c->ninst_ceil; i++)
        if (c->inst_ceil_threads[i] == threads)
            return c->inst_ceil_gbps[i];
    return 0;
}

void pdl_run_measure_ceiling(run_ctx_t *c)
{
    /*
     * Each rank pulls with its own worker thread and one engine worker (num_workers = 1 in kv_config):
     * one rank's engine rate is compared with a 1-thread memcpy or a single TCP stream, and a decode
     * instance of TP T pulls with T threads (one per rank, all copying at once when pulls overlap), so
     * its transfer rate is compared with a T-thread memcpy or T streams (the same threads:
     * docs/benchmarks.md#how-it-is-measured).
     * More threads than cores share the cores, as the ranks do. 32 MiB is about two llama-3.1-8b pulls
     * of this workload, large enough to leave the caches.
     */
    c->ceiling_threads = 1;
    c->ceiling_gbps = pdl_run_ceiling_with(c, 1);
    for (int i = 0; i < c->o.ntopos; i++) {
        int t = pdl_run_topo_pull_threads(&c->o.topos[i]);
        bool seen = false;
        for (int k = 0; k < c->ninst_ceil; k++)
            seen |= c->inst_ceil_threads[k] == t;
        if (t < 1 || seen || c->ninst_ceil == (int)(sizeof(c->inst_ceil_gbps) / sizeof(c->inst_ceil_gbps[0])))
            continue;
        c->inst_ceil_threads[c->ninst_ceil] = t;
        c->inst_ceil_gbps[c->ninst_ceil] = t == 1 ? c->ceiling_gbps : pdl_run_ceiling_with(c, t);
        c->ninst_ceil++;
    }
}
