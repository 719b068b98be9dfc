/*
 * check_config.c -- `pdlink check-config FILE|-`: validates a --kv-transfer-config JSON (its
 * kv_connector_extra_config included) with libpdlink's strict parser, pdl_connector_config_check, without
 * starting anything, so a deployment can be checked before any weights load (docs/run.md).
 *
 * The rules are the parser's own -- the same call PdlinkConnector makes in vLLM's scheduler process --
 * so the command can neither accept what vLLM would refuse nor refuse what it would accept. Exit status:
 * 0 valid (what the parser settled on is printed), 2 invalid or unreadable (the message names the key, the
 * value and what is accepted; an unknown key names the nearest known one).
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/optab.h"
#include "cli/cli.h"
#include "pdlink/connector.h"
#include "pdlink/engine.h"

typedef struct check_opts {
    const char *path; /* FILE, or "-" for stdin */
    bool json;
} check_opts_t;

static pdl_status_t take_path(void *opts, const char *arg, pdl_error_t *err)
{
    check_opts_t *o = opts;
    if (o->path != NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "one FILE only ('%s' and '%s' given)", o->path, arg);
    o->path = arg;
    return PDL_OK;
}

#define CO(field) offsetof(check_opts_t, field)
static const pdl_optdef_t check_rows[] = {
    {.name = "json", .kind = PDL_OPT_FLAG, .off = CO(json),
     .help = "print {\"ok\": ..., \"error\": ..., \"config\": {...}} on stdout instead of text"},
    {.name = "help", .alias = 'h', .kind = PDL_OPT_HELP, .help = "this text"},
    {0},
};
#undef CO

static const pdl_optab_t check_table = {
    .prog = "pdlink check-config",
    .usage = "usage: pdlink check-config [--json] FILE|-\n"
             "\n"
             "Validates a --kv-transfer-config JSON (FILE, or stdin for '-') as PdlinkConnector does in vLLM's\n"
             "scheduler process before any weights load: every kv_connector_extra_config value against its\n"
             "range, and an unknown key is an error naming the nearest known one. Starts nothing. Exit status\n"
             "0 valid, 2 invalid or unreadable. pdlink-node --help-config lists the keys.\n"
             "\n",
    .rows = check_rows,
    .positional = take_path,
};

/* The whole of FILE (or stdin for "-") as a NUL-terminated string the caller frees; NULL with err set. */
static char *read_all(const char *path, pdl_error_t *err)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (f == NULL) {
        pdl_error_set(err, PDL_ERR_INVALID, "%s: cannot open", path);
        return NULL;
    }
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap);
    while (buf != NULL) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1)
            break;
        char *grown = realloc(buf, cap *= 2);
        if (grown == NULL)
            free(buf);
        buf = grown;
    }
    bool failed = buf == NULL || ferror(f);
    if (f != stdin)
        fclose(f);
    if (failed) {
        free(buf);
        pdl_error_set(err, PDL_ERR_INVALID, "%s: cannot read", path);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* What the parser settled on, defaults filled in: the fields config.py's connector_config returns. */
static json_t *settled(const pdl_connector_config_t *c)
{
    return json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:b, s:s}", "role",
                     c->role == PDL_ROLE_PRODUCER ? "producer" : "consumer", "host_ip", c->host_ip, "proxy_ip",
                     c->proxy_ip, "proxy_ping_port", c->proxy_ping_port, "http_port", c->http_port, "handshake_port",
                     c->handshake_port, "notify_port", c->notify_port, "read_mode", c->read_mode, "backend",
                     pdl_backend_name(c->backend));
}

static void report(const check_opts_t *o, pdl_status_t st, const pdl_error_t *err, const pdl_connector_config_t *c)
{
    if (o->json) {
        json_t *doc = st == PDL_OK ? json_pack("{s:b, s:s, s:o}", "ok", 1, "file", o->path, "config", settled(c))
                                   : json_pack("{s:b, s:s, s:s}", "ok", 0, "file", o->path, "error", err->msg);
        json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(doc);
        return;
    }
    if (st != PDL_OK) {
        fprintf(stderr, "pdlink check-config: %s: %s\n", o->path, err->msg);
        return;
    }
    printf("%s: valid: %s, %s mode, backend %s, host_ip %s, handshake_port %d, notify_port %d\n", o->path,
           c->role == PDL_ROLE_PRODUCER ? "producer" : "consumer", c->read_mode ? "READ" : "WRITE",
           pdl_backend_name(c->backend), c->host_ip, c->handshake_port, c->notify_port);
}

int pdl_cli_check_config(int argc, char **argv)
{
    check_opts_t o = {0};
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_optab_result_t r = pdl_optab_parse(&check_table, &o, argc, argv, NULL, &err);
    if (r != PDL_OPTAB_GO)
        return r == PDL_OPTAB_DONE ? 0 : (fprintf(stderr, "pdlink check-config: %s\n", err.msg), 2);
    if (o.path == NULL) {
        pdl_optab_help(&check_table, stderr);
        return 2;
    }
    pdl_connector_config_t cfg;
    char *text = read_all(o.path, &err);
    pdl_status_t st = text ? pdl_connector_config_check(text, &cfg, &err) : PDL_ERR_INVALID;
    free(text);
    report(&o, st, &err, &cfg);
    return st == PDL_OK ? 0 : 2;
}
