/*
 * test_child.h -- run part of a test in a child process and require that it ended well: for code that
 * may crash the process by design when the code under test is wrong (a CPU access to device memory
 * faults), so the parent can report the signal instead of dying with it. Needs cmocka included first.
 */
#ifndef PDL_TEST_CHILD_H
#define PDL_TEST_CHILD_H

#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Run fn(arg) in a child whose exit status is fn's return value, and fail the test unless it returned 0.
 * `who` names the child and `meaning` what a fatal signal means, in the failure message ("the READ child
 * died of signal 11 (Segmentation fault): a CPU access to device memory"). */
static inline void tch_run_exit(int (*fn)(void *), void *arg, const char *who, const char *meaning, bool leak_check);
static inline void tch_run(int (*fn)(void *), void *arg, const char *who, const char *meaning)
{
    tch_run_exit(fn, arg, who, meaning, false);
}

/* The same; leak_check: the child ends through exit() rather than _exit(), so under ASan its leak check
 * runs and memory the child's engines left behind fails the case. */
static inline void tch_run_exit(int (*fn)(void *), void *arg, const char *who, const char *meaning, bool leak_check)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* cmocka catches SIGSEGV to report a test; here the parent must see the signal itself. */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        int rc = fn(arg);
        if (leak_check)
            exit(rc);
        _exit(rc);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (WIFSIGNALED(ws))
        fail_msg("%s died of signal %d (%s): %s", who, WTERMSIG(ws), strsignal(WTERMSIG(ws)), meaning);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
}

/* A cmocka case `name` that runs child(&tc), tc = {__VA_ARGS__} of type `type`, in a child process ended
 * through exit() (tch_run_exit with the leak check): the device-memory tests' cases, where a fault means
 * a CPU access to device memory. */
#define TCH_DEVICE_CASE(name, child, type, ...)                                                                    \
    static int name##_child(void *arg) { return child((const type *)arg); }                                    \
    static void name(void **state)                                                                             \
    {                                                                                                          \
        (void)state;                                                                                           \
        type tc = {__VA_ARGS__};                                                                               \
        tch_run_exit(name##_child, &tc, #name, "a CPU access to device memory?", true);                        \
    }

/* In a child's body (a function returning its exit status): unless cond holds, say why on stderr, with
 * the place, and return 2 (a setup or check failure, told apart from a fault by the parent). */
#define TCH_CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__);                                                         \
            return 2;                                                                                                  \
        }                                                                                                              \
    } while (0)

#endif
