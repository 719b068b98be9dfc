/*
 * budget.c -- the socket budget (budget.h): per-share caps over one instance-wide total.
 *
 * Why shares: a libzmq context has 1,023 sockets by default and a process a descriptor limit. A client
 * can make an instance dial wherever its requests point (releases to a made-up notify port, a watch of
 * a made-up consumer, a handshake with a made-up producer); before the budget, 1,750 such requests took
 * a prefill from 29 to 1,712 descriptors and its next real transfer failed with "Too many open files".
 */
#include "connector/budget.h"

static const struct {
    const char *name;
    int cap;
} SHARES[PDL_SOCKETS_SHARES] = {
    [PDL_SOCKETS_VERIFIED] = {"verified", PDL_SOCKETS_MAX},
    [PDL_SOCKETS_UNVERIFIED] = {"unverified", 64},
    [PDL_SOCKETS_HANDSHAKE] = {"handshake", 64},
    [PDL_SOCKETS_PROBE] = {"probe", 64},
};

int pdl__budget_cap(pdl_socket_share_t share) { return SHARES[share].cap; }

/* One more in counter c unless it is at cap. */
static bool take_one(atomic_int *c, int cap)
{
    int v = atomic_load(c);
    while (v < cap)
        if (atomic_compare_exchange_weak(c, &v, v + 1))
            return true;
    return false;
}

bool pdl__budget_take(pdl_budget_t *b, pdl_socket_share_t share)
{
    if (take_one(&b->open[share], SHARES[share].cap)) {
        if (take_one(&b->total, PDL_SOCKETS_MAX))
            return true;
        atomic_fetch_sub(&b->open[share], 1);
    }
    return false;
}

void pdl__budget_refused(pdl_budget_t *b, pdl_socket_share_t share) { atomic_fetch_add(&b->refused[share], 1); }

void pdl__budget_put(pdl_budget_t *b, pdl_socket_share_t share)
{
    atomic_fetch_sub(&b->open[share], 1);
    atomic_fetch_sub(&b->total, 1);
}

void pdl__budget_promote(pdl_budget_t *b, pdl_socket_share_t from)
{
    atomic_fetch_add(&b->open[PDL_SOCKETS_VERIFIED], 1);
    atomic_fetch_sub(&b->open[from], 1);
}

void pdl__budget_stats(pdl_budget_t *b, pdl_socket_stats_t out[PDL_SOCKETS_SHARES])
{
    for (int i = 0; i < PDL_SOCKETS_SHARES; i++)
        out[i] = (pdl_socket_stats_t){.name = SHARES[i].name,
                                      .open = atomic_load(&b->open[i]),
                                      .cap = SHARES[i].cap,
                                      .refused = atomic_load(&b->refused[i])};
}
