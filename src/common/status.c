/*
 * status.c -- names and messages of pdlink status codes, and the error record helpers.
 */
#include "pdlink/status.h"

#include <stdio.h>
#include <string.h>

const char *pdl_status_name(pdl_status_t st)
{
    switch (st) {
#define PDL_STATUS_NAME_(name, val, msg)                                      \
    case PDL_##name:                                                          \
        return "PDL_" #name;
        PDL_STATUS_MAP(PDL_STATUS_NAME_)
#undef PDL_STATUS_NAME_
    }
    return "PDL_UNKNOWN";
}

const char *pdl_status_string(pdl_status_t st)
{
    switch (st) {
#define PDL_STATUS_STR_(name, val, msg)                                       \
    case PDL_##name:                                                          \
        return msg;
        PDL_STATUS_MAP(PDL_STATUS_STR_)
#undef PDL_STATUS_STR_
    }
    return "unknown status";
}

pdl_status_t pdl_error_vset(pdl_error_t *err, pdl_status_t st, const char *fmt, va_list ap)
{
    if (err == NULL)
        return st;
    err->status = st;
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    return st;
}

pdl_status_t pdl_error_set(pdl_error_t *err, pdl_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pdl_error_vset(err, st, fmt, ap);
    va_end(ap);
    return st;
}

pdl_status_t pdl_error_prefix(pdl_error_t *err, pdl_status_t st, const char *fmt, ...)
{
    if (err == NULL)
        return st;
    char old[PDL_ERR_MSG_LEN];
    memcpy(old, err->msg, sizeof(old));
    old[sizeof(old) - 1] = '\0';
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    size_t used = (size_t)n < sizeof(err->msg) ? (size_t)n : sizeof(err->msg) - 1;
    /* Append ": old", truncated to what is left; the message is always NUL-terminated. */
    const char *parts[2] = {": ", old};
    for (int i = 0; i < 2; i++)
        for (const char *c = parts[i]; *c && used < sizeof(err->msg) - 1; c++)
            err->msg[used++] = *c;
    err->msg[used] = '\0';
    return st;
}

void pdl_error_clear(pdl_error_t *err)
{
    if (err == NULL)
        return;
    err->status = PDL_OK;
    err->msg[0] = '\0';
}
