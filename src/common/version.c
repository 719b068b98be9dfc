/*
 * version.c -- the version of the running libpdlink (pdlink/version.h), which a program can compare
 * with the PDL_VERSION_* macros it was compiled with.
 */
#include "pdlink/version.h"

const char *pdl_version_string(void)
{
    return PDL_VERSION_STRING;
}

int pdl_version_number(void)
{
    return PDL_VERSION_NUMBER;
}
