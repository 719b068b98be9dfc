/*
 * http.c -- pdlink-node's OpenAI-compatible HTTP API on libmicrohttpd.
 *
 * Routes: POST /v1/completions, POST /v1/chat/completions (JSON or SSE), GET /v1/models, GET /health,
 * GET /metrics, GET /version. MHD runs one thread per connection, so a request that waits for a KV pull
 * blocks only its own connection; hundreds of concurrent streams through a router are hundreds of
 * threads, which is fine at this scale and keeps the request code straight-line.
 *
 * Response shapes follow vLLM's OpenAI server: `id` "cmpl-<request id>" ("chatcmpl-" for chat), `object`,
 * `created`, `model`, `choices` with `finish_reason` and `logprobs: null`, `usage`, and a top-level
 * `kv_transfer_params` (null unless the connector returned params). Streams are `data: {chunk}\n\n` lines
 * ending with `data: [DONE]\n\n`; the KV work is done before the first byte, so a failure is a proper
 * error status rather than a broken stream. Errors are {"error": {message, type, param, code}}.
 */
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "node/node.h"
#include "node/synth.h"
#include "pdlink/log.h"

#define BODY_MAX (16u << 20)

struct pdl_node_http {
    struct MHD_Daemon *daemon;
    pdl_node_t *node;
};

typedef struct conn_state {
    char *body;
    size_t len, cap;
    bool too_big;
} conn_state_t;

/* ---- responses -------------------------------------------------------------------------------- */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *ctype, const char *text,
                                 size_t len, const char *request_id)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    if (ctype != NULL)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (request_id != NULL && request_id[0] != '\0')
        MHD_add_response_header(r, "X-Request-Id", request_id);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *obj, const char *request_id)
{
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (s == NULL)
        return send_text(c, 500, "application/json",
                         "{\"error\":{\"message\":\"out of memory\",\"type\":\"InternalServerError\",\"param\":null,"
                         "\"code\":500}}",
                         95, request_id);
    enum MHD_Result ret = send_text(c, status, "application/json", s, strlen(s), request_id);
    free(s);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *type, const char *msg,
                                  const char *request_id)
{
    json_t *e = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", msg, "type", type, "param", "code",
                          (int)status);
    if (e == NULL) /* msg was not valid UTF-8: never echo it raw */
        e = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", "invalid request", "type", type, "param",
                      "code", (int)status);
    return send_json(c, status, e, request_id);
}

static enum MHD_Result send_result_error(struct MHD_Connection *c, const pdl_node_result_t *res, const char *rid)
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
        return MHD_CONTENT_READER_END_OF_STREAM;
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

static enum MHD_Result handle_completion(pdl_node_t *node, struct MHD_Connection *c, bool chat, conn_state_t *cs)
{
    const char *rid_hdr = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    pdl_node_result_t res;
    memset(&res, 0, sizeof(res));
    if (cs->too_big) {
        pdl_node_metrics_request(node->metrics, false);
        return send_error(c, 413, "RequestEntityTooLarge", "request body: larger than 16 MiB", NULL);
    }
    json_error_t jerr;
    json_t *body = cs->len ? json_loadb(cs->body, cs->len, 0, &jerr) : NULL;
    if (body == NULL) {
        char msg[300];
        if (cs->len == 0)
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
        enum MHD_Result r = send_result_error(c, &res, req.request_id);
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
        return send_json(c, 200, resp, rid);
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
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, s, sse_free);
    if (r == NULL) {
        sse_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Request-Id", s->req.request_id);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle_models(pdl_node_t *node, struct MHD_Connection *c)
{
    json_t *m = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:s, s:n, s:i}]}", "object", "list", "data", "id",
                          node->served_name, "object", "model", "created", (json_int_t)node->started, "owned_by",
                          "pdlink", "root", node->preset->name, "parent", "max_model_len", node->max_model_len);
    return send_json(c, 200, m, NULL);
}

static enum MHD_Result handle_metrics(pdl_node_t *node, struct MHD_Connection *c)
{
    char *text = pdl_node_metrics_render(node->metrics, node->kv, node->role_label);
    if (text == NULL)
        return send_error(c, 500, "InternalServerError", "metrics: out of memory", NULL);
    enum MHD_Result r = send_text(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text), NULL);
    free(text);
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    pdl_node_t *node = cls;
    conn_state_t *cs = *con_cls;
    if (cs == NULL) {
        cs = calloc(1, sizeof(*cs));
        if (cs == NULL)
            return MHD_NO;
        *con_cls = cs;
        return MHD_YES;
    }
    if (*upload_size != 0) {
        size_t n = *upload_size;
        if (!cs->too_big) {
            if (cs->len + n > BODY_MAX) {
                cs->too_big = true;
            } else {
                if (cs->len + n + 1 > cs->cap) {
                    size_t ncap = (cs->cap ? cs->cap * 2 : 4096) + n + 1;
                    char *nb = realloc(cs->body, ncap);
                    if (nb == NULL)
                        return MHD_NO;
                    cs->body = nb;
                    cs->cap = ncap;
                }
                memcpy(cs->body + cs->len, upload, n);
                cs->len += n;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!atomic_load(&node->ready))
        return send_error(c, 503, "ServiceUnavailableError", "starting up or shutting down", NULL);
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool post = strcmp(method, "POST") == 0;
    if (strcmp(url, "/v1/completions") == 0 || strcmp(url, "/v1/chat/completions") == 0) {
        if (!post)
            return send_error(c, 405, "MethodNotAllowed", "use POST", NULL);
        return handle_completion(node, c, url[4] == 'c' && url[5] == 'h', cs);
    }
    if (strcmp(url, "/health") == 0 || strcmp(url, "/ping") == 0) {
        if (!get && !(post && strcmp(url, "/ping") == 0))
            return send_error(c, 405, "MethodNotAllowed", "use GET", NULL);
        return send_text(c, 200, NULL, "", 0, NULL);
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
        return send_json(c, 200, json_pack("{s:s}", "version", PDL_VERSION_STRING), NULL);
    return send_error(c, 404, "NotFoundError", "no such route", NULL);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode tc)
{
    (void)cls;
    (void)c;
    (void)tc;
    conn_state_t *cs = *con_cls;
    if (cs != NULL) {
        free(cs->body);
        free(cs);
        *con_cls = NULL;
    }
}

pdl_status_t pdl_node_http_start(pdl_node_t *node, pdl_node_http_t **http_out, int *port_out, pdl_error_t *err)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof(port), "%d", node->args.port);
    int rc = getaddrinfo(node->args.host, port, &hints, &ai);
    if (rc != 0 || ai == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "--host '%s': cannot resolve: %s", node->args.host,
                             gai_strerror(rc));
    pdl_node_http_t *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        freeaddrinfo(ai);
        return pdl_error_set(err, PDL_ERR_NOMEM, "http: out of memory");
    }
    h->node = node;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(flags, (uint16_t)node->args.port, NULL, NULL, on_request, node,
                                 MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)0, MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (h->daemon == NULL) {
        free(h);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "http: cannot listen on %s:%d (port in use?)", node->args.host,
                             node->args.port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    *port_out = info ? (int)info->port : node->args.port;
    *http_out = h;
    return PDL_OK;
}

void pdl_node_http_stop(pdl_node_http_t *http)
{
    if (http == NULL)
        return;
    MHD_stop_daemon(http->daemon);
    free(http);
}
