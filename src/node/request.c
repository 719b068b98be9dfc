/*
 * request.c -- what one completion request does on a pdlink-node (see node.h for the three flows).
 *
 * Parsing follows vLLM's OpenAI server where a client would notice: `prompt` is a string, a list of
 * token ids or a batch of either, chat `messages` are rendered with a fixed template, `n` copies the
 * greedy answer, `stop`/`min_tokens`/`echo`/`logprobs`/`seed` behave as vLLM's, `max_tokens`
 * defaults to 16, and `kv_transfer_params` is a top-level object whose semantics are MoRIIO's
 * (docs/protocol.md#kv_transfer_params). Input is hostile: every field is type-checked and a wrong one is a 400 naming it.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "app/buf.h"
#include "node/node.h"
#include "node/synth.h"
#include "common/log.h"
#include "pdlink/pull_hook.h"
#include "pdlink/wire.h"
#include "common/clock.h"

static const char *error_type_of(int status)
{
    switch (status) {
    case 400: return "BadRequestError";
    case 404: return "NotFoundError";
    case 413: return "RequestEntityTooLarge";
    case 503: return "ServiceUnavailableError";
    default: return status >= 500 ? "InternalServerError" : "BadRequestError";
    }
}

void pdl_node_result_error(pdl_node_result_t *res, int http_status, const char *fmt, ...)
{
    res->http_status = http_status;
    res->error_type = error_type_of(http_status);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->error, sizeof(res->error), fmt, ap);
    va_end(ap);
}

void pdl_node_result_clear(pdl_node_result_t *res)
{
    free(res->tokens);
    free(res->prompt_prefix);
    free(res->prompt_token_ids);
    if (res->kv_transfer_params != NULL)
        json_decref(res->kv_transfer_params);
    memset(res, 0, sizeof(*res));
}

void pdl_node_request_clear(pdl_node_request_t *req)
{
    free(req->prompt);
    free(req->prompt_ids);
    if (req->more_prompts != NULL)
        json_decref(req->more_prompts);
    for (size_t i = 0; i < req->nstop; i++)
        free(req->stop[i]);
    free(req->stop);
    pdl_kv_params_clear(&req->params);
    memset(req, 0, sizeof(*req));
}

/* Append text to a growing prompt buffer; false when memory runs out. */
static bool append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (!pdl_buf_reserve(buf, cap, *len + n + 1, 256))
        return false;
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

/* A token-id prompt: a non-empty array of integers that fit a token id. */
static bool parse_ids(const json_t *a, const char *what, pdl_node_request_t *req, pdl_node_result_t *res)
{
    size_t n = json_array_size(a);
    if (n == 0) {
        pdl_node_result_error(res, 400, "%s: a token-id prompt must not be empty", what);
        return false;
    }
    req->prompt_ids = malloc(n * sizeof(uint32_t));
    req->prompt = strdup("");
    if (req->prompt_ids == NULL || req->prompt == NULL) {
        pdl_node_result_error(res, 500, "out of memory for a %zu-token prompt", n);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(a, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > UINT32_MAX) {
            pdl_node_result_error(res, 400, "%s[%zu]: expected a token id (an integer 0..4294967295)", what, i);
            return false;
        }
        req->prompt_ids[i] = (uint32_t)json_integer_value(t);
    }
    req->n_prompt_ids = n;
    return true;
}

/* One prompt of `prompt`: a string, or a token-id array (vLLM's str | list[int]). */
static bool parse_one_prompt(const json_t *p, const char *what, pdl_node_request_t *req, pdl_node_result_t *res)
{
    if (json_is_array(p))
        return parse_ids(p, what, req, res);
    if (!json_is_string(p)) {
        pdl_node_result_error(res, 400, "%s: expected a string or an array of token ids", what);
        return false;
    }
    size_t n = json_string_length(p);
    req->prompt = malloc(n + 1);
    if (req->prompt == NULL) {
        pdl_node_result_error(res, 500, "out of memory for a %zu-byte prompt", n);
        return false;
    }
    memcpy(req->prompt, json_string_value(p), n);
    req->prompt[n] = '\0';
    req->prompt_len = n;
    return true;
}

/*
 * `prompt` as vLLM takes it: a string, a list of token ids, or a batch (a list of strings or of token-id
 * lists). This request keeps the first prompt; the others go to more_prompts, which the HTTP layer runs
 * one by one into choices prompt_index*n + j, as vLLM numbers them.
 */
static bool parse_prompt(const json_t *body, pdl_node_request_t *req, pdl_node_result_t *res)
{
    const json_t *p = json_object_get(body, "prompt");
    if (p == NULL || json_is_null(p)) {
        pdl_node_result_error(res, 400, "prompt: required");
        return false;
    }
    if (!json_is_array(p))
        return parse_one_prompt(p, "prompt", req, res);
    if (json_array_size(p) == 0) {
        pdl_node_result_error(res, 400, "prompt: an empty array");
        return false;
    }
    const json_t *first = json_array_get(p, 0);
    if (json_is_integer(first))
        return parse_ids(p, "prompt", req, res);
    for (size_t i = 1; i < json_array_size(p); i++)
        if (json_typeof(json_array_get(p, i)) != json_typeof(first)) {
            pdl_node_result_error(res, 400, "prompt[%zu]: a batch must hold only strings or only token-id lists", i);
            return false;
        }
    if (!parse_one_prompt(first, "prompt[0]", req, res))
        return false;
    if (json_array_size(p) > 1) {
        req->more_prompts = json_array();
        for (size_t i = 1; req->more_prompts != NULL && i < json_array_size(p); i++)
            json_array_append(req->more_prompts, json_array_get(p, i));
        if (req->more_prompts == NULL) {
            pdl_node_result_error(res, 500, "out of memory for a batch of %zu prompts", json_array_size(p));
            return false;
        }
    }
    return true;
}

/* The next prompt of a batch into `req` (already parsed once): replaces the prompt, keeps the rest. */
bool pdl_node_request_set_prompt(pdl_node_request_t *req, const json_t *prompt, size_t index, pdl_node_result_t *res)
{
    free(req->prompt);
    free(req->prompt_ids);
    req->prompt = NULL;
    req->prompt_ids = NULL;
    req->prompt_len = req->n_prompt_ids = 0;
    char what[32];
    snprintf(what, sizeof(what), "prompt[%zu]", index);
    return parse_one_prompt(prompt, what, req, res);
}

/* `stop`: null, a string or an array of strings (empty ones never match, as in vLLM). */
static bool parse_stop(const json_t *body, pdl_node_request_t *req, pdl_node_result_t *res)
{
    const json_t *v = json_object_get(body, "stop");
    if (v == NULL || json_is_null(v))
        return true;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_string(v)) {
        pdl_node_result_error(res, 400, "stop: expected a string or an array of strings");
        return false;
    }
    req->stop = calloc(n ? n : 1, sizeof(char *));
    if (req->stop == NULL) {
        pdl_node_result_error(res, 500, "out of memory for %zu stop strings", n);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(x)) {
            pdl_node_result_error(res, 400, "stop[%zu]: expected a string", i);
            return false;
        }
        if (json_string_length(x) == 0)
            continue;
        if ((req->stop[req->nstop] = strdup(json_string_value(x))) == NULL) {
            pdl_node_result_error(res, 500, "out of memory for stop strings");
            return false;
        }
        req->nstop++;
    }
    return true;
}

/* Chat template: "<|role|>\ncontent\n" per message, then "<|assistant|>\n". */
static bool parse_messages(const json_t *body, pdl_node_request_t *req, pdl_node_result_t *res)
{
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        pdl_node_result_error(res, 400, "messages: expected a non-empty array");
        return false;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m)
    {
        const json_t *role = json_object_get(m, "role");
        const json_t *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role)) {
            free(buf);
            pdl_node_result_error(res, 400, "messages[%zu].role: expected a string", i);
            return false;
        }
        bool ok = append(&buf, &len, &cap, "<|", 2) &&
                  append(&buf, &len, &cap, json_string_value(role), json_string_length(role)) &&
                  append(&buf, &len, &cap, "|>\n", 3);
        if (json_is_string(content)) {
            ok = ok && append(&buf, &len, &cap, json_string_value(content), json_string_length(content));
        } else if (json_is_array(content)) {
            size_t j;
            const json_t *part;
            json_array_foreach(content, j, part)
            {
                const json_t *type = json_object_get(part, "type");
                const json_t *text = json_object_get(part, "text");
                if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
                    free(buf);
                    pdl_node_result_error(res, 400,
                                          "messages[%zu].content[%zu]: expected {\"type\": \"text\", \"text\": string}",
                                          i, j);
                    return false;
                }
                ok = ok && append(&buf, &len, &cap, json_string_value(text), json_string_length(text)) &&
                     append(&buf, &len, &cap, "\n", 1);
            }
        } else if (!json_is_null(content) && content != NULL) {
            free(buf);
            pdl_node_result_error(res, 400, "messages[%zu].content: expected a string, an array of parts or null", i);
            return false;
        }
        ok = ok && append(&buf, &len, &cap, "\n", 1);
        if (!ok) {
            free(buf);
            pdl_node_result_error(res, 500, "out of memory rendering messages");
            return false;
        }
    }
    if (!append(&buf, &len, &cap, "<|assistant|>\n", 14)) {
        free(buf);
        pdl_node_result_error(res, 500, "out of memory rendering messages");
        return false;
    }
    req->prompt = buf;
    req->prompt_len = len;
    return true;
}

/* An optional positive integer field; *out untouched when absent or null. */
static bool opt_positive_int(const json_t *body, const char *key, int *out, pdl_node_result_t *res)
{
    const json_t *v = json_object_get(body, key);
    if (v == NULL || json_is_null(v))
        return true;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 24)) {
        pdl_node_result_error(res, 400, "%s: expected a positive integer", key);
        return false;
    }
    *out = (int)json_integer_value(v);
    return true;
}

static bool opt_type(const json_t *body, const char *key, int (*is)(const json_t *), const char *what,
                     pdl_node_result_t *res)
{
    const json_t *v = json_object_get(body, key);
    if (v == NULL || json_is_null(v) || is(v))
        return true;
    pdl_node_result_error(res, 400, "%s: expected %s", key, what);
    return false;
}

static int is_number(const json_t *v) { return json_is_number(v); }
static int is_bool(const json_t *v) { return json_is_boolean(v); }
static int is_object(const json_t *v) { return json_is_object(v); }

static void make_request_id(char *out, size_t cap)
{
    uint8_t rnd[16];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        uint64_t t = pdl__clock_now_ns();
        for (size_t i = 0; i < sizeof(rnd); i++)
            rnd[i] = (uint8_t)(t >> ((i % 8) * 8)) ^ (uint8_t)(i * 37);
    }
    size_t n = 0;
    for (size_t i = 0; i < sizeof(rnd) && n + 2 < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%02x", rnd[i]);
}

static const char *role_name(pdl_node_role_t r)
{
    return r == PDL_NODE_PRODUCER ? "kv_producer" : r == PDL_NODE_CONSUMER ? "kv_consumer" : "a node serving alone";
}

/*
 * What both legs of a P/D request need: the right role, a transfer id and, in WRITE mode, the peer's
 * address (from the params, else from the request id): the producer pushes to the decode, the consumer
 * waits for the prefill. False with res filled when one is missing.
 */
static bool check_remote_leg(const pdl_node_t *node, const pdl_node_request_t *req, bool producer,
                             pdl_node_result_t *res)
{
    const pdl_kv_params_t *p = &req->params;
    const char *flag = producer ? "do_remote_decode" : "do_remote_prefill";
    if (node->role != (producer ? PDL_NODE_PRODUCER : PDL_NODE_CONSUMER)) {
        pdl_node_result_error(res, 400, "kv_transfer_params.%s: this node is %s, not %s", flag,
                              role_name(node->role), producer ? "kv_producer" : "kv_consumer");
        return false;
    }
    if (p->transfer_id[0] == '\0') {
        pdl_node_result_error(res, 400, "kv_transfer_params.transfer_id: required with %s", flag);
        return false;
    }
    if (node->conn.read_mode)
        return true;
    pdl_zmq_addr_t peer;
    if ((p->remote_host[0] == '\0' || p->remote_handshake_port <= 0 || p->remote_notify_port <= 0) &&
        pdl_wire_parse_request_id(req->request_id, producer ? NULL : &peer, producer ? &peer : NULL, NULL) != PDL_OK) {
        pdl_node_result_error(res, 400,
                              "kv_transfer_params.remote_host: remote_host, remote_handshake_port and "
                              "remote_notify_port are required in WRITE mode unless X-Request-Id carries the %s "
                              "address",
                              producer ? "decode" : "prefill");
        return false;
    }
    return true;
}


static bool request_parse(pdl_node_t *node, bool chat, const json_t *body, const char *request_id,
                          pdl_node_request_t *req, pdl_node_result_t *res);
static void abandon_transfer(pdl_node_t *node, const pdl_kv_params_t *params, const char *request_id,
                             bool started);

/* A rejected WRITE prefill request still tells the decode its push will not come (abandon_transfer),
 * whatever made it invalid (e.g. "max_tokens": -1 is refused before the params are even read). A rejected
 * decode request releases nothing: see abandon_transfer. */
bool pdl_node_request_parse(pdl_node_t *node, bool chat, const json_t *body, const char *request_id,
                            pdl_node_request_t *req, pdl_node_result_t *res)
{
    if (request_parse(node, chat, body, request_id, req, res))
        return true;
    const json_t *kp = json_is_object(body) ? json_object_get(body, "kv_transfer_params") : NULL;
    pdl_kv_params_t params;
    pdl_kv_params_init(&params);
    if (json_is_object(kp) && pdl_kv_params_from_json(kp, &params, NULL) == PDL_OK)
        abandon_transfer(node, &params, req->request_id[0] ? req->request_id : NULL, false);
    pdl_kv_params_clear(&params);
    return false;
}

/* X-Request-Id: printable ASCII of at most PDL_NODE_RID_MAX bytes; absent, a random one. */
static bool parse_request_id(const char *request_id, pdl_node_request_t *req, pdl_node_result_t *res)
{
    if (request_id == NULL || request_id[0] == '\0') {
        make_request_id(req->request_id, sizeof(req->request_id));
        return true;
    }
    size_t n = strlen(request_id);
    if (n > PDL_NODE_RID_MAX) {
        pdl_node_result_error(res, 400, "X-Request-Id: longer than %d bytes", PDL_NODE_RID_MAX);
        return false;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)request_id[i] < 0x21 || (unsigned char)request_id[i] > 0x7e) {
            pdl_node_result_error(res, 400, "X-Request-Id: byte %zu is not printable ASCII", i);
            return false;
        }
    memcpy(req->request_id, request_id, n + 1);
    return true;
}

/* `model`, when given, names this node: its served name, its preset or --model as given. */
static bool check_model(const pdl_node_t *node, const json_t *body, pdl_node_result_t *res)
{
    const json_t *model = json_object_get(body, "model");
    if (model == NULL || json_is_null(model))
        return true;
    if (!json_is_string(model)) {
        pdl_node_result_error(res, 400, "model: expected a string");
        return false;
    }
    const char *m = json_string_value(model);
    if (strcmp(m, node->served_name) != 0 && strcmp(m, node->preset->name) != 0 && strcmp(m, node->args.model) != 0) {
        pdl_node_result_error(res, 400, "model: the model `%.200s` does not exist; this node serves `%s`", m,
                              node->served_name);
        return false;
    }
    return true;
}

/* The sampling and output fields: max_tokens, n, stop, min_tokens, seed, echo, logprobs. */
static bool parse_sampling(bool chat, const json_t *body, pdl_node_request_t *req, pdl_node_result_t *res)
{
    if (!opt_positive_int(body, "max_tokens", &req->max_tokens, res))
        return false;
    if (chat && !opt_positive_int(body, "max_completion_tokens", &req->max_tokens, res))
        return false;
    req->n = 1;
    req->logprobs = -1;
    if (!opt_positive_int(body, "n", &req->n, res) || !parse_stop(body, req, res))
        return false;
    if (req->n > 128) {
        pdl_node_result_error(res, 400, "n: at most 128 choices");
        return false;
    }
    const json_t *mt = json_object_get(body, "min_tokens");
    if (mt != NULL && !json_is_null(mt)) {
        if (!json_is_integer(mt) || json_integer_value(mt) < 0 || json_integer_value(mt) > (1 << 24)) {
            pdl_node_result_error(res, 400, "min_tokens: expected a non-negative integer");
            return false;
        }
        req->min_tokens = (int)json_integer_value(mt);
    }
    const json_t *seed = json_object_get(body, "seed");
    if (seed != NULL && !json_is_null(seed) && !json_is_integer(seed)) {
        /* Accepted and type-checked; a greedy deterministic model has nothing to seed. */
        pdl_node_result_error(res, 400, "seed: expected an integer");
        return false;
    }
    if (!opt_type(body, "echo", is_bool, "a boolean", res))
        return false;
    req->echo = !chat && json_is_true(json_object_get(body, "echo"));
    const json_t *lp = json_object_get(body, chat ? "top_logprobs" : "logprobs");
    if (chat) {
        if (!opt_type(body, "logprobs", is_bool, "a boolean", res))
            return false;
        if (json_is_true(json_object_get(body, "logprobs")))
            req->logprobs = 0;
    }
    if (lp != NULL && !json_is_null(lp) && !(chat && req->logprobs < 0)) {
        if (!json_is_integer(lp) || json_integer_value(lp) < 0 || json_integer_value(lp) > 20) {
            pdl_node_result_error(res, 400, "%s: expected an integer 0..20", chat ? "top_logprobs" : "logprobs");
            return false;
        }
        req->logprobs = (int)json_integer_value(lp);
    }
    return true;
}

/* stream and stream_options, and the type of the fields read elsewhere or ignored. */
static bool parse_stream(const json_t *body, pdl_node_request_t *req, pdl_node_result_t *res)
{
    if (!opt_type(body, "stream", is_bool, "a boolean", res) ||
        !opt_type(body, "temperature", is_number, "a number", res) ||
        !opt_type(body, "top_p", is_number, "a number", res) ||
        !opt_type(body, "stream_options", is_object, "an object", res) ||
        !opt_type(body, "kv_transfer_params", is_object, "an object", res))
        return false;
    req->stream = json_is_true(json_object_get(body, "stream"));
    if (req->stream && (req->n > 1 || req->more_prompts != NULL)) {
        pdl_node_result_error(res, 400, "stream: streaming a batch of prompts or n > 1 is not supported by pdlink-node");
        return false;
    }
    const json_t *so = json_object_get(body, "stream_options");
    if (json_is_object(so)) {
        const json_t *iu = json_object_get(so, "include_usage");
        if (iu != NULL && !json_is_null(iu) && !json_is_boolean(iu)) {
            pdl_node_result_error(res, 400, "stream_options.include_usage: expected a boolean");
            return false;
        }
        req->include_usage = json_is_true(iu);
    }
    return true;
}

/* kv_transfer_params into req->params, with tp_size and remote_tp_size made to agree. */
static bool parse_kv_params(pdl_node_t *node, const json_t *body, pdl_node_request_t *req, pdl_node_result_t *res)
{
    const json_t *kp = json_object_get(body, "kv_transfer_params");
    if (json_is_object(kp)) {
        pdl_error_t perr;
        pdl_error_clear(&perr);
        if (pdl_kv_params_from_json(kp, &req->params, &perr) != PDL_OK) {
            pdl_node_result_error(res, 400, "%s", perr.msg);
            return false;
        }
    }
    if (req->params.tp_size > 0 && req->params.remote_tp_size > 0 &&
        req->params.tp_size != req->params.remote_tp_size) {
        /* Upstream MoRIIO takes the peer's TP from tp_size (what the prefill reported) before
         * remote_tp_size (what a router may have added, possibly stale), and so does the connector
         * (pdl_kv_params_peer_tp). Say so once per process, not on every request of a router that
         * always sends both, and hand the connector agreeing values so it does not warn again. */
        if (!atomic_exchange(&node->tp_disagree_warned, true))
            pdl_warn("request %s: kv_transfer_params tp_size %d and remote_tp_size %d disagree; using tp_size %d "
                     "as upstream MoRIIO does (logged once)", req->request_id, req->params.tp_size,
                     req->params.remote_tp_size, req->params.tp_size);
        req->params.remote_tp_size = req->params.tp_size;
    }
    return true;
}

/* A READ decode leg: the producer's blocks, engine id and address (params, else the request id). */
static bool check_pull_leg(const pdl_node_request_t *req, pdl_node_result_t *res)
{
    const pdl_kv_params_t *p = &req->params;
    if (!p->has_remote_block_ids || p->num_remote_blocks == 0) {
        pdl_node_result_error(res, 400, "kv_transfer_params.remote_block_ids: required (a non-empty array) "
                                        "with do_remote_prefill in READ mode");
        return false;
    }
    if (p->remote_engine_id[0] == '\0') {
        pdl_node_result_error(res, 400,
                              "kv_transfer_params.remote_engine_id: required with do_remote_prefill in READ mode");
        return false;
    }
    if (p->remote_host[0] == '\0' || p->remote_handshake_port <= 0 || p->remote_notify_port <= 0) {
        /* Upstream falls back to the addresses embedded in the request id (docs/protocol.md#peer-addresses). */
        pdl_zmq_addr_t pa, da;
        if (pdl_wire_parse_request_id(req->request_id, &pa, &da, NULL) != PDL_OK) {
            pdl_node_result_error(res, 400,
                                  "kv_transfer_params.remote_host: remote_host, remote_handshake_port and "
                                  "remote_notify_port are required unless X-Request-Id carries the prefill "
                                  "address");
            return false;
        }
    }
    return true;
}

/* The flow of the request (node.h) from kv_transfer_params, the node's role and READ or WRITE mode. */
static bool choose_mode(const pdl_node_t *node, pdl_node_request_t *req, pdl_node_result_t *res)
{
    const pdl_kv_params_t *p = &req->params;
    req->mode = PDL_NODE_MODE_LOCAL;
    if (p->do_remote_prefill && p->do_remote_decode) {
        pdl_node_result_error(res, 400,
                              "kv_transfer_params: do_remote_prefill and do_remote_decode cannot both be true");
        return false;
    }
    if ((p->do_remote_prefill || p->do_remote_decode) && node->role != PDL_NODE_ALONE &&
        (req->n > 1 || req->more_prompts != NULL)) {
        /* One transfer id names one prompt's KV: a batch or n > 1 would need one per sequence. */
        pdl_node_result_error(res, 400, "%s: a P/D request (kv_transfer_params) carries one prompt and n = 1",
                              req->more_prompts != NULL ? "prompt" : "n");
        return false;
    }
    if (node->role == PDL_NODE_ALONE) {
        if (p->do_remote_prefill || p->do_remote_decode)
            pdl_debug("request %s: kv_transfer_params ignored, this node serves alone", req->request_id);
        return true;
    }
    if (p->do_remote_decode) {
        if (!check_remote_leg(node, req, true, res))
            return false;
        req->mode = node->conn.read_mode ? PDL_NODE_MODE_PREFILL_HOLD : PDL_NODE_MODE_PREFILL_PUSH;
    } else if (p->do_remote_prefill) {
        if (!check_remote_leg(node, req, false, res))
            return false;
        if (!node->conn.read_mode)
            req->mode = PDL_NODE_MODE_RECV;
        else if (check_pull_leg(req, res))
            req->mode = PDL_NODE_MODE_PULL;
        else
            return false;
    }
    return true;
}

static bool request_parse(pdl_node_t *node, bool chat, const json_t *body, const char *request_id,
                          pdl_node_request_t *req, pdl_node_result_t *res)
{
    memset(req, 0, sizeof(*req));
    pdl_kv_params_init(&req->params);
    req->chat = chat;
    req->max_tokens = node->args.max_tokens_default;
    if (!parse_request_id(request_id, req, res))
        return false;
    if (!json_is_object(body)) {
        pdl_node_result_error(res, 400, "request body: expected a JSON object");
        return false;
    }
    return check_model(node, body, res) && (chat ? parse_messages(body, req, res) : parse_prompt(body, req, res)) &&
           parse_sampling(chat, body, req, res) && parse_stream(body, req, res) &&
           parse_kv_params(node, body, req, res) && choose_mode(node, req, res);
}

/*
 * The pull hook (pull_hook.h) only stamps when each rank's reads and releases were done, for the
 * transfer's time; the request's thread verifies every rank's share after the pull. Verifying in the
 * hook would run it on the rank's READ lane, and every later pull on that lane would queue behind it
 * (the pull p99 either way: docs/benchmarks.md#pdlink-node-the-synthetic-model). The context belongs to
 * the pull (freed with it): a request that gave up waiting may be gone while a rank's hook still runs.
 */
typedef struct pull_verify {
    pdl_node_kv_t *kv;
    uint64_t seed;
    pdl_synth_prompt_t prompt;   /* n and prefix are what verification reads */
    uint32_t *blocks;
    int tp;
    uint64_t *reads_done_ns;     /* per rank: when its reads and releases were done (hook entry) */
    pdl_synth_part_t parts[];    /* per rank */
} pull_verify_t;

static void pull_verify_free(void *arg)
{
    pull_verify_t *v = arg;
    if (v == NULL)
        return;
    free(v->prompt.prefix);
    free(v->blocks);
    free(v->reads_done_ns);
    free(v);
}

static pull_verify_t *pull_verify_new(pdl_node_t *node, const pdl_synth_prompt_t *p, const uint32_t *blocks,
                                      size_t nblocks)
{
    int tp = pdl_node_kv_tp_size(node->kv);
    pull_verify_t *v = calloc(1, sizeof(*v) + (size_t)tp * sizeof(pdl_synth_part_t));
    if (v == NULL)
        return NULL;
    v->kv = node->kv;
    v->seed = node->args.seed;
    v->tp = tp;
    v->prompt.n = p->n;
    v->prompt.prefix = malloc((p->n ? p->n : 1) * sizeof(uint64_t));
    v->blocks = malloc((nblocks ? nblocks : 1) * sizeof(uint32_t));
    v->reads_done_ns = calloc((size_t)tp, sizeof(uint64_t));
    if (v->prompt.prefix == NULL || v->blocks == NULL || v->reads_done_ns == NULL) {
        pull_verify_free(v);
        return NULL;
    }
    memcpy(v->prompt.prefix, p->prefix, p->n * sizeof(uint64_t));
    memcpy(v->blocks, blocks, nblocks * sizeof(uint32_t));
    return v;
}

static void pull_verify_rank(void *arg, int tp_rank)
{
    pull_verify_t *v = arg;
    if (tp_rank < 0 || tp_rank >= v->tp)
        return;
    v->reads_done_ns[tp_rank] = pdl__clock_now_ns();
}

/*
 * A failed transfer's answer to the HTTP client. Whether the producer address refused the connection,
 * never answered or answered with something that is not a pdlink/MoRIIO peer is the difference a port
 * scan through this decode looks for (kv_transfer_params name any host and port), so those failures
 * read the same to the client when `dialled` (the failure came from reaching the producer); the node's
 * log keeps the cause under the request id. Other failures (a refused grant, a mismatched peer, a wait for
 * write_done) do not depend on what listens on the port, and keep their text.
 */
static void transfer_failed(pdl_node_result_t *res, const pdl_node_request_t *req, const char *what,
                            pdl_status_t st, const pdl_error_t *err, bool dialled)
{
    const char *cause = err->msg[0] ? err->msg : pdl_status_string(st);
    if (dialled && (st == PDL_ERR_TIMEOUT || st == PDL_ERR_PEER_GONE || st == PDL_ERR_TRANSPORT || st == PDL_ERR_PARSE)) {
        pdl_warn("request %s: KV transfer of %s%s failed: %s", req->request_id, req->params.transfer_id, what, cause);
        pdl_node_result_error(res, 500,
                              "KV transfer of %s%s failed: the producer could not be reached or did not answer as "
                              "a KV peer (the node's log has the cause, under request %s)",
                              req->params.transfer_id, what, req->request_id);
        return;
    }
    pdl_node_result_error(res, 500, "KV transfer of %s%s failed: %s", req->params.transfer_id, what, cause);
}

/*
 * Pull the prompt's KV from the producer and verify every received byte into `check`; on failure the
 * blocks are freed by the caller. The transfer's time (metrics) ends when the last rank's reads were
 * done, not when its verification was: verification is the node's work, not the transfer's.
 */
static bool pull_kv(pdl_node_t *node, pdl_node_request_t *req, const pdl_synth_prompt_t *prompt,
                    const uint32_t *blocks, size_t nblocks, pdl_synth_check_t *check, pdl_node_result_t *res,
                    bool *released)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_pull_t *pull = NULL;
    pull_verify_t *v = pull_verify_new(node, prompt, blocks, nblocks);
    uint64_t t0 = pdl__clock_now_ns();
    pdl_node_metrics_pull_begin(node->metrics, t0);
    pdl_status_t st;
    if (v != NULL) {
        st = pdl_instance_pull_hooked(pdl_node_kv_instance(node->kv), &req->params, req->request_id, blocks, nblocks,
                                      pull_verify_rank, v, pull_verify_free, &pull, &err);
        if (st != PDL_OK)
            pull_verify_free(v); /* still ours on failure */
    } else {
        st = pdl_instance_pull(pdl_node_kv_instance(node->kv), &req->params, req->request_id, blocks, nblocks, &pull,
                               &err);
    }
    *released = pull != NULL; /* a started pull releases the producer itself, whatever its outcome */
    if (st == PDL_OK) {
        double budget_s = node->conn.transfer_timeout_s + node->conn.handshake_timeout_s + 5.0;
        st = pdl_pull_wait(pull, (int)(budget_s * 1000.0), &err);
    }
    uint64_t t1 = pdl__clock_now_ns();
    if (st == PDL_OK && v != NULL) {
        uint64_t last = t0;
        for (int r = 0; r < v->tp; r++)
            last = v->reads_done_ns[r] > last ? v->reads_done_ns[r] : last;
        t1 = last;
    }
    pdl_node_metrics_pull_end(node->metrics, t1);
    double secs = (double)(t1 - t0) / 1e9;
    uint64_t bytes = pull != NULL && st == PDL_OK ? pdl_pull_bytes(pull) : 0;
    if (pull != NULL || st == PDL_OK)
        pdl_node_metrics_pull(node->metrics, secs, bytes);
    if (st == PDL_OK) {
        if (v != NULL) {
            /* Every rank's share, on this thread (see pull_verify_t). */
            for (int r = 0; r < v->tp; r++)
                pdl_synth_verify_rank(node->kv, node->args.seed, prompt, blocks, r, PDL_SYNTH_KERNEL_AUTO, &v->parts[r]);
            pdl_synth_check_combine(prompt, v->parts, v->tp, check);
        } else {
            pdl_synth_verify(node->kv, node->args.seed, prompt, blocks, check);
        }
    }
    pdl_pull_free(pull); /* frees v once no rank works on it */
    if (st != PDL_OK) {
        char from[sizeof(req->params.remote_engine_id) + 8];
        snprintf(from, sizeof(from), " from %s", req->params.remote_engine_id);
        transfer_failed(res, req, from, st, &err, true);
        return false;
    }
    pdl_debug("request %s: pulled %llu bytes in %.3f ms", req->request_id, (unsigned long long)bytes, secs * 1e3);
    return true;
}

/*
 * WRITE mode, consumer leg: send remote_blocks, wait for every rank's write_done, then verify every
 * byte like a pull. The transfer's time (metrics) runs from the remote_blocks to the last write_done.
 */
static bool recv_kv(pdl_node_t *node, pdl_node_request_t *req, const pdl_synth_prompt_t *prompt,
                    const uint32_t *blocks, size_t nblocks, pdl_synth_check_t *check, pdl_node_result_t *res,
                    bool *released, bool *started)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_instance_t *inst = pdl_node_kv_instance(node->kv);
    pdl_recv_t *rv = NULL;
    uint64_t t0 = pdl__clock_now_ns();
    pdl_node_metrics_pull_begin(node->metrics, t0);
    pdl_status_t st = pdl_instance_expect_push(inst, &req->params, req->request_id, blocks, nblocks, &rv, &err);
    if (st == PDL_OK) {
        /* The prefill runs concurrently: its compute comes before the push, so allow for it too. */
        double budget_s = node->conn.transfer_timeout_s + node->conn.handshake_timeout_s + 5.0;
        st = pdl_recv_wait(rv, (int)(budget_s * 1000.0), &err);
    }
    /* Every write_done came (ok or failed): the producer is done with the push. A receive that never
     * started or timed out is abandoned by the caller, in case the push still waits. */
    *released = rv != NULL && st != PDL_INPROGRESS && st != PDL_ERR_TIMEOUT;
    *started = rv != NULL;
    uint64_t t1 = pdl__clock_now_ns();
    pdl_node_metrics_pull_end(node->metrics, t1);
    uint64_t bytes = 0;
    int layers = 0;
    while (pdl_instance_kv_layer(inst, 0, layers) != NULL)
        layers++;
    if (st == PDL_OK)
        for (int r = 0; r < pdl_instance_tp_size(inst); r++) {
            const pdl_kv_geometry_t *g = pdl_instance_geometry(inst, r);
            bytes += (uint64_t)layers * (uint64_t)pdl_layout_num_halves(g) *
                     pdl_layout_block_len(g) * nblocks;
        }
    if (rv != NULL)
        pdl_node_metrics_pull(node->metrics, (double)(t1 - t0) / 1e9, bytes);
    bool receiving = rv != NULL;
    pdl_recv_free(rv);
    if (st != PDL_OK) {
        /* A receive that started waits for write_done, whatever the producer's port does: its timeout
         * tells nothing about that port and keeps its text. */
        transfer_failed(res, req, " (WRITE mode)", st, &err, !receiving);
        return false;
    }
    pdl_synth_verify(node->kv, node->args.seed, prompt, blocks, check);
    pdl_debug("request %s: received %llu pushed bytes in %.3f ms", req->request_id, (unsigned long long)bytes,
              (double)(t1 - t0) / 1e6);
    return true;
}

/* CPU time of the calling thread (debug timings: wall time alone hides contention for the cores). */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

size_t pdl_node_token_text(const uint32_t *tokens, size_t from, size_t to, bool chat, char *out)
{
    size_t n = 0;
    for (size_t i = from; i < to; i++) {
        const char *w = pdl_synth_word(tokens[i]);
        size_t wl = strlen(w);
        bool space = !(chat && i == 0);
        if (out != NULL) {
            if (space)
                out[n] = ' ';
            memcpy(out + n + (space ? 1 : 0), w, wl);
        }
        n += wl + (space ? 1 : 0);
    }
    if (out != NULL)
        out[n] = '\0';
    return n;
}

/*
 * vLLM's stop strings: after each generated token (once min_tokens are out) the text so far is searched
 * for every stop string; the first hit ends generation there, the text is cut before the stop string
 * and finish_reason becomes "stop" with stop_reason naming it. Tokens after it are dropped.
 */
static void apply_stop(const pdl_node_request_t *req, pdl_node_result_t *res)
{
    if (req->nstop == 0 || res->num_tokens == 0)
        return;
    size_t total = pdl_node_token_text(res->tokens, 0, res->num_tokens, req->chat, NULL);
    char *text = malloc(total + 1);
    if (text == NULL)
        return;
    pdl_node_token_text(res->tokens, 0, res->num_tokens, req->chat, text);
    size_t end = 0;
    for (size_t i = 0; i < res->num_tokens; i++) {
        end += pdl_node_token_text(res->tokens, i, i + 1, req->chat && i == 0, NULL);
        if ((int)(i + 1) < req->min_tokens)
            continue;
        char saved = text[end];
        text[end] = '\0';
        size_t best = SIZE_MAX;
        int which = -1;
        for (size_t k = 0; k < req->nstop; k++) {
            const char *hit = strstr(text, req->stop[k]);
            if (hit != NULL && (size_t)(hit - text) < best) {
                best = (size_t)(hit - text);
                which = (int)k;
            }
        }
        text[end] = saved;
        if (which >= 0) {
            res->num_tokens = i + 1;
            res->text_limit = best;
            res->stop_index = which;
            res->finish_reason = "stop";
            break;
        }
    }
    free(text);
}

/* The prompt's tokens and prefix hashes, for echo and prompt logprobs (owned by the result). */
static void keep_prompt(const pdl_synth_prompt_t *p, pdl_node_result_t *res)
{
    res->prompt_prefix = malloc((p->n ? p->n : 1) * sizeof(uint64_t));
    res->prompt_token_ids = malloc((p->n ? p->n : 1) * sizeof(uint32_t));
    if (res->prompt_prefix == NULL || res->prompt_token_ids == NULL) {
        free(res->prompt_prefix);
        free(res->prompt_token_ids);
        res->prompt_prefix = NULL;
        res->prompt_token_ids = NULL;
        return;
    }
    memcpy(res->prompt_prefix, p->prefix, p->n * sizeof(uint64_t));
    memcpy(res->prompt_token_ids, p->tokens, p->n * sizeof(uint32_t));
}

/*
 * A WRITE decode whose receive started and then failed tells the producer at once (pdl_instance_abandon:
 * failed releases), so the prefill's push is not pinned until its defer_timeout. In WRITE mode a prefill
 * that will not push (rejected, or failed before its push) does the same the other way (failed
 * write_done), so the decode that waits for the push frees its blocks now instead of at
 * transfer_timeout: the router sends both legs at once there.
 */
static void abandon_transfer(pdl_node_t *node, const pdl_kv_params_t *params, const char *request_id,
                             bool started)
{
    /* A decode releases only a transfer it engaged with: one it pulled (the pull releases the producer
     * itself, ok or failed) or whose receive it started (its remote_blocks went to that producer). A
     * request rejected or failed before that is only a client's word that the transfer is its own: any
     * client could name another request's transfer id ("max_tokens": -1 plus the id) and have this
     * decode -- the consumer's own host, which the prefill trusts -- free the victim's blocks before the
     * victim's decode leg read them, which then fails with a 500. Such a hold is
     * freed by the router's failed release (pdlink-router sends one for every decode leg that fails),
     * the consumer-gone watch, or the prefill's defer_timeout. */
    bool decode = node->role == PDL_NODE_CONSUMER && params->do_remote_prefill && started;
    bool write_prefill = node->role == PDL_NODE_PRODUCER && !node->conn.read_mode && params->do_remote_decode;
    if (!(decode || write_prefill) || params->transfer_id[0] == '\0')
        return;
    pdl_error_t err;
    if (pdl_instance_abandon(pdl_node_kv_instance(node->kv), params, request_id, &err) != PDL_OK)
        pdl_warn("request %s: transfer %s not released early (the prefill frees it after its defer_timeout): %s",
                 request_id, params->transfer_id, err.msg);
    else
        pdl_info("request %s: failed before its %s; transfer %s released", request_id,
                 write_prefill ? "push" : "pull or receive", params->transfer_id);
}

static void request_run(pdl_node_t *node, pdl_node_request_t *req, pdl_node_result_t *res, bool *released,
                        bool *started);

void pdl_node_request_run(pdl_node_t *node, pdl_node_request_t *req, pdl_node_result_t *res)
{
    bool released = false, started = false;
    request_run(node, req, res, &released, &started);
    if ((req->mode == PDL_NODE_MODE_PULL || req->mode == PDL_NODE_MODE_RECV ||
         req->mode == PDL_NODE_MODE_PREFILL_PUSH) &&
        !released)
        abandon_transfer(node, &req->params, req->request_id, started);
}

/* The prompt's tokens, within max_model_len with max_tokens, and (a READ decode) as many blocks as the
 * prefill sent. False with res filled otherwise. */
static bool prompt_tokens(pdl_node_t *node, const pdl_node_request_t *req, pdl_synth_prompt_t *prompt,
                          pdl_node_result_t *res)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_status_t tst = req->prompt_ids != NULL
                           ? pdl_synth_from_ids(node->args.seed, req->prompt_ids, req->n_prompt_ids, prompt, &err)
                           : pdl_synth_tokenize(node->args.seed, req->prompt, req->prompt_len, prompt, &err);
    if (tst != PDL_OK) {
        pdl_node_result_error(res, 500, "%s", err.msg);
        return false;
    }
    res->prompt_tokens = prompt->n;
    if ((long long)prompt->n + req->max_tokens > node->max_model_len) {
        pdl_node_result_error(res, 400,
                              "max_tokens: this model's maximum context length is %d tokens; you requested %lld "
                              "tokens (%zu in the prompt, %d in the completion)",
                              node->max_model_len, (long long)prompt->n + req->max_tokens, prompt->n, req->max_tokens);
        pdl_synth_prompt_free(prompt);
        return false;
    }
    size_t nblocks = pdl_synth_blocks_needed(prompt->n, node->args.block_size);
    if (req->mode == PDL_NODE_MODE_PULL && req->params.num_remote_blocks != nblocks) {
        pdl_node_result_error(res, 400,
                              "kv_transfer_params.remote_block_ids: %zu blocks, but this prompt of %zu tokens needs "
                              "%zu with block size %d (same prompt, model and --block-size as the prefill?)",
                              req->params.num_remote_blocks, prompt->n, nblocks, node->args.block_size);
        pdl_synth_prompt_free(prompt);
        return false;
    }
    return true;
}

/*
 * A prefill leg hands its blocks to the connector: the rows past the prompt zeroed, then held for the
 * decode's pull (READ: res gets the kv_transfer_params) or pushed (WRITE). *nblocks becomes 0 when the
 * instance owns the blocks; *released when the push tells the consumer itself. False with res filled.
 */
static bool prefill_hand_over(pdl_node_t *node, const pdl_node_request_t *req, pdl_node_result_t *res,
                              const uint32_t *blocks, size_t *nblocks, size_t prompt_n, bool *released)
{
    pdl_instance_t *inst = pdl_node_kv_instance(node->kv);
    pdl_error_t err;
    pdl_error_clear(&err);
    if (pdl_instance_zero_tail(inst, blocks, *nblocks, prompt_n, &err) != PDL_OK) {
        /* The consumer gets whole blocks: their rows past the prompt must not be an earlier request's. */
        pdl_node_result_error(res, 500, "zeroing the unused rows of transfer %s failed: %s", req->params.transfer_id,
                              err.msg);
        return false;
    }
    if (req->mode == PDL_NODE_MODE_PREFILL_PUSH) {
        /* Upstream's prefill answers at once in WRITE mode; the push runs on the connector's threads. */
        if (pdl_instance_push(inst, &req->params, req->request_id, blocks, *nblocks, &err) != PDL_OK) {
            pdl_node_result_error(res, 500, "pushing the KV of transfer %s failed: %s", req->params.transfer_id,
                                  err.msg);
            return false;
        }
        pdl_debug("request %s: pushing %zu blocks under %s", req->request_id, *nblocks, req->params.transfer_id);
        *released = true; /* the push tells the consumer itself, whatever its outcome */
        *nblocks = 0;     /* the instance owns them now */
        return true;
    }
    if (strcmp(res->finish_reason, "length") != 0) {
        /* vLLM's producer returns kv_transfer_params only for a request capped by length: a stop
         * string in the first token ends it without a transfer, and the router then sends the decode
         * null params, so it prefills locally. Our blocks are simply freed by the caller. */
        pdl_debug("request %s: stopped (%s) on the prefill: no transfer", req->request_id, res->finish_reason);
        return true;
    }
    pdl_kv_params_t held;
    res->kv_transfer_params = NULL;
    if (pdl_instance_params(inst, req->params.transfer_id, blocks, *nblocks, &held, NULL) == PDL_OK) {
        res->kv_transfer_params = pdl_kv_params_to_json(&held);
        pdl_kv_params_clear(&held);
    }
    if (res->kv_transfer_params == NULL) {
        pdl_node_result_error(res, 500, "kv_transfer_params: could not build the params of %s",
                              req->params.transfer_id);
        return false;
    }
    if (pdl_instance_hold_for(inst, req->params.transfer_id, req->request_id, blocks, *nblocks, &err) != PDL_OK) {
        pdl_node_result_error(res, 500, "holding the KV of transfer %s failed: %s", req->params.transfer_id, err.msg);
        return false;
    }
    pdl_debug("request %s: holding %zu blocks under %s", req->request_id, *nblocks, req->params.transfer_id);
    *nblocks = 0; /* the instance owns them now */
    return true;
}

/* *released: the connector told the peer itself (a pull's releases, a push's write_done, every
 * write_done counted); *started: a WRITE receive sent its remote_blocks (the decode engaged with it). */
static void request_run(pdl_node_t *node, pdl_node_request_t *req, pdl_node_result_t *res, bool *released,
                        bool *started)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_synth_prompt_t prompt;
    res->stop_index = -1;
    res->text_limit = SIZE_MAX;
    if (!prompt_tokens(node, req, &prompt, res))
        return;
    size_t nblocks = pdl_synth_blocks_needed(prompt.n, node->args.block_size);
    uint32_t *blocks = malloc(nblocks * sizeof(uint32_t));
    res->tokens = malloc((size_t)req->max_tokens * sizeof(uint32_t));
    if (blocks == NULL || res->tokens == NULL) {
        free(blocks);
        pdl_synth_prompt_free(&prompt);
        pdl_node_result_error(res, 500, "out of memory for a request of %zu tokens", prompt.n);
        return;
    }
    uint64_t t_alloc = pdl__clock_now_ns();
    if (pdl_node_kv_alloc(node->kv, nblocks, blocks, node->args.kv_wait_ms, &err) != PDL_OK) {
        free(blocks);
        pdl_synth_prompt_free(&prompt);
        pdl_node_result_error(res, 503, "%s", err.msg);
        return;
    }
    /*
     * Prefill (alone or as the producer) writes the KV and takes the digest from the bytes as it writes
     * them: re-reading what this thread just wrote would check nothing. The decode pulls and verifies
     * every received byte (each rank right after its reads, see pull_kv), taking the digest from what
     * it read.
     */
    uint64_t t_fill = pdl__clock_now_ns(), c_fill = thread_cpu_ns();
    pdl_synth_check_t check;
    memset(&check, 0, sizeof(check));
    bool ok = true;
    bool receives = req->mode == PDL_NODE_MODE_PULL || req->mode == PDL_NODE_MODE_RECV;
    if (req->mode == PDL_NODE_MODE_RECV)
        ok = recv_kv(node, req, &prompt, blocks, nblocks, &check, res, released, started);
    else if (req->mode == PDL_NODE_MODE_PULL)
        ok = pull_kv(node, req, &prompt, blocks, nblocks, &check, res, released);
    else
        check.digest = pdl_synth_prefill(node->kv, node->args.seed, &prompt, blocks);
    uint64_t t_verify = pdl__clock_now_ns(), c_verify = thread_cpu_ns();
    if (ok && receives) {
        pdl_node_metrics_verified(node->metrics, check.verified_bytes, check.mismatched_bytes);
        if (check.mismatched_bytes != 0) {
            pdl_node_result_error(res, 500, "KV verification failed: %llu of %llu bytes mismatched; first at %s",
                                  (unsigned long long)check.mismatched_bytes,
                                  (unsigned long long)check.verified_bytes, check.first_mismatch);
            pdl_error("request %s: %s", req->request_id, res->error);
            ok = false;
        }
    }
    uint64_t t_gen = pdl__clock_now_ns(), c_gen = thread_cpu_ns();
    if (ok) {
        pdl_synth_generate(check.digest, (size_t)req->max_tokens, res->tokens);
        res->num_tokens = (size_t)req->max_tokens;
        res->finish_reason = "length";
        res->digest = check.digest;
        apply_stop(req, res);
        keep_prompt(&prompt, res);
    }
    if (ok && (req->mode == PDL_NODE_MODE_PREFILL_HOLD || req->mode == PDL_NODE_MODE_PREFILL_PUSH))
        ok = prefill_hand_over(node, req, res, blocks, &nblocks, prompt.n, released);
    uint64_t t_end = pdl__clock_now_ns();
    pdl_node_kv_free(node->kv, blocks, nblocks);
    free(blocks);
    pdl_debug("request %s: %zu tokens, %zu blocks: alloc %.3f ms, %s %.3f ms (cpu %.3f), verify %.3f ms (cpu %.3f), "
              "generate+hold %.3f ms",
              req->request_id, prompt.n, pdl_synth_blocks_needed(prompt.n, node->args.block_size),
              (t_fill - t_alloc) / 1e6, receives ? "receive" : "prefill", (t_verify - t_fill) / 1e6,
              (c_verify - c_fill) / 1e6, (t_gen - t_verify) / 1e6, (c_gen - c_verify) / 1e6, (t_end - t_gen) / 1e6);
    pdl_synth_prompt_free(&prompt);
    if (ok)
        res->http_status = 200;
}
