/*
 * ports.c -- TCP port ranges versus the kernel's ephemeral range (see common/ports.h).
 */
#include "common/ports.h"

#include <stdio.h>

#include "common/log.h"

bool pdl_ports_parse_range(const char *text, pdl_port_range_t *out)
{
    int lo = 0, hi = 0;
    if (text == NULL || sscanf(text, "%d %d", &lo, &hi) != 2)
        return false;
    if (lo < 1 || hi > 65535 || lo > hi)
        return false;
    out->lo = lo;
    out->hi = hi;
    return true;
}

pdl_port_range_t pdl_ports_ephemeral(void)
{
    pdl_port_range_t r = {PDL_PORTS_EPHEMERAL_DEFAULT_LO, PDL_PORTS_EPHEMERAL_DEFAULT_HI};
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f == NULL)
        return r;
    char line[64];
    if (fgets(line, sizeof(line), f) != NULL)
        pdl_ports_parse_range(line, &r);
    fclose(f);
    return r;
}

bool pdl_ports_overlap(int first, int last, pdl_port_range_t r)
{
    return first <= last && r.lo <= r.hi && first <= r.hi && last >= r.lo;
}

bool pdl_ports_ephemeral_message(char *buf, size_t cap, const char *key, int first, int last, pdl_port_range_t eph)
{
    if (!pdl_ports_overlap(first, last, eph))
        return false;
    char ports[32];
    if (first == last)
        snprintf(ports, sizeof(ports), "port %d is", first);
    else
        snprintf(ports, sizeof(ports), "ports %d-%d overlap", first, last);
    snprintf(buf, cap,
             "%s: %s in the kernel's ephemeral port range %d-%d (/proc/sys/net/ipv4/ip_local_port_range): any "
             "outgoing connection on this machine may take it before it is bound; choose ports below %d or "
             "above %d",
             key, ports, eph.lo, eph.hi, eph.lo, eph.hi);
    return true;
}

bool pdl_ports_warn_ephemeral(const char *key, int first, int last)
{
    char msg[400];
    if (!pdl_ports_ephemeral_message(msg, sizeof(msg), key, first, last, pdl_ports_ephemeral()))
        return false;
    pdl_warn("%s", msg);
    return true;
}
