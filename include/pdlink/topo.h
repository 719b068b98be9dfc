/*
 * topo.h -- heterogeneous tensor-parallel topology: which ranks pair up and which KV heads move where
 * (docs/topology.md).
 *
 * Layer: topo, the lowest above common (includes only status.h). Pure functions: no I/O, no
 * allocation, no logging, no global state, so every function is thread-safe.
 *
 * P = producer (prefill) TP size, D = consumer (decode) TP size, H = total KV heads of the model.
 * Everything here is a function of small integers, so it is tested exhaustively over P, D, H.
 * Two TP sizes are compatible only when one divides the other, and each must be in
 * [1, PDL_TOPO_MAX_TP]. Error convention: every failure is PDL_ERR_INVALID, with `err` (may be NULL)
 * naming the values, e.g. "decode TP 6 is not a multiple of prefill TP 4". Integer outputs may be
 * NULL (that value is then not returned) and are written only on success.
 */
#ifndef PDLINK_TOPO_H
#define PDLINK_TOPO_H

#include <stdbool.h>
#include <stdint.h>

#include "pdlink/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest TP size pdlink plans for; bounds the fixed-size arrays below. */
#define PDL_TOPO_MAX_TP 256

/*
 * map(rank, L, R): the remote rank a local rank dials. L == R → rank; R > L → rank*(R/L);
 * R < L → rank/(L/R). Fails when a TP size is outside [1, PDL_TOPO_MAX_TP], when neither size divides
 * the other (message contains "multiple") or when local_rank is outside [0, local_tp).
 * remote_rank_out may be NULL.
 */
pdl_status_t pdl_topo_map_rank(int local_rank, int local_tp, int remote_tp, int *remote_rank_out, pdl_error_t *err);

/*
 * expected(P, D) = D > P ? D/P : 1: the releases a producer rank waits for in READ mode. Fails on an
 * incompatible (P, D) pair; out may be NULL.
 */
pdl_status_t pdl_topo_expected_acks(int prefill_tp, int decode_tp, int *out, pdl_error_t *err);

/* The write_done count a consumer rank waits for in WRITE mode: P > D ? P/D : 1. Same errors as above. */
pdl_status_t pdl_topo_expected_write_done(int prefill_tp, int decode_tp, int *out, pdl_error_t *err);

/*
 * Group of consumer rank d: the producer ranks it is paired with, [*first, *first + *count).
 * D >= P: { d/(D/P) }. D < P: { d*(P/D) ... d*(P/D) + P/D - 1 }.
 * Fails on an incompatible (P, D) pair or d outside [0, D). Both outputs may be NULL.
 */
pdl_status_t pdl_topo_group(int prefill_tp, int decode_tp, int consumer_rank, int *first_out, int *count_out,
                            pdl_error_t *err);

/*
 * Consumer ranks whose group contains producer rank p: [*first, *first + *count). Every producer rank
 * lies in exactly max(1, D/P) groups. Fails on an incompatible (P, D) pair or p outside [0, P). Both
 * outputs may be NULL.
 */
pdl_status_t pdl_topo_consumers_of(int prefill_tp, int decode_tp, int producer_rank, int *first_out,
                                   int *count_out, pdl_error_t *err);

/*
 * Heads held by rank r of T ranks with H total KV heads: [*first, *first + *count).
 * T <= H (H % T == 0): [r*H/T, (r+1)*H/T). T > H (T % H == 0): the single head r/(T/H), replicated.
 * MLA: one latent "head" (index 0) on every rank, whatever H is (H is not checked).
 * Fails when T is outside [1, PDL_TOPO_MAX_TP], r outside [0, T), H <= 0 (not MLA), or neither of
 * H and T divides the other. Both outputs may be NULL.
 */
pdl_status_t pdl_topo_heads(int tp, int total_heads, bool is_mla, int rank, int *first_out, int *count_out,
                            pdl_error_t *err);

/*
 * One contiguous run of heads that a consumer rank takes from one producer rank (contiguous on both
 * sides); pdl_layout_build_descs turns it into byte ranges.
 */
typedef struct pdl_plan_piece {
    int producer_rank;
    int first_head;    /* global head index of the first head moved */
    int num_heads;     /* heads moved (>= 1) */
    int src_head;      /* index of first_head among the producer rank's own heads */
    int dst_head;      /* index of first_head among the consumer rank's own heads */
} pdl_plan_piece_t;

/*
 * The read plan of one consumer rank (docs/topology.md#read-plans): for every head it holds, the lowest
 * producer rank of
 * its group that holds that head; adjacent heads from the same producer are one piece.
 * `prefill_tp` .. `consumer_rank` echo the inputs. `group_first/group_count` is its group (as
 * pdl_topo_group): in READ mode it releases every rank of it, including ranks it read nothing from.
 * `local_first_head/local_num_heads` are the heads the consumer holds (as pdl_topo_heads), and
 * `pieces[0 .. num_pieces)` the pieces, in head order. A value type of a few KiB, filled in place.
 */
typedef struct pdl_read_plan {
    int prefill_tp, decode_tp, total_heads;
    bool is_mla;
    int consumer_rank;
    int group_first, group_count;
    int local_first_head, local_num_heads;   /* heads the consumer holds */
    int num_pieces;
    pdl_plan_piece_t pieces[PDL_TOPO_MAX_TP];
} pdl_read_plan_t;

/*
 * Compute the read plan of `consumer_rank` into *out (caller-provided; NULL is refused). Validates the
 * whole (P, D, H) triple first (both TP sizes, heads splittable over both), then the rank; every
 * failure is PDL_ERR_INVALID. On failure *out may be partly written.
 */
pdl_status_t pdl_topo_read_plan(int prefill_tp, int decode_tp, int total_heads, bool is_mla, int consumer_rank,
                                pdl_read_plan_t *out, pdl_error_t *err);

/*
 * One consumer rank a producer rank writes to in WRITE mode, with the heads it writes; `piece` is the
 * consumer's read-plan piece, so piece.producer_rank is the writing producer.
 */
typedef struct pdl_write_target {
    int consumer_rank;
    pdl_plan_piece_t piece; /* piece.producer_rank == the writing producer */
} pdl_write_target_t;

/*
 * The write plan of one producer rank: the mirror of the read plans -- every piece of every consumer
 * rank's read plan whose producer is `producer_rank`, in targets[0 .. num_targets), ordered by
 * consumer rank. `notify_first/notify_count` are the consumer ranks it sends write_done to (as
 * pdl_topo_consumers_of: every consumer whose group holds it, whether or not it wrote to it), so
 * num_targets may be 0 while notify_count is not. The first fields echo the inputs.
 */
typedef struct pdl_write_plan {
    int prefill_tp, decode_tp, total_heads;
    bool is_mla;
    int producer_rank;
    int notify_first, notify_count;
    int num_targets;
    pdl_write_target_t targets[PDL_TOPO_MAX_TP];
} pdl_write_plan_t;

/*
 * Compute the write plan of `producer_rank` into *out (caller-provided; NULL is refused). Same
 * validation and errors as pdl_topo_read_plan, with the rank checked against [0, P).
 */
pdl_status_t pdl_topo_write_plan(int prefill_tp, int decode_tp, int total_heads, bool is_mla, int producer_rank,
                                 pdl_write_plan_t *out, pdl_error_t *err);

/*
 * Port offset of a rank: dp_rank*tp_size + tp_rank, added to a base port. Not upstream MoRIIO, which
 * adds dp+tp and so gives two ranks the same port (dp 1/tp 0 and dp 0/tp 1); this is injective over
 * DP x TP. Returns -1 (no status: a caller has nothing to report beyond the values) for a negative
 * rank, tp_size <= 0, tp_rank >= tp_size, or an offset above 65535.
 */
int pdl_topo_port_offset(int dp_rank, int tp_size, int tp_rank);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_TOPO_H */
