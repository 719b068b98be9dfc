/*
 * topo.h -- heterogeneous tensor-parallel topology: pure functions, no I/O (SPEC §2).
 *
 * P = producer (prefill) TP size, D = consumer (decode) TP size, H = total KV heads of the model.
 * Everything here is a function of small integers, so it is tested exhaustively over P, D, H.
 * Errors are PDL_ERR_INVALID with a message naming the values, e.g.
 * "decode TP 6 is not a multiple of prefill TP 4".
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
 * R < L → rank/(L/R). Error (message contains "multiple") when neither size divides the other.
 */
pdl_status_t pdl_topo_map_rank(int local_rank, int local_tp, int remote_tp, int *remote_rank_out, pdl_error_t *err);

/* expected(P, D) = D > P ? D/P : 1: the releases a producer rank waits for in READ mode. */
pdl_status_t pdl_topo_expected_acks(int prefill_tp, int decode_tp, int *out, pdl_error_t *err);

/* The write_done count a consumer rank waits for in WRITE mode: P > D ? P/D : 1. */
pdl_status_t pdl_topo_expected_write_done(int prefill_tp, int decode_tp, int *out, pdl_error_t *err);

/*
 * Group of consumer rank d: the producer ranks it is paired with, [*first, *first + *count).
 * D >= P: { d/(D/P) }. D < P: { d*(P/D) ... d*(P/D) + P/D - 1 }.
 */
pdl_status_t pdl_topo_group(int prefill_tp, int decode_tp, int consumer_rank, int *first_out, int *count_out,
                            pdl_error_t *err);

/*
 * Consumer ranks whose group contains producer rank p: [*first, *first + *count). Every producer rank
 * lies in exactly max(1, D/P) groups.
 */
pdl_status_t pdl_topo_consumers_of(int prefill_tp, int decode_tp, int producer_rank, int *first_out,
                                   int *count_out, pdl_error_t *err);

/*
 * Heads held by rank r of T ranks with H total KV heads: [*first, *first + *count).
 * T <= H (H % T == 0): [r*H/T, (r+1)*H/T). T > H (T % H == 0): the single head r/(T/H), replicated.
 * MLA: one latent "head" (index 0) on every rank, whatever H is.
 */
pdl_status_t pdl_topo_heads(int tp, int total_heads, bool is_mla, int rank, int *first_out, int *count_out,
                            pdl_error_t *err);

/* One contiguous run of heads that a consumer rank takes from one producer rank. */
typedef struct pdl_plan_piece {
    int producer_rank;
    int first_head;    /* global head index of the first head moved */
    int num_heads;     /* heads moved (>= 1) */
    int src_head;      /* index of first_head among the producer rank's own heads */
    int dst_head;      /* index of first_head among the consumer rank's own heads */
} pdl_plan_piece_t;

/*
 * The read plan of one consumer rank (SPEC §2): for every head it holds, the lowest producer rank of
 * its group that holds that head; adjacent heads from the same producer are one piece.
 * `group_first/group_count` is its group: in READ mode it releases every rank of it.
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

pdl_status_t pdl_topo_read_plan(int prefill_tp, int decode_tp, int total_heads, bool is_mla, int consumer_rank,
                                pdl_read_plan_t *out, pdl_error_t *err);

/* One consumer rank a producer rank writes to in WRITE mode, with the heads it writes. */
typedef struct pdl_write_target {
    int consumer_rank;
    pdl_plan_piece_t piece; /* piece.producer_rank == the writing producer */
} pdl_write_target_t;

/*
 * The write plan of one producer rank: the mirror of the read plans -- every piece of every consumer
 * rank's read plan whose producer is `producer_rank`. `notify_*` are the consumer ranks it sends
 * write_done to (every consumer whose group holds it, whether or not it wrote to it).
 */
typedef struct pdl_write_plan {
    int prefill_tp, decode_tp, total_heads;
    bool is_mla;
    int producer_rank;
    int notify_first, notify_count;
    int num_targets;
    pdl_write_target_t targets[PDL_TOPO_MAX_TP];
} pdl_write_plan_t;

pdl_status_t pdl_topo_write_plan(int prefill_tp, int decode_tp, int total_heads, bool is_mla, int producer_rank,
                                 pdl_write_plan_t *out, pdl_error_t *err);

/*
 * Port offset of a rank: dp_rank*tp_size + tp_rank (injective over DP x TP; MoRIIO's dp+tp is not).
 * Returns -1 for a negative rank, tp_size <= 0, tp_rank >= tp_size, or an offset above 65535.
 */
int pdl_topo_port_offset(int dp_rank, int tp_size, int tp_rank);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_TOPO_H */
