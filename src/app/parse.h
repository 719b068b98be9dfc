/*
 * parse.h -- numbers from a program's command line, checked one way in every program (node, router,
 * pdlink run/plan/bench).
 *
 * A value is accepted only when all of it is a base-10 integer inside [lo, hi]: "12abc", "", " 7",
 * "99999999999999999999" (overflow) and a value outside the range are refused. The error names the flag
 * and the value, so main() can print it as it is: "--port '70000': expected an integer in [0, 65535]".
 */
#ifndef PDL_APP_PARSE_H
#define PDL_APP_PARSE_H

#include "pdlink/status.h"

/* Parse `s` for `flag` into *out_p (set only on success). Returns PDL_OK or PDL_ERR_INVALID with err
 * filled (err may be NULL). lo <= hi is the caller's duty. */
pdl_status_t pdl_parse_long(const char *flag, const char *s, long lo, long hi, long *out_p, pdl_error_t *err);

/* The same for an int. */
pdl_status_t pdl_parse_int(const char *flag, const char *s, int lo, int hi, int *out_p, pdl_error_t *err);

#endif /* PDL_APP_PARSE_H */
