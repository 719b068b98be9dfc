/*
 * test_ports.h -- free TCP ports for the C tests (header-only, static), by the one rule of
 * app/ports.h: whole ranges outside the kernel's ephemeral range, proved free by binding, searched
 * from a point that differs per process so tests running side by side (ctest -j) start far apart.
 * The shell and Python tests use tests/tools/free_ports.py, which implements the same rule.
 *
 * A probed port can still be taken between the probe and the test's own bind (by another test doing
 * the same): callers that create a listener retry with a new range when that fails with "in use".
 * Programs that can bind port 0 and report it (pdlink-node/pdlink-router --port 0 --port-file) need
 * no probe at all.
 */
#ifndef PDL_TEST_PORTS_H
#define PDL_TEST_PORTS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "common/log.h"
#include "app/ports.h"
#include "common/clock.h"

/* First port of `count` consecutive ports free on 127.0.0.1, or -1 (with the reason on stderr). */
static inline int tp_free_range(int count)
{
    static pdl_port_picker_t picker;
    static bool ready;
    if (!ready) {
        pdl_port_picker_init(&picker, ((uint64_t)getpid() << 32) ^ pdl__clock_now_ns());
        ready = true;
    }
    int first = -1;
    pdl_error_t err;
    if (pdl_port_picker_take(&picker, "127.0.0.1", count, &first, &err) != PDL_OK) {
        fprintf(stderr, "test_ports: %s\n", err.msg);
        return -1;
    }
    return first;
}

#endif
