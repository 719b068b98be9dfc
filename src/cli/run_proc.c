/*
 * run_proc.c -- child process supervision for `pdlink run` (see run_proc.h).
 *
 * How it works: fork, then in the child only async-signal-safe calls (the parent may have libcurl
 * threads): setpgid(0,0) for a group of its own, PR_SET_PDEATHSIG so the child dies with us, the
 * caller's signal mask back (ours blocks SIGINT/SIGTERM for the signalfd), optional setns into a
 * network namespace, dup2 of the log file, execv. The parent also calls setpgid for the child, so the
 * group exists whichever process runs first (the classic job-control race). Children are reaped with
 * waitpid(WNOHANG) from the supervisor's polling loops; stopping sends SIGTERM to each group, waits a
 * grace period, then SIGKILLs whatever is left, so no exit path leaves a process behind.
 */
#include "cli/run_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"

pdl_status_t pdl_run_child_start(pdl_run_child_t *c, char *const argv[], const sigset_t *child_mask,
                                 int netns_fd, pdl_error_t *err)
{
    int logfd = open(c->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0)
        return pdl_error_set(err, PDL_ERR_SYSTEM, "%s: open log file %s: %s", c->name, c->log_path,
                             strerror(errno));
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nullfd < 0) {
        int e = errno;
        close(logfd);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "%s: open /dev/null: %s", c->name, strerror(e));
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(logfd);
        close(nullfd);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "%s: fork: %s", c->name, strerror(e));
    }
    if (pid == 0) {
        /* Child: async-signal-safe calls only until execv. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) /* the parent died before prctl took effect */
            _exit(126);
        if (netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) != 0) {
            static const char msg[] = "pdlink run: setns into the network namespace failed\n";
            ssize_t w = write(logfd, msg, sizeof(msg) - 1);
            (void)w;
            _exit(126);
        }
        dup2(nullfd, STDIN_FILENO);
        dup2(logfd, STDOUT_FILENO);
        dup2(logfd, STDERR_FILENO);
        sigprocmask(SIG_SETMASK, child_mask, NULL);
        execv(argv[0], argv);
        static const char msg[] = "pdlink run: execv failed\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)w;
        _exit(127);
    }
    setpgid(pid, pid); /* EACCES after the child's exec is fine: the child did it itself */
    close(logfd);
    close(nullfd);
    c->pid = pid;
    c->started = true;
    c->exited = false;
    c->stopping = false;
    c->wstatus = 0;
    return PDL_OK;
}

bool pdl_run_child_poll(pdl_run_child_t *c)
{
    if (!c->started)
        return false;
    if (c->exited)
        return true;
    int st = 0;
    pid_t r = waitpid(c->pid, &st, WNOHANG);
    if (r == c->pid) {
        c->exited = true;
        c->wstatus = st;
        /* The group may still hold grandchildren; the pid is no longer ours to signal. */
        c->pid = 0;
        return true;
    }
    return false;
}

bool pdl_run_child_died(pdl_run_child_t *c) { return pdl_run_child_poll(c) && !c->stopping; }

void pdl_run_child_exit_text(const pdl_run_child_t *c, char *buf, size_t len)
{
    if (!c->started)
        snprintf(buf, len, "was not started");
    else if (!c->exited)
        snprintf(buf, len, "is running");
    else if (WIFEXITED(c->wstatus))
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(c->wstatus));
    else if (WIFSIGNALED(c->wstatus))
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(c->wstatus), strsignal(WTERMSIG(c->wstatus)));
    else
        snprintf(buf, len, "ended with wait status 0x%x", (unsigned)c->wstatus);
}

void pdl_run_child_signal(pdl_run_child_t *c, int sig)
{
    if (c->started && !c->exited && c->pid > 0)
        kill(-c->pid, sig);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int pdl_run_children_stop(pdl_run_child_t *const *cs, int n, int grace_ms)
{
    for (int i = 0; i < n; i++) {
        if (cs[i] == NULL || !cs[i]->started || pdl_run_child_poll(cs[i]))
            continue;
        cs[i]->stopping = true;
        pdl_run_child_signal(cs[i], SIGTERM);
    }
    uint64_t deadline = pdl__clock_now_ms() + (uint64_t)grace_ms;
    for (;;) {
        bool all = true;
        for (int i = 0; i < n; i++)
            if (cs[i] != NULL && cs[i]->started && !pdl_run_child_poll(cs[i]))
                all = false;
        if (all || pdl__clock_now_ms() >= deadline)
            break;
        sleep_ms(20);
    }
    int unclean = 0;
    for (int i = 0; i < n; i++) {
        pdl_run_child_t *c = cs[i];
        if (c == NULL || !c->started)
            continue;
        if (!c->exited) {
            pdl_warn("%s (%s) did not exit within %d ms of SIGTERM; sending SIGKILL", c->name, c->what, grace_ms);
            pid_t pid = c->pid;
            kill(-pid, SIGKILL);
            int st = 0;
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
            }
            c->exited = true;
            c->wstatus = st;
            c->pid = 0;
            unclean++;
            continue;
        }
        bool clean = (WIFEXITED(c->wstatus) && WEXITSTATUS(c->wstatus) == 0) ||
                     (WIFSIGNALED(c->wstatus) && WTERMSIG(c->wstatus) == SIGTERM);
        if (c->stopping && !clean) {
            char how[128];
            pdl_run_child_exit_text(c, how, sizeof(how));
            pdl_warn("%s (%s) %s after SIGTERM; log %s", c->name, c->what, how, c->log_path);
            unclean++;
        }
    }
    return unclean;
}

void pdl_run_log_tail(FILE *out, const char *path, int lines, const char *indent)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(out, "%s(no log: %s)\n", indent, strerror(errno));
        return;
    }
    /* Read the last 16 KiB at most: enough for a few dozen lines, bounded for a chatty child. */
    enum { TAIL_BYTES = 16384 };
    char *buf = malloc(TAIL_BYTES + 1);
    if (buf == NULL) {
        fclose(f);
        return;
    }
    long start = 0;
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        start = size > TAIL_BYTES ? size - TAIL_BYTES : 0;
    }
    fseek(f, start, SEEK_SET);
    size_t got = fread(buf, 1, TAIL_BYTES, f);
    fclose(f);
    buf[got] = '\0';
    while (got > 0 && buf[got - 1] == '\n')
        buf[--got] = '\0';
    int seen = 0;
    size_t pos = got;
    while (pos > 0 && seen < lines) {
        pos--;
        if (buf[pos] == '\n')
            seen++;
    }
    const char *p = buf + pos;
    if (*p == '\n')
        p++;
    if (*p == '\0')
        fprintf(out, "%s(log is empty)\n", indent);
    while (*p != '\0') {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        fprintf(out, "%s%.*s\n", indent, len, p);
        p += len + (nl ? 1 : 0);
    }
    free(buf);
}

int pdl_run_signals_open(sigset_t *old_mask_p, pdl_error_t *err)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &set, old_mask_p) != 0) {
        pdl_error_set(err, PDL_ERR_SYSTEM, "sigprocmask: %s", strerror(errno));
        return -1;
    }
    int fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd < 0) {
        pdl_error_set(err, PDL_ERR_SYSTEM, "signalfd: %s", strerror(errno));
        sigprocmask(SIG_SETMASK, old_mask_p, NULL);
        return -1;
    }
    return fd;
}

int pdl_run_signals_check(int fd)
{
    struct signalfd_siginfo si;
    ssize_t r = read(fd, &si, sizeof(si));
    if (r == (ssize_t)sizeof(si))
        return (int)si.ssi_signo;
    return 0;
}

void pdl_run_signals_close(int fd, const sigset_t *old_mask)
{
    if (fd >= 0)
        close(fd);
    sigprocmask(SIG_SETMASK, old_mask, NULL);
}
