/*
 * run_netns.c -- network namespaces for `pdlink run --netns` (see run_netns.h).
 *
 * How it works: the `ip` tool does the netlink work (creating namespaces by hand would mean
 * re-implementing `ip netns add`'s bind mount under /run/netns). Layout, for pid P and subnet
 * 10.213.S.0/24 (S derived from P so that parallel runs differ):
 *
 *     caller's namespace:  bridge pdlbP 10.213.S.1 ── veth pdlvPh<i> ─┐
 *     namespace pdlrP-<i>:                      veth pdlvPn<i> 10.213.S.(i+2), lo up
 *
 * Interface names stay within IFNAMSIZ-1 = 15 characters for pids up to 7 digits. A child joins its
 * namespace with setns() on the fd of /run/netns/pdlrP-<i> between fork and exec (run_proc.c).
 */
#include "cli/run_netns.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { NETNS_MAX = 60 };

struct pdl_run_netns {
    int count;
    int subnet;
    pid_t pid;
    char log_path[512];
    char ip[NETNS_MAX][20];
    int fd[NETNS_MAX];
    int created;          /* namespaces created so far */
    int bridge;           /* bridge created */
};

static const char *ip_tool(void)
{
    static const char *const paths[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
        if (access(paths[i], X_OK) == 0)
            return paths[i];
    return NULL;
}

/* Run `ip ARGS...` (NULL-terminated), output appended to the log; returns its exit status or -1. */
static int run_ip(const char *log_path, ...)
{
    const char *argv[16];
    int argc = 0;
    argv[argc++] = ip_tool();
    va_list ap;
    va_start(ap, log_path);
    const char *a;
    while (argc < 15 && (a = va_arg(ap, const char *)) != NULL)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    if (argv[0] == NULL)
        return -1;
    int logfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd >= 0) {
        char line[512];
        size_t off = 0;
        for (int i = 0; i < argc && off < sizeof(line); i++)
            off += (size_t)snprintf(line + off, sizeof(line) - off, "%s%s", i ? " " : "+ ", argv[i]);
        if (off < sizeof(line) - 1)
            line[off++] = '\n';
        ssize_t w = write(logfd, line, off);
        (void)w;
    }
    pid_t pid = fork();
    if (pid < 0) {
        if (logfd >= 0)
            close(logfd);
        return -1;
    }
    if (pid == 0) {
        if (logfd >= 0) {
            dup2(logfd, STDOUT_FILENO);
            dup2(logfd, STDERR_FILENO);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (logfd >= 0)
        close(logfd);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

pdl_status_t pdl_run_netns_check(pdl_error_t *err)
{
    if (geteuid() != 0)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "--netns needs root (CAP_NET_ADMIN) to create network namespaces; run as root or "
                             "drop --netns");
    if (ip_tool() == NULL)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED, "--netns needs the `ip` tool (Debian package iproute2)");
    return PDL_OK;
}

pdl_status_t pdl_run_netns_create(int count, const char *log_path, pdl_run_netns_t **ns_p, pdl_error_t *err)
{
    pdl_status_t st = pdl_run_netns_check(err);
    if (st != PDL_OK)
        return st;
    if (count < 1 || count > NETNS_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "--netns: %d namespaces requested (1..%d)", count, NETNS_MAX);
    pdl_run_netns_t *ns = calloc(1, sizeof(*ns));
    if (ns == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "out of memory");
    ns->count = count;
    ns->pid = getpid();
    ns->subnet = 16 + (int)(ns->pid % 224);
    snprintf(ns->log_path, sizeof(ns->log_path), "%s", log_path);
    for (int i = 0; i < NETNS_MAX; i++)
        ns->fd[i] = -1;

    char br[32], braddr[32];
    snprintf(br, sizeof(br), "pdlb%d", (int)ns->pid);
    snprintf(braddr, sizeof(braddr), "10.213.%d.1/24", ns->subnet);
    if (run_ip(log_path, "link", "add", br, "type", "bridge", NULL) != 0) {
        pdl_run_netns_destroy(ns);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "--netns: `ip link add %s type bridge` failed (see %s)", br, log_path);
    }
    ns->bridge = 1;
    if (run_ip(log_path, "addr", "add", braddr, "dev", br, NULL) != 0 ||
        run_ip(log_path, "link", "set", br, "up", NULL) != 0) {
        pdl_run_netns_destroy(ns);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "--netns: configuring bridge %s failed (see %s)", br, log_path);
    }
    for (int i = 0; i < count; i++) {
        char name[32], vh[24], vn[24], addr[32], path[64];
        snprintf(name, sizeof(name), "pdlr%d-%d", (int)ns->pid, i);
        snprintf(vh, sizeof(vh), "pdlv%dh%d", (int)ns->pid, i);
        snprintf(vn, sizeof(vn), "pdlv%dn%d", (int)ns->pid, i);
        snprintf(ns->ip[i], sizeof(ns->ip[i]), "10.213.%d.%d", ns->subnet, i + 2);
        snprintf(addr, sizeof(addr), "%s/24", ns->ip[i]);
        if (run_ip(log_path, "netns", "add", name, NULL) != 0) {
            pdl_run_netns_destroy(ns);
            return pdl_error_set(err, PDL_ERR_SYSTEM, "--netns: `ip netns add %s` failed (see %s)", name, log_path);
        }
        ns->created = i + 1;
        if (run_ip(log_path, "link", "add", vh, "type", "veth", "peer", "name", vn, NULL) != 0 ||
            run_ip(log_path, "link", "set", vn, "netns", name, NULL) != 0 ||
            run_ip(log_path, "link", "set", vh, "master", br, "up", NULL) != 0 ||
            run_ip(log_path, "-n", name, "addr", "add", addr, "dev", vn, NULL) != 0 ||
            run_ip(log_path, "-n", name, "link", "set", vn, "up", NULL) != 0 ||
            run_ip(log_path, "-n", name, "link", "set", "lo", "up", NULL) != 0) {
            pdl_run_netns_destroy(ns);
            return pdl_error_set(err, PDL_ERR_SYSTEM, "--netns: wiring namespace %s failed (see %s)", name, log_path);
        }
        snprintf(path, sizeof(path), "/run/netns/%s", name);
        ns->fd[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (ns->fd[i] < 0) {
            int e = errno;
            pdl_run_netns_destroy(ns);
            return pdl_error_set(err, PDL_ERR_SYSTEM, "--netns: open %s: %s", path, strerror(e));
        }
    }
    *ns_p = ns;
    return PDL_OK;
}

const char *pdl_run_netns_ip(const pdl_run_netns_t *ns, int i) { return ns->ip[i]; }
int pdl_run_netns_fd(const pdl_run_netns_t *ns, int i) { return ns->fd[i]; }

void pdl_run_netns_destroy(pdl_run_netns_t *ns)
{
    if (ns == NULL)
        return;
    for (int i = 0; i < ns->created; i++) {
        char name[32];
        snprintf(name, sizeof(name), "pdlr%d-%d", (int)ns->pid, i);
        if (ns->fd[i] >= 0)
            close(ns->fd[i]);
        /* Deleting the namespace deletes the veth end inside it, and with it the peer on the bridge. */
        run_ip(ns->log_path, "netns", "del", name, NULL);
    }
    if (ns->bridge) {
        char br[32];
        snprintf(br, sizeof(br), "pdlb%d", (int)ns->pid);
        run_ip(ns->log_path, "link", "del", br, NULL);
    }
    free(ns);
}
