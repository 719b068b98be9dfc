/*
 * test_router_apikey.c -- pdlink-router hands its --api-key only to workers it verified (router/apikey.h,
 * docs/security.md#the-routers---api-key): fake vLLM workers (fake_vllm.py) record the headers of every
 * leg, a rogue prefill registers on another loopback address (127.0.0.2) like any worker in compatible
 * mode, and round robin sends it its share of the requests.
 *
 *   - compatible mode, --api-key alone: no worker's leg (prefill or decode) carries the key;
 *     the router logs each worker once, with the reason, however often it pings;
 *   - --api-key-hosts 127.0.0.1/32: the listed workers get "Authorization: Bearer KEY" on every leg, the
 *     rogue on 127.0.0.2 on none, and /workers says which is which;
 *   - the verdict follows the host libcurl connects to (user info, names, IPv6, normalised IPv4), and a
 *     bad --api-key-hosts is a usage error (exit 2) naming the flag.
 *
 * Authenticated mode (every registration came from a key holder, so every worker gets the key) runs
 * with real nodes in test_auth_cluster.sh.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "router/apikey.h"
#include "router_harness.h"

#define KEY "test-router-key-4242"
#define NREQ 6

typedef struct cluster {
    rh_router_t r;
    rh_fake_t p, rogue, d;
} cluster_t;

/* Router (round robin, READ) with the extra flags, a prefill and a decode on 127.0.0.1 and a rogue
 * prefill on 127.0.0.2; returns once all three are listed. */
static void cluster_start(cluster_t *s, const char *extra_flag, const char *extra_value)
{
    memset(s, 0, sizeof(*s));
    assert_true(rh_router_start(&s->r, "--policy", "round_robin", "--api-key", KEY, extra_flag, extra_value, NULL));
    assert_true(rh_fake_start(&s->p, "P", s->r.disc, "--mode", "READ", NULL));
    assert_true(rh_fake_start(&s->rogue, "P", s->r.disc, "--mode", "READ", "--host", "127.0.0.2", NULL));
    assert_true(rh_fake_start(&s->d, "D", s->r.disc, "--mode", "READ", "--handshake-port", "7301", "--notify-port",
                              "62005", NULL));
    long long end = rh_now_ms() + RH_DEADLINE_MS;
    while (rh_now_ms() < end && (rh_nworkers(s->r.http, "prefill") != 2 || rh_nworkers(s->r.http, "decode") != 1))
        rh_msleep(20);
    assert_int_equal(rh_nworkers(s->r.http, "prefill"), 2);
    assert_int_equal(rh_nworkers(s->r.http, "decode"), 1);
}

static void cluster_stop(cluster_t *s)
{
    assert_int_equal(rh_stop(s->r.pid, SIGTERM), 0);
    rh_stop(s->p.pid, SIGKILL);
    rh_stop(s->rogue.pid, SIGKILL);
    rh_stop(s->d.pid, SIGKILL);
}

/* POST (body) or GET (NULL) to host:port with the router's own key; the status, and the body into *r_p
 * (may be NULL). */
static long call_at(const char *host, int port, const char *path, const char *body, rh_resp_t *r_p)
{
    char url[256];
    snprintf(url, sizeof(url), "http://%s:%d%s", host, port, path);
    rh_resp_t r = {0};
    r.body = calloc(1, 1);
    CURL *e = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "Authorization: Bearer " KEY);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 60000L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, rh_on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    if (body != NULL)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    long status = 0;
    if (curl_easy_perform(e) == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    if (r_p != NULL)
        *r_p = r;
    else
        rh_resp_free(&r);
    return status;
}

static long client_call(int port, const char *path, const char *body)
{
    return call_at("127.0.0.1", port, path, body, NULL);
}

static void send_requests(const cluster_t *s)
{
    for (int i = 0; i < NREQ; i++)
        assert_int_equal(client_call(s->r.http, "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":2}"), 200);
}

/* How many legs a worker recorded, and how many of them carried "Authorization: Bearer KEY" or any
 * other Authorization header. */
static void legs_of(const rh_fake_t *f, const char *host, size_t *n_p, size_t *with_key_p, size_t *other_auth_p)
{
    rh_resp_t r;
    json_t *a = call_at(host, f->port, "/_requests", NULL, &r) == 200 ? json_loadb(r.body, r.len, 0, NULL) : NULL, *rec;
    rh_resp_free(&r);
    assert_true(json_is_array(a));
    size_t i;
    *n_p = *with_key_p = *other_auth_p = 0;
    json_array_foreach(a, i, rec)
    {
        const char *auth = json_string_value(json_object_get(json_object_get(rec, "headers"), "authorization"));
        (*n_p)++;
        if (auth != NULL && strcmp(auth, "Bearer " KEY) == 0)
            (*with_key_p)++;
        else if (auth != NULL)
            (*other_auth_p)++;
    }
    json_decref(a);
}

/* Occurrences of needle in the router's log. */
static int log_count(const rh_router_t *r, const char *needle)
{
    FILE *f = fopen(r->log, "r");
    if (f == NULL)
        return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static void compatible_mode_sends_the_key_to_no_worker(void **state)
{
    (void)state;
    cluster_t s;
    cluster_start(&s, NULL, NULL);
    send_requests(&s);
    size_t n, key, other;
    legs_of(&s.rogue, "127.0.0.2", &n, &key, &other);
    assert_int_equal(n, NREQ / 2); /* the rogue was served its share: it did see the requests */
    assert_int_equal(key, 0);
    assert_int_equal(other, 0);
    legs_of(&s.p, "127.0.0.1", &n, &key, &other);
    assert_int_equal(n, NREQ / 2);
    assert_int_equal(key + other, 0);
    legs_of(&s.d, "127.0.0.1", &n, &key, &other);
    assert_int_equal(n, NREQ);
    assert_int_equal(key + other, 0);
    /* Each worker logged once (pings every 100 ms refresh the entries, they do not log again). */
    rh_msleep(500);
    assert_int_equal(log_count(&s.r, "--api-key is sent to no worker"), 1);
    assert_int_equal(log_count(&s.r, "without the router's --api-key: compatible mode and no --api-key-hosts"), 3);
    assert_int_equal(log_count(&s.r, KEY), 0); /* the key itself is never logged */
    cluster_stop(&s);
}

static bool worker_api_key(int http_port, const char *role, int port, const char *host)
{
    json_t *w = rh_get_json(http_port, "/workers");
    char addr[64];
    snprintf(addr, sizeof(addr), "%s:%d", host, port);
    json_t *e = rh_worker(w, role, addr);
    bool v = e != NULL && json_is_true(json_object_get(e, "api_key"));
    json_decref(w);
    return v;
}

static void allow_listed_workers_get_the_key_and_the_rogue_does_not(void **state)
{
    (void)state;
    cluster_t s;
    cluster_start(&s, "--api-key-hosts", "127.0.0.1/32");
    send_requests(&s);
    size_t n, key, other;
    legs_of(&s.rogue, "127.0.0.2", &n, &key, &other);
    assert_int_equal(n, NREQ / 2);
    assert_int_equal(key, 0);
    assert_int_equal(other, 0);
    legs_of(&s.p, "127.0.0.1", &n, &key, &other);
    assert_int_equal(n, NREQ / 2);
    assert_int_equal(key, NREQ / 2);
    legs_of(&s.d, "127.0.0.1", &n, &key, &other);
    assert_int_equal(n, NREQ);
    assert_int_equal(key, NREQ);
    assert_true(worker_api_key(s.r.http, "prefill", s.p.port, "127.0.0.1"));
    assert_true(worker_api_key(s.r.http, "decode", s.d.port, "127.0.0.1"));
    assert_false(worker_api_key(s.r.http, "prefill", s.rogue.port, "127.0.0.2"));
    rh_msleep(500);
    char rogue_line[160];
    snprintf(rogue_line, sizeof(rogue_line),
             "instance 127.0.0.2:%d (from 127.0.0.1) gets its requests without the router's --api-key: its host "
             "127.0.0.2 is not a numeric address in --api-key-hosts",
             s.rogue.port);
    assert_int_equal(log_count(&s.r, rogue_line), 1);
    assert_int_equal(log_count(&s.r, "without the router's --api-key"), 1);
    assert_int_equal(log_count(&s.r, "--api-key is sent to no worker"), 0);
    cluster_stop(&s);
}

static void verdict_follows_the_host_curl_connects_to(void **state)
{
    (void)state;
    pdl_rt_apikey_t k;
    pdl_error_t err;
    pdl_error_clear(&err);
    assert_int_equal(pdl_rt_apikey_init(&k, KEY, "127.0.0.1/32, ::1", false, &err), PDL_OK);
    char why[200];
    assert_true(pdl_rt_apikey_verify(&k, "127.0.0.1:8000", why, sizeof(why)));
    assert_true(pdl_rt_apikey_verify(&k, "[::1]:8000", why, sizeof(why)));
    assert_true(pdl_rt_apikey_verify(&k, "127.1:8000", why, sizeof(why))); /* curl connects to 127.0.0.1 */
    /* The text starts with a listed address, but curl would connect to 127.0.0.2 (the rest is user info). */
    assert_false(pdl_rt_apikey_verify(&k, "127.0.0.1:8000@127.0.0.2:8000", why, sizeof(why)));
    assert_string_equal(why, "its host 127.0.0.2 is not a numeric address in --api-key-hosts");
    assert_false(pdl_rt_apikey_verify(&k, "localhost:8000", why, sizeof(why))); /* names never match */
    assert_false(pdl_rt_apikey_verify(&k, "127.0.0.1.:8000", why, sizeof(why)));
    assert_false(pdl_rt_apikey_verify(&k, "[::2]:8000", why, sizeof(why)));
    assert_string_equal(pdl_rt_apikey_header(&k, true), "Authorization: Bearer " KEY);
    assert_null(pdl_rt_apikey_header(&k, false));
    pdl_rt_apikey_free(&k);
    /* Authenticated mode: every registration came from a key holder. No key: nothing to hand out. */
    assert_int_equal(pdl_rt_apikey_init(&k, KEY, "", true, &err), PDL_OK);
    assert_true(pdl_rt_apikey_verify(&k, "10.9.9.9:8000", why, sizeof(why)));
    pdl_rt_apikey_free(&k);
    assert_int_equal(pdl_rt_apikey_init(&k, "", "", false, &err), PDL_OK);
    assert_true(pdl_rt_apikey_verify(&k, "10.9.9.9:8000", why, sizeof(why)));
    assert_null(pdl_rt_apikey_header(&k, true));
    pdl_rt_apikey_free(&k);
}

static void bad_api_key_hosts_is_a_usage_error(void **state)
{
    (void)state;
    static const char *const bad[] = {"not-a-host", "10.0.0.0/33", ","};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char bin[600], log[280];
        snprintf(bin, sizeof(bin), "%s/pdlink-router", rh_env("PDLINK_BUILD_DIR", "."));
        snprintf(log, sizeof(log), "%s/bad-hosts%zu.log", rh_dir(), i);
        char *argv[] = {bin, "--vllm-pd-disaggregation", "--vllm-discovery-address", "127.0.0.1:0", "--port", "0",
                        "--api-key", KEY, "--api-key-hosts", (char *)bad[i], NULL};
        pid_t pid = rh_spawn(argv, log);
        assert_true(pid > 0);
        assert_int_equal(rh_stop(pid, 0), 2); /* signal 0: only wait for it */
        rh_router_t r = {0};
        snprintf(r.log, sizeof(r.log), "%s", log);
        char line[128]; /* the error names the flag and the entry; --help follows it */
        snprintf(line, sizeof(line), "pdlink-router: --api-key-hosts: '%s'", bad[i]);
        assert_int_equal(log_count(&r, line), 1);
        assert_int_equal(log_count(&r, "trusted_hosts"), 0); /* the flag's name, not the connector key's */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(compatible_mode_sends_the_key_to_no_worker),
        cmocka_unit_test(allow_listed_workers_get_the_key_and_the_rogue_does_not),
        cmocka_unit_test(verdict_follows_the_host_curl_connects_to),
        cmocka_unit_test(bad_api_key_hosts_is_a_usage_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
