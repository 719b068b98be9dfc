/*
 * test_liveness.c -- a peer process's liveness through a pidfd proved by its start time
 * (src/engine/liveness.c): the proof accepts the process and refuses another start time, and an exit
 * is seen while the process is still an unreaped zombie (what UCX's keepalive misses).
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/liveness.h"

static void test_self(void **state)
{
    (void)state;
    uint64_t start = pdl__proc_start_time(getpid());
    assert_true(start != 0);
    assert_true(start == pdl__proc_start_time(getpid()));
    int fd = pdl__proc_pidfd(getpid(), start);
    assert_true(fd >= 0);
    assert_false(pdl__proc_exited(fd));
    close(fd);
    fd = pdl__proc_pidfd(getpid(), 0); /* no start time: no proof asked */
    assert_true(fd >= 0);
    close(fd);
    /* Another start time: a reused pid, or a pid from another namespace. */
    errno = 0;
    assert_int_equal(pdl__proc_pidfd(getpid(), start + 1), -1);
    assert_int_equal(errno, ESTALE);
}

static void test_bad_pids(void **state)
{
    (void)state;
    int64_t bad[] = {0, -1, (int64_t)INT_MAX + 1, INT64_MIN};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        errno = 0;
        assert_int_equal(pdl__proc_pidfd(bad[i], 0), -1);
        assert_int_equal(errno, EINVAL);
    }
    assert_true(pdl__proc_start_time(0) == 0);
    assert_true(pdl__proc_start_time(-5) == 0);
}

/* A child killed and not reaped is a zombie: it has exited for the pidfd. Reaped, it is gone. */
static void test_zombie_and_reaped(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        pause();
        _exit(0);
    }
    uint64_t start = pdl__proc_start_time(pid);
    assert_true(start != 0);
    int fd = pdl__proc_pidfd(pid, start);
    assert_true(fd >= 0);
    assert_false(pdl__proc_exited(fd));
    assert_int_equal(kill(pid, SIGKILL), 0);
    /* Wait for the exit without reaping (WNOWAIT): the child stays a zombie. */
    siginfo_t si;
    assert_int_equal(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
    assert_true(pdl__proc_exited(fd));
    assert_true(pdl__proc_start_time(pid) == start); /* a zombie still has its start time... */
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    assert_true(pdl__proc_exited(fd));
    close(fd);
    errno = 0;
    assert_int_equal(pdl__proc_pidfd(pid, start), -1); /* ...a reaped child has none */
    assert_true(errno == ESRCH || errno == ESTALE); /* ESTALE only if the pid was reused meanwhile */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self),
        cmocka_unit_test(test_bad_pids),
        cmocka_unit_test(test_zombie_and_reaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
