/* shim.h -- the C shim between libpdlink and the Python package: what pdlink._pdlink (the cffi
 * extension) needs beyond libpdlink's own API (include/pdlink/).
 *
 * _build.py hands these declarations to cffi as they are (lines starting with '#' removed), after
 * libpdlink's, so they are written once; shim.c defines them. Every function here is called with
 * Python's GIL held and returns what the libpdlink call it wraps returns. */
#ifndef PDLINK_PY_SHIM_H
#define PDLINK_PY_SHIM_H

#include "pdlink/connector.h"

/* Held-transfer events wait in a queue in C until Python takes them (Instance.events()): the
 * connector calls its event function on its own threads, which must never wait for the GIL. */
typedef struct pdlpy_events pdlpy_events_t;
/* A queue receiving inst's events from now on; NULL without memory. Free it after pdl_instance_destroy. */
pdlpy_events_t *pdlpy_events_attach(pdl_instance_t *inst);
/* The oldest event into ev/rank/tid (cut to cap bytes with its NUL): 1, or 0 when there is none. */
int pdlpy_events_take(pdlpy_events_t *q, int *ev, int *rank, char *tid, size_t cap);
/* Frees the queue and the events still in it; NULL is accepted. */
void pdlpy_events_free(pdlpy_events_t *q);

/* pdl_log_set_level with the level as an int (pdl_log_level_parse's result). */
void pdlpy_log_set_level(int lvl);

/* kv_transfer_params cross the boundary as JSON text (pdl_kv_params_parse / pdl_kv_params_format). */

/* pdl_instance_params as JSON text, to free(); NULL with err set on failure. */
char *pdlpy_params_json(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n,
                        pdl_error_t *err);
/* pdl_instance_pull of the params in params_json. */
pdl_status_t pdlpy_pull(pdl_instance_t *inst, const char *params_json, const char *request_id,
                        const uint32_t *ids, size_t n, pdl_pull_t **pull_out, pdl_error_t *err);
/* layers < 0: pdl_instance_push (every layer final); else pdl_instance_push_start and, when layers > 0,
 * pdl_instance_push_layers. */
pdl_status_t pdlpy_push(pdl_instance_t *inst, const char *params_json, const char *request_id,
                        const uint32_t *ids, size_t n, int layers, pdl_error_t *err);
/* pdl_instance_expect_push of the params in params_json. */
pdl_status_t pdlpy_expect_push(pdl_instance_t *inst, const char *params_json, const char *request_id,
                               const uint32_t *ids, size_t n, pdl_recv_t **recv_out, pdl_error_t *err);
/* pdl_instance_abandon of the params in params_json. */
pdl_status_t pdlpy_abandon(pdl_instance_t *inst, const char *params_json, const char *request_id, pdl_error_t *err);

#endif /* PDLINK_PY_SHIM_H */
