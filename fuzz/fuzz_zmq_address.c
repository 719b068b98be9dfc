/*
 * fuzz_zmq_address.c -- libFuzzer target for pdl_wire_parse_zmq_address and pdl_wire_parse_request_id.
 * The input is used as a C string. Round-trip properties: a parsed address formats canonically and
 * parses back equal; the addresses of a parsed request id, formatted into a new id, parse back equal.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdlink/wire.h"

static int addr_eq(const pdl_zmq_addr_t *a, const pdl_zmq_addr_t *b)
{
    return strcmp(a->host, b->host) == 0 && a->handshake_port == b->handshake_port && a->notify_port == b->notify_port;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s == NULL)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    pdl_error_t err;
    pdl_zmq_addr_t a, b, p, d, p2, d2;
    char buf[1024], pz[1024], dz[1024];
    if (pdl_wire_parse_zmq_address(s, &a, &err) == PDL_OK) {
        if (pdl_wire_format_zmq_address(&a, buf, sizeof(buf)) < 0 || pdl_wire_parse_zmq_address(buf, &b, &err) != PDL_OK ||
            !addr_eq(&a, &b))
            abort();
    }
    if (pdl_wire_parse_request_id(s, &p, &d, &err) == PDL_OK) {
        static const uint8_t uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
        char rid[PDL_WIRE_RID_MAX + 1];
        if (pdl_wire_format_zmq_address(&p, pz, sizeof(pz)) < 0 || pdl_wire_format_zmq_address(&d, dz, sizeof(dz)) < 0 ||
            pdl_wire_format_request_id(pz, dz, uuid, rid, sizeof(rid)) < 0 ||
            pdl_wire_parse_request_id(rid, &p2, &d2, &err) != PDL_OK || !addr_eq(&p, &p2) || !addr_eq(&d, &d2))
            abort();
    }
    /* one side alone must agree with the pair */
    if (pdl_wire_parse_request_id(s, &p2, NULL, &err) == PDL_OK && pdl_wire_parse_request_id(s, &p, &d, &err) == PDL_OK &&
        !addr_eq(&p, &p2))
        abort();
    free(s);
    return 0;
}
