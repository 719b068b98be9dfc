/*
 * version.c -- the version of the running libpdlink (pdlink/version.h), which a program can compare
 * with the PDLINK_VERSION_* macros it was compiled with.
 */
#include "pdlink/version.h"

const char *pdl_version_string(void)
{
    return PDLINK_VERSION_STRING;
}

int pdl_version_number(void)
{
    return PDLINK_VERSION_NUMBER;
}
