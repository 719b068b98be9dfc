/*
 * apikey.c -- the router's verdict on which workers get its --api-key (see apikey.h for the rules).
 *
 * The host is taken with libcurl's URL parser from the same "http://<http_address>" base the legs are
 * built from, not by splitting the text at a colon: an http_address of "10.0.0.5:8000@evil.example"
 * starts with a listed address, yet libcurl would connect to evil.example (the rest is user info).
 * Asking the parser that the legs' URLs go through makes the checked host the one connected to.
 */
#include "router/apikey.h"

#include <stdio.h>
#include <string.h>

#include <curl/curl.h>

#include "common/log.h"

pdl_status_t pdl_rt_apikey_parse_hosts(const char *text, pdl_cidrs_t *out, pdl_error_t *err)
{
    pdl_error_t inner;
    pdl_error_clear(&inner);
    pdl_status_t st = pdl__cidrs_parse(text ? text : "", out, &inner);
    if (st == PDL_OK)
        return PDL_OK;
    /* The list parser names the connector's key, which is the same form; the operator typed this flag. */
    const char *msg = inner.msg, *own = "trusted_hosts: ";
    if (strncmp(msg, own, strlen(own)) == 0)
        msg += strlen(own);
    return pdl_error_set(err, st, "--api-key-hosts: %s", msg);
}

pdl_status_t pdl_rt_apikey_init(pdl_rt_apikey_t *k, const char *api_key, const char *hosts_text, bool authenticated,
                                pdl_error_t *err)
{
    memset(k, 0, sizeof(*k));
    k->authenticated = authenticated;
    pdl_status_t st = pdl_rt_apikey_parse_hosts(hosts_text, &k->hosts, err);
    if (st != PDL_OK)
        return st;
    if (api_key == NULL || api_key[0] == '\0')
        return PDL_OK;
    snprintf(k->header, sizeof(k->header), "Authorization: Bearer %s", api_key);
    if (!authenticated && k->hosts.n == 0)
        pdl_warn("--api-key is sent to no worker: in compatible mode a registration proves nothing, so only "
                 "workers on the hosts of --api-key-hosts CIDR[,CIDR] get it, or every worker in authenticated "
                 "mode (--auth-key-file); nodes started with --api-key will answer the router's legs with 401");
    return PDL_OK;
}

void pdl_rt_apikey_free(pdl_rt_apikey_t *k)
{
    if (k == NULL)
        return;
    pdl__cidrs_free(&k->hosts);
    memset(k, 0, sizeof(*k));
}

/* The host libcurl connects to for "http://<http_address>/", brackets of an IPv6 literal removed, into
 * out[cap]; false when the URL does not parse or the host does not fit. */
static bool url_host(const char *http_address, char *out, size_t cap)
{
    char url[1024];
    int n = snprintf(url, sizeof(url), "http://%s/", http_address);
    if (n < 0 || (size_t)n >= sizeof(url))
        return false;
    CURLU *u = curl_url();
    char *host = NULL;
    bool ok = u != NULL && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK && host != NULL;
    if (ok) {
        const char *h = host;
        size_t hl = strlen(h);
        if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
            h++;
            hl -= 2;
        }
        ok = hl > 0 && hl < cap;
        if (ok) {
            memcpy(out, h, hl);
            out[hl] = '\0';
        }
    }
    curl_free(host);
    curl_url_cleanup(u);
    return ok;
}

bool pdl_rt_apikey_verify(const pdl_rt_apikey_t *k, const char *http_address, char *why, size_t cap)
{
    if (k->header[0] == '\0' || k->authenticated)
        return true;
    char host[256];
    const char *reason = NULL;
    if (k->hosts.n == 0)
        reason = "compatible mode and no --api-key-hosts";
    else if (!url_host(http_address, host, sizeof(host)))
        reason = "its http_address is not a URL host libcurl accepts";
    else if (pdl__cidrs_match_text(&k->hosts, host))
        return true;
    if (why != NULL && cap > 0) {
        if (reason != NULL)
            snprintf(why, cap, "%s", reason);
        else
            snprintf(why, cap, "its host %s is not a numeric address in --api-key-hosts", host);
    }
    return false;
}

const char *pdl_rt_apikey_header(const pdl_rt_apikey_t *k, bool verified)
{
    return verified && k->header[0] != '\0' ? k->header : NULL;
}
