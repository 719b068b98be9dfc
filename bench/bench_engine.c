/*
 * bench_engine.c -- `pdlink bench`: block size × batch size sweeps of the transfer engine between two
 * processes, each row printed next to the ceiling measured in the same run with the same resources.
 *
 * Method (nixlbench / MoRI bench_engine style): the initiator forks the target before any thread
 * exists (or, with --serve/--connect, the two run as separate commands, e.g. in two network
 * namespaces), and both create an engine with --threads workers. For each point the batch is `batch`
 * descriptors of `block` bytes, local blocks in order and remote blocks in reverse order, so no two
 * descriptors merge (--contiguous lets them). A point is a series of alternating pairs (bench/pairs.h):
 * an engine loop A (warm-up batches right before it, since memory idle for a few seconds is several
 * times slower here, docs/benchmarks.md#this-machine; then a whole-loop timer over post + wait per batch, stop-and-wait
 * like nixlbench), then at once a ceiling loop B with the same resources: memcpy of the same bytes with
 * the same number of threads into the same destination (shm), or a plain TCP stream of the same bytes
 * into the same local buffer over warm connections, one per engine connection (tcp). The figure is the
 * median of the per-pair ratios. Per-batch latencies over all A loops give median and p99. After the
 * first A loop the data is validated (READ: every byte in the initiator; WRITE: every byte checked by
 * the target).
 *
 * --auth-compare KEYFILE (tcp): the cost of authenticated mode (docs/security.md). Both sides also
 * create a second engine holding the cluster key, over the same memory; pair member A is the engine
 * loop over the authenticated session and B the same loop over the open one (instead of a ceiling), so
 * the ratio is on/off with the method above. The challenge runs once per connection, when the session
 * opens, so the loops measure what stays: the same frames on an authenticated connection.
 *
 * Control channel (socketpair, or TCP for --serve/--connect): the target sends its engine descriptor
 * and memory descriptor (with --auth-compare, then those of its authenticated engine), then answers commands {op, seed, len, ndesc}: 'F' fill [0, len) with the
 * pattern, 'V' verify ndesc descriptors that follow, 'Q' quit. Every answer is an int32 (0 = ok).
 */
#include "bench_engine.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "app/optab.h"
#include "ceiling.h"
#include "pairs.h"
#include "common/clock.h"
#include "pdlink/engine.h"
#include "pdlink/layout.h"
#include "common/log.h"
#include "pdlink/topo.h"

#define MAX_LIST 32
#define DEFAULT_CAP (256ull << 20)

typedef struct opts {
    pdl_backend_kind_t backend;
    pdl_op_t op;
    int op_i;          /* --op: index into bench_ops */
    bool connector;    /* --connector: pdl_cli_bench runs the connector benchmark instead */
    uint64_t blocks[MAX_LIST];
    int nblocks;
    uint64_t batches[MAX_LIST];
    int nbatches;
    int threads, qp, iters;
    int pairs;         /* --pairs: minimum alternating pairs per row */
    double max_spread; /* --max-spread: above it a row is "unstable" */
    uint64_t cap;
    bool contiguous, same_block, hetero, strict;
    const char *json, *plot, *host, *serve, *connect, *port_file;
    const char *tcp_cc; /* --tcp-congestion (NULL = the engine's choice) */
    const char *auth_compare; /* --auth-compare KEYFILE: A = authenticated session, B = open one */
} opts_t;

typedef struct row {
    char label[32];
    uint64_t block, batch, bytes;
    size_t descs;
    int iters, per;                                   /* timed batches in all, per engine loop */
    double gbps, lat_med_us, lat_p99_us, ceil_gbps, ratio; /* medians over the pairs */
    pdl_pairs_summary_t sum;                          /* min-max, spread, pairs, verdict */
    bool valid;
} row_t;

/* ---------------------------------------------------------------- data pattern */

static inline uint64_t mix(uint64_t seed, uint64_t word)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + word + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The byte at offset `off` of a buffer filled with `seed` (8-byte words, little-endian). */
static inline uint8_t pat_byte(uint64_t seed, uint64_t off) { return (uint8_t)(mix(seed, off >> 3) >> ((off & 7) * 8)); }

static void fill_pattern(uint8_t *p, uint64_t len, uint64_t seed)
{
    uint64_t *w = (uint64_t *)p;
    for (uint64_t i = 0; i < len / 8; i++)
        w[i] = mix(seed, i);
    for (uint64_t o = len & ~7ull; o < len; o++)
        p[o] = pat_byte(seed, o);
}

/* true if p[0, len) equals the pattern of `seed` starting at offset `off`. */
static bool check_pattern(const uint8_t *p, uint64_t len, uint64_t seed, uint64_t off)
{
    uint64_t j = 0;
    if ((off & 7) == 0 && ((uintptr_t)p & 7) == 0) {
        const uint64_t *w = (const uint64_t *)p;
        for (; j + 8 <= len; j += 8)
            if (w[j / 8] != mix(seed, (off + j) >> 3))
                return false;
    }
    for (; j < len; j++)
        if (p[j] != pat_byte(seed, off + j))
            return false;
    return true;
}

/* ---------------------------------------------------------------- control channel */

typedef struct cmd {
    char op;
    uint64_t seed, len;
    uint32_t ndesc;
} cmd_t;

static int xio(int fd, void *b, size_t n, bool wr)
{
    uint8_t *p = b;
    while (n) {
        ssize_t r = wr ? write(fd, p, n) : read(fd, p, n);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int send_blob(int fd, const void *b, uint32_t n)
{
    return xio(fd, &n, 4, true) || xio(fd, (void *)b, n, true) ? -1 : 0;
}

static int recv_blob(int fd, uint8_t **b, uint32_t *n)
{
    if (xio(fd, n, 4, false) || *n > (1u << 20))
        return -1;
    *b = malloc(*n ? *n : 1);
    return *b == NULL ? -1 : xio(fd, *b, *n, false);
}

static int target_run(int fd, const opts_t *o, const char *host, uint64_t region)
{
    pdl_engine_config_t cfg = {"bench-target", host, 0, o->backend, o->qp, o->threads, o->tcp_cc, false, NULL, NULL};
    pdl_engine_t *e = NULL;
    pdl_mem_t *m = NULL;
    pdl_error_t err;
    if (pdl_engine_create(&cfg, &e, &err) != PDL_OK || pdl_engine_alloc_mem(e, region, &m, &err) != PDL_OK) {
        fprintf(stderr, "pdlink bench target: %s\n", err.msg);
        return 2;
    }
    pdl_bytes_t ed = {0}, md = {0};
    pdl_engine_pack(e, &ed, NULL);
    pdl_mem_pack(m, &md, NULL);
    int rc = send_blob(fd, ed.data, (uint32_t)ed.len) || send_blob(fd, md.data, (uint32_t)md.len) ? 2 : 0;
    pdl_bytes_free(&ed);
    pdl_bytes_free(&md);
    uint8_t *p = pdl_mem_ptr(m);
    /* --auth-compare: the same memory behind a second engine that holds the cluster key. */
    pdl_auth_t *auth = NULL;
    pdl_engine_t *ea = NULL;
    pdl_mem_t *ma = NULL;
    if (rc == 0 && o->auth_compare) {
        pdl_engine_config_t acfg = cfg;
        acfg.key = "bench-target-auth";
        if (pdl_auth_load(o->auth_compare, &auth, &err) != PDL_OK ||
            (acfg.auth = auth, pdl_engine_create(&acfg, &ea, &err)) != PDL_OK ||
            pdl_engine_register_mem(ea, p, region, &ma, &err) != PDL_OK) {
            fprintf(stderr, "pdlink bench target: %s\n", err.msg);
            rc = 2;
        } else {
            pdl_engine_pack(ea, &ed, NULL);
            pdl_mem_pack(ma, &md, NULL);
            rc = send_blob(fd, ed.data, (uint32_t)ed.len) || send_blob(fd, md.data, (uint32_t)md.len) ? 2 : 0;
            pdl_bytes_free(&ed);
            pdl_bytes_free(&md);
        }
    }
    cmd_t c;
    while (rc == 0 && xio(fd, &c, sizeof(c), false) == 0 && c.op != 'Q') {
        int32_t res = 0;
        if (c.op == 'F') {
            if (c.len <= region)
                fill_pattern(p, c.len, c.seed);
            else
                res = -1;
        } else if (c.op == 'V') {
            pdl_desc_t *d = malloc((size_t)c.ndesc * sizeof(*d) + 1);
            if (d == NULL || xio(fd, d, (size_t)c.ndesc * sizeof(*d), false) != 0) {
                free(d);
                break;
            }
            for (uint32_t i = 0; i < c.ndesc && res == 0; i++)
                if (d[i].remote_off > region || d[i].len > region - d[i].remote_off ||
                    !check_pattern(p + d[i].remote_off, d[i].len, c.seed, d[i].local_off))
                    res = (int32_t)i + 1;
            free(d);
        } else {
            res = -2;
        }
        if (xio(fd, &res, sizeof(res), true) != 0)
            break;
    }
    if (ma)
        pdl_engine_deregister_mem(ea, ma);
    pdl_engine_destroy(ea);
    pdl_auth_free(auth);
    pdl_engine_deregister_mem(e, m);
    pdl_engine_destroy(e);
    return rc;
}

static int32_t ctl_cmd(int fd, char op, uint64_t seed, uint64_t len, const pdl_desc_t *d, uint32_t n)
{
    cmd_t c;
    memset(&c, 0, sizeof(c));
    c.op = op;
    c.seed = seed;
    c.len = len;
    c.ndesc = n;
    if (xio(fd, &c, sizeof(c), true) != 0 || (n && xio(fd, (void *)d, n * sizeof(*d), true) != 0))
        return -100;
    if (op == 'Q')
        return 0;
    int32_t r;
    return xio(fd, &r, sizeof(r), false) ? -100 : r;
}

/* ---------------------------------------------------------------- option parsing */

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024ull * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B')
        end++;
    if (*end == 'B')
        end++;
    if (*end != '\0' || v == 0 || v > (UINT64_MAX / mul))
        return -1;
    *out = v * mul;
    return 0;
}

static int parse_list(const char *s, uint64_t *out, int *n, bool sizes)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_LIST)
            return -1;
        uint64_t v;
        if (sizes) {
            if (parse_size(t, &v) != 0)
                return -1;
        } else {
            char *end;
            v = strtoull(t, &end, 10);
            if (*end || v == 0 || v > 65536)
                return -1;
        }
        out[(*n)++] = v;
    }
    return *n > 0 ? 0 : -1;
}

static void fmt_size(uint64_t v, char *buf, size_t cap)
{
    if (v % (1ull << 30) == 0)
        snprintf(buf, cap, "%" PRIu64 "G", v >> 30);
    else if (v % (1ull << 20) == 0)
        snprintf(buf, cap, "%" PRIu64 "M", v >> 20);
    else if (v % 1024 == 0)
        snprintf(buf, cap, "%" PRIu64 "K", v >> 10);
    else
        snprintf(buf, cap, "%" PRIu64, v);
}

/* The odd values, set through PDL_OPT_CALL rows: a backend name, sizes with K/M/G suffixes, size lists. */
static pdl_status_t set_backend(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                pdl_error_t *err)
{
    (void)row, (void)done_p;
    int b = pdl_backend_parse(v);
    if (b < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected shm, tcp or ucx", flag, v);
    ((opts_t *)opts)->backend = (pdl_backend_kind_t)b;
    return PDL_OK;
}

static pdl_status_t set_block_sizes(void *opts, const pdl_optdef_t *row, const char *flag, const char *v,
                                    bool *done_p, pdl_error_t *err)
{
    (void)row, (void)done_p;
    opts_t *o = opts;
    if (parse_list(v, o->blocks, &o->nblocks, true) != 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected sizes like 4K,1M (at most %d)", flag, v, MAX_LIST);
    for (int i = 0; i < o->nblocks; i++)
        if (o->blocks[i] % 8 != 0)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': block size %" PRIu64 " is not a multiple of 8", flag,
                                 v, o->blocks[i]);
    return PDL_OK;
}

static pdl_status_t set_batch_sizes(void *opts, const pdl_optdef_t *row, const char *flag, const char *v,
                                    bool *done_p, pdl_error_t *err)
{
    (void)row, (void)done_p;
    opts_t *o = opts;
    if (parse_list(v, o->batches, &o->nbatches, false) != 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected counts 1..65536 like 1,16,1024", flag, v);
    return PDL_OK;
}

static pdl_status_t set_cap(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                            pdl_error_t *err)
{
    (void)row, (void)done_p;
    if (parse_size(v, &((opts_t *)opts)->cap) != 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected a size like 256M", flag, v);
    return PDL_OK;
}

static const char *const bench_ops[] = {"read", "write", NULL};

#define BO(field) offsetof(opts_t, field)
static const pdl_optdef_t bench_rows[] = {
    {.name = "connector", .kind = PDL_OPT_FLAG, .off = BO(connector),
     .help = "the whole connector path instead (bench/bench_connector.c; `pdlink bench --connector --help`)"},
    {.name = "backend", .kind = PDL_OPT_CALL, .metavar = "shm|tcp|ucx", .def = "shm", .set = set_backend,
     .help = "backend (ucx honours UCX_TLS and the other UCX_*)"},
    {.name = "op", .kind = PDL_OPT_CHOICE, .metavar = "read|write", .def = "read", .off = BO(op_i), .choices = bench_ops,
     .help = "one-sided READ (remote -> local) or WRITE"},
    {.name = "block-sizes", .kind = PDL_OPT_CALL, .metavar = "LIST", .def = "4K,16K,64K,256K,1M,4M,16M,64M",
     .set = set_block_sizes, .help = "block sizes, multiples of 8 with K, M or G"},
    {.name = "batch-sizes", .kind = PDL_OPT_CALL, .metavar = "LIST", .def = "1,4,16,64,256,1024",
     .set = set_batch_sizes, .help = "descriptors per batch"},
    {.name = "threads", .kind = PDL_OPT_INT, .metavar = "N", .def = "2", .off = BO(threads), .lo = 1, .hi = 64,
     .help = "engine workers on both sides = memcpy ceiling threads"},
    {.name = "qp", .kind = PDL_OPT_INT, .metavar = "N", .def = "1", .off = BO(qp), .lo = 1, .hi = 64,
     .help = "tcp connections per session = ceiling streams"},
    {.name = "iters", .kind = PDL_OPT_INT, .metavar = "N", .off = BO(iters), .lo = 1, .hi = 1000000,
     .help = "timed batches per point over all engine loops (default: about 2 GB (shm) / 1 GB (tcp) per point, "
             "9..2001); each engine loop runs N / pairs of them (at least 2) after a tenth as warm-up (at least 1)"},
    {.name = "pairs", .kind = PDL_OPT_INT, .metavar = "N", .def = "5", .off = BO(pairs), .lo = PDL_PAIRS_MIN,
     .hi = PDL_PAIRS_MAX / 2,
     .help = "alternating (engine loop, ceiling loop) pairs per point; up to twice as many while the spread is too wide"},
    {.name = "max-spread", .kind = PDL_OPT_DOUBLE, .metavar = "X", .def = "0.25", .off = BO(max_spread), .dlo = 0,
     .dhi = 100, .flags = PDL_OPTF_LO_OPEN,
     .help = "a point whose spread of per-pair ratios is above X is 'unstable' (spread = (q3 - q1) / median)"},
    {.name = "strict", .kind = PDL_OPT_FLAG, .off = BO(strict),
     .help = "exit status 3 if a point is unstable or ABOVE CEILING"},
    {.name = "max-batch-bytes", .kind = PDL_OPT_CALL, .metavar = "SIZE", .def = "256M", .set = set_cap,
     .help = "skip points with block*batch above this"},
    {.name = "contiguous", .kind = PDL_OPT_FLAG, .off = BO(contiguous),
     .help = "remote blocks in order, so descriptors merge"},
    {.name = "same-block", .kind = PDL_OPT_FLAG, .off = BO(same_block),
     .help = "every descriptor of a batch names block 0 on both sides: one block re-read N times, what "
             "ucx_perftest -O N measures (its footprint is one block, cache-resident); the memcpy ceiling copies "
             "that block N times too"},
    {.name = "no-hetero", .kind = PDL_OPT_FLAG_OFF, .off = BO(hetero),
     .help = "skip the heterogeneous-TP rows (P4/D8, P8/D4 vs P4/D4)"},
    {.name = "host", .kind = PDL_OPT_STRING, .metavar = "ADDR", .def = "127.0.0.1", .off = BO(host),
     .help = "address the engines (tcp) and the tcp ceiling use"},
    {.name = "json", .kind = PDL_OPT_STRING, .metavar = "FILE", .off = BO(json), .help = "write the rows as JSON"},
    {.name = "plot", .kind = PDL_OPT_STRING, .metavar = "FILE.svg", .off = BO(plot),
     .help = "draw GB/s vs block size, one line per batch size, ceilings dashed"},
    {.name = "serve", .kind = PDL_OPT_STRING, .metavar = "ADDR:PORT", .off = BO(serve),
     .help = "be the target only: listen for one initiator on ADDR:PORT (0 = any)"},
    {.name = "port-file", .kind = PDL_OPT_STRING, .metavar = "FILE", .off = BO(port_file),
     .help = "with --serve: write the bound control port to FILE"},
    {.name = "connect", .kind = PDL_OPT_STRING, .metavar = "ADDR:PORT", .off = BO(connect),
     .help = "be the initiator of a target started with --serve"},
    {.name = "tcp-congestion", .kind = PDL_OPT_STRING, .metavar = "NAME", .off = BO(tcp_cc),
     .help = "congestion control of the engines' data sockets (default: the engine's choice, cubic else reno; "
             "'system' = the system default); the ceiling is the best of the system default and this one"},
    {.name = "auth-compare", .kind = PDL_OPT_STRING, .metavar = "KEYFILE", .off = BO(auth_compare),
     .help = "tcp: authenticated mode's cost -- each point alternates a session of engines holding the key in "
             "KEYFILE (A) with an open one (B) over the same memory, instead of the ceiling: ratio = auth on / off"},
    {.name = "help", .kind = PDL_OPT_HELP, .help = "this text"},
    {0},
};
#undef BO

static void bench_help_tail(FILE *f)
{
    fprintf(f,
            "\nMethod: per point, engine loop and ceiling loop alternate over the same bytes (A B A B ...);\n"
            "ratio = median of the per-pair ratios A/B, with their min-max; GB/s and ceiling = medians.\n"
            "A point whose spread is too wide prints 'unstable' and the spread instead of a ratio; a median\n"
            "ratio above 1.05 is flagged 'ABOVE CEILING' (a ceiling is an upper bound: the ceiling or the\n"
            "measurement is wrong there).\n"
            "Columns: block, batch, descriptors after merge, GB/s (10^9 B/s, whole-loop timer), latency per\n"
            "batch median and p99 (us), the ceiling measured in the same run with the same threads and\n"
            "bytes, the ratio, its min-max, the pairs and the verdict.\n"
            "Exit status: 0 ok, 1 a data validation failed, 2 usage or set-up error, 3 (--strict only) a\n"
            "point unstable or above its ceiling.\n");
}

static const pdl_optab_t bench_table = {
    .prog = "pdlink bench",
    .usage = "usage: pdlink bench [options]\n"
             "       pdlink bench --connector [options]   (the whole connector path; --connector --help)\n"
             "Measure the transfer engine between two processes against this machine's own ceilings.\n\n",
    .rows = bench_rows,
    .help_tail = bench_help_tail,
};

/* Returns 0 to run, -1 after --help, 2 on a usage error (printed). */
static int parse_opts(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->hetero = true; /* --no-hetero clears it */
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_optab_result_t r = pdl_optab_parse(&bench_table, o, argc, argv, NULL, &err);
    if (r == PDL_OPTAB_DONE)
        return -1;
    if (r == PDL_OPTAB_USAGE) {
        fprintf(stderr, "pdlink bench: %s\n", err.msg);
        return 2;
    }
    o->op = o->op_i == 1 ? PDL_OP_WRITE : PDL_OP_READ;
    if (o->auth_compare && o->backend != PDL_BACKEND_TCP) {
        fprintf(stderr, "pdlink bench: --auth-compare needs --backend tcp (the engine authenticated mode guards)\n");
        return 2;
    }
    if ((o->serve || o->connect) && o->backend != PDL_BACKEND_TCP) {
        fprintf(stderr, "pdlink bench: --serve/--connect need --backend tcp\n");
        return 2;
    }
    return 0;
}

/* ---------------------------------------------------------------- helpers */

static double now_s(void) { return (double)pdl__clock_now_ns() * 1e-9; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int split_hostport(const char *s, char *host, size_t cap, char *port, size_t pcap)
{
    const char *colon = strrchr(s, ':');
    if (colon == NULL || (size_t)(colon - s) >= cap)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    snprintf(port, pcap, "%s", colon + 1);
    return 0;
}

static int tcp_listen_accept(const char *addr, const char *port_file)
{
    char host[256], port[16];
    if (split_hostport(addr, host, sizeof(host), port, sizeof(port)) != 0) {
        fprintf(stderr, "pdlink bench: --serve '%s': expected ADDR:PORT\n", addr);
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0) {
        fprintf(stderr, "pdlink bench: cannot resolve %s\n", addr);
        return -1;
    }
    int lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (lfd < 0 || bind(lfd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(lfd, 1) != 0) {
        fprintf(stderr, "pdlink bench: listen on %s: %s\n", addr, strerror(errno));
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    getsockname(lfd, (struct sockaddr *)&ss, &sl);
    char pbuf[16];
    getnameinfo((struct sockaddr *)&ss, sl, NULL, 0, pbuf, sizeof(pbuf), NI_NUMERICSERV);
    if (port_file) {
        char tmp[1024];
        snprintf(tmp, sizeof(tmp), "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (f == NULL || fprintf(f, "%s\n", pbuf) < 0 || fclose(f) != 0 || rename(tmp, port_file) != 0) {
            fprintf(stderr, "pdlink bench: cannot write %s\n", port_file);
            close(lfd);
            return -1;
        }
    }
    fprintf(stderr, "pdlink bench: target waiting for an initiator on %s:%s\n", host, pbuf);
    int fd = accept(lfd, NULL, NULL);
    close(lfd);
    return fd;
}

static int tcp_connect_to(const char *addr)
{
    char host[256], port[16];
    if (split_hostport(addr, host, sizeof(host), port, sizeof(port)) != 0) {
        fprintf(stderr, "pdlink bench: --connect '%s': expected ADDR:PORT\n", addr);
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, port, &hints, &ai) != 0) {
        fprintf(stderr, "pdlink bench: cannot resolve %s\n", addr);
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        fprintf(stderr, "pdlink bench: connect to %s: %s\n", addr, strerror(errno));
        freeaddrinfo(ai);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    freeaddrinfo(ai);
    return fd;
}

/* ---------------------------------------------------------------- measuring */

typedef struct ctx {
    const opts_t *o;
    int fd;
    pdl_engine_t *e;
    pdl_mem_t *local;
    pdl_session_t *s;
    /* --auth-compare: the engine holding the key, the same local memory registered with it, its session */
    pdl_auth_t *auth;
    pdl_engine_t *ea;
    pdl_mem_t *local_a;
    pdl_session_t *sa;
    double *lat_b; /* latencies of the open session's loops (not reported) */
    uint8_t *src; /* the ceiling's other buffer (region bytes): memcpy source / stream source of a READ */
    uint64_t region;
    pdl_ceiling_memcpy_t *cm; /* memcpy ceiling, or NULL for a TCP stream ceiling */
    pdl_ceiling_tcp_t *tcp[2]; /* streams with the system default and with the engine's congestion control */
    uint64_t seed;
    int failures;
} ctx_t;

/* One engine loop (pair member A): `warm` untimed batches right before `per` timed ones; the latency of
 * each timed batch goes to lat[0, per). Returns GB/s of the whole timed loop, < 0 on a failed batch. */
static double engine_loop(ctx_t *c, pdl_session_t *s, const pdl_desc_t *d, size_t n, uint64_t bytes, int warm,
                          int per, double *lat, size_t *descs)
{
    const opts_t *o = c->o;
    pdl_error_t err;
    double t_start = 0;
    for (int i = -warm; i < per; i++) {
        if (i == 0)
            t_start = now_s(); /* start of the timed loop; warm-up ran right before it */
        double t0 = i >= 0 ? now_s() : 0;
        pdl_batch_t *b = NULL;
        pdl_status_t st = pdl_session_post(s, o->op, d, n, &b, &err);
        if (st == PDL_OK) {
            *descs = pdl_batch_num_descs(b);
            st = pdl_batch_wait(b, -1, &err);
            pdl_batch_free(b);
        }
        if (st != PDL_OK) {
            fprintf(stderr, "\npdlink bench: %s %s batch failed: %s\n", pdl_backend_name(o->backend),
                    o->op == PDL_OP_READ ? "read" : "write", err.msg);
            return -1;
        }
        if (i >= 0)
            lat[i] = now_s() - t0;
    }
    return (double)bytes * per / (now_s() - t_start) / 1e9;
}

/*
 * One ceiling loop (pair member B) with the same resources as the engine loop: the same bytes, the same
 * local buffer (the destination of a READ, the source of a WRITE), the same threads (memcpy) or one
 * warm stream per engine connection (tcp; the faster of the system-default and the engine's congestion
 * control). With reuse_block (--same-block) the memcpy ceiling copies that one block bytes/reuse_block
 * times, the batch's own footprint. Returns GB/s, < 0 on failure.
 */
static double ceiling_loop(ctx_t *c, uint64_t bytes, uint64_t reuse_block, int per)
{
    const opts_t *o = c->o;
    uint8_t *local = pdl_mem_ptr(c->local);
    uint8_t *dst = o->op == PDL_OP_READ ? local : c->src;
    const uint8_t *src = o->op == PDL_OP_READ ? c->src : local;
    if (c->cm != NULL && reuse_block > 0) /* --same-block: the batch's footprint, one block copied N times */
        return pdl_ceiling_memcpy_run(c->cm, dst, src, reuse_block, per * (int)(bytes / reuse_block));
    if (c->cm != NULL)
        return pdl_ceiling_memcpy_run(c->cm, dst, src, bytes, per);
    /* The stream cycles 1 MiB writes over the batch's bytes (at least one write per stream, so a 4 KiB
     * batch's stream reads a cache-resident 1 MiB) and moves at least 16 MiB: a shorter stream is
     * mostly its own start and would understate the bound. */
    uint64_t buf = bytes < (uint64_t)o->qp << 20 ? (uint64_t)o->qp << 20 : bytes;
    if (buf > c->region)
        buf = c->region;
    uint64_t total = bytes * (uint64_t)per < (16ull << 20) ? 16ull << 20 : bytes * (uint64_t)per;
    double best = -1;
    for (int k = 0; k < 2; k++)
        if (c->tcp[k] != NULL) {
            double g = pdl_ceiling_tcp_run(c->tcp[k], dst, src, buf, total, 1u << 20);
            if (g > best)
                best = g;
        }
    return best;
}

/*
 * Run one point: alternating pairs (engine loop A, ceiling loop B) over the same bytes, at least
 * o->pairs of them and up to twice as many while the spread is too wide; the data is validated after
 * the first engine loop, before a ceiling loop touches the local buffer. `d` is the batch.
 */
static int measure(ctx_t *c, const char *label, const pdl_desc_t *d, size_t n, uint64_t block, uint64_t batch,
                   row_t *row)
{
    const opts_t *o = c->o;
    uint64_t bytes = 0, remote_end = 0, local_end = 0;
    for (size_t i = 0; i < n; i++) {
        bytes += d[i].len;
        if (d[i].remote_off + d[i].len > remote_end)
            remote_end = d[i].remote_off + d[i].len;
        if (d[i].local_off + d[i].len > local_end)
            local_end = d[i].local_off + d[i].len;
    }
    uint64_t seed = ++c->seed;
    uint64_t reuse = o->same_block && strcmp(label, "sweep") == 0 ? block : 0; /* the hetero rows never reuse */
    uint8_t *local = pdl_mem_ptr(c->local);
    if (o->op == PDL_OP_READ) {
        if (ctl_cmd(c->fd, 'F', seed, remote_end, NULL, 0) != 0) {
            fprintf(stderr, "pdlink bench: target failed to fill its region\n");
            return -1;
        }
    } else {
        fill_pattern(local, local_end, seed);
    }
    int iters = o->iters;
    if (iters == 0) {
        double budget = pdl_ceiling_is_memcpy(pdl_backend_name(o->backend)) ? 2e9 : 1e9;
        double it = budget / (double)bytes;
        iters = it < 9 ? 9 : it > 2001 ? 2001 : (int)it;
    }
    int per = iters / o->pairs < 2 ? 2 : iters / o->pairs;
    int warm = per / 10 < 1 ? 1 : per / 10;
    int max_pairs = 2 * o->pairs > PDL_PAIRS_MAX ? PDL_PAIRS_MAX : 2 * o->pairs;
    /* One more loop's room at the end: the latencies of --auth-compare's B loops (scratch). */
    double *lat = malloc((size_t)per * (size_t)(max_pairs + 1) * sizeof(double));
    if (lat == NULL)
        return -1;
    c->lat_b = lat + (size_t)per * (size_t)max_pairs;
    size_t descs = 0;
    bool valid = true;
    pdl_pairs_t pairs;
    pdl_pairs_init(&pairs);
    pdl_pairs_summary_t sum;
    /* --auth-compare: B is the open session, not a bound, so no ratio is "above" it. */
    double above_tol = c->sa ? 1e9 : PDL_PAIRS_ABOVE_TOL;
    pdl_pairs_summarize(&pairs, o->max_spread, above_tol, &sum);
    int done = 0;
    while (done < o->pairs || (sum.verdict == PDL_PAIRS_UNSTABLE && done < max_pairs)) {
        double g = engine_loop(c, c->sa ? c->sa : c->s, d, n, bytes, warm, per, lat + (size_t)done * (size_t)per,
                               &descs);
        if (g < 0) {
            free(lat);
            return -1;
        }
        if (done == 0) {
            if (o->op == PDL_OP_READ) {
                for (size_t i = 0; i < n && valid; i++)
                    valid = check_pattern(local + d[i].local_off, d[i].len, seed, d[i].remote_off);
            } else {
                valid = ctl_cmd(c->fd, 'V', seed, 0, d, (uint32_t)n) == 0;
            }
        }
        size_t descs_b = 0;
        double ceil = c->sa ? engine_loop(c, c->s, d, n, bytes, warm, per, c->lat_b, &descs_b) : ceiling_loop(c, bytes, reuse, per);
        if (pdl_pairs_add(&pairs, g, ceil) != 0) {
            fprintf(stderr, "\npdlink bench: the ceiling loop failed (%.3f GB/s)\n", ceil);
            free(lat);
            return -1;
        }
        done++;
        pdl_pairs_summarize(&pairs, o->max_spread, above_tol, &sum);
    }
    int timed = per * done;
    qsort(lat, (size_t)timed, sizeof(double), cmp_double);
    row->lat_med_us = lat[timed / 2] * 1e6;
    row->lat_p99_us = lat[(size_t)((timed - 1) * 0.99)] * 1e6;
    free(lat);
    if (!valid)
        c->failures++;
    snprintf(row->label, sizeof(row->label), "%s", label);
    row->block = block;
    row->batch = batch;
    row->bytes = bytes;
    row->descs = descs;
    row->iters = timed;
    row->per = per;
    row->gbps = sum.measured_median;
    row->ceil_gbps = sum.ceiling_median;
    row->ratio = sum.ratio_median;
    row->sum = sum;
    row->valid = valid;
    return 0;
}

/* The system's default congestion control (for the header), "?" if unreadable. */
static void system_cc(char *buf, size_t cap)
{
    snprintf(buf, cap, "?");
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");
    if (f == NULL)
        return;
    if (fgets(buf, (int)cap, f) == NULL)
        snprintf(buf, cap, "?");
    buf[strcspn(buf, "\n")] = '\0';
    fclose(f);
}

static void print_header(const opts_t *o, const char *engine_cc)
{
    char conns[64] = "";
    if (o->backend == PDL_BACKEND_TCP)
        snprintf(conns, sizeof(conns), ", %d connection(s) per session", o->qp);
    printf("pdlink bench: backend %s, op %s, engine workers %d per side%s, remote blocks %s\n",
           pdl_backend_name(o->backend), o->op == PDL_OP_READ ? "read" : "write", o->threads, conns,
           o->same_block   ? "all block 0 (--same-block: one block re-read per batch)"
           : o->contiguous ? "in order (mergeable)"
                           : "in reverse order (no merging)");
    if (o->backend == PDL_BACKEND_UCX)
        printf("ucx: UCX_TLS=%s\n", getenv("UCX_TLS") ? getenv("UCX_TLS") : "(unset: UCX's default selection)");
    if (o->auth_compare)
        printf("auth compare: A = a session between engines holding the cluster key of %s (each connection\n"
               "proved the key when the session opened), B = a session between open engines over the same memory;\n"
               "the 'ceiling GB/s' column is B (auth off) and the ratio is auth on / off\n",
               o->auth_compare);
    else if (pdl_ceiling_is_memcpy(pdl_backend_name(o->backend)))
        printf("ceiling: memcpy of the same bytes per batch, %d thread(s) (copies < 4 MiB use one, as the engine "
               "does), same destination buffer, warm\n",
               o->threads);
    else {
        char sys[32];
        system_cc(sys, sizeof(sys));
        printf("ceiling: plain TCP stream over %s, %d stream(s) (1 sender + 1 receiver thread each, connected once\n"
               "and kept warm for the whole run), 1 MiB writes cycling over a batch's bytes (at least 1 MiB) into the\n"
               "same local buffer, same total bytes as the engine loop (at least 16 MiB)\n",
               o->host, o->qp);
        printf("congestion control: engine data sockets %s; ceiling = the faster stream of the system default (%s)%s%s\n",
               engine_cc[0] ? engine_cc : "= system default", sys, engine_cc[0] ? " and " : "", engine_cc);
    }
    printf("method: per point, at least %d alternating pairs (engine loop A, ceiling loop B, A, B, ...) over the\n"
           "same bytes, each loop a whole-loop timer after its own warm-up; ratio = median of the per-pair ratios\n"
           "A/B (min-max beside it); GB/s and ceiling = medians; spread = (q3 - q1) / median of the ratios: above\n"
           "%.2f the point is 'unstable' (more pairs are run, up to %d) and no ratio is given; a median ratio above\n"
           "%.2f is flagged ABOVE CEILING. GB = 10^9 bytes; latency = post + wait of one batch over all engine\n"
           "loops; data validated after the first engine loop\n\n",
           o->pairs, o->max_spread, 2 * o->pairs, 1 + PDL_PAIRS_ABOVE_TOL);
    printf("%-10s %8s %6s %6s %9s %11s %11s %12s %7s %11s %5s  %s\n", "case", "block", "batch", "descs", "GB/s",
           "lat med us", "lat p99 us", "ceiling GB/s", "ratio", "min-max", "pairs", "verdict");
}

static void print_row(const row_t *r)
{
    char b[32];
    fmt_size(r->block, b, sizeof(b));
    char ratio[16], range[32], verdict[64];
    if (r->sum.verdict == PDL_PAIRS_UNSTABLE) {
        snprintf(ratio, sizeof(ratio), "-");
        snprintf(verdict, sizeof(verdict), "unstable (spread %.2f)", r->sum.spread);
    } else {
        snprintf(ratio, sizeof(ratio), "%.2f", r->ratio);
        snprintf(verdict, sizeof(verdict), "%s", pdl_pairs_verdict_name(r->sum.verdict));
    }
    snprintf(range, sizeof(range), "%.2f-%.2f", r->sum.ratio_min, r->sum.ratio_max);
    printf("%-10s %8s %6" PRIu64 " %6zu %9.2f %11.1f %11.1f %12.2f %7s %11s %5d  %s%s\n", r->label, b, r->batch,
           r->descs, r->gbps, r->lat_med_us, r->lat_p99_us, r->ceil_gbps, ratio, range, r->sum.n, verdict,
           r->valid ? "" : "  DATA MISMATCH");
    fflush(stdout);
}

/* ---------------------------------------------------------------- heterogeneous TP */

/*
 * One layer's KV (K and V halves) of a Llama-3.1-70B-like model: 8 KV heads, head_dim 128, bf16,
 * 16 tokens per block, HND, K and V separate; `layers` layers are consecutive regions. Consumer rank 0
 * reads `nblocks` blocks (remote block ids shuffled, as two caches allocate independently).
 * P4/D8: 1 piece (half of producer 0's heads). P8/D4: 2 pieces (producers 0 and 1, one head each;
 * the target's one region stands in for both producer ranks). P4/D4: the homogeneous baseline.
 */
static int hetero_descs(int ptp, int dtp, uint32_t nblocks, int layers, pdl_descv_t *out, uint64_t *remote_need,
                        uint64_t *local_need, char *why, size_t whycap)
{
    const int heads = 8;
    pdl_read_plan_t plan;
    pdl_error_t err;
    if (pdl_topo_read_plan(ptp, dtp, heads, false, 0, &plan, &err) != PDL_OK) {
        snprintf(why, whycap, "%s", err.msg);
        return -1;
    }
    pdl_kv_geometry_t lg = {nblocks, 16, (uint32_t)(heads / dtp), 128, 2, true, PDL_KV_HND, false, false};
    pdl_kv_geometry_t rg = {nblocks, 16, (uint32_t)(heads / ptp), 128, 2, true, PDL_KV_HND, false, false};
    uint32_t *lb = malloc(nblocks * sizeof(uint32_t)), *rb = malloc(nblocks * sizeof(uint32_t));
    unsigned rng = 7;
    for (uint32_t i = 0; i < nblocks; i++)
        lb[i] = rb[i] = i;
    for (uint32_t i = nblocks - 1; i > 0; i--) {
        uint32_t j = (uint32_t)rand_r(&rng) % (i + 1), t = rb[i];
        rb[i] = rb[j];
        rb[j] = t;
    }
    uint64_t llen = pdl_layout_region_len(&lg), rlen = pdl_layout_region_len(&rg);
    int rc = 0;
    for (int l = 0; l < layers && rc == 0; l++) {
        for (int p = 0; p < plan.num_pieces && rc == 0; p++) {
            /* Every producer rank's region is stood in for by the same remote region. */
            if (pdl_layout_build_descs(&lg, &rg, PDL_DIR_READ, &plan.pieces[p], 1, lb, rb, nblocks,
                                       (uint64_t)l * llen, (uint64_t)l * rlen, out, &err) != PDL_OK) {
                snprintf(why, whycap, "%s", err.msg);
                rc = -1;
            }
        }
    }
    *remote_need = rlen * (uint64_t)layers;
    *local_need = llen * (uint64_t)layers;
    free(lb);
    free(rb);
    return rc;
}

/* ---------------------------------------------------------------- JSON and SVG */

static int write_json(const char *path, const opts_t *o, const row_t *rows, int n)
{
    json_t *root = json_object(), *arr = json_array();
    json_object_set_new(root, "backend", json_string(pdl_backend_name(o->backend)));
    json_object_set_new(root, "op", json_string(o->op == PDL_OP_READ ? "read" : "write"));
    json_object_set_new(root, "threads", json_integer(o->threads));
    json_object_set_new(root, "qp", json_integer(o->qp));
    bool memcpy_ceil = pdl_ceiling_is_memcpy(pdl_backend_name(o->backend));
    json_object_set_new(root, "ceiling", json_string(memcpy_ceil ? "memcpy" : "tcp_stream"));
    json_object_set_new(root, "ceiling_threads", json_integer(memcpy_ceil ? o->threads : o->qp));
    json_object_set_new(root, "gb", json_string("1e9 bytes"));
    json_object_set_new(root, "method", json_string("alternating pairs (engine loop, ceiling loop) over the same bytes; "
                                                    "ratio = median of per-pair ratios; gbps and ceiling_gbps = medians; "
                                                    "spread = (q3 - q1) / median of the ratios"));
    json_object_set_new(root, "min_pairs", json_integer(o->pairs));
    json_object_set_new(root, "max_spread", json_real(o->max_spread));
    json_object_set_new(root, "above_ceiling_above", json_real(1 + PDL_PAIRS_ABOVE_TOL));
    for (int i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        json_t *j = json_object();
        json_object_set_new(j, "case", json_string(r->label));
        json_object_set_new(j, "block", json_integer((json_int_t)r->block));
        json_object_set_new(j, "batch", json_integer((json_int_t)r->batch));
        json_object_set_new(j, "bytes_per_batch", json_integer((json_int_t)r->bytes));
        json_object_set_new(j, "descs_after_merge", json_integer((json_int_t)r->descs));
        json_object_set_new(j, "iters", json_integer(r->iters));
        json_object_set_new(j, "gbps", json_real(r->gbps));
        json_object_set_new(j, "lat_median_us", json_real(r->lat_med_us));
        json_object_set_new(j, "lat_p99_us", json_real(r->lat_p99_us));
        json_object_set_new(j, "ceiling_gbps", json_real(r->ceil_gbps));
        json_object_set_new(j, "ratio", json_real(r->ratio));
        json_object_set_new(j, "ratio_min", json_real(r->sum.ratio_min));
        json_object_set_new(j, "ratio_max", json_real(r->sum.ratio_max));
        json_object_set_new(j, "spread", json_real(r->sum.spread));
        json_object_set_new(j, "pairs", json_integer(r->sum.n));
        json_object_set_new(j, "iters_per_loop", json_integer(r->per));
        json_object_set_new(j, "verdict", json_string(pdl_pairs_verdict_name(r->sum.verdict)));
        json_object_set_new(j, "stable", json_boolean(r->sum.verdict != PDL_PAIRS_UNSTABLE));
        json_object_set_new(j, "above_ceiling", json_boolean(r->sum.verdict == PDL_PAIRS_ABOVE_CEILING));
        json_object_set_new(j, "validated", json_boolean(r->valid));
        json_array_append_new(arr, j);
    }
    json_object_set_new(root, "rows", arr);
    int rc = json_dump_file(root, path, JSON_INDENT(2));
    json_decref(root);
    if (rc != 0)
        fprintf(stderr, "pdlink bench: cannot write %s\n", path);
    return rc;
}

static int write_svg(const char *path, const opts_t *o, const row_t *rows, int n)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "pdlink bench: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    const double W = 900, H = 520, L = 70, R = 170, T = 40, B = 60;
    double xmin = 1e30, xmax = -1e30, ymax = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(rows[i].label, "sweep") != 0)
            continue;
        double x = log2((double)rows[i].block);
        xmin = fmin(xmin, x);
        xmax = fmax(xmax, x);
        ymax = fmax(ymax, fmax(rows[i].gbps, rows[i].ceil_gbps));
    }
    if (xmax <= xmin)
        xmax = xmin + 1;
    ymax = ymax <= 0 ? 1 : ceil(ymax * 1.1);
#define PX(x) (L + ((x)-xmin) / (xmax - xmin) * (W - L - R))
#define PY(y) (H - B - (y) / ymax * (H - T - B))
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">pdlink bench: %s %s, %d worker(s); solid = engine, dashed "
               "= same-run ceiling (%s)</text>\n",
            L, pdl_backend_name(o->backend), o->op == PDL_OP_READ ? "read" : "write", o->threads,
            pdl_ceiling_is_memcpy(pdl_backend_name(o->backend)) ? "memcpy" : "TCP stream");
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T, L, H - B);
    for (int k = 0; k <= 5; k++) {
        double y = ymax * k / 5;
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.1f</text>\n", L - 6, PY(y) + 4, y);
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, PY(y), W - R, PY(y));
    }
    for (int e = (int)xmin; e <= (int)xmax; e += 2) {
        char b[32];
        fmt_size(1ull << e, b, sizeof(b));
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n", PX(e), H - B + 18, b);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">block size</text>\n", (L + W - R) / 2, H - 15);
    fprintf(f, "<text x=\"18\" y=\"%.0f\" transform=\"rotate(-90 18 %.0f)\" text-anchor=\"middle\">GB/s (10^9 "
               "B/s)</text>\n",
            (T + H - B) / 2, (T + H - B) / 2);
    static const char *colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
    for (int bi = 0; bi < o->nbatches; bi++) {
        const char *col = colors[bi % 8];
        for (int pass = 0; pass < 2; pass++) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", col,
                    pass ? " stroke-dasharray=\"5,4\"" : "");
            for (int i = 0; i < n; i++)
                if (strcmp(rows[i].label, "sweep") == 0 && rows[i].batch == o->batches[bi])
                    fprintf(f, "%.1f,%.1f ", PX(log2((double)rows[i].block)),
                            PY(pass ? rows[i].ceil_gbps : rows[i].gbps));
            fprintf(f, "\"/>\n");
        }
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"/>"
                   "<text x=\"%.0f\" y=\"%.0f\">batch %" PRIu64 "</text>\n",
                W - R + 15, T + 20.0 * bi, W - R + 40, T + 20.0 * bi, col, W - R + 46, T + 20.0 * bi + 4,
                o->batches[bi]);
    }
    fprintf(f, "</svg>\n");
#undef PX
#undef PY
    return fclose(f) == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- main */

static uint64_t region_needed(const opts_t *o)
{
    uint64_t need = 0;
    for (int i = 0; i < o->nblocks; i++)
        for (int j = 0; j < o->nbatches; j++) {
            uint64_t b = o->blocks[i] * o->batches[j];
            if (b <= o->cap && b > need)
                need = b;
        }
    if (o->hetero && need < (64ull << 20))
        need = 64ull << 20; /* the heterogeneous rows use 4 layers of 16 MiB */
    if (!pdl_ceiling_is_memcpy(pdl_backend_name(o->backend)) && need < ((uint64_t)o->qp << 20))
        need = (uint64_t)o->qp << 20; /* the TCP ceiling's streams each cycle over at least one 1 MiB write */
    return need;
}

/* --auth-compare: what the challenge itself costs -- opening a session (connect and set up every
 * connection: HELLO, or HELLO_AUTH and AUTH), authenticated and open ones alternated; medians in us
 * into on_us/off_us, -1 when an open failed. */
#define SESSION_SAMPLES 15
static void session_open_costs(ctx_t *c, const uint8_t *md, uint32_t mlen, const uint8_t *mad, uint32_t malen,
                               double *on_us, double *off_us)
{
    double on[SESSION_SAMPLES], off[SESSION_SAMPLES];
    *on_us = *off_us = -1;
    for (int i = 0; i < SESSION_SAMPLES; i++) {
        pdl_session_t *s = NULL;
        double t0 = now_s();
        if (pdl_session_open(c->ea, c->local_a, mad, malen, &s, NULL) != PDL_OK)
            return;
        on[i] = (now_s() - t0) * 1e6;
        pdl_session_close(s);
        t0 = now_s();
        if (pdl_session_open(c->e, c->local, md, mlen, &s, NULL) != PDL_OK)
            return;
        off[i] = (now_s() - t0) * 1e6;
        pdl_session_close(s);
    }
    qsort(on, SESSION_SAMPLES, sizeof(double), cmp_double);
    qsort(off, SESSION_SAMPLES, sizeof(double), cmp_double);
    *on_us = on[SESSION_SAMPLES / 2];
    *off_us = off[SESSION_SAMPLES / 2];
}

/* The ceiling of every pair's B loop: its buffer and its memcpy threads or warm TCP streams; -1 (said). */
static int ceiling_setup(ctx_t *c)
{
    const opts_t *o = c->o;
    c->src = pdl_ceiling_alloc(c->region);
    if (c->src == NULL) {
        fprintf(stderr, "pdlink bench: cannot allocate the ceiling's %" PRIu64 "-byte buffer\n", c->region);
        return -1;
    }
    memset(c->src, 0x5a, c->region);
    if (pdl_ceiling_is_memcpy(pdl_backend_name(o->backend))) {
        c->cm = pdl_ceiling_memcpy_create(o->threads);
        if (c->cm == NULL) {
            fprintf(stderr, "pdlink bench: cannot start the memcpy ceiling's %d thread(s)\n", o->threads);
            return -1;
        }
        return 0;
    }
    /* The engine sets its own congestion control on its sockets (engine.h): one stream set gets the
     * same, one the system default, and the faster is the ceiling of each pair. */
    const char *cc = pdl_engine_tcp_congestion(c->e);
    c->tcp[0] = pdl_ceiling_tcp_create(o->host, o->qp, NULL);
    if (c->tcp[0] != NULL && cc[0] != '\0')
        c->tcp[1] = pdl_ceiling_tcp_create(o->host, o->qp, cc);
    if (c->tcp[0] == NULL || (cc[0] != '\0' && c->tcp[1] == NULL)) {
        fprintf(stderr, "pdlink bench: cannot open the TCP stream ceiling's connections over %s\n", o->host);
        return -1;
    }
    return 0;
}

/* Receive the target's descriptors and open the session: the plain one, and with --auth-compare also the
 * authenticated one over the same local buffer (its median open times in open_us[0] on, [1] off).
 * Returns 0, or 2 with the reason printed; initiator_close undoes what was opened either way. */
static int initiator_open(ctx_t *c, double open_us[2])
{
    const opts_t *o = c->o;
    pdl_error_t err;
    uint8_t *ed = NULL, *md = NULL, *ead = NULL, *mad = NULL;
    uint32_t elen = 0, mlen = 0, ealen = 0, malen = 0;
    if (recv_blob(c->fd, &ed, &elen) != 0 || recv_blob(c->fd, &md, &mlen) != 0) {
        fprintf(stderr, "pdlink bench: the target did not send its descriptors (did it fail to start?)\n");
        free(ed);
        return 2;
    }
    pdl_engine_config_t cfg = {"bench-initiator", o->host, 0, o->backend, o->qp, o->threads, o->tcp_cc, false, NULL, NULL};
    pdl_status_t st = PDL_OK;
    if ((st = pdl_engine_create(&cfg, &c->e, &err)) != PDL_OK ||
        (st = pdl_engine_alloc_mem(c->e, c->region, &c->local, &err)) != PDL_OK ||
        (st = pdl_engine_add_remote(c->e, ed, elen, NULL, 0, &err)) != PDL_OK ||
        (st = pdl_session_open(c->e, c->local, md, mlen, &c->s, &err)) != PDL_OK)
        fprintf(stderr, "pdlink bench: %s\n", err.msg);
    if (st == PDL_OK && o->auth_compare) {
        /* The target's authenticated engine and memory, and ours over the same local buffer. */
        pdl_engine_config_t acfg = cfg;
        acfg.key = "bench-initiator-auth";
        st = PDL_ERR_PEER_GONE;
        pdl_error_set(&err, st, "the target did not send its authenticated engine (did its key fail to load?)");
        if (recv_blob(c->fd, &ead, &ealen) == 0 && recv_blob(c->fd, &mad, &malen) == 0 &&
            (st = pdl_auth_load(o->auth_compare, &c->auth, &err)) == PDL_OK) {
            acfg.auth = c->auth;
            if ((st = pdl_engine_create(&acfg, &c->ea, &err)) == PDL_OK &&
                (st = pdl_engine_register_mem(c->ea, pdl_mem_ptr(c->local), c->region, &c->local_a, &err)) == PDL_OK &&
                (st = pdl_engine_add_remote(c->ea, ead, ealen, NULL, 0, &err)) == PDL_OK)
                st = pdl_session_open(c->ea, c->local_a, mad, malen, &c->sa, &err);
        }
        if (st == PDL_OK)
            session_open_costs(c, md, mlen, mad, malen, &open_us[0], &open_us[1]);
        else
            fprintf(stderr, "pdlink bench: --auth-compare: %s\n", err.msg);
    }
    free(ead);
    free(mad);
    free(ed);
    free(md);
    return st == PDL_OK ? 0 : 2;
}

/* Tell the target to quit, and close everything the initiator opened (each close accepts NULL). */
static void initiator_close(ctx_t *c)
{
    ctl_cmd(c->fd, 'Q', 0, 0, NULL, 0);
    pdl_session_close(c->sa);
    if (c->local_a)
        pdl_engine_deregister_mem(c->ea, c->local_a);
    pdl_engine_destroy(c->ea);
    pdl_auth_free(c->auth);
    pdl_session_close(c->s);
    if (c->local)
        pdl_engine_deregister_mem(c->e, c->local);
    pdl_engine_destroy(c->e);
    pdl_ceiling_memcpy_destroy(c->cm);
    pdl_ceiling_tcp_destroy(c->tcp[0]);
    pdl_ceiling_tcp_destroy(c->tcp[1]);
    pdl_ceiling_free(c->src, c->region);
}

/* The sweep: one row per (block size, batch size) within --max-batch-bytes, appended to rows. Returns 0,
 * or 2 when a point could not be measured. */
static int sweep_rows(ctx_t *c, row_t *rows, int *nrows_p, double t_start)
{
    const opts_t *o = c->o;
    int npoints = 0, done = 0, rc = 0;
    for (int i = 0; i < o->nblocks; i++)
        for (int j = 0; j < o->nbatches; j++)
            npoints += o->blocks[i] * o->batches[j] <= o->cap;
    pdl_desc_t *d = malloc(65536 * sizeof(pdl_desc_t));
    for (int i = 0; i < o->nblocks && rc == 0; i++) {
        for (int j = 0; j < o->nbatches && rc == 0; j++) {
            uint64_t block = o->blocks[i], batch = o->batches[j];
            if (block * batch > o->cap)
                continue;
            char bs[32];
            fmt_size(block, bs, sizeof(bs));
            fprintf(stderr, "\r[%d/%d] block %s batch %" PRIu64 " (%.0f s elapsed)...          ", ++done, npoints, bs,
                    batch, now_s() - t_start);
            for (uint64_t k = 0; k < batch; k++)
                d[k] = o->same_block ? (pdl_desc_t){0, 0, block}
                                     : (pdl_desc_t){k * block, (o->contiguous ? k : batch - 1 - k) * block, block};
            if (measure(c, "sweep", d, batch, block, batch, &rows[*nrows_p]) != 0) {
                rc = 2;
                break;
            }
            fprintf(stderr, "\r%60s\r", "");
            print_row(&rows[(*nrows_p)++]);
        }
    }
    free(d);
    return rc;
}

/* The heterogeneous-TP rows (READ only), appended to rows. Returns 0, or 2 when one could not be measured. */
static int hetero_rows(ctx_t *c, row_t *rows, int *nrows_p)
{
    const opts_t *o = c->o;
    printf("\nheterogeneous TP, consumer rank 0 READs 4 layers x K,V x 1024 blocks (8 KV heads, head_dim 128, "
           "bf16, block 16 tokens, HND; remote block ids shuffled):\n");
    static const struct {
        int p, d;
        const char *label;
    } cases[] = {{4, 4, "P4/D4"}, {4, 8, "P4/D8"}, {8, 4, "P8/D4"}};
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        pdl_descv_t dv = {0};
        uint64_t rneed, lneed;
        char why[PDL_ERR_MSG_LEN];
        if (hetero_descs(cases[k].p, cases[k].d, 1024, 4, &dv, &rneed, &lneed, why, sizeof(why)) != 0) {
            printf("%-10s skipped: %s\n", cases[k].label, why);
            pdl_descv_free(&dv);
            continue;
        }
        if (rneed > c->region || lneed > c->region || o->op != PDL_OP_READ) {
            printf("%-10s skipped: %s\n", cases[k].label,
                   o->op != PDL_OP_READ ? "heterogeneous rows are READ mode only" : "region too small");
            pdl_descv_free(&dv);
            continue;
        }
        fprintf(stderr, "\rheterogeneous %s...", cases[k].label);
        uint64_t total = pdl_layout_total_bytes(&dv);
        if (measure(c, cases[k].label, dv.v, dv.n, dv.n ? dv.v[0].len : 0, dv.n, &rows[*nrows_p]) != 0) {
            rc = 2;
        } else {
            fprintf(stderr, "\r%60s\r", "");
            rows[*nrows_p].bytes = total;
            print_row(&rows[(*nrows_p)++]);
        }
        pdl_descv_free(&dv);
    }
    printf("(P8/D4: two producer ranks, each one head; the target's single region stands in for both)\n");
    return rc;
}

/* The rows' verdicts: unstable and above-ceiling counts printed; the exit status from rc (the runs'), the
 * validation failures and --strict. */
static int rows_verdict(const ctx_t *c, const row_t *rows, int nrows, int rc)
{
    int unstable = 0, above = 0;
    for (int i = 0; i < nrows; i++) {
        unstable += rows[i].sum.verdict == PDL_PAIRS_UNSTABLE;
        above += rows[i].sum.verdict == PDL_PAIRS_ABOVE_CEILING;
    }
    if (unstable > 0)
        printf("\n%d point(s) unstable: the machine was too noisy for a ratio there; rerun them (e.g. --pairs 9)\n",
               unstable);
    if (above > 0)
        printf("\n%d point(s) ABOVE CEILING: a ceiling must bound the engine, so that ceiling or that measurement "
               "is wrong\n",
               above);
    if (rc == 0 && c->failures > 0) {
        printf("\n%d point(s) FAILED data validation\n", c->failures);
        return 1;
    }
    if (rc == 0 && c->o->strict && (unstable > 0 || above > 0))
        return 3;
    return rc;
}

static int initiator_run(ctx_t *c)
{
    const opts_t *o = c->o;
    double open_us[2] = {-1, -1}; /* --auth-compare: median session open times, auth on and off */
    int rc = initiator_open(c, open_us);
    if (rc == 0 && !o->auth_compare && ceiling_setup(c) != 0) /* --auth-compare: B is the open session */
        rc = 2;
    if (rc != 0) {
        initiator_close(c);
        return rc;
    }
    print_header(o, pdl_engine_tcp_congestion(c->e));
    if (o->auth_compare)
        printf("session open (connect + set-up of %d connection(s)), median of %d alternated: auth on %.0f us, "
               "off %.0f us\n\n",
               o->qp, SESSION_SAMPLES, open_us[0], open_us[1]);
    row_t *rows = calloc((size_t)(o->nblocks * o->nbatches + 3), sizeof(row_t));
    int nrows = 0;
    double t_start = now_s();
    rc = sweep_rows(c, rows, &nrows, t_start);
    if (rc == 0 && o->hetero)
        rc = hetero_rows(c, rows, &nrows);
    fprintf(stderr, "pdlink bench: %d rows in %.1f s\n", nrows, now_s() - t_start);
    rc = rows_verdict(c, rows, nrows, rc);
    if (o->json && write_json(o->json, o, rows, nrows) != 0 && rc == 0)
        rc = 2;
    if (o->plot && write_svg(o->plot, o, rows, nrows) != 0 && rc == 0)
        rc = 2;
    free(rows);
    initiator_close(c);
    return rc;
}

int pdl_bench_engine_main(int argc, char **argv)
{
    opts_t o;
    int prc = parse_opts(argc, argv, &o);
    if (prc != 0)
        return prc < 0 ? 0 : prc;
    signal(SIGPIPE, SIG_IGN);
    uint64_t region = region_needed(&o);
    if (region == 0) {
        fprintf(stderr, "pdlink bench: every point is above --max-batch-bytes\n");
        return 2;
    }
    if (o.serve) {
        /* Target only. The initiator decides the sizes, so take the largest region the options allow. */
        int fd = tcp_listen_accept(o.serve, o.port_file);
        if (fd < 0)
            return 2;
        char host[256], port[16];
        split_hostport(o.serve, host, sizeof(host), port, sizeof(port));
        int rc = target_run(fd, &o, host, region);
        close(fd);
        return rc;
    }
    ctx_t c;
    memset(&c, 0, sizeof(c));
    c.o = &o;
    c.region = region;
    pid_t child = -1;
    if (o.connect) {
        c.fd = tcp_connect_to(o.connect);
        if (c.fd < 0)
            return 2;
    } else {
        /* Fork before any thread exists in this process. */
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
            perror("pdlink bench: socketpair");
            return 2;
        }
        fflush(NULL);
        child = fork();
        if (child < 0) {
            perror("pdlink bench: fork");
            return 2;
        }
        if (child == 0) {
            close(sv[0]);
            int rc = target_run(sv[1], &o, o.host, region);
            _exit(rc);
        }
        close(sv[1]);
        c.fd = sv[0];
    }
    int rc = initiator_run(&c);
    close(c.fd);
    if (child > 0) {
        int status = 0;
        waitpid(child, &status, 0);
        if (rc == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            fprintf(stderr, "pdlink bench: the target process failed\n");
            rc = 2;
        }
    }
    return rc;
}
