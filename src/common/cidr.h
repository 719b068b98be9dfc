/*
 * cidr.h -- lists of addresses and networks ("10.0.0.0/8, 127.0.0.1, fd00::/8"), the form of the
 * `trusted_hosts` key (docs/security.md), and the test whether a peer's address is in one (internal).
 *
 * IPv4 rules also match IPv4-mapped IPv6 addresses (::ffff:a.b.c.d), which is how a dual-stack socket
 * reports an IPv4 peer. An empty list matches nothing; callers treat "no list" as "everyone" themselves.
 */
#ifndef PDL_COMMON_CIDR_H
#define PDL_COMMON_CIDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "pdlink/status.h"

typedef struct pdl_cidr {
    int family; /* AF_INET or AF_INET6 */
    uint8_t addr[16];
    int bits;
} pdl_cidr_t;

typedef struct pdl_cidrs {
    pdl_cidr_t *v; /* owned */
    size_t n;
} pdl_cidrs_t;

/*
 * Parse a comma- or space-separated list of numeric addresses, each optionally with "/bits" (host names
 * are refused: what they resolve to can change). On success *out owns the list (pdl__cidrs_free); an
 * empty text gives an empty list. PDL_ERR_INVALID naming the bad entry, PDL_ERR_NOMEM.
 */
pdl_status_t pdl__cidrs_parse(const char *text, pdl_cidrs_t *out, pdl_error_t *err);
void pdl__cidrs_free(pdl_cidrs_t *l);
/* Is the address (AF_INET or AF_INET6 sockaddr) in the list? */
bool pdl__cidrs_match(const pdl_cidrs_t *l, const struct sockaddr *sa);
/* Is the numeric address text in the list? False for text that is not a numeric address. */
bool pdl__cidrs_match_text(const pdl_cidrs_t *l, const char *numeric);
/*
 * The first address `host` resolves to, as numeric text (getnameinfo's form) in out; with `names`
 * false a host name is not looked up (AI_NUMERICHOST: what a name resolves to can change). 0, or -1
 * when it does not resolve (out is then "").
 */
int pdl__host_numeric(const char *host, bool names, char *out, size_t cap);
/*
 * Does `host` (a name or a numeric address) resolve only to addresses in the list? False when it does
 * not resolve. Blocks for the name lookup like a connect to it would.
 */
bool pdl__cidrs_match_host(const pdl_cidrs_t *l, const char *host);

#endif /* PDL_COMMON_CIDR_H */
