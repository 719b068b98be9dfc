/*
 * opts.c -- getopt_long_only with exact flag names and messages that name the flag (see opts.h).
 *
 * The optstring is "-:": '-' returns positionals in order instead of permuting argv (so "serve MODEL"
 * keeps its order), ':' makes a missing value come back as ':' rather than '?'. There are no short
 * options: "-h" is the long option "h", which getopt_long_only matches exactly.
 */
#include "app/opts.h"

#include <stdio.h>
#include <string.h>

void pdl_opts_init(pdl_opts_t *o, int argc, char **argv, const struct option *longopts, bool dash_underscores)
{
    memset(o, 0, sizeof(*o));
    o->argc = argc;
    o->argv = argv;
    o->longopts = longopts;
    o->dash_underscores = dash_underscores;
    optind = 0; /* 0, not 1: glibc then also forgets a half-read argument of an earlier parse */
    opterr = 0;
}

/* The flag name of an argv element without its dashes and "=value": "--port=8" -> "port", length 4. */
static size_t flag_name(const char *elem, const char **name_p)
{
    const char *n = elem + strspn(elem, "-");
    *name_p = n;
    return strcspn(n, "=");
}

static const struct option *find_exact(const struct option *longopts, const char *name, size_t len)
{
    for (const struct option *lo = longopts; lo->name != NULL; lo++)
        if (strlen(lo->name) == len && strncmp(lo->name, name, len) == 0)
            return lo;
    return NULL;
}

int pdl_opts_next(pdl_opts_t *o, const char **value_p, pdl_error_t *err)
{
    if (o->rest > 0) {
        if (o->rest >= o->argc)
            return 0;
        o->at = o->rest;
        *value_p = o->argv[o->rest++];
        return 1;
    }
    int at = optind > 0 ? optind : 1;
    char *elem = at < o->argc ? o->argv[at] : NULL;
    if (elem != NULL && elem[0] == '-' && o->dash_underscores)
        for (char *c = elem; *c != '\0' && *c != '='; c++)
            if (*c == '_')
                *c = '-';
    int idx = -1;
    int ch = getopt_long_only(o->argc, o->argv, "-:", o->longopts, &idx);
    if (ch == -1) {
        /* The end, or "--": what follows it is positional. getopt is not called again, since after
         * "--" it would rewind optind to the arguments it has already reported. */
        o->rest = optind; /* >= 1 once getopt has run */
        return pdl_opts_next(o, value_p, err);
    }
    if (ch == 1) {
        o->at = optind - 1; /* getopt has stepped past it */
        *value_p = optarg;
        return 1;
    }
    const char *name;
    size_t len = flag_name(elem, &name);
    snprintf(o->flag, sizeof(o->flag), "%.*s", (int)(name - elem + len), elem);
    const struct option *exact = find_exact(o->longopts, name, len);
    if (ch == ':') {
        pdl_error_set(err, PDL_ERR_INVALID, "%s needs a value", o->flag);
        return -1;
    }
    if (ch == '?' && exact != NULL && exact->has_arg == no_argument && name[len] == '=') {
        pdl_error_set(err, PDL_ERR_INVALID, "%s takes no value", o->flag);
        return -1;
    }
    /* '?' is an unknown or ambiguous name; a match that is not exact is an abbreviation. */
    if (ch == '?' || idx < 0 || exact != &o->longopts[idx]) {
        pdl_error_set(err, PDL_ERR_INVALID, "unknown flag '%s' (see --help)", o->flag);
        return -1;
    }
    *value_p = optarg;
    return ch;
}

pdl_status_t pdl_opts_parse(int argc, char **argv, const struct option *longopts, bool dash_underscores,
                            pdl_opts_take_fn take, void *ctx, pdl_error_t *err)
{
    pdl_opts_t o;
    pdl_opts_init(&o, argc, argv, longopts, dash_underscores);
    while (!o.done) {
        const char *value = NULL;
        int opt = pdl_opts_next(&o, &value, err);
        if (opt == 0)
            break;
        if (opt < 0)
            return PDL_ERR_INVALID;
        pdl_status_t st = take(&o, opt, value, ctx, err);
        if (st != PDL_OK)
            return st;
    }
    return PDL_OK;
}
