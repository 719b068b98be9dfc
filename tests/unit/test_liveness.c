/*
 * test_liveness.c -- a peer process's liveness through a pidfd proved by its start time
 * (src/engine/liveness.c): the proof accepts the process and refuses another start time, and an exit
 * is seen while the process is still an unreaped zombie (what UCX's keepalive misses).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <sys/socket.h>
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

/* The connections the consumer-gone watch reads as a host's sign of life: counted per local port and
 * peer address while established, none once the peer closed its end. */
static void test_established(void **state)
{
    (void)state;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(lfd, 4), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
    uint16_t port = ntohs(a.sin_port);
    assert_int_equal(pdl__tcp_established(port, "127.0.0.1"), 0);
    int cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(cfd, (struct sockaddr *)&a, sizeof(a)), 0);
    int sfd = accept(lfd, NULL, NULL);
    assert_true(sfd >= 0);
    assert_int_equal(pdl__tcp_established(port, "127.0.0.1"), 1);
    assert_int_equal(pdl__tcp_established(port, "127.0.0.2"), 0); /* another host */
    assert_int_equal(pdl__tcp_established(port, "not-an-address"), -1);
    close(cfd); /* the peer's FIN: our end is in CLOSE_WAIT, no longer established */
    usleep(20000);
    assert_int_equal(pdl__tcp_established(port, "127.0.0.1"), 0);
    close(sfd);
    close(lfd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self),
        cmocka_unit_test(test_bad_pids),
        cmocka_unit_test(test_zombie_and_reaped),
        cmocka_unit_test(test_established),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
