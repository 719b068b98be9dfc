/*
 * http.c -- pdlink-node's OpenAI-compatible HTTP API on libmicrohttpd.
 *
 * Routes: POST /v1/completions, POST /v1/chat/completions (JSON or SSE), GET /v1/models, GET /health,
 * GET /metrics, GET /version. app/http.c runs each complete request on one of its workers, so a request
 * that waits for a KV pull blocks only its own worker and the request code stays straight-line; idle
 * connections cost no thread.
 *
 * Response shapes follow vLLM's OpenAI server: `id` "cmpl-<request id>" ("chatcmpl-" for chat), `object`,
 * `created`, `model`, `choices` with `finish_reason` and `logprobs: null`, `usage`, and a top-level
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
#include "pdlink/log.h"

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

/* Words of tokens [from, to); a completion continues the prompt so each word has a leading space, a
 * chat message starts with its first word. */
static char *generated_text(const pdl_node_result_t *res, size_t from, size_t to, bool chat)
{
    size_t cap = 1;
    for (size_t i = from; i < to; i++)
        cap += 1 + strlen(pdl_synth_word(res->tokens[i]));
    char *s = malloc(cap);
    if (s == NULL)
        return NULL;
    size_t n = 0;
    for (size_t i = from; i < to; i++)
        n += (size_t)sprintf(s + n, "%s%s", chat && i == 0 ? "" : " ", pdl_synth_word(res->tokens[i]));
    s[n] = '\0';
    return s;
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

static json_t *full_response(pdl_node_t *node, const pdl_node_request_t *req, pdl_node_result_t *res)
{
    char id[PDL_NODE_RID_MAX + 16];
    resp_id(req, id, sizeof(id));
    char *text = generated_text(res, 0, res->num_tokens, req->chat);
    if (text == NULL)
        return NULL;
    json_t *choice;
    if (req->chat)
        choice = json_pack("{s:i, s:{s:s, s:s}, s:n, s:s, s:n}", "index", 0, "message", "role", "assistant",
                           "content", text, "logprobs", "finish_reason", res->finish_reason, "stop_reason");
    else
        choice = json_pack("{s:i, s:s, s:n, s:s, s:n}", "index", 0, "text", text, "logprobs", "finish_reason",
                           res->finish_reason, "stop_reason");
    free(text);
    json_t *params = res->kv_transfer_params ? json_incref(res->kv_transfer_params) : json_null();
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o, s:o}", "id", id, "object",
                     req->chat ? "chat.completion" : "text_completion", "created", (json_int_t)time(NULL), "model",
                     node->served_name, "choices", choice, "usage", usage_json(res), "kv_transfer_params", params);
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
            json_t *choice =
                s->req.chat ? json_pack("{s:i, s:{s:s}, s:n, s:o}", "index", 0, "delta", "content", text, "logprobs",
                                        "finish_reason", fin)
                            : json_pack("{s:i, s:s, s:n, s:o, s:n}", "index", 0, "text", text, "logprobs",
                                        "finish_reason", fin, "stop_reason");
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

static int handle_completion(pdl_node_t *node, const pdl_http_request_t *hr, bool chat)
{
    pdl_http_conn_t *c = hr->conn;
    const char *rid_hdr = pdl_http_header(hr, "X-Request-Id");
    pdl_node_result_t res;
    memset(&res, 0, sizeof(res));
    if (hr->too_large) {
        pdl_node_metrics_request(node->metrics, false);
        return send_error(c, 413, "RequestEntityTooLarge", "request body: larger than 16 MiB", NULL);
    }
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
                                 .cls = node};
    return pdl_http_start(&p, http_p, port_p, err);
}
