/*
 * topo.c -- heterogeneous tensor-parallel topology (docs/topology.md): rank mapping, groups, head ownership,
 * read and write plans, fan-in counts and port offsets.
 *
 * How it works: everything is a function of (P, D, H, rank). Two TP sizes are compatible only when one
 * divides the other; the ratio then says how ranks pair up. A consumer rank's *group* is the set of
 * producer ranks whose heads together cover its own heads (one rank when D >= P, P/D consecutive ranks
 * when D < P). The read plan walks the consumer's heads in order, picks for each the lowest group rank
 * that holds it, and joins neighbouring heads taken from the same producer into one piece, so a piece
 * is one contiguous head slice on both sides. The write plan of a producer is the mirror image: every
 * piece of every read plan that names it. Pure functions: no I/O, no allocation, no logging.
 */
#include "pdlink/topo.h"

#include <string.h>

/* Checks that both TP sizes are usable; names them with the caller's words ("prefill", "local"...). */
static pdl_status_t check_tp(int tp, const char *what, pdl_error_t *err)
{
    if (tp <= 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s TP %d must be positive", what, tp);
    if (tp > PDL_TOPO_MAX_TP)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s TP %d is larger than the supported maximum %d", what, tp,
                             PDL_TOPO_MAX_TP);
    return PDL_OK;
}

/*
 * Checks that one of the two sizes divides the other. The message always says which size should have
 * been a multiple of which, so "decode TP 6 is not a multiple of prefill TP 4" reads naturally.
 */
static pdl_status_t check_pair(int a, const char *a_name, int b, const char *b_name, pdl_error_t *err)
{
    pdl_status_t st = check_tp(a, a_name, err);
    if (st != PDL_OK)
        return st;
    if ((st = check_tp(b, b_name, err)) != PDL_OK)
        return st;
    if (a > b && a % b != 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s TP %d is not a multiple of %s TP %d", a_name, a, b_name, b);
    if (b > a && b % a != 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s TP %d is not a multiple of %s TP %d", b_name, b, a_name, a);
    return PDL_OK;
}

static pdl_status_t check_rank(int rank, int tp, const char *what, pdl_error_t *err)
{
    if (rank < 0 || rank >= tp)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s rank %d is outside [0, %d)", what, rank, tp);
    return PDL_OK;
}

pdl_status_t pdl_topo_map_rank(int local_rank, int local_tp, int remote_tp, int *remote_rank_out, pdl_error_t *err)
{
    pdl_status_t st = check_pair(local_tp, "local", remote_tp, "remote", err);
    if (st != PDL_OK)
        return st;
    if ((st = check_rank(local_rank, local_tp, "local", err)) != PDL_OK)
        return st;
    int r;
    if (local_tp == remote_tp)
        r = local_rank;
    else if (remote_tp > local_tp)
        r = local_rank * (remote_tp / local_tp);
    else
        r = local_rank / (local_tp / remote_tp);
    if (remote_rank_out != NULL)
        *remote_rank_out = r;
    return PDL_OK;
}

pdl_status_t pdl_topo_expected_acks(int prefill_tp, int decode_tp, int *out, pdl_error_t *err)
{
    pdl_status_t st = check_pair(prefill_tp, "prefill", decode_tp, "decode", err);
    if (st != PDL_OK)
        return st;
    if (out != NULL)
        *out = decode_tp > prefill_tp ? decode_tp / prefill_tp : 1;
    return PDL_OK;
}

pdl_status_t pdl_topo_expected_write_done(int prefill_tp, int decode_tp, int *out, pdl_error_t *err)
{
    pdl_status_t st = check_pair(prefill_tp, "prefill", decode_tp, "decode", err);
    if (st != PDL_OK)
        return st;
    if (out != NULL)
        *out = prefill_tp > decode_tp ? prefill_tp / decode_tp : 1;
    return PDL_OK;
}

pdl_status_t pdl_topo_group(int prefill_tp, int decode_tp, int consumer_rank, int *first_out, int *count_out,
                            pdl_error_t *err)
{
    pdl_status_t st = check_pair(prefill_tp, "prefill", decode_tp, "decode", err);
    if (st != PDL_OK)
        return st;
    if ((st = check_rank(consumer_rank, decode_tp, "decode", err)) != PDL_OK)
        return st;
    int first, count;
    if (decode_tp >= prefill_tp) {
        first = consumer_rank / (decode_tp / prefill_tp);
        count = 1;
    } else {
        count = prefill_tp / decode_tp;
        first = consumer_rank * count;
    }
    if (first_out != NULL)
        *first_out = first;
    if (count_out != NULL)
        *count_out = count;
    return PDL_OK;
}

pdl_status_t pdl_topo_consumers_of(int prefill_tp, int decode_tp, int producer_rank, int *first_out,
                                   int *count_out, pdl_error_t *err)
{
    pdl_status_t st = check_pair(prefill_tp, "prefill", decode_tp, "decode", err);
    if (st != PDL_OK)
        return st;
    if ((st = check_rank(producer_rank, prefill_tp, "prefill", err)) != PDL_OK)
        return st;
    int first, count;
    if (decode_tp >= prefill_tp) {
        count = decode_tp / prefill_tp;
        first = producer_rank * count;
    } else {
        first = producer_rank / (prefill_tp / decode_tp);
        count = 1;
    }
    if (first_out != NULL)
        *first_out = first;
    if (count_out != NULL)
        *count_out = count;
    return PDL_OK;
}

pdl_status_t pdl_topo_heads(int tp, int total_heads, bool is_mla, int rank, int *first_out, int *count_out,
                            pdl_error_t *err)
{
    if (tp <= 0 || tp > PDL_TOPO_MAX_TP)
        return pdl_error_set(err, PDL_ERR_INVALID, "TP %d must be in [1, %d]", tp, PDL_TOPO_MAX_TP);
    if (rank < 0 || rank >= tp)
        return pdl_error_set(err, PDL_ERR_INVALID, "rank %d is outside [0, %d)", rank, tp);
    int first, count;
    if (is_mla) {
        /* The MLA latent is one vector per token, replicated on every rank. */
        first = 0;
        count = 1;
    } else if (total_heads <= 0) {
        return pdl_error_set(err, PDL_ERR_INVALID, "%d KV heads: the head count must be positive", total_heads);
    } else if (tp <= total_heads) {
        if (total_heads % tp != 0)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "%d KV heads cannot be split over TP %d (the head count must be a multiple of "
                                 "the TP size, or the TP size a multiple of the head count)",
                                 total_heads, tp);
        count = total_heads / tp;
        first = rank * count;
    } else {
        if (tp % total_heads != 0)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "%d KV heads cannot be replicated over TP %d (TP %d is not a multiple of %d)",
                                 total_heads, tp, tp, total_heads);
        first = rank / (tp / total_heads);
        count = 1;
    }
    if (first_out != NULL)
        *first_out = first;
    if (count_out != NULL)
        *count_out = count;
    return PDL_OK;
}

/* Validates the whole (P, D, H) triple once, so a plan either fails up front or cannot fail later. */
static pdl_status_t check_topology(int prefill_tp, int decode_tp, int total_heads, bool is_mla, pdl_error_t *err)
{
    pdl_status_t st = check_pair(prefill_tp, "prefill", decode_tp, "decode", err);
    if (st != PDL_OK)
        return st;
    if ((st = pdl_topo_heads(prefill_tp, total_heads, is_mla, 0, NULL, NULL, err)) != PDL_OK)
        return pdl_error_prefix(err, st, "prefill");
    if ((st = pdl_topo_heads(decode_tp, total_heads, is_mla, 0, NULL, NULL, err)) != PDL_OK)
        return pdl_error_prefix(err, st, "decode");
    return PDL_OK;
}

/* Read plan without re-validating the topology (the caller did). */
static pdl_status_t read_plan(int prefill_tp, int decode_tp, int total_heads, bool is_mla, int consumer_rank,
                              pdl_read_plan_t *out, pdl_error_t *err)
{
    int gfirst, gcount, lfirst, lcount;
    pdl_status_t st = pdl_topo_group(prefill_tp, decode_tp, consumer_rank, &gfirst, &gcount, err);
    if (st != PDL_OK)
        return st;
    if ((st = pdl_topo_heads(decode_tp, total_heads, is_mla, consumer_rank, &lfirst, &lcount, err)) != PDL_OK)
        return st;

    memset(out, 0, sizeof(*out));
    out->prefill_tp = prefill_tp;
    out->decode_tp = decode_tp;
    out->total_heads = total_heads;
    out->is_mla = is_mla;
    out->consumer_rank = consumer_rank;
    out->group_first = gfirst;
    out->group_count = gcount;
    out->local_first_head = lfirst;
    out->local_num_heads = lcount;

    for (int h = lfirst; h < lfirst + lcount; h++) {
        /* The lowest rank of the group that holds head h; group ranks hold ascending head ranges. */
        int src = -1, pfirst = 0;
        for (int p = gfirst; p < gfirst + gcount && src < 0; p++) {
            int f = 0, c = 0; /* set by pdl_topo_heads on success; -O3 cannot see it */
            if ((st = pdl_topo_heads(prefill_tp, total_heads, is_mla, p, &f, &c, err)) != PDL_OK)
                return st;
            if (h >= f && h < f + c) {
                src = p;
                pfirst = f;
            }
        }
        if (src < 0) /* Unreachable for a validated topology; kept so a logic slip cannot read wrong bytes. */
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "no prefill rank in the group [%d, %d) of decode rank %d holds KV head %d "
                                 "(P %d, D %d, %d heads)",
                                 gfirst, gfirst + gcount, consumer_rank, h, prefill_tp, decode_tp, total_heads);
        pdl_plan_piece_t *last = out->num_pieces > 0 ? &out->pieces[out->num_pieces - 1] : NULL;
        if (last != NULL && last->producer_rank == src && last->first_head + last->num_heads == h &&
            last->src_head + last->num_heads == h - pfirst) {
            last->num_heads++;
            continue;
        }
        if (out->num_pieces >= PDL_TOPO_MAX_TP)
            return pdl_error_set(err, PDL_ERR_INVALID, "read plan of decode rank %d needs more than %d pieces",
                                 consumer_rank, PDL_TOPO_MAX_TP);
        out->pieces[out->num_pieces++] = (pdl_plan_piece_t){
            .producer_rank = src,
            .first_head = h,
            .num_heads = 1,
            .src_head = h - pfirst,
            .dst_head = h - lfirst,
        };
    }
    return PDL_OK;
}

pdl_status_t pdl_topo_read_plan(int prefill_tp, int decode_tp, int total_heads, bool is_mla, int consumer_rank,
                                pdl_read_plan_t *out, pdl_error_t *err)
{
    if (out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "read plan output is NULL");
    pdl_status_t st = check_topology(prefill_tp, decode_tp, total_heads, is_mla, err);
    if (st != PDL_OK)
        return st;
    if ((st = check_rank(consumer_rank, decode_tp, "decode", err)) != PDL_OK)
        return st;
    return read_plan(prefill_tp, decode_tp, total_heads, is_mla, consumer_rank, out, err);
}

pdl_status_t pdl_topo_write_plan(int prefill_tp, int decode_tp, int total_heads, bool is_mla, int producer_rank,
                                 pdl_write_plan_t *out, pdl_error_t *err)
{
    if (out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "write plan output is NULL");
    pdl_status_t st = check_topology(prefill_tp, decode_tp, total_heads, is_mla, err);
    if (st != PDL_OK)
        return st;
    if ((st = check_rank(producer_rank, prefill_tp, "prefill", err)) != PDL_OK)
        return st;
    int cfirst, ccount;
    if ((st = pdl_topo_consumers_of(prefill_tp, decode_tp, producer_rank, &cfirst, &ccount, err)) != PDL_OK)
        return st;

    memset(out, 0, sizeof(*out));
    out->prefill_tp = prefill_tp;
    out->decode_tp = decode_tp;
    out->total_heads = total_heads;
    out->is_mla = is_mla;
    out->producer_rank = producer_rank;
    out->notify_first = cfirst;
    out->notify_count = ccount;

    /* Only consumers whose group contains this producer can read from it, so only they are scanned. */
    pdl_read_plan_t rp;
    for (int d = cfirst; d < cfirst + ccount; d++) {
        if ((st = read_plan(prefill_tp, decode_tp, total_heads, is_mla, d, &rp, err)) != PDL_OK)
            return st;
        for (int i = 0; i < rp.num_pieces; i++) {
            if (rp.pieces[i].producer_rank != producer_rank)
                continue;
            if (out->num_targets >= PDL_TOPO_MAX_TP)
                return pdl_error_set(err, PDL_ERR_INVALID, "write plan of prefill rank %d needs more than %d targets",
                                     producer_rank, PDL_TOPO_MAX_TP);
            out->targets[out->num_targets++] = (pdl_write_target_t){.consumer_rank = d, .piece = rp.pieces[i]};
        }
    }
    return PDL_OK;
}

int pdl_topo_port_offset(int dp_rank, int tp_size, int tp_rank)
{
    if (dp_rank < 0 || tp_size <= 0 || tp_rank < 0 || tp_rank >= tp_size)
        return -1;
    /* 64-bit so a hostile dp_rank cannot overflow; offsets beyond int are refused like bad input. */
    long long off = (long long)dp_rank * tp_size + tp_rank;
    return off > 65535 ? -1 : (int)off;
}
