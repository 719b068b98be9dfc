/*
 * http.c -- pdlink-node's OpenAI-compatible HTTP API on libmicrohttpd.
 *
 * Routes: POST /v1/completions, POST /v1/chat/completions (JSON or SSE), GET /v1/models, GET /health,
 * GET /metrics, GET /version. app/http.c runs each complete request on one of its workers, so a request
 * that waits for a KV pull blocks only its own worker and the request code stays straight-line; idle
 * connections cost no thread.
 *
 * Response shapes follow vLLM's OpenAI server: `id` "cmpl-<request id>" ("chatcmpl-" for chat), `object`,
 * `created`, `model`, `choices` with `finish_reason`, `stop_reason` and `logprobs`, `usage`, and a top-level
 * `kv_transfer_params` (null unless the connector returned params). Streams are `data: {chunk}\n\n` lines
 * ending with `data: [DONE]\n\n`; the KV work is done before the first byte, so a failure is a proper
 * error status rather than a broken stream. Errors are {"error": {message, type, param, code}}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/http.h"
#include "node/node.h"
#include "node/synth.h"
#include "common/log.h"
#include "pdlink/version.h"

/* A completion body is a prompt plus options; 16 MiB is far above any prompt a node accepts. */
#define BODY_MAX (16u << 20)

/* ---- responses -------------------------------------------------------------------------------- */

static int send_error(pdl_http_conn_t *c, unsigned status, const char *type, const char *msg,
                      const char *request_id)
{
    json_t *e = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", msg, "type", type, "param", "code",
                          (int)status);
    if (e == NULL) /* msg was not valid UTF-8: never echo it raw */
        e = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", "invalid request", "type", type, "param",
                      "code", (int)status);
    return pdl_http_reply_json(c, status, e, request_id);
}

static int send_result_error(pdl_http_conn_t *c, const pdl_node_result_t *res, const char *rid)
{
    return send_error(c, (unsigned)res->http_status, res->error_type ? res->error_type : "BadRequestError",
                      res->error, rid);
}

/* ---- completion bodies ------------------------------------------------------------------------ */

/* Text of generated tokens [from, to), cut at the stop string (res->text_limit) as the client sees it:
 * a completion continues the prompt so each word has a leading space, a chat message starts with its
 * first word. */
static char *generated_text(const pdl_node_result_t *res, size_t from, size_t to, bool chat)
{
    size_t total = pdl_node_token_text(res->tokens, 0, to, chat, NULL);
    size_t start = pdl_node_token_text(res->tokens, 0, from, chat, NULL);
    char *all = malloc(total + 1);
    if (all == NULL)
        return NULL;
    pdl_node_token_text(res->tokens, 0, to, chat, all);
    size_t end = total < res->text_limit ? total : res->text_limit;
    if (start > end)
        start = end;
    memmove(all, all + start, end - start);
    all[end - start] = '\0';
    return all;
}

static json_t *usage_json(const pdl_node_result_t *res)
{
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)res->prompt_tokens, "completion_tokens",
                     (json_int_t)res->num_tokens, "total_tokens", (json_int_t)(res->prompt_tokens + res->num_tokens));
}

static void resp_id(const pdl_node_request_t *req, char *out, size_t cap)
{
    snprintf(out, cap, "%s%s", req->chat ? "chatcmpl-" : "cmpl-", req->request_id);
}

static json_t *stop_reason_json(const pdl_node_request_t *req, const pdl_node_result_t *res)
{
    if (res->stop_index >= 0 && (size_t)res->stop_index < req->nstop)
        return json_string(req->stop[res->stop_index]);
    return json_null();
}

/* ---- synthetic logprobs --------------------------------------------------------------------------
 * The model is greedy and deterministic, so its "logprobs" are too: the chosen token is always the most
 * likely one, and every value is a function of the prompt's KV digest (generated tokens) or of the
 * prompt prefix hash (echoed prompt tokens), multiples of 1/1024 so that they print exactly. A P/D pair
 * and a single node therefore return identical logprobs, as they return identical text. */

static uint64_t lp_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double lp_value(uint64_t h) { return -(double)(h % 4096u) / 1024.0; }

/* {word: logprob} of the chosen token first, then k-1 runner-up vocabulary words, each less likely. */
static json_t *top_map(const char *chosen, double lp, int k, uint64_t h)
{
    json_t *m = json_object();
    json_object_set_new(m, chosen, json_real(lp));
    for (int j = 1; j < k && j < 64; j++) {
        const char *w = pdl_synth_word((uint32_t)((h >> 7) + (uint64_t)j) % 64u);
        char key[64];
        snprintf(key, sizeof(key), " %s", w);
        if (json_object_get(m, key) == NULL)
            json_object_set_new(m, key, json_real(lp - (double)j));
    }
    return m;
}

/* The words of a text prompt as tokens (BOS is ""), for echo; token-id prompts show "<id>". */
static char *prompt_token_text(const pdl_node_request_t *req, const pdl_node_result_t *res, size_t t)
{
    char buf[64];
    if (req->prompt_ids != NULL) {
        snprintf(buf, sizeof(buf), "<%u>", res->prompt_token_ids ? res->prompt_token_ids[t] : 0u);
        return strdup(buf);
    }
    if (t == 0)
        return strdup("");
    const char *p = req->prompt, *e = req->prompt + req->prompt_len;
    for (size_t w = 1;; w++) {
        while (p < e && strchr(" \t\n\r\f\v", *p) != NULL && *p != '\0')
            p++;
        const char *st = p;
        while (p < e && strchr(" \t\n\r\f\v", *p) == NULL)
            p++;
        if (p == st)
            return strdup("");
        if (w == t) {
            char *out = malloc((size_t)(p - st) + 2);
            if (out != NULL)
                sprintf(out, "%s%.*s", t == 1 ? "" : " ", (int)(p - st), st);
            return out;
        }
    }
}

/*
 * Completions logprobs for echoed prompt tokens (when echo) and generated tokens [from, to): vLLM's
 * {tokens, token_logprobs, top_logprobs, text_offset}; the first prompt token has null ones.
 */
static json_t *completion_logprobs(const pdl_node_request_t *req, const pdl_node_result_t *res, bool with_prompt,
                                   size_t from, size_t to, size_t offset)
{
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    if (with_prompt && res->prompt_prefix != NULL)
        for (size_t t = 0; t < res->prompt_tokens; t++) {
            char *w = prompt_token_text(req, res, t);
            if (w == NULL)
                continue;
            json_array_append_new(toks, json_string(w));
            json_array_append_new(offs, json_integer((json_int_t)offset));
            offset += strlen(w);
            if (t == 0) {
                json_array_append_new(lps, json_null());
                json_array_append_new(tops, json_null());
            } else {
                double lp = lp_value(res->prompt_prefix[t]);
                json_array_append_new(lps, json_real(lp));
                json_array_append_new(tops, top_map(w, lp, req->logprobs, res->prompt_prefix[t]));
            }
            free(w);
        }
    for (size_t i = from; i < to; i++) {
        char *w = generated_text(res, i, i + 1, false);
        if (w == NULL)
            continue;
        uint64_t h = lp_mix(res->digest + i);
        double lp = lp_value(h) / 8.0; /* a confident model: the chosen token is likely */
        json_array_append_new(toks, json_string(w));
        json_array_append_new(lps, json_real(lp));
        json_array_append_new(tops, top_map(w, lp, req->logprobs, h));
        json_array_append_new(offs, json_integer((json_int_t)offset));
        offset += strlen(w);
        free(w);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "text_offset", offs, "token_logprobs", lps, "tokens", toks,
                     "top_logprobs", tops);
}

/* Chat logprobs: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}. */
static json_t *bytes_of(const char *w)
{
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)w; *p; p++)
        json_array_append_new(a, json_integer(*p));
    return a;
}

static json_t *chat_logprobs(const pdl_node_request_t *req, const pdl_node_result_t *res, size_t from, size_t to)
{
    json_t *content = json_array();
    for (size_t i = from; i < to; i++) {
        char *w = generated_text(res, i, i + 1, true);
        if (w == NULL)
            continue;
        uint64_t h = lp_mix(res->digest + i);
        double lp = lp_value(h) / 8.0;
        json_t *top = json_array();
        json_t *m = top_map(w, lp, req->logprobs, h);
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) json_array_append_new(
            top, json_pack("{s:s, s:O, s:o}", "token", k, "logprob", v, "bytes", bytes_of(k)));
        json_decref(m);
        json_array_append_new(content, json_pack("{s:s, s:f, s:o, s:o}", "token", w, "logprob", lp, "bytes",
                                                 bytes_of(w), "top_logprobs", top));
        free(w);
    }
    return json_pack("{s:o}", "content", content);
}

/* The n choices of one prompt's result, indexes base .. base+n-1 (greedy: n identical ones). */
static bool append_choices(json_t *choices, const pdl_node_request_t *req, const pdl_node_result_t *res,
                           size_t base)
{
    char *gen = generated_text(res, 0, res->num_tokens, req->chat);
    if (gen == NULL)
        return false;
    for (int j = 0; j < req->n; j++) {
        json_t *lp = json_null();
        json_t *choice;
        if (req->chat) {
            if (req->logprobs >= 0)
                lp = chat_logprobs(req, res, 0, res->num_tokens);
            choice = json_pack("{s:I, s:{s:s, s:s}, s:o, s:s, s:o}", "index", (json_int_t)(base + (size_t)j),
                               "message", "role", "assistant", "content", gen, "logprobs", lp, "finish_reason",
                               res->finish_reason, "stop_reason", stop_reason_json(req, res));
        } else {
            const char *echo = req->echo ? req->prompt : "";
            char *text = malloc(strlen(echo) + strlen(gen) + 1);
            if (text == NULL) {
                free(gen);
                return false;
            }
            sprintf(text, "%s%s", echo, gen);
            if (req->logprobs >= 0)
                lp = completion_logprobs(req, res, req->echo, 0, res->num_tokens, 0);
            choice = json_pack("{s:I, s:s, s:o, s:s, s:o}", "index", (json_int_t)(base + (size_t)j), "text", text,
                               "logprobs", lp, "finish_reason", res->finish_reason, "stop_reason",
                               stop_reason_json(req, res));
            free(text);
        }
        if (choice == NULL || json_array_append_new(choices, choice) != 0) {
            free(gen);
            return false;
        }
    }
    free(gen);
    return true;
}

/* The response of a whole request: `nres` prompt results (a batch) of `req`'s n choices each. */
static json_t *full_response(pdl_node_t *node, const pdl_node_request_t *req, pdl_node_result_t *res)
{
    char id[PDL_NODE_RID_MAX + 16];
    resp_id(req, id, sizeof(id));
    json_t *choices = json_array();
    if (choices == NULL || !append_choices(choices, req, res, 0)) {
        json_decref(choices);
        return NULL;
    }
    json_t *params = res->kv_transfer_params ? json_incref(res->kv_transfer_params) : json_null();
    json_t *usage = usage_json(res);
    if (usage != NULL && req->n > 1) /* n sequences of num_tokens each */
        json_object_set_new(usage, "completion_tokens", json_integer((json_int_t)(res->num_tokens * (size_t)req->n)));
    if (usage != NULL && req->n > 1)
        json_object_set_new(usage, "total_tokens",
                            json_integer((json_int_t)(res->prompt_tokens + res->num_tokens * (size_t)req->n)));
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:o}", "id", id, "object",
                     req->chat ? "chat.completion" : "text_completion", "created", (json_int_t)time(NULL), "model",
                     node->served_name, "choices", choices, "usage", usage, "kv_transfer_params", params);
}

/* ---- SSE streaming ---------------------------------------------------------------------------- */

typedef struct sse_stream {
    pdl_node_t *node;
    pdl_node_request_t req;
    pdl_node_result_t res;
    char id[PDL_NODE_RID_MAX + 16];
    json_int_t created;
    size_t next;      /* next token to emit */
    int phase;        /* 0 role chunk (chat), 1 tokens, 2 usage, 3 [DONE], 4 end */
    char *pending;
    size_t pending_len, pending_off;
} sse_stream_t;

static json_t *chunk_json(sse_stream_t *s, json_t *choices)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", s->id, "object",
                     s->req.chat ? "chat.completion.chunk" : "text_completion", "created", s->created, "model",
                     s->node->served_name, "choices", choices);
}

/* Build the next SSE event into s->pending; false at the end of the stream. */
static bool sse_next(sse_stream_t *s)
{
    json_t *chunk = NULL;
    free(s->pending);
    s->pending = NULL;
    s->pending_len = s->pending_off = 0;
    for (;;) {
        if (s->phase == 0) {
            s->phase = 1;
            if (s->req.chat) {
                chunk = chunk_json(s, json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", 0, "delta", "role",
                                                "assistant", "content", "", "logprobs", "finish_reason"));
                break;
            }
            if (s->req.echo) {
                /* vLLM streams an echoed prompt as the first chunk of the choice. */
                json_t *lp = s->req.logprobs >= 0 ? completion_logprobs(&s->req, &s->res, true, 0, 0, 0) : json_null();
                chunk = chunk_json(s, json_pack("[{s:i, s:s, s:o, s:n, s:n}]", "index", 0, "text", s->req.prompt,
                                                "logprobs", lp, "finish_reason", "stop_reason"));
                break;
            }
            continue;
        }
        if (s->phase == 1) {
            if (s->next >= s->res.num_tokens) {
                s->phase = 2;
                continue;
            }
            char *text = generated_text(&s->res, s->next, s->next + 1, s->req.chat);
            if (text == NULL)
                return false;
            s->next++;
            bool last = s->next == s->res.num_tokens;
            json_t *fin = last ? json_string(s->res.finish_reason) : json_null();
            json_t *lp = json_null();
            if (s->req.logprobs >= 0) {
                json_decref(lp);
                lp = s->req.chat ? chat_logprobs(&s->req, &s->res, s->next - 1, s->next)
                                 : completion_logprobs(&s->req, &s->res, false, s->next - 1, s->next,
                                                       (s->req.echo ? s->req.prompt_len : 0) +
                                                           pdl_node_token_text(s->res.tokens, 0, s->next - 1, false,
                                                                               NULL));
            }
            json_t *choice =
                s->req.chat ? json_pack("{s:i, s:{s:s}, s:o, s:o}", "index", 0, "delta", "content", text, "logprobs",
                                        lp, "finish_reason", fin)
                            : json_pack("{s:i, s:s, s:o, s:o, s:o}", "index", 0, "text", text, "logprobs", lp,
                                        "finish_reason", fin, "stop_reason",
                                        last ? stop_reason_json(&s->req, &s->res) : json_null());
            free(text);
            chunk = chunk_json(s, json_pack("[o]", choice));
            if (chunk != NULL && last && s->res.kv_transfer_params != NULL)
                json_object_set(chunk, "kv_transfer_params", s->res.kv_transfer_params);
            break;
        }
        if (s->phase == 2) {
            s->phase = 3;
            if (s->req.include_usage) {
                chunk = chunk_json(s, json_array());
                if (chunk != NULL)
                    json_object_set_new(chunk, "usage", usage_json(&s->res));
                break;
            }
            continue;
        }
        if (s->phase == 3) {
            s->phase = 4;
            s->pending = strdup("data: [DONE]\n\n");
            if (s->pending == NULL)
                return false;
            s->pending_len = strlen(s->pending);
            return true;
        }
        return false;
    }
    if (chunk == NULL)
        return false;
    char *body = json_dumps(chunk, JSON_COMPACT);
    json_decref(chunk);
    if (body == NULL)
        return false;
    size_t n = strlen(body);
    s->pending = malloc(n + 9);
    if (s->pending == NULL) {
        free(body);
        return false;
    }
    s->pending_len = (size_t)sprintf(s->pending, "data: %s\n\n", body);
    free(body);
    return true;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    sse_stream_t *s = cls;
    if (s->pending_off >= s->pending_len && !sse_next(s))
        return PDL_HTTP_STREAM_END;
    size_t n = s->pending_len - s->pending_off;
    if (n > max)
        n = max;
    memcpy(buf, s->pending + s->pending_off, n);
    s->pending_off += n;
    return (ssize_t)n;
}

static void sse_free(void *cls)
{
    sse_stream_t *s = cls;
    pdl_node_request_clear(&s->req);
    pdl_node_result_clear(&s->res);
    free(s->pending);
    free(s);
}

/* ---- handlers --------------------------------------------------------------------------------- */

/* Also called at the headers, on the polling thread, for a Content-Length over the limit: no blocking. */
static int refuse_too_large(pdl_node_t *node, const pdl_http_request_t *hr)
{
    pdl_node_metrics_request(node->metrics, false);
    return send_error(hr->conn, 413, "RequestEntityTooLarge", "request body: larger than 16 MiB", NULL);
}

static int on_refuse(void *cls, const pdl_http_request_t *hr) { return refuse_too_large(cls, hr); }

static int handle_completion(pdl_node_t *node, const pdl_http_request_t *hr, bool chat)
{
    pdl_http_conn_t *c = hr->conn;
    const char *rid_hdr = pdl_http_header(hr, "X-Request-Id");
    pdl_node_result_t res;
    memset(&res, 0, sizeof(res));
    if (hr->too_large)
        return refuse_too_large(node, hr);
    if (hr->over_budget) {
        pdl_node_metrics_request(node->metrics, false);
        return send_error(c, 503, "ServiceUnavailableError",
                          "request bodies in flight: over the node's 256 MiB budget; retry later", NULL);
    }
    json_error_t jerr;
    json_t *body = hr->len ? json_loadb(hr->body, hr->len, 0, &jerr) : NULL;
    if (body == NULL) {
        char msg[300];
        if (hr->len == 0)
            snprintf(msg, sizeof(msg), "request body: empty, expected a JSON object");
        else
            snprintf(msg, sizeof(msg), "request body: invalid JSON at line %d column %d: %s", jerr.line, jerr.column,
                     jerr.text);
        pdl_node_metrics_request(node->metrics, false);
        return send_error(c, 400, "BadRequestError", msg, NULL);
    }
    pdl_node_request_t req;
    bool ok = pdl_node_request_parse(node, chat, body, rid_hdr, &req, &res);
    json_decref(body);
    if (ok)
        pdl_node_request_run(node, &req, &res);
    if (res.http_status != 200) {
        pdl_node_metrics_request(node->metrics, false);
        if (res.http_status >= 500)
            pdl_warn("request %s failed (%d): %s", req.request_id, res.http_status, res.error);
        else
            pdl_info("request %s rejected (%d): %s", req.request_id, res.http_status, res.error);
        int r = send_result_error(c, &res, req.request_id);
        pdl_node_request_clear(&req);
        pdl_node_result_clear(&res);
        return r;
    }
    pdl_node_metrics_request(node->metrics, true);
    if (!req.stream) {
        json_t *resp = full_response(node, &req, &res);
        /* A batch: prompts 2..k run one after the other, their choices numbered prompt_index*n + j and
         * their usage added, as vLLM answers a list prompt. */
        for (size_t i = 0; resp != NULL && req.more_prompts != NULL && i < json_array_size(req.more_prompts); i++) {
            pdl_node_result_t r2;
            memset(&r2, 0, sizeof(r2));
            if (pdl_node_request_set_prompt(&req, json_array_get(req.more_prompts, i), i + 1, &r2))
                pdl_node_request_run(node, &req, &r2);
            json_t *usage = json_object_get(resp, "usage");
            if (r2.http_status != 200 ||
                !append_choices(json_object_get(resp, "choices"), &req, &r2, (i + 1) * (size_t)req.n)) {
                json_decref(resp);
                char rid[PDL_NODE_RID_MAX + 1];
                memcpy(rid, req.request_id, sizeof(rid));
                int er = r2.http_status != 200 ? send_result_error(c, &r2, rid)
                                                : send_error(c, 500, "InternalServerError", "out of memory", rid);
                pdl_node_result_clear(&r2);
                pdl_node_request_clear(&req);
                pdl_node_result_clear(&res);
                return er;
            }
            json_int_t pt = json_integer_value(json_object_get(usage, "prompt_tokens")) + (json_int_t)r2.prompt_tokens;
            json_int_t ct = json_integer_value(json_object_get(usage, "completion_tokens")) +
                            (json_int_t)(r2.num_tokens * (size_t)req.n);
            json_object_set_new(usage, "prompt_tokens", json_integer(pt));
            json_object_set_new(usage, "completion_tokens", json_integer(ct));
            json_object_set_new(usage, "total_tokens", json_integer(pt + ct));
            pdl_node_result_clear(&r2);
        }
        char rid[PDL_NODE_RID_MAX + 1];
        memcpy(rid, req.request_id, sizeof(rid));
        pdl_node_request_clear(&req);
        pdl_node_result_clear(&res);
        return pdl_http_reply_json(c, 200, resp, rid);
    }
    sse_stream_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        pdl_node_request_clear(&req);
        pdl_node_result_clear(&res);
        return send_error(c, 500, "InternalServerError", "out of memory", NULL);
    }
    s->node = node;
    s->req = req;
    s->res = res;
    s->created = (json_int_t)time(NULL);
    resp_id(&s->req, s->id, sizeof(s->id));
    char rid_header[PDL_NODE_RID_MAX + 32];
    snprintf(rid_header, sizeof(rid_header), "X-Request-Id: %s", s->req.request_id);
    const char *const headers[] = {"Content-Type: text/event-stream; charset=utf-8", "Cache-Control: no-cache",
                                   rid_header};
    return pdl_http_reply_stream(c, 200, PDL_HTTP_SIZE_UNKNOWN, sse_read, s, sse_free, headers, 3);
}

static int handle_models(pdl_node_t *node, pdl_http_conn_t *c)
{
    json_t *m = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:s, s:n, s:i}]}", "object", "list", "data", "id",
                          node->served_name, "object", "model", "created", (json_int_t)node->started, "owned_by",
                          "pdlink", "root", node->preset->name, "parent", "max_model_len", node->max_model_len);
    return pdl_http_reply_json(c, 200, m, NULL);
}

static int handle_metrics(pdl_node_t *node, pdl_http_conn_t *c)
{
    char *text = pdl_node_metrics_render(node->metrics, node->kv, node->role_label);
    if (text == NULL)
        return send_error(c, 500, "InternalServerError", "metrics: out of memory", NULL);
    int r = pdl_http_reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text), NULL);
    free(text);
    return r;
}

static int on_request(void *cls, const pdl_http_request_t *hr)
{
    pdl_node_t *node = cls;
    pdl_http_conn_t *c = hr->conn;
    const char *url = hr->url, *method = hr->method;
    if (!atomic_load(&node->ready))
        return send_error(c, 503, "ServiceUnavailableError", "starting up or shutting down", NULL);
    /* --api-key guards the /v1 routes, as vLLM's does; health, metrics and version stay open to probes. */
    if (node->args.api_key != NULL && strncmp(url, "/v1/", 4) == 0 && !pdl_http_bearer_ok(hr, node->args.api_key)) {
        pdl_node_metrics_unauthorized(node->metrics);
        return send_error(c, 401, "Unauthorized", "missing or wrong Authorization: Bearer token (--api-key)", NULL);
    }
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool post = strcmp(method, "POST") == 0;
    if (strcmp(url, "/v1/completions") == 0 || strcmp(url, "/v1/chat/completions") == 0) {
        if (!post)
            return send_error(c, 405, "MethodNotAllowed", "use POST", NULL);
        return handle_completion(node, hr, url[4] == 'c' && url[5] == 'h');
    }
    if (strcmp(url, "/health") == 0 || strcmp(url, "/ping") == 0) {
        if (!get && !(post && strcmp(url, "/ping") == 0))
            return send_error(c, 405, "MethodNotAllowed", "use GET", NULL);
        return pdl_http_reply(c, 200, NULL, "", 0, NULL);
    }
    if (!get)
        return strcmp(url, "/v1/models") == 0 || strcmp(url, "/metrics") == 0 || strcmp(url, "/version") == 0
                   ? send_error(c, 405, "MethodNotAllowed", "use GET", NULL)
                   : send_error(c, 404, "NotFoundError", "no such route", NULL);
    if (strcmp(url, "/v1/models") == 0)
        return handle_models(node, c);
    if (strcmp(url, "/metrics") == 0)
        return handle_metrics(node, c);
    if (strcmp(url, "/version") == 0)
        return pdl_http_reply_json(c, 200, json_pack("{s:s}", "version", PDL_VERSION_STRING), NULL);
    return send_error(c, 404, "NotFoundError", "no such route", NULL);
}

pdl_status_t pdl_node_http_start(pdl_node_t *node, pdl_http_t **http_p, int *port_p, pdl_error_t *err)
{
    const pdl_http_params_t p = {.host = node->args.host,
                                 .port = node->args.port,
                                 .what = "--host",
                                 .max_body = BODY_MAX,
                                 .limits = node->args.http,
                                 .handler = on_request,
                                 .refuse = on_refuse,
                                 .cls = node};
    return pdl_http_start(&p, http_p, port_p, err);
}
