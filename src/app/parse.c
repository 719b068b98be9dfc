/*
 * parse.c -- checked integers for command-line flags (see parse.h).
 *
 * strtol alone accepts leading blanks and a sign, stops at the first non-digit and clamps on overflow,
 * so each of those is checked here: a leading blank is refused (a shell quoting mistake should not look
 * like a number), the whole string must be consumed, and ERANGE is an error rather than LONG_MAX.
 */
#include "app/parse.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

pdl_status_t pdl_parse_long(const char *flag, const char *s, long lo, long hi, long *out_p, pdl_error_t *err)
{
    char *end = NULL;
    errno = 0;
    long v = s[0] != '\0' && !isspace((unsigned char)s[0]) ? strtol(s, &end, 10) : 0;
    if (end == NULL || end == s || *end != '\0' || errno != 0 || v < lo || v > hi)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected an integer in [%ld, %ld]", flag, s, lo, hi);
    *out_p = v;
    return PDL_OK;
}

pdl_status_t pdl_parse_int(const char *flag, const char *s, int lo, int hi, int *out_p, pdl_error_t *err)
{
    long v = 0;
    pdl_status_t st = pdl_parse_long(flag, s, lo, hi, &v, err);
    if (st == PDL_OK)
        *out_p = (int)v;
    return st;
}
