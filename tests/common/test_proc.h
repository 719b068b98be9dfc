/*
 * test_proc.h -- what the tests read about another process from /proc: its CPU time, to show that a
 * service stays idle under a flood (test_app_http, test_fd_exhaustion). Needs cmocka included first.
 */
#ifndef PDL_TEST_PROC_H
#define PDL_TEST_PROC_H

#include <stdio.h>
#include <string.h>
#include <sys/types.h>

/* CPU time (utime + stime, in clock ticks) of a process. */
static inline long tp_cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *s = strrchr(buf, ')');
    assert_non_null(s);
    long utime = 0, stime = 0;
    /* fields after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    assert_int_equal(sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &utime, &stime), 2);
    return utime + stime;
}

#endif /* PDL_TEST_PROC_H */
