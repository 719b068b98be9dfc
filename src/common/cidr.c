/*
 * cidr.c -- address lists of the `trusted_hosts` key (see cidr.h).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cidr.h"

static const uint8_t v4_mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

static pdl_status_t parse_one(const char *tok, pdl_cidr_t *c, pdl_error_t *err)
{
    char addr[64];
    const char *slash = strchr(tok, '/');
    size_t alen = slash ? (size_t)(slash - tok) : strlen(tok);
    if (alen == 0 || alen >= sizeof(addr))
        return pdl_error_set(err, PDL_ERR_INVALID, "trusted_hosts: '%.64s' is not an address or network", tok);
    memcpy(addr, tok, alen);
    addr[alen] = '\0';
    int max;
    if (inet_pton(AF_INET, addr, c->addr) == 1) {
        c->family = AF_INET;
        max = 32;
    } else if (inet_pton(AF_INET6, addr, c->addr) == 1) {
        c->family = AF_INET6;
        max = 128;
    } else {
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "trusted_hosts: '%.64s' is not a numeric IPv4/IPv6 address (names are not accepted: "
                             "what they resolve to can change)",
                             addr);
    }
    c->bits = max;
    if (slash) {
        char *end;
        long b = strtol(slash + 1, &end, 10);
        if (slash[1] == '\0' || *end != '\0' || b < 0 || b > max)
            return pdl_error_set(err, PDL_ERR_INVALID, "trusted_hosts: '%.64s': prefix length must be 0..%d", tok,
                                 max);
        c->bits = (int)b;
    }
    return PDL_OK;
}

pdl_status_t pdl__cidrs_parse(const char *text, pdl_cidrs_t *out, pdl_error_t *err)
{
    out->v = NULL;
    out->n = 0;
    char *copy = strdup(text ? text : "");
    if (copy == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "trusted_hosts: out of memory");
    size_t cap = 1;
    for (const char *p = copy; *p; p++)
        cap += *p == ',' || *p == ' ';
    out->v = calloc(cap, sizeof(*out->v));
    if (out->v == NULL) {
        free(copy);
        return pdl_error_set(err, PDL_ERR_NOMEM, "trusted_hosts: out of memory");
    }
    pdl_status_t st = PDL_OK;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ", \t", &save); tok && st == PDL_OK; tok = strtok_r(NULL, ", \t", &save)) {
        st = parse_one(tok, &out->v[out->n], err);
        if (st == PDL_OK)
            out->n++;
    }
    free(copy);
    if (st != PDL_OK)
        pdl__cidrs_free(out);
    return st;
}

void pdl__cidrs_free(pdl_cidrs_t *l)
{
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

static bool prefix_equal(const uint8_t *a, const uint8_t *b, int bits)
{
    int whole = bits / 8, rest = bits % 8;
    if (memcmp(a, b, (size_t)whole) != 0)
        return false;
    if (rest == 0)
        return true;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

static bool match_raw(const pdl_cidrs_t *l, int family, const uint8_t *addr)
{
    for (size_t i = 0; i < l->n; i++) {
        const pdl_cidr_t *c = &l->v[i];
        if (c->family == family && prefix_equal(c->addr, addr, c->bits))
            return true;
        if (c->family == AF_INET && family == AF_INET6 && memcmp(addr, v4_mapped_prefix, 12) == 0 &&
            prefix_equal(c->addr, addr + 12, c->bits))
            return true;
    }
    return false;
}

bool pdl__cidrs_match(const pdl_cidrs_t *l, const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return match_raw(l, AF_INET, (const uint8_t *)&((const struct sockaddr_in *)(const void *)sa)->sin_addr);
    if (sa->sa_family == AF_INET6)
        return match_raw(l, AF_INET6, ((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr.s6_addr);
    return false;
}

bool pdl__cidrs_match_text(const pdl_cidrs_t *l, const char *numeric)
{
    uint8_t a[16];
    if (numeric == NULL)
        return false;
    if (inet_pton(AF_INET, numeric, a) == 1)
        return match_raw(l, AF_INET, a);
    if (inet_pton(AF_INET6, numeric, a) == 1)
        return match_raw(l, AF_INET6, a);
    return false;
}

int pdl__host_numeric(const char *host, bool names, char *out, size_t cap)
{
    out[0] = '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = names ? 0 : AI_NUMERICHOST}, *ai = NULL;
    if (host == NULL || host[0] == '\0' || getaddrinfo(host, NULL, &hints, &ai) != 0)
        return -1;
    int rc = getnameinfo(ai->ai_addr, ai->ai_addrlen, out, (socklen_t)cap, NULL, 0, NI_NUMERICHOST) == 0 ? 0 : -1;
    if (rc != 0)
        out[0] = '\0';
    freeaddrinfo(ai);
    return rc;
}

bool pdl__cidrs_match_host(const pdl_cidrs_t *l, const char *host)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0)
        return false;
    bool ok = ai != NULL;
    for (const struct addrinfo *p = ai; p && ok; p = p->ai_next)
        ok = pdl__cidrs_match(l, p->ai_addr);
    freeaddrinfo(ai);
    return ok;
}
