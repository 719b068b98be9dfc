/*
 * presets.c -- model lookup for pdlink-node over models.h (see presets.h).
 */
#include "node/presets.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *basename_of(const char *s)
{
    const char *slash = strrchr(s, '/');
    return slash ? slash + 1 : s;
}

const pdl_model_preset_t *pdl_node_preset_find(const char *name)
{
    if (name == NULL || name[0] == '\0')
        return NULL;
    const pdl_model_preset_t *m = pdl_model_find(name);
    if (m != NULL)
        return m;
    const char *base = basename_of(name);
    for (size_t i = 0; i < pdl_model_count(); i++) {
        m = pdl_model_at(i);
        if (strcasecmp(base, m->name) == 0 || (m->hf_id[0] != '\0' && strcasecmp(base, basename_of(m->hf_id)) == 0))
            return m;
    }
    return NULL;
}

int pdl_node_preset_max_len(const pdl_model_preset_t *m)
{
    /* Published context lengths (max_position_embeddings); test presets get a small one. */
    static const struct {
        const char *name;
        int len;
    } lens[] = {{"llama-3.1-8b", 131072}, {"llama-3.1-70b", 131072}, {"qwen3-32b", 40960}, {"deepseek-v3", 163840}};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
        if (strcmp(m->name, lens[i].name) == 0)
            return lens[i].len;
    return 8192;
}

void pdl_node_preset_names(char *buf, size_t cap)
{
    if (cap == 0)
        return;
    buf[0] = '\0';
    size_t used = 0;
    for (size_t i = 0; i < pdl_model_count(); i++) {
        int w = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", pdl_model_at(i)->name);
        if (w < 0 || (size_t)w >= cap - used)
            return;
        used += (size_t)w;
    }
}
