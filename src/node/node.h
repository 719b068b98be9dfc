/*
 * node.h -- pdlink-node's instance state and its request engine: what one completion request does.
 *
 * A request is parsed and checked (pdl_node_request_parse), then executed (pdl_node_request_run):
 *   serve alone       allocate blocks → synthetic prefill → verify → generate → free blocks
 *   producer leg      (kv_producer, do_remote_decode) prefill → verify → generate (max_tokens, normally 1)
 *                     → pdl_instance_hold(transfer_id) → finish_reason "length" + kv_transfer_params
 *   consumer leg      (kv_consumer, do_remote_prefill) allocate → pdl_instance_pull (READ mode) → verify
 *                     every received byte → generate → free blocks
 * WRITE mode (read_mode false; the router sends both legs at once):
 *   producer leg      prefill → generate → pdl_instance_push(transfer_id; consumer address from the
 *                     request id or params, consumer TP from remote_tp_size) → kv_transfer_params null,
 *                     as upstream's prefill returns in WRITE mode; the instance frees the blocks
 *   consumer leg      allocate → pdl_instance_expect_push (remote_blocks out, write_done counted) →
 *                     verify every byte → generate → free blocks
 * The HTTP layer (http.c) then formats the result as a JSON body or an SSE stream. Every failure carries
 * an HTTP status and a message naming the field or the cause; the blocks of a failed request are freed.
 */
#ifndef PDL_NODE_NODE_H
#define PDL_NODE_NODE_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "app/http.h"
#include "node/args.h"
#include "node/kvstore.h"
#include "node/metrics.h"
#include "node/presets.h"
#include "pdlink/connector.h"
#include "wire/params_json.h"

typedef enum pdl_node_role {
    PDL_NODE_ALONE = 0,    /* no connector, or kv_both: serves whole requests */
    PDL_NODE_PRODUCER = 1, /* kv_producer: prefill */
    PDL_NODE_CONSUMER = 2, /* kv_consumer: decode */
} pdl_node_role_t;

typedef struct pdl_node {
    pdl_node_args_t args;
    const pdl_model_preset_t *preset;
    const char *served_name;
    int max_model_len;
    pdl_node_role_t role;
    const char *role_label;       /* "prefill" | "decode" | "both" (metrics label) */
    pdl_connector_config_t conn;  /* valid when role != ALONE */
    pdl_node_kv_t *kv;
    pdl_node_metrics_t *metrics;
    time_t started;
    atomic_bool ready;            /* KV store and connector up: requests are served */
    atomic_bool tp_disagree_warned; /* kv_transfer_params tp_size != remote_tp_size was logged once */
} pdl_node_t;

#define PDL_NODE_RID_MAX 600

typedef enum pdl_node_mode {
    PDL_NODE_MODE_LOCAL = 0,
    PDL_NODE_MODE_PREFILL_HOLD = 1,
    PDL_NODE_MODE_PULL = 2,
    PDL_NODE_MODE_PREFILL_PUSH = 3, /* WRITE mode, kv_producer: prefill then pdl_instance_push */
    PDL_NODE_MODE_RECV = 4,         /* WRITE mode, kv_consumer: pdl_instance_expect_push then verify */
} pdl_node_mode_t;

typedef struct pdl_node_request {
    bool chat;
    char request_id[PDL_NODE_RID_MAX + 1];
    char *prompt;                 /* owned, NUL-terminated; "" for a token-id prompt */
    size_t prompt_len;
    uint32_t *prompt_ids;         /* owned; a token-id prompt (prompt: [ids]) when non-NULL */
    size_t n_prompt_ids;
    json_t *more_prompts;         /* owned; prompts 2..k of a batched completion (http runs each) */
    int n;                        /* choices per prompt (greedy: identical) */
    char **stop;                  /* owned; stop strings (vLLM's `stop`), nstop of them */
    size_t nstop;
    int min_tokens;               /* stop strings apply from this many tokens on (vLLM) */
    bool echo;                    /* completions: the prompt comes back before the completion */
    int logprobs;                 /* -1 none; completions: top-N count; chat: top_logprobs */
    int max_tokens;
    bool stream;
    bool include_usage;
    pdl_node_mode_t mode;
    pdl_kv_params_t params;       /* owned */
} pdl_node_request_t;

typedef struct pdl_node_result {
    int http_status;              /* 200 on success */
    const char *error_type;       /* "BadRequestError", ... */
    char error[PDL_ERR_MSG_LEN + 200];
    size_t prompt_tokens;
    uint32_t *tokens;             /* owned; generated tokens */
    size_t num_tokens;
    const char *finish_reason;
    size_t text_limit;            /* bytes of the generated text the client gets (SIZE_MAX: all) */
    int stop_index;               /* -1, or the req->stop entry that ended generation (stop_reason) */
    uint64_t digest;              /* the prompt's KV digest (synthetic logprobs derive from it) */
    uint64_t *prompt_prefix;      /* owned; prefix hashes of the prompt tokens (echo logprobs) */
    uint32_t *prompt_token_ids;   /* owned; the prompt's tokens */
    json_t *kv_transfer_params;   /* owned reference or NULL */
} pdl_node_result_t;

/*
 * Parse a request body (already JSON-decoded) for /v1/completions (chat = false) or
 * /v1/chat/completions. On failure fills res with a 4xx and returns false. `request_id` is the
 * X-Request-Id header or NULL (then one is generated).
 */
bool pdl_node_request_parse(pdl_node_t *node, bool chat, const json_t *body, const char *request_id,
                            pdl_node_request_t *req, pdl_node_result_t *res);
void pdl_node_request_clear(pdl_node_request_t *req);
/* Replace the prompt of a parsed request with prompt `index` of its batch (more_prompts). */
bool pdl_node_request_set_prompt(pdl_node_request_t *req, const json_t *prompt, size_t index, pdl_node_result_t *res);
/* The text of generated tokens [from, to) as the client sees it (a leading space per word, except the
 * first word of a chat message) into out (NULL: only measure); returns its length in bytes. */
size_t pdl_node_token_text(const uint32_t *tokens, size_t from, size_t to, bool chat, char *out);

/* Execute a parsed request; fills res (success or a 4xx/5xx with a message). */
void pdl_node_request_run(pdl_node_t *node, pdl_node_request_t *req, pdl_node_result_t *res);
void pdl_node_result_clear(pdl_node_result_t *res);

/* Set an error result. */
void pdl_node_result_error(pdl_node_result_t *res, int http_status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- http.c ---- */
/* Serve the node's routes on --host/--port (see app/http.h for the errors); stop with pdl_http_stop. */
pdl_status_t pdl_node_http_start(pdl_node_t *node, pdl_http_t **http_p, int *port_p, pdl_error_t *err);

#endif /* PDL_NODE_NODE_H */
