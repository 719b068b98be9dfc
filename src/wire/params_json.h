/*
 * params_json.h -- kv_transfer_params as jansson values, for the code that already holds the request's
 * JSON tree (the connector, pdlink-node, pdlink-router): the same parsing and building as
 * pdlink/params.h's text functions, without printing and re-reading the JSON.
 *
 * Layer: wire, internal: jansson's types stay out of the installed headers.
 */
#ifndef PDL_WIRE_PARAMS_JSON_H
#define PDL_WIRE_PARAMS_JSON_H

#include <jansson.h>

#include "pdlink/params.h"

/*
 * pdl_kv_params_parse for a parsed value: `obj` (NULL or JSON null: every field absent) is borrowed and
 * no reference is kept. Fails like pdl_kv_params_parse, except that it never sees text (no "not JSON").
 */
pdl_status_t pdl_kv_params_from_json(const json_t *obj, pdl_kv_params_t *out, pdl_error_t *err);

/*
 * pdl_kv_params_format as a value: a new reference the caller releases with json_decref, or NULL when p
 * is NULL, memory runs out or a string is not UTF-8.
 */
json_t *pdl_kv_params_to_json(const pdl_kv_params_t *p);

#endif /* PDL_WIRE_PARAMS_JSON_H */
