/*
 * test_topo.c -- heterogeneous TP topology (docs/topology.md): test vectors, error messages, worked
 * examples of split and replicated heads, and exhaustive properties of groups, read plans, write plans,
 * the release rule and port offsets over every compatible (P, D) up to 16 and every valid head count.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdbool.h>
#include <string.h>

#include "pdlink/topo.h"

static const int tps[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const int head_counts[] = {1, 2, 4, 8, 16, 32};
#define N_TPS (int)(sizeof(tps) / sizeof(tps[0]))
#define N_HEADS (int)(sizeof(head_counts) / sizeof(head_counts[0]))

static bool compatible(int a, int b) { return a % b == 0 || b % a == 0; }
static bool heads_valid(int t, int h) { return h % t == 0 || t % h == 0; }

static void map_vectors(void **state)
{
    (void)state;
    const int want84[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    for (int r = 0; r < 8; r++) {
        int m = -1;
        assert_int_equal(pdl_topo_map_rank(r, 8, 4, &m, NULL), PDL_OK);
        assert_int_equal(m, want84[r]);
    }
    const int want48[4] = {0, 2, 4, 6};
    for (int r = 0; r < 4; r++) {
        int m = -1;
        assert_int_equal(pdl_topo_map_rank(r, 4, 8, &m, NULL), PDL_OK);
        assert_int_equal(m, want48[r]);
    }
    for (int t = 1; t <= 16; t++)
        for (int r = 0; r < t; r++) {
            int m = -1;
            assert_int_equal(pdl_topo_map_rank(r, t, t, &m, NULL), PDL_OK);
            assert_int_equal(m, r);
        }
}

static void map_errors(void **state)
{
    (void)state;
    pdl_error_t e;
    int m = 77;
    pdl_error_clear(&e);
    assert_int_equal(pdl_topo_map_rank(0, 6, 4, &m, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "multiple"));
    assert_non_null(strstr(e.msg, "6"));
    assert_non_null(strstr(e.msg, "4"));
    assert_int_equal(m, 77); /* output untouched on failure */
    pdl_error_clear(&e);
    assert_int_equal(pdl_topo_map_rank(0, 4, 6, &m, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "multiple"));
    assert_int_equal(pdl_topo_map_rank(4, 4, 8, &m, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "rank 4"));
    assert_int_equal(pdl_topo_map_rank(-1, 4, 8, &m, NULL), PDL_ERR_INVALID);
    assert_int_equal(pdl_topo_map_rank(0, 0, 8, &m, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "positive"));
    assert_int_equal(pdl_topo_map_rank(0, 4, -2, &m, NULL), PDL_ERR_INVALID);
    assert_int_equal(pdl_topo_map_rank(0, PDL_TOPO_MAX_TP * 2, 4, &m, NULL), PDL_ERR_INVALID);
}

static void expected_vectors(void **state)
{
    (void)state;
    int n = -1;
    assert_int_equal(pdl_topo_expected_acks(4, 4, &n, NULL), PDL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(pdl_topo_expected_acks(8, 4, &n, NULL), PDL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(pdl_topo_expected_acks(4, 8, &n, NULL), PDL_OK);
    assert_int_equal(n, 2);
    pdl_error_t e;
    pdl_error_clear(&e);
    assert_int_equal(pdl_topo_expected_acks(4, 6, &n, &e), PDL_ERR_INVALID);
    assert_string_equal(e.msg, "decode TP 6 is not a multiple of prefill TP 4");
    assert_int_equal(pdl_topo_expected_acks(6, 4, &n, &e), PDL_ERR_INVALID);
    assert_string_equal(e.msg, "prefill TP 6 is not a multiple of decode TP 4");
    /* WRITE fan-in goes the other way. */
    assert_int_equal(pdl_topo_expected_write_done(8, 4, &n, NULL), PDL_OK);
    assert_int_equal(n, 2);
    assert_int_equal(pdl_topo_expected_write_done(4, 8, &n, NULL), PDL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(pdl_topo_expected_write_done(16, 2, &n, NULL), PDL_OK);
    assert_int_equal(n, 8);
    assert_int_equal(pdl_topo_expected_write_done(4, 6, &n, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "multiple"));
}

static void groups_examples(void **state)
{
    (void)state;
    int f, c;
    assert_int_equal(pdl_topo_group(4, 8, 5, &f, &c, NULL), PDL_OK);
    assert_int_equal(f, 2);
    assert_int_equal(c, 1);
    assert_int_equal(pdl_topo_group(8, 4, 1, &f, &c, NULL), PDL_OK);
    assert_int_equal(f, 2);
    assert_int_equal(c, 2);
    assert_int_equal(pdl_topo_consumers_of(4, 8, 3, &f, &c, NULL), PDL_OK);
    assert_int_equal(f, 6);
    assert_int_equal(c, 2);
    assert_int_equal(pdl_topo_consumers_of(8, 4, 7, &f, &c, NULL), PDL_OK);
    assert_int_equal(f, 3);
    assert_int_equal(c, 1);
    pdl_error_t e;
    assert_int_equal(pdl_topo_group(4, 8, 8, &f, &c, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "decode rank 8"));
    assert_int_equal(pdl_topo_consumers_of(4, 8, 4, &f, &c, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "prefill rank 4"));
}

static void heads_examples(void **state)
{
    (void)state;
    int f, c;
    assert_int_equal(pdl_topo_heads(4, 8, false, 3, &f, &c, NULL), PDL_OK);
    assert_int_equal(f, 6);
    assert_int_equal(c, 2);
    assert_int_equal(pdl_topo_heads(16, 8, false, 5, &f, &c, NULL), PDL_OK); /* replicated */
    assert_int_equal(f, 2);
    assert_int_equal(c, 1);
    assert_int_equal(pdl_topo_heads(8, 64, true, 7, &f, &c, NULL), PDL_OK); /* MLA latent */
    assert_int_equal(f, 0);
    assert_int_equal(c, 1);
    pdl_error_t e;
    assert_int_equal(pdl_topo_heads(6, 16, false, 0, &f, &c, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "16 KV heads cannot be split over TP 6"));
    assert_int_equal(pdl_topo_heads(12, 8, false, 0, &f, &c, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "TP 12"));
    assert_int_equal(pdl_topo_heads(4, 0, false, 0, &f, &c, &e), PDL_ERR_INVALID);
    assert_int_equal(pdl_topo_heads(4, 8, false, 4, &f, &c, &e), PDL_ERR_INVALID);
    /* A read plan names the side whose heads cannot be split. */
    pdl_read_plan_t rp;
    assert_int_equal(pdl_topo_read_plan(4, 12, 8, false, 0, &rp, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "decode"));
    assert_int_equal(pdl_topo_read_plan(6, 4, 8, false, 0, &rp, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "multiple"));
}

/* P4/D8, 8 heads: decode 5 takes head 5 = the second head of prefill rank 2. */
static void read_plan_split_p4_d8(void **state)
{
    (void)state;
    pdl_read_plan_t rp;
    assert_int_equal(pdl_topo_read_plan(4, 8, 8, false, 5, &rp, NULL), PDL_OK);
    assert_int_equal(rp.group_first, 2);
    assert_int_equal(rp.group_count, 1);
    assert_int_equal(rp.local_first_head, 5);
    assert_int_equal(rp.local_num_heads, 1);
    assert_int_equal(rp.num_pieces, 1);
    assert_int_equal(rp.pieces[0].producer_rank, 2);
    assert_int_equal(rp.pieces[0].first_head, 5);
    assert_int_equal(rp.pieces[0].src_head, 1);
    assert_int_equal(rp.pieces[0].dst_head, 0);
}

/* P8/D4, 8 heads: decode 1 holds heads 2,3, one from each of prefill ranks 2 and 3. */
static void read_plan_split_p8_d4(void **state)
{
    (void)state;
    pdl_read_plan_t rp;
    assert_int_equal(pdl_topo_read_plan(8, 4, 8, false, 1, &rp, NULL), PDL_OK);
    assert_int_equal(rp.group_first, 2);
    assert_int_equal(rp.group_count, 2);
    assert_int_equal(rp.num_pieces, 2);
    assert_int_equal(rp.pieces[0].producer_rank, 2);
    assert_int_equal(rp.pieces[0].first_head, 2);
    assert_int_equal(rp.pieces[0].src_head, 0);
    assert_int_equal(rp.pieces[0].dst_head, 0);
    assert_int_equal(rp.pieces[1].producer_rank, 3);
    assert_int_equal(rp.pieces[1].first_head, 3);
    assert_int_equal(rp.pieces[1].dst_head, 1);
    /* P8/D4 with 16 heads: two heads from each producer, merged into one piece each. */
    assert_int_equal(pdl_topo_read_plan(8, 4, 16, false, 3, &rp, NULL), PDL_OK);
    assert_int_equal(rp.num_pieces, 2);
    assert_int_equal(rp.pieces[0].producer_rank, 6);
    assert_int_equal(rp.pieces[0].num_heads, 2);
    assert_int_equal(rp.pieces[1].producer_rank, 7);
    assert_int_equal(rp.pieces[1].num_heads, 2);
    assert_int_equal(rp.pieces[1].dst_head, 2);
}

/* Replicated: P8/D4 with 4 heads, and MLA, read one whole block from the lowest rank of the group. */
static void read_plan_replicated(void **state)
{
    (void)state;
    pdl_read_plan_t rp;
    assert_int_equal(pdl_topo_read_plan(8, 4, 4, false, 3, &rp, NULL), PDL_OK);
    assert_int_equal(rp.group_first, 6);
    assert_int_equal(rp.group_count, 2);
    assert_int_equal(rp.num_pieces, 1);
    assert_int_equal(rp.pieces[0].producer_rank, 6);
    assert_int_equal(rp.pieces[0].first_head, 3);
    assert_int_equal(pdl_topo_read_plan(8, 4, 0, true, 1, &rp, NULL), PDL_OK);
    assert_int_equal(rp.num_pieces, 1);
    assert_int_equal(rp.pieces[0].producer_rank, 2);
    assert_int_equal(rp.pieces[0].num_heads, 1);
    /* Mixed: H=8, P=4, D=16 -- decode 5 holds head 2, the first head of prefill rank 1. */
    assert_int_equal(pdl_topo_read_plan(4, 16, 8, false, 5, &rp, NULL), PDL_OK);
    assert_int_equal(rp.group_first, 1);
    assert_int_equal(rp.pieces[0].producer_rank, 1);
    assert_int_equal(rp.pieces[0].first_head, 2);
    assert_int_equal(rp.pieces[0].src_head, 0);
}

static void write_plan_examples(void **state)
{
    (void)state;
    pdl_write_plan_t wp;
    /* P8/D4 split: prefill 3 writes head 3 into slot 1 of decode 1, and notifies decode 1. */
    assert_int_equal(pdl_topo_write_plan(8, 4, 8, false, 3, &wp, NULL), PDL_OK);
    assert_int_equal(wp.notify_first, 1);
    assert_int_equal(wp.notify_count, 1);
    assert_int_equal(wp.num_targets, 1);
    assert_int_equal(wp.targets[0].consumer_rank, 1);
    assert_int_equal(wp.targets[0].piece.dst_head, 1);
    /* P8/D4 MLA: prefill 3 writes nothing (rank 2 does) but still notifies decode 1. */
    assert_int_equal(pdl_topo_write_plan(8, 4, 1, true, 3, &wp, NULL), PDL_OK);
    assert_int_equal(wp.num_targets, 0);
    assert_int_equal(wp.notify_first, 1);
    assert_int_equal(wp.notify_count, 1);
    /* P4/D8: prefill 2 writes one head into each of decode 4 and 5. */
    assert_int_equal(pdl_topo_write_plan(4, 8, 8, false, 2, &wp, NULL), PDL_OK);
    assert_int_equal(wp.num_targets, 2);
    assert_int_equal(wp.targets[0].consumer_rank, 4);
    assert_int_equal(wp.targets[1].consumer_rank, 5);
    assert_int_equal(wp.targets[1].piece.src_head, 1);
    assert_int_equal(wp.notify_count, 2);
}

/* Groups, consumers_of and the release rule for every compatible (P, D) with P, D <= 16. */
static void exhaustive_groups_and_releases(void **state)
{
    (void)state;
    int checked = 0;
    for (int a = 0; a < N_TPS; a++)
        for (int b = 0; b < N_TPS; b++) {
            int P = tps[a], D = tps[b];
            int f, c, exp;
            if (!compatible(P, D)) {
                pdl_error_t e;
                assert_int_equal(pdl_topo_group(P, D, 0, &f, &c, &e), PDL_ERR_INVALID);
                assert_non_null(strstr(e.msg, "multiple"));
                assert_int_equal(pdl_topo_expected_acks(P, D, &exp, &e), PDL_ERR_INVALID);
                continue;
            }
            assert_int_equal(pdl_topo_expected_acks(P, D, &exp, NULL), PDL_OK);
            int in_groups[16] = {0}, releases[16] = {0};
            for (int d = 0; d < D; d++) {
                assert_int_equal(pdl_topo_group(P, D, d, &f, &c, NULL), PDL_OK);
                assert_true(f >= 0 && c >= 1 && f + c <= P);
                /* The map of a consumer rank is the first rank of its group (MoRIIO's dial target). */
                int m;
                assert_int_equal(pdl_topo_map_rank(d, D, P, &m, NULL), PDL_OK);
                assert_int_equal(m, f);
                for (int p = f; p < f + c; p++) {
                    in_groups[p]++;
                    releases[p]++; /* the release rule: every rank of the group, read or not */
                    int cf, cc;
                    assert_int_equal(pdl_topo_consumers_of(P, D, p, &cf, &cc, NULL), PDL_OK);
                    assert_true(d >= cf && d < cf + cc);
                }
            }
            for (int p = 0; p < P; p++) {
                int want = D / P > 1 ? D / P : 1;
                assert_int_equal(in_groups[p], want);
                assert_int_equal(releases[p], exp);
                int cf, cc;
                assert_int_equal(pdl_topo_consumers_of(P, D, p, &cf, &cc, NULL), PDL_OK);
                assert_int_equal(cc, want);
            }
            checked++;
        }
    assert_true(checked > 40);
}

/* Read plans cover every consumer head exactly once from the lowest holder; write plans mirror them. */
static void exhaustive_plans(void **state)
{
    (void)state;
    static pdl_read_plan_t rps[16];
    static pdl_write_plan_t wp;
    int checked = 0;
    for (int a = 0; a < N_TPS; a++)
        for (int b = 0; b < N_TPS; b++)
            for (int hi = -1; hi < N_HEADS; hi++) {
                int P = tps[a], D = tps[b];
                bool mla = hi < 0;
                int H = mla ? 1 : head_counts[hi];
                if (!compatible(P, D))
                    continue;
                if (!mla && (!heads_valid(P, H) || !heads_valid(D, H))) {
                    pdl_error_t e;
                    assert_int_not_equal(pdl_topo_read_plan(P, D, H, false, 0, &rps[0], &e), PDL_OK);
                    assert_non_null(strstr(e.msg, "KV heads"));
                    continue;
                }
                int pieces_total = 0;
                for (int d = 0; d < D; d++) {
                    pdl_read_plan_t *rp = &rps[d];
                    assert_int_equal(pdl_topo_read_plan(P, D, H, mla, d, rp, NULL), PDL_OK);
                    int lf, lc;
                    assert_int_equal(pdl_topo_heads(D, H, mla, d, &lf, &lc, NULL), PDL_OK);
                    assert_int_equal(rp->local_first_head, lf);
                    assert_int_equal(rp->local_num_heads, lc);
                    int next = lf; /* pieces are in head order and cover [lf, lf+lc) exactly once */
                    for (int i = 0; i < rp->num_pieces; i++) {
                        const pdl_plan_piece_t *pc = &rp->pieces[i];
                        assert_int_equal(pc->first_head, next);
                        assert_int_equal(pc->dst_head, next - lf);
                        assert_true(pc->num_heads >= 1);
                        assert_true(pc->producer_rank >= rp->group_first &&
                                    pc->producer_rank < rp->group_first + rp->group_count);
                        int pf, pcnt;
                        assert_int_equal(pdl_topo_heads(P, H, mla, pc->producer_rank, &pf, &pcnt, NULL), PDL_OK);
                        assert_true(pc->first_head >= pf && pc->first_head + pc->num_heads <= pf + pcnt);
                        assert_int_equal(pc->src_head, pc->first_head - pf);
                        for (int h = pc->first_head; h < pc->first_head + pc->num_heads; h++)
                            for (int q = rp->group_first; q < pc->producer_rank; q++) { /* none lower holds h */
                                int qf, qc;
                                assert_int_equal(pdl_topo_heads(P, H, mla, q, &qf, &qc, NULL), PDL_OK);
                                assert_false(h >= qf && h < qf + qc);
                            }
                        if (i > 0) /* maximal pieces: neighbours come from different producers */
                            assert_int_not_equal(rp->pieces[i - 1].producer_rank, pc->producer_rank);
                        next += pc->num_heads;
                    }
                    assert_int_equal(next, lf + lc);
                    pieces_total += rp->num_pieces;
                }
                int targets_total = 0;
                for (int p = 0; p < P; p++) {
                    assert_int_equal(pdl_topo_write_plan(P, D, H, mla, p, &wp, NULL), PDL_OK);
                    int cf, cc;
                    assert_int_equal(pdl_topo_consumers_of(P, D, p, &cf, &cc, NULL), PDL_OK);
                    assert_int_equal(wp.notify_first, cf);
                    assert_int_equal(wp.notify_count, cc);
                    for (int t = 0; t < wp.num_targets; t++) {
                        const pdl_write_target_t *tg = &wp.targets[t];
                        assert_int_equal(tg->piece.producer_rank, p);
                        assert_true(tg->consumer_rank >= cf && tg->consumer_rank < cf + cc);
                        /* The same piece is in the consumer's read plan. */
                        const pdl_read_plan_t *rp = &rps[tg->consumer_rank];
                        bool found = false;
                        for (int i = 0; i < rp->num_pieces; i++)
                            found |= memcmp(&rp->pieces[i], &tg->piece, sizeof(tg->piece)) == 0;
                        assert_true(found);
                    }
                    targets_total += wp.num_targets;
                }
                assert_int_equal(targets_total, pieces_total);
                checked++;
            }
    assert_true(checked > 150);
}

static void port_offsets_injective(void **state)
{
    (void)state;
    for (int tp = 1; tp <= 16; tp++) {
        static bool seen[16 * 16 + 16];
        memset(seen, 0, sizeof(seen));
        for (int dp = 0; dp < 16; dp++)
            for (int r = 0; r < tp; r++) {
                int off = pdl_topo_port_offset(dp, tp, r);
                assert_true(off >= 0 && off < 16 * 16);
                assert_false(seen[off]);
                seen[off] = true;
            }
    }
    /* MoRIIO's dp + tp collides here; ours does not. */
    assert_int_not_equal(pdl_topo_port_offset(1, 2, 0), pdl_topo_port_offset(0, 2, 1));
    assert_int_equal(pdl_topo_port_offset(3, 8, 5), 29);
    assert_int_equal(pdl_topo_port_offset(0, 4, 4), -1);
    assert_int_equal(pdl_topo_port_offset(-1, 4, 0), -1);
    assert_int_equal(pdl_topo_port_offset(0, 0, 0), -1);
    assert_int_equal(pdl_topo_port_offset(1 << 30, 8, 0), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(map_vectors),
        cmocka_unit_test(map_errors),
        cmocka_unit_test(expected_vectors),
        cmocka_unit_test(groups_examples),
        cmocka_unit_test(heads_examples),
        cmocka_unit_test(read_plan_split_p4_d8),
        cmocka_unit_test(read_plan_split_p8_d4),
        cmocka_unit_test(read_plan_replicated),
        cmocka_unit_test(write_plan_examples),
        cmocka_unit_test(exhaustive_groups_and_releases),
        cmocka_unit_test(exhaustive_plans),
        cmocka_unit_test(port_offsets_injective),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
