/* buf.c -- see buf.h. */
#include "app/buf.h"

#include <stdint.h>
#include <stdlib.h>

bool pdl_buf_reserve(char **buf_p, size_t *cap_p, size_t need, size_t first_cap)
{
    if (need <= *cap_p)
        return true;
    size_t cap = *cap_p ? *cap_p : first_cap ? first_cap : 1;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return false;
        cap *= 2;
    }
    char *p = realloc(*buf_p, cap);
    if (p == NULL)
        return false;
    *buf_p = p;
    *cap_p = cap;
    return true;
}
