/*
 * plan.h -- what the files of `pdlink plan` share: the resolved configuration (topologies and KV geometry,
 * after the model preset and the flags are folded together), the plan as a JSON document built from it,
 * and the human output rendered from that document, so that the two outputs can never disagree.
 *   plan.c        the command: options (one table), the preset and topology folding, --json or text
 *   plan_doc.c    the document: per (P, D) pair, every rank's group, reads, ranges, descriptors, fan-in
 *   plan_print.c  the human output, from the document only
 */
#ifndef PDL_CLI_PLAN_H
#define PDL_CLI_PLAN_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "pdlink/layout.h"
#include "pdlink/models.h"
#include "pdlink/status.h"

#define PLAN_MAX_INSTANCES 16
#define PLAN_MAX_TOPOS 4

typedef struct plan_topo {
    char name[96];
    int prefill[PLAN_MAX_INSTANCES], n_prefill;
    int decode[PLAN_MAX_INSTANCES], n_decode;
} plan_topo_t;

typedef struct plan_cfg {
    plan_topo_t topos[PLAN_MAX_TOPOS];
    int n_topos;
    const pdl_model_preset_t *model;
    int layers, heads, head_dim, elem_size;
    const char *dtype;
    bool mla;
    uint32_t block_size;
    uint64_t num_blocks;
    uint32_t sample_blocks;
    pdl_kv_order_t order;
    bool kv_separate;
    bool kv_fused;
    bool write_mode;
    bool json;
} plan_cfg_t;

/* The plan of every topology of c as one document (schema in docs/plan.md); NULL with err naming the
 * topology and pair on a topology error. The caller owns the reference. */
json_t *pdl_plan_doc(const plan_cfg_t *c, pdl_error_t *err);

/* The human output of a document pdl_plan_doc built from c, on stdout. */
void pdl_plan_print(const plan_cfg_t *c, const json_t *doc);

#endif /* PDL_CLI_PLAN_H */
