/*
 * run_proc.h -- child process supervision for `pdlink run`: start a program with its output in a log
 * file, notice when it dies, stop a whole set of children, show a dead child's last log lines, and
 * turn SIGINT/SIGTERM into a pollable event (signalfd) instead of a global flag.
 *
 * Every child runs in its own process group (so a Ctrl-C in the terminal reaches only `pdlink run`,
 * which then stops the children in order) and gets PR_SET_PDEATHSIG=SIGKILL, so even a `kill -9` of
 * `pdlink run` leaves nothing behind.
 */
#ifndef PDL_CLI_RUN_PROC_H
#define PDL_CLI_RUN_PROC_H

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include "pdlink/status.h"

typedef struct pdl_run_child {
    char name[48];        /* "decode-0": how reports and errors name it */
    char what[160];       /* "pdlink-node TP8, port 8201": what it is */
    char log_path[512];   /* stdout+stderr of the child */
    pid_t pid;            /* > 0 while started and not reaped */
    bool started;
    bool exited;          /* reaped; wstatus is valid */
    int wstatus;
    bool stopping;        /* we sent it SIGTERM: its exit is expected */
} pdl_run_child_t;

/*
 * Start argv[0] (a path) with argv as its arguments, stdout and stderr appended to c->log_path,
 * stdin from /dev/null, in a new process group, with `child_mask` as its signal mask. netns_fd >= 0
 * makes the child join that network namespace (setns) before exec. c->name/what/log_path must be set.
 * argv is borrowed for the call. An exec failure shows as exit status 127 and a line in the log.
 */
pdl_status_t pdl_run_child_start(pdl_run_child_t *c, char *const argv[], const sigset_t *child_mask,
                                 int netns_fd, pdl_error_t *err);

/* Reap without blocking; true if the child has exited (now or before). */
bool pdl_run_child_poll(pdl_run_child_t *c);

/* True if the child exited and we had not asked it to. */
bool pdl_run_child_died(pdl_run_child_t *c);

/* "exited with status 1", "was killed by signal 9 (Killed)", "is running". */
void pdl_run_child_exit_text(const pdl_run_child_t *c, char *buf, size_t len);

/* Send `sig` to the child's process group (no-op if it is not running). */
void pdl_run_child_signal(pdl_run_child_t *c, int sig);

/*
 * Stop every started child: SIGTERM to each process group, wait up to grace_ms for all, then SIGKILL
 * and reap the rest. Returns the number of children that did not exit cleanly (status 0 or SIGTERM)
 * after SIGTERM; each is named in a warning.
 */
int pdl_run_children_stop(pdl_run_child_t *const *cs, int n, int grace_ms);

/* Print the last `lines` lines of a log file, each prefixed by `indent`. */
void pdl_run_log_tail(FILE *out, const char *path, int lines, const char *indent);

/*
 * Block SIGINT, SIGTERM and SIGHUP in this thread (do it before any thread is created, so threads
 * inherit the mask) and return a non-blocking signalfd for them, or -1 (with err) on failure.
 * *old_mask_p receives the previous mask, for children.
 */
int pdl_run_signals_open(sigset_t *old_mask_p, pdl_error_t *err);

/* Non-blocking: the signal number that arrived, or 0. */
int pdl_run_signals_check(int fd);

/* Close the signalfd and restore the old mask. */
void pdl_run_signals_close(int fd, const sigset_t *old_mask);

#endif
