/*
 * serde_text.c -- vllm-router's serde_json::to_string of a parsed completion/chat request (serde_text.h).
 */
#include "router/serde_text.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"

typedef enum {
    F_VALUE,    /* Option<T> of a JSON-shaped T: skipped when absent or null, else the value as sent */
    F_STRING,   /* Option<String>: skipped when absent or null; anything else is a serde error */
    F_INT,      /* Option<u32/i32/i64>: skipped when absent or null; must be an integer */
    F_F32,      /* Option<f32>: skipped when absent or null; printed as the f64 of the f32 */
    F_FALSE,    /* bool, #[serde(default)]: always written, false unless the body says otherwise */
    F_TRUE,     /* bool, default_true */
    F_PROMPT,   /* PromptInput (required): the value as sent */
    F_MESSAGES, /* Vec<ChatMessage> (required) */
    F_STREAM_OPTIONS,
} field_kind_t;

typedef struct field {
    const char *name;
    field_kind_t kind;
} field_t;

/* vllm-router 0.1.17, src/protocols/spec.rs, struct CompletionRequest, in declaration order. */
static const field_t completion_fields[] = {
    {"model", F_STRING},         {"prompt", F_PROMPT},          {"suffix", F_STRING},
    {"max_tokens", F_INT},       {"temperature", F_F32},        {"top_p", F_F32},
    {"n", F_INT},                {"stream", F_FALSE},           {"stream_options", F_STREAM_OPTIONS},
    {"logprobs", F_INT},         {"echo", F_FALSE},             {"stop", F_VALUE},
    {"presence_penalty", F_F32}, {"frequency_penalty", F_F32},  {"best_of", F_INT},
    {"logit_bias", F_VALUE},     {"user", F_STRING},            {"seed", F_INT},
    {"top_k", F_INT},            {"min_p", F_F32},              {"min_tokens", F_INT},
    {"repetition_penalty", F_F32}, {"regex", F_STRING},         {"ebnf", F_STRING},
    {"json_schema", F_STRING},   {"stop_token_ids", F_VALUE},   {"no_stop_trim", F_FALSE},
    {"ignore_eos", F_FALSE},     {"skip_special_tokens", F_TRUE}, {"lora_path", F_VALUE},
    {"session_params", F_VALUE}, {"return_hidden_states", F_FALSE},
};

/* The same for struct ChatCompletionRequest. */
static const field_t chat_fields[] = {
    {"model", F_STRING},             {"messages", F_MESSAGES},          {"temperature", F_F32},
    {"top_p", F_F32},                {"n", F_INT},                      {"stream", F_FALSE},
    {"stream_options", F_STREAM_OPTIONS}, {"stop", F_VALUE},            {"max_tokens", F_INT},
    {"max_completion_tokens", F_INT}, {"presence_penalty", F_F32},      {"frequency_penalty", F_F32},
    {"logit_bias", F_VALUE},         {"user", F_STRING},                {"seed", F_INT},
    {"logprobs", F_FALSE},           {"top_logprobs", F_INT},           {"response_format", F_VALUE},
    {"tools", F_VALUE},              {"tool_choice", F_VALUE},          {"parallel_tool_calls", F_VALUE},
    {"functions", F_VALUE},          {"function_call", F_VALUE},        {"top_k", F_INT},
    {"min_p", F_F32},                {"min_tokens", F_INT},             {"repetition_penalty", F_F32},
    {"regex", F_STRING},             {"ebnf", F_STRING},                {"stop_token_ids", F_VALUE},
    {"no_stop_trim", F_FALSE},       {"ignore_eos", F_FALSE},           {"add_generation_prompt", F_VALUE},
    {"continue_final_message", F_FALSE}, {"skip_special_tokens", F_TRUE}, {"lora_path", F_VALUE},
    {"session_params", F_VALUE},     {"separate_reasoning", F_TRUE},    {"stream_reasoning", F_TRUE},
    {"chat_template_kwargs", F_VALUE}, {"return_hidden_states", F_FALSE}, {"echo", F_VALUE},
    {"reasoning_effort", F_VALUE},   {"include_reasoning", F_TRUE},     {"structured_outputs", F_VALUE},
};

#define NFIELDS(a) (sizeof(a) / sizeof((a)[0]))

void pdl_rt_serde_f64(double v, char *out, size_t cap)
{
    if (!isfinite(v)) {
        /* serde_json writes null for a non-finite float. */
        snprintf(out, cap, "null");
        return;
    }
    /* Shortest round-tripping digits, as ryu finds them: the fewest significant digits whose
     * %e form parses back to exactly v. */
    char sci[40];
    for (int prec = 0; prec <= 17; prec++) {
        snprintf(sci, sizeof(sci), "%.*e", prec, v);
        if (strtod(sci, NULL) == v)
            break;
    }
    const char *p = sci;
    bool neg = *p == '-';
    if (neg)
        p++;
    char digits[24];
    size_t nd = 0;
    for (; *p != 'e' && *p != '\0'; p++)
        if (*p >= '0' && *p <= '9' && nd < sizeof(digits) - 1)
            digits[nd++] = *p;
    int e10 = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') /* %.Ne may pad the mantissa with zeros */
        nd--;
    digits[nd] = '\0';
    if (nd == 1 && digits[0] == '0') {
        snprintf(out, cap, "%s0.0", neg ? "-" : "");
        return;
    }
    /* ryu's pretty printer: kk is where the decimal point falls relative to the digits. */
    int len = (int)nd, k = e10 - (len - 1), kk = len + k;
    pdl_strbuf_t b = {0};
    if (neg)
        pdl_strbuf_printf(&b, "-");
    if (k >= 0 && kk <= 16) {
        pdl_strbuf_printf(&b, "%s%.*s.0", digits, k, "0000000000000000");
    } else if (kk > 0 && kk <= 16) {
        pdl_strbuf_printf(&b, "%.*s.%s", kk, digits, digits + kk);
    } else if (kk > -5 && kk <= 0) {
        pdl_strbuf_printf(&b, "0.%.*s%s", -kk, "00000", digits);
    } else if (len == 1) {
        pdl_strbuf_printf(&b, "%se%+d", digits, kk - 1);
    } else {
        pdl_strbuf_printf(&b, "%c.%se%+d", digits[0], digits + 1, kk - 1);
    }
    snprintf(out, cap, "%s", b.failed || b.p == NULL ? "null" : b.p);
    pdl_strbuf_free(&b);
}

/* serde_json's string escaping: the two-character escapes, \u00xx (lowercase) for other control
 * bytes, everything else (including '/' and UTF-8) as is. */
static void put_string(pdl_strbuf_t *b, const char *s, size_t n)
{
    pdl_strbuf_printf(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof(u), "\\u%04x", c);
                esc = u;
            }
        }
        if (esc == NULL) {
            run++;
            continue;
        }
        pdl_strbuf_printf(b, "%.*s%s", (int)run, s + i - run, esc);
        run = 0;
    }
    pdl_strbuf_printf(b, "%.*s\"", (int)run, s + n - run);
}

/* A serde_json::Value (preserve_order): objects in the order received. */
static void put_value(pdl_strbuf_t *b, const json_t *v)
{
    char num[48];
    switch (json_typeof(v)) {
    case JSON_NULL: pdl_strbuf_printf(b, "null"); break;
    case JSON_TRUE: pdl_strbuf_printf(b, "true"); break;
    case JSON_FALSE: pdl_strbuf_printf(b, "false"); break;
    case JSON_INTEGER: pdl_strbuf_printf(b, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL:
        pdl_rt_serde_f64(json_real_value(v), num, sizeof(num));
        pdl_strbuf_printf(b, "%s", num);
        break;
    case JSON_STRING: put_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_ARRAY: {
        pdl_strbuf_printf(b, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                pdl_strbuf_printf(b, ",");
            put_value(b, json_array_get(v, i));
        }
        pdl_strbuf_printf(b, "]");
        break;
    }
    case JSON_OBJECT: {
        pdl_strbuf_printf(b, "{");
        const char *k;
        const json_t *x;
        bool first = true;
        json_object_foreach((json_t *)v, k, x) {
            if (!first)
                pdl_strbuf_printf(b, ",");
            first = false;
            put_string(b, k, strlen(k));
            pdl_strbuf_printf(b, ":");
            put_value(b, x);
        }
        pdl_strbuf_printf(b, "}");
        break;
    }
    }
}

static void put_key(pdl_strbuf_t *b, bool *first, const char *k)
{
    if (!*first)
        pdl_strbuf_printf(b, ",");
    *first = false;
    put_string(b, k, strlen(k));
    pdl_strbuf_printf(b, ":");
}

static bool absent(const json_t *v)
{
    return v == NULL || json_is_null(v);
}

/* UserMessageContent: a string, or an array of text / image_url parts (other part keys dropped). */
static bool put_content(pdl_strbuf_t *b, const json_t *c)
{
    if (json_is_string(c)) {
        put_value(b, c);
        return true;
    }
    if (!json_is_array(c))
        return false;
    pdl_strbuf_printf(b, "[");
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *part = json_array_get(c, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        if (i)
            pdl_strbuf_printf(b, ",");
        if (type != NULL && strcmp(type, "text") == 0 && json_is_string(json_object_get(part, "text"))) {
            pdl_strbuf_printf(b, "{\"type\":\"text\",\"text\":");
            put_value(b, json_object_get(part, "text"));
            pdl_strbuf_printf(b, "}");
        } else if (type != NULL && strcmp(type, "image_url") == 0 &&
                   json_is_string(json_object_get(json_object_get(part, "image_url"), "url"))) {
            const json_t *iu = json_object_get(part, "image_url");
            pdl_strbuf_printf(b, "{\"type\":\"image_url\",\"image_url\":{\"url\":");
            put_value(b, json_object_get(iu, "url"));
            if (json_is_string(json_object_get(iu, "detail"))) {
                pdl_strbuf_printf(b, ",\"detail\":");
                put_value(b, json_object_get(iu, "detail"));
            }
            pdl_strbuf_printf(b, "}}");
        } else {
            return false;
        }
    }
    pdl_strbuf_printf(b, "]");
    return true;
}

/* One ChatMessage as its hand-written Deserialize and derived Serialize leave it, per role. */
static bool put_message(pdl_strbuf_t *b, const json_t *m)
{
    const char *role = json_string_value(json_object_get(m, "role"));
    if (role == NULL)
        return false; /* "missing role field": a 400 at vllm-router */
    const json_t *content = json_object_get(m, "content");
    const json_t *name = json_object_get(m, "name");
    bool first = true;
    pdl_strbuf_printf(b, "{");
    put_key(b, &first, "role");
    put_value(b, json_object_get(m, "role"));
    if (strcmp(role, "system") == 0 || strcmp(role, "user") == 0) {
        put_key(b, &first, "content");
        /* Absent or unparseable content becomes "" there. */
        if (absent(content) || (!json_is_string(content) && !json_is_array(content)))
            pdl_strbuf_printf(b, "\"\"");
        else if (!put_content(b, content))
            return false;
        if (json_is_string(name)) {
            put_key(b, &first, "name");
            put_value(b, name);
        }
    } else if (strcmp(role, "assistant") == 0) {
        if (!absent(content)) {
            put_key(b, &first, "content");
            if (!put_content(b, content))
                return false;
        }
        if (json_is_string(name)) {
            put_key(b, &first, "name");
            put_value(b, name);
        }
        if (!absent(json_object_get(m, "tool_calls")) || !absent(json_object_get(m, "function_call")))
            return false; /* typed structs of their own: not reproduced */
        const json_t *r = json_object_get(m, "reasoning");
        if (!json_is_string(r))
            r = json_object_get(m, "reasoning_content");
        if (json_is_string(r)) {
            put_key(b, &first, "reasoning");
            put_value(b, r);
        }
    } else if (strcmp(role, "tool") == 0) {
        put_key(b, &first, "content");
        if (content == NULL)
            pdl_strbuf_printf(b, "\"\"");
        else
            put_value(b, content);
        const json_t *id = json_object_get(m, "tool_call_id");
        put_key(b, &first, "tool_call_id");
        if (json_is_string(id))
            put_value(b, id);
        else
            pdl_strbuf_printf(b, "\"\"");
    } else if (strcmp(role, "function") == 0) {
        put_key(b, &first, "content");
        if (json_is_string(content))
            put_value(b, content);
        else
            pdl_strbuf_printf(b, "\"\"");
        put_key(b, &first, "name");
        if (json_is_string(name))
            put_value(b, name);
        else
            pdl_strbuf_printf(b, "\"\"");
    } else {
        /* ChatMessage::Other keeps the object verbatim: start over with it. */
        return false;
    }
    pdl_strbuf_printf(b, "}");
    return true;
}

static bool put_messages(pdl_strbuf_t *b, const json_t *msgs)
{
    if (!json_is_array(msgs))
        return false;
    pdl_strbuf_printf(b, "[");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        if (i)
            pdl_strbuf_printf(b, ",");
        if (!json_is_object(m))
            return false;
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role != NULL && strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool") && strcmp(role, "function")) {
            put_value(b, m); /* Other(Value) */
            continue;
        }
        if (!put_message(b, m))
            return false;
    }
    pdl_strbuf_printf(b, "]");
    return true;
}

static bool known(const field_t *f, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(f[i].name, key) == 0)
            return true;
    return false;
}

char *pdl_rt_serde_text(const json_t *body, bool chat, size_t *len)
{
    *len = 0;
    if (!json_is_object(body))
        return NULL;
    const field_t *fields = chat ? chat_fields : completion_fields;
    size_t nf = chat ? NFIELDS(chat_fields) : NFIELDS(completion_fields);
    pdl_strbuf_t b = {0};
    bool first = true, ok = true;
    char num[48];
    pdl_strbuf_printf(&b, "{");
    for (size_t i = 0; i < nf && ok; i++) {
        const json_t *v = json_object_get(body, fields[i].name);
        switch (fields[i].kind) {
        case F_VALUE:
            if (!absent(v)) {
                put_key(&b, &first, fields[i].name);
                put_value(&b, v);
            }
            break;
        case F_STRING:
            if (!absent(v)) {
                ok = json_is_string(v);
                put_key(&b, &first, fields[i].name);
                put_value(&b, v);
            }
            break;
        case F_INT:
            if (!absent(v)) {
                ok = json_is_integer(v);
                put_key(&b, &first, fields[i].name);
                put_value(&b, v);
            }
            break;
        case F_F32:
            if (!absent(v)) {
                ok = json_is_number(v);
                /* serde reads the number into an f32 and writes that f32 widened to f64. */
                pdl_rt_serde_f64((double)(float)json_number_value(v), num, sizeof(num));
                put_key(&b, &first, fields[i].name);
                pdl_strbuf_printf(&b, "%s", num);
            }
            break;
        case F_FALSE:
        case F_TRUE:
            if (!absent(v) && !json_is_boolean(v))
                ok = false;
            put_key(&b, &first, fields[i].name);
            pdl_strbuf_printf(&b, "%s", (absent(v) ? fields[i].kind == F_TRUE : json_is_true(v)) ? "true" : "false");
            break;
        case F_PROMPT:
            ok = v != NULL; /* required */
            if (ok) {
                put_key(&b, &first, fields[i].name);
                put_value(&b, v);
            }
            break;
        case F_MESSAGES:
            put_key(&b, &first, fields[i].name);
            ok = put_messages(&b, v);
            break;
        case F_STREAM_OPTIONS:
            /* StreamOptions has one field; others (continuous_usage_stats, …) are dropped. */
            if (!absent(v)) {
                ok = json_is_object(v);
                const json_t *iu = json_object_get(v, "include_usage");
                put_key(&b, &first, fields[i].name);
                if (absent(iu)) {
                    pdl_strbuf_printf(&b, "{}");
                } else {
                    ok = ok && json_is_boolean(iu);
                    pdl_strbuf_printf(&b, "{\"include_usage\":%s}", json_is_true(iu) ? "true" : "false");
                }
            }
            break;
        }
    }
    /* #[serde(flatten)] other: every key the struct does not name, in the client's order. */
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)body, k, x) {
        if (!ok)
            break;
        if (known(fields, nf, k))
            continue;
        put_key(&b, &first, k);
        put_value(&b, x);
    }
    pdl_strbuf_printf(&b, "}");
    if (!ok || b.failed) {
        pdl_strbuf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.p;
}
