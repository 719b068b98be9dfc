/*
 * run_router.c -- the router in front of `pdlink run`'s nodes: pdlink-router or the real vllm-router.
 */
#include "cli/run_router.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool executable(const char *p)
{
    return p != NULL && p[0] != '\0' && access(p, X_OK) == 0;
}

static bool set_exe(pdl_run_router_t *out, const char *path)
{
    int n = snprintf(out->exe, sizeof(out->exe), "%s", path);
    return n > 0 && (size_t)n < sizeof(out->exe);
}

/* First executable `name` in $PATH, into out->exe. */
static bool search_path(pdl_run_router_t *out, const char *name)
{
    const char *path = getenv("PATH");
    if (path == NULL)
        return false;
    while (*path != '\0') {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);
        char cand[PATH_MAX + 64];
        if (len > 0 && len < PATH_MAX) {
            snprintf(cand, sizeof(cand), "%.*s/%s", (int)len, path, name);
            if (executable(cand))
                return set_exe(out, cand);
        }
        if (colon == NULL)
            break;
        path = colon + 1;
    }
    return false;
}

pdl_status_t pdl_run_router_resolve(const char *spec, const char *exe_dir, pdl_run_router_t *out,
                                    pdl_error_t *err)
{
    memset(out, 0, sizeof(*out));
    char cand[PATH_MAX + 64];
    if (spec == NULL || strcmp(spec, "pdlink") == 0 || strcmp(spec, "pdlink-router") == 0) {
        snprintf(cand, sizeof(cand), "%s/pdlink-router", exe_dir);
        if (!executable(cand) || !set_exe(out, cand))
            return pdl_error_set(err, PDL_ERR_NOT_FOUND, "--router %s: %s not found or not executable (it is "
                                 "built next to pdlink)", spec ? spec : "pdlink", cand);
        return PDL_OK;
    }
    out->real = true;
    if (strcmp(spec, "vllm-router") == 0) {
        /* An explicit override first, then the venv scripts/install-deps makes (exe_dir is build/, the
         * venv sits at the repo root beside it), then whatever the user has on $PATH. */
        const char *env = getenv("PDLINK_VLLM_ROUTER");
        if (env != NULL && env[0] != '\0') {
            if (!executable(env) || !set_exe(out, env))
                return pdl_error_set(err, PDL_ERR_NOT_FOUND, "--router vllm-router: PDLINK_VLLM_ROUTER=%s is not "
                                     "an executable", env);
            return PDL_OK;
        }
        snprintf(cand, sizeof(cand), "%s/../.venv/bin/vllm-router", exe_dir);
        if (executable(cand) && set_exe(out, cand))
            return PDL_OK;
        if (search_path(out, "vllm-router"))
            return PDL_OK;
        return pdl_error_set(err, PDL_ERR_NOT_FOUND, "--router vllm-router: not found in $PDLINK_VLLM_ROUTER, %s "
                             "or $PATH (scripts/install-deps installs it into the venv)", cand);
    }
    if (!executable(spec) || !set_exe(out, spec))
        return pdl_error_set(err, PDL_ERR_NOT_FOUND, "--router %s: not an executable file", spec);
    const char *base = strrchr(spec, '/');
    base = base ? base + 1 : spec;
    out->real = strcmp(base, "pdlink-router") != 0;
    return PDL_OK;
}

static int add(char **argv, int cap, int *n, const char *fmt, ...)
{
    if (*n < 0 || *n >= cap - 1) {
        *n = -1;
        return -1;
    }
    char buf[4096 + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    argv[*n] = strdup(buf);
    if (argv[*n] == NULL) {
        *n = -1;
        return -1;
    }
    argv[++*n] = NULL;
    return 0;
}

/* vllm-router's --log-level choices are debug, info, warning, error, critical. */
static const char *real_level(const char *pdl_level)
{
    if (strcmp(pdl_level, "warn") == 0)
        return "warning";
    if (strcmp(pdl_level, "trace") == 0)
        return "debug";
    return pdl_level;
}

int pdl_run_router_argv(const pdl_run_router_t *r, char **argv, int cap, const char *host, int port,
                        int disc_port, int prom_port, const char *policy, const char *log_level)
{
    int n = 0;
    add(argv, cap, &n, "%s", r->exe);
    add(argv, cap, &n, "--host");
    add(argv, cap, &n, "%s", host);
    add(argv, cap, &n, "--port");
    add(argv, cap, &n, "%d", port);
    add(argv, cap, &n, "--vllm-pd-disaggregation");
    add(argv, cap, &n, "--kv-connector");
    add(argv, cap, &n, "moriio");
    add(argv, cap, &n, "--vllm-discovery-address");
    add(argv, cap, &n, "%s:%d", host, disc_port);
    /* The real router runs exactly as the seed ran it: consistent_hash for both roles. */
    const char *pol = r->real ? "consistent_hash" : policy;
    add(argv, cap, &n, "--policy");
    add(argv, cap, &n, "%s", pol);
    if (r->real) {
        add(argv, cap, &n, "--prefill-policy");
        add(argv, cap, &n, "%s", pol);
        add(argv, cap, &n, "--decode-policy");
        add(argv, cap, &n, "%s", pol);
    }
    add(argv, cap, &n, "--prometheus-port");
    add(argv, cap, &n, "%d", prom_port);
    add(argv, cap, &n, "--log-level");
    add(argv, cap, &n, "%s", r->real ? real_level(log_level) : log_level);
    return n;
}

int pdl_run_router_log_count(const char *log_path, bool prefill)
{
    FILE *f = fopen(log_path, "r");
    if (f == NULL)
        return -1;
    const char *needle = prefill ? "Add Prefill [HTTP:" : "Add Decode [HTTP:";
    /* Distinct addresses: a worker that expired and came back is logged twice but is one worker. */
    enum { MAX_SEEN = 64 };
    char seen[MAX_SEEN][80];
    int nseen = 0;
    char line[4096];
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, needle);
        if (p == NULL)
            continue;
        p += strlen(needle);
        size_t len = strcspn(p, ",] \n");
        if (len == 0 || len >= sizeof(seen[0]))
            continue;
        bool dup = false;
        for (int i = 0; i < nseen && !dup; i++)
            dup = strncmp(seen[i], p, len) == 0 && seen[i][len] == '\0';
        if (!dup && nseen < MAX_SEEN) {
            memcpy(seen[nseen], p, len);
            seen[nseen][len] = '\0';
            nseen++;
        }
    }
    fclose(f);
    return nseen;
}

int pdl_run_router_log_state(const char *log_path, bool prefill, const char *http_addr, bool *listed_p)
{
    *listed_p = false;
    FILE *f = fopen(log_path, "r");
    if (f == NULL)
        return -1;
    char add[160], rm[160];
    snprintf(add, sizeof(add), "Add %s [HTTP:%s", prefill ? "Prefill" : "Decode", http_addr);
    snprintf(rm, sizeof(rm), "Remove %s [HTTP:%s", prefill ? "Prefill" : "Decode", http_addr);
    size_t alen = strlen(add), rlen = strlen(rm);
    int removals = 0;
    char line[4096];
    while (fgets(line, sizeof(line), f) != NULL) {
        /* The address must end there: 127.0.0.1:1000 is not 127.0.0.1:10001. */
        const char *p = strstr(line, add);
        if (p != NULL && strchr(",] \n", p[alen]) != NULL)
            *listed_p = true;
        p = strstr(line, rm);
        if (p != NULL && strchr(",] \n", p[rlen]) != NULL) {
            *listed_p = false;
            removals++;
        }
    }
    fclose(f);
    return removals;
}
