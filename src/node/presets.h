/*
 * presets.h -- model lookup for pdlink-node on top of include/pdlink/models.h.
 *
 * models.h finds a preset by short name or exact Hugging Face id. A `vllm serve` command line names a
 * model by its id, often a variant ("meta-llama/Llama-3.1-8B", "org/Llama-3.1-8B-Instruct-FP8"), so the
 * node also accepts a name whose last path component equals a preset's short name or the last component
 * of its id. The node additionally needs a default --max-model-len per preset.
 */
#ifndef PDL_NODE_PRESETS_H
#define PDL_NODE_PRESETS_H

#include <stddef.h>

#include "pdlink/models.h"

/* NULL when nothing matches. */
const pdl_model_preset_t *pdl_node_preset_find(const char *name);

/* The default --max-model-len of a preset (its published context length). */
int pdl_node_preset_max_len(const pdl_model_preset_t *m);

/* Comma-separated list of preset names, for error messages and --help. */
void pdl_node_preset_names(char *buf, size_t cap);

#endif /* PDL_NODE_PRESETS_H */
