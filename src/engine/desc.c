/*
 * desc.c -- packing and unpacking of engine and memory descriptors (msgpack maps with string keys).
 *
 * Engine descriptor: {"magic":"pdlink-engine","v":1,"key","backend":"shm"|"tcp"|"ucx","host","port",
 *                     "pid","pid_start","hostname","boot_id","ctl_fd"} and, for ucx, {"ucx_addr","ctl_addr",
 *                     "ctl_rkey"}; "pid_start" (the sender's start time, liveness.h) is optional on
 *                     reading, so descriptors from engines that predate it are still read
 * Memory descriptor: {"magic":"pdlink-mem","v":1,"engine","id","size","kind":"memfd"|"user","addr",
 *                     "fd","pid","slot"} and, for ucx, {"rkey"}; for device memory {"mem_type"} (1 CUDA,
 *                     2 ROCm; absent = host); for cuda {"ipc" (the 64-byte CUipcMemHandle of the
 *                     allocation), "ipc_off" (the region's offset in that allocation)}
 * The ucx fields are msgpack bin (the worker address, the live table's and the region's packed rkeys:
 * opaque UCX bytes, bounded by PDL_UCX_ADDR_MAX / PDL_UCX_RKEY_MAX); they are written only when
 * non-empty; readers of version 1 skip keys they do not know, so they read every field added since.
 * A map is order-free and unknown keys are ignored, so later versions can add fields; a key given twice
 * is refused. A different "v" is PDL_ERR_MISMATCH (checked before any field, whose shape that version
 * may have changed), anything malformed is PDL_ERR_PARSE. The bytes come from a peer, so they enter
 * msgpack-c only through the wire layer's guarded door (pdl__mp_unpack, src/wire/mp.c), which refuses a
 * container header announcing more elements than the bytes that follow could hold before msgpack-c
 * allocates a table for it (`df ff ff ff ff` would otherwise ask for a multi-GiB map). Keys are matched
 * and values read with the same typed reads as the wire codecs' (wire/mp.h): strings are bounded,
 * NUL-free UTF-8 (str, or bin holding UTF-8), integers are range-checked, blobs are bounded.
 *
 * Encoding goes from the decoded form (pdl_remote_t, pdl_rmem_t), so a live engine's descriptor and a
 * re-encoded peer descriptor come from the same code; the fuzz target fuzz/fuzz_engine_desc.c checks
 * that decode → encode → decode is the identity.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "wire/mp.h" /* the one guarded door into msgpack-c for bytes from peers, and the encoder glue */

/* Elements a descriptor may announce in all (msgpack-c allocates a table for each container before
 * reading it). Version 1 has 10 keys = 20 elements; the rest leaves room for fields a later version
 * adds, which this one skips. */
#define DESC_MAX_ITEMS 1024

static void enc_kv_str(pdl__mp_enc_t *enc, const char *k, const char *v)
{
    pdl__enc_str(enc, k);
    pdl__enc_str(enc, v);
}

static void enc_kv_u64(pdl__mp_enc_t *enc, const char *k, uint64_t v)
{
    pdl__enc_str(enc, k);
    pdl__enc_uint(enc, v);
}

static void enc_kv_i64(pdl__mp_enc_t *enc, const char *k, int64_t v)
{
    pdl__enc_str(enc, k);
    pdl__enc_int(enc, v);
}

static void enc_kv_bin(pdl__mp_enc_t *enc, const char *k, const void *v, size_t n)
{
    pdl__enc_str(enc, k);
    pdl__enc_bin(enc, v, n);
}

pdl_status_t pdl__engine_desc_encode(const pdl_remote_t *r, pdl_bytes_t *out, pdl_error_t *err)
{
    pdl__mp_enc_t enc;
    pdl__enc_init(&enc);
    bool ucx = r->ucx_addr_len > 0;
    pdl__enc_map(&enc, ucx ? 14 : 11);
    enc_kv_str(&enc, "magic", "pdlink-engine");
    enc_kv_u64(&enc, "v", PDL_ENGINE_DESC_VERSION);
    enc_kv_str(&enc, "key", r->key);
    enc_kv_str(&enc, "backend", pdl_backend_name(r->backend));
    enc_kv_str(&enc, "host", r->host);
    enc_kv_u64(&enc, "port", r->port);
    enc_kv_i64(&enc, "pid", r->pid);
    enc_kv_u64(&enc, "pid_start", r->pid_start);
    enc_kv_str(&enc, "hostname", r->hostname);
    enc_kv_str(&enc, "boot_id", r->boot_id);
    enc_kv_i64(&enc, "ctl_fd", r->ctl_fd);
    if (ucx) {
        enc_kv_bin(&enc, "ucx_addr", r->ucx_addr, r->ucx_addr_len);
        enc_kv_u64(&enc, "ctl_addr", r->ctl_addr);
        enc_kv_bin(&enc, "ctl_rkey", r->ctl_rkey, r->ctl_rkey_len);
    }
    return pdl__enc_finish(&enc, "engine descriptor", out, err);
}

pdl_status_t pdl__mem_desc_encode(const pdl_rmem_t *rm, pdl_bytes_t *out, pdl_error_t *err)
{
    pdl__mp_enc_t enc;
    pdl__enc_init(&enc);
    bool dev = rm->type != PDL_MEM_TYPE_HOST, ipc = rm->ipc_len > 0;
    pdl__enc_map(&enc, 10 + (rm->rkey_len > 0) + dev + 2 * ipc);
    enc_kv_str(&enc, "magic", "pdlink-mem");
    enc_kv_u64(&enc, "v", PDL_ENGINE_DESC_VERSION);
    enc_kv_str(&enc, "engine", rm->engine_key);
    enc_kv_u64(&enc, "id", rm->id);
    enc_kv_u64(&enc, "size", rm->size);
    enc_kv_str(&enc, "kind", rm->kind == PDL_MEM_MEMFD ? "memfd" : "user");
    enc_kv_u64(&enc, "addr", rm->addr);
    enc_kv_i64(&enc, "fd", rm->fd);
    enc_kv_i64(&enc, "pid", rm->pid);
    enc_kv_i64(&enc, "slot", rm->slot);
    if (rm->rkey_len > 0)
        enc_kv_bin(&enc, "rkey", rm->rkey, rm->rkey_len);
    if (dev)
        enc_kv_u64(&enc, "mem_type", (uint64_t)rm->type);
    if (ipc) {
        enc_kv_bin(&enc, "ipc", rm->ipc, rm->ipc_len);
        enc_kv_u64(&enc, "ipc_off", rm->ipc_off);
    }
    return pdl__enc_finish(&enc, "memory descriptor", out, err);
}

pdl_status_t pdl__engine_desc_pack(const pdl_engine_t *e, pdl_bytes_t *out, pdl_error_t *err)
{
    /* The descriptor is the peer's view of this engine: fill that view and encode it, so packing a live
     * engine and re-encoding a decoded descriptor (fuzz/fuzz_engine_desc.c) share one encoder. */
    pdl_remote_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory packing its descriptor", e->key);
    memcpy(r->key, e->key, sizeof(r->key));
    memcpy(r->host, e->host, sizeof(r->host));
    memcpy(r->hostname, e->hostname, sizeof(r->hostname));
    memcpy(r->boot_id, e->boot_id, sizeof(r->boot_id));
    r->backend = e->backend;
    r->port = e->port;
    r->pid = (int64_t)getpid();
    r->pid_start = e->pid_start;
    r->ctl_fd = e->ctl_fd;
    if (e->ops->engine_desc_fill != NULL)
        e->ops->engine_desc_fill(e, r);
    pdl_status_t st = pdl__engine_desc_encode(r, out, err);
    free(r);
    return st;
}

pdl_status_t pdl__mem_desc_pack(const pdl_mem_t *m, pdl_bytes_t *out, pdl_error_t *err)
{
    pdl_rmem_t rm = {
        .id = m->id,
        .size = m->size,
        .kind = m->kind,
        .addr = (uint64_t)(uintptr_t)m->ptr,
        .fd = m->memfd,
        .pid = (int64_t)getpid(),
        .slot = m->slot,
        .type = m->type,
    };
    memcpy(rm.engine_key, m->engine->key, sizeof(rm.engine_key));
    if (m->engine->ops->mem_desc_fill != NULL)
        m->engine->ops->mem_desc_fill(m, &rm);
    return pdl__mem_desc_encode(&rm, out, err);
}

/* --- unpacking --- */

/* A field of a descriptor map: where its value goes and which of wire/mp.h's typed reads checks it. */
typedef struct field {
    const char *name;
    enum { F_STR, F_U64, F_I64, F_BIN } type;
    void *dst;
    size_t cap;     /* strings: capacity incl. NUL; bin: capacity */
    uint32_t *blen; /* bin: length received */
    bool required;
    bool nonempty;  /* strings: "" is refused */
} field_t;

/* Fields a descriptor table may have; the map's values are collected for them plus magic and "v". */
#define DESC_MAX_FIELDS 16
enum { V_MAGIC, V_VERSION, V_FIELDS };

/* Bounds, the guarded decode (the only way bytes from a peer reach msgpack-c) and a map at the top. */
static pdl_status_t desc_open(const char *what, const void *buf, size_t len, msgpack_unpacked *u, pdl_error_t *err)
{
    if (buf == NULL || len == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: empty descriptor", what);
    if (len > 65536)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: descriptor of %zu bytes exceeds the 65536-byte limit", what,
                             len);
    pdl_status_t st = pdl__mp_unpack(buf, len, DESC_MAX_ITEMS, what, u, err);
    if (st == PDL_OK && u->data.type != MSGPACK_OBJECT_MAP)
        st = pdl_error_set(err, PDL_ERR_PARSE, "%s: payload is %s, expected a msgpack map", what,
                           pdl__mp_kind(&u->data));
    return st;
}

/* The value of every key the descriptor knows into v (V_MAGIC, V_VERSION, then field j at V_FIELDS + j).
 * Keys match as the wire codecs match them (pdl__mp_key_is); other keys are skipped, so a later version
 * can add some, and a key given twice is refused, since which of its values counts would be a guess. */
static pdl_status_t desc_collect(const char *what, const msgpack_object_map *map, const field_t *f, int nf,
                                 const msgpack_object **v, pdl_error_t *err)
{
    for (uint32_t i = 0; i < map->size; i++) {
        const msgpack_object_kv *kv = &map->ptr[i];
        for (int k = 0; k < V_FIELDS + nf; k++) {
            const char *name = k == V_MAGIC ? "magic" : k == V_VERSION ? "v" : f[k - V_FIELDS].name;
            if (!pdl__mp_key_is(&kv->key, name))
                continue;
            if (v[k] != NULL)
                return pdl_error_set(err, PDL_ERR_PARSE, "%s: duplicate key '%s'", what, name);
            v[k] = &kv->val;
            break;
        }
    }
    return PDL_OK;
}

/* The magic and the version, before any field is read: another version may shape its fields otherwise,
 * and "upgrade both sides" is what its reader needs to hear. */
static pdl_status_t desc_header(const char *what, const char *magic, const msgpack_object *const *v,
                                pdl_error_t *err)
{
    const char *s = NULL;
    size_t n = 0;
    if (v[V_MAGIC] == NULL || !pdl__mp_token(v[V_MAGIC], &s, &n) || n != strlen(magic) || memcmp(s, magic, n) != 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: missing or wrong magic (expected \"%s\")", what, magic);
    if (v[V_VERSION] == NULL)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: missing version field 'v'", what);
    uint64_t ver = 0;
    pdl_status_t st = pdl__mp_uint64(v[V_VERSION], what, "version field 'v'", &ver, err);
    if (st == PDL_OK && ver != PDL_ENGINE_DESC_VERSION)
        st = pdl_error_set(err, PDL_ERR_MISMATCH,
                           "%s: descriptor version %llu, this pdlink speaks version %d; upgrade both sides to the "
                           "same pdlink release",
                           what, (unsigned long long)ver, PDL_ENGINE_DESC_VERSION);
    return st;
}

/* One value into its field with the wire layer's checks: strings bounded, NUL-free UTF-8 (str, or bin
 * holding it); integers in range; bin of 1..cap bytes. */
static pdl_status_t desc_field(const char *what, const field_t *f, const msgpack_object *o, pdl_error_t *err)
{
    if (f->type == F_STR)
        return pdl__mp_str(o, what, f->name, f->dst, f->cap, !f->nonempty, err);
    if (f->type == F_U64)
        return pdl__mp_uint64(o, what, f->name, f->dst, err);
    if (f->type == F_I64)
        return pdl__mp_int(o, what, f->name, INT64_MIN, INT64_MAX, f->dst, err);
    pdl_bytes_t b = {0};
    pdl_status_t st = pdl__mp_bin(o, what, f->name, f->cap, &b, err);
    if (st != PDL_OK)
        return st;
    /* The encoder writes a blob only when it has bytes: an empty one means a broken peer. */
    if (b.len == 0)
        st = pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is empty binary, expected 1..%zu bytes", what, f->name, f->cap);
    else
        memcpy(f->dst, b.data, b.len);
    *f->blen = (uint32_t)b.len;
    pdl_bytes_free(&b);
    return st;
}

/* Decode a descriptor map into the nf fields of f (at most DESC_MAX_FIELDS), checking its magic and
 * version; fields the map lacks keep what the caller put there. */
static pdl_status_t parse_map(const char *what, const void *buf, size_t len, const char *magic, const field_t *f,
                              int nf, pdl_error_t *err)
{
    if (nf > DESC_MAX_FIELDS)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: %d fields, the parser holds %d", what, nf, DESC_MAX_FIELDS);
    const msgpack_object *v[V_FIELDS + DESC_MAX_FIELDS] = {0};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    pdl_status_t st = desc_open(what, buf, len, &u, err);
    if (st == PDL_OK)
        st = desc_collect(what, &u.data.via.map, f, nf, v, err);
    if (st == PDL_OK)
        st = desc_header(what, magic, v, err);
    for (int j = 0; j < nf && st == PDL_OK; j++) {
        const msgpack_object *o = v[V_FIELDS + j];
        if (o != NULL)
            st = desc_field(what, &f[j], o, err);
        else if (f[j].required)
            st = pdl_error_set(err, PDL_ERR_PARSE, "%s: missing field '%s'", what, f[j].name);
    }
    msgpack_unpacked_destroy(&u);
    return st;
}

pdl_status_t pdl__engine_desc_unpack(const void *buf, size_t len, pdl_remote_t *r, pdl_error_t *err)
{
    char backend[16] = "";
    uint64_t port = 0;
    memset(r, 0, sizeof(*r));
    r->ctl_fd = -1;
    field_t f[] = {
        {"key", F_STR, r->key, sizeof(r->key), NULL, true, true},
        {"backend", F_STR, backend, sizeof(backend), NULL, true, false},
        {"host", F_STR, r->host, sizeof(r->host), NULL, true, false},
        {"port", F_U64, &port, 0, NULL, true, false},
        {"pid", F_I64, &r->pid, 0, NULL, true, false},
        {"pid_start", F_U64, &r->pid_start, 0, NULL, false, false},
        {"hostname", F_STR, r->hostname, sizeof(r->hostname), NULL, true, false},
        {"boot_id", F_STR, r->boot_id, sizeof(r->boot_id), NULL, false, false},
        {"ctl_fd", F_I64, &r->ctl_fd, 0, NULL, false, false},
        {"ucx_addr", F_BIN, r->ucx_addr, sizeof(r->ucx_addr), &r->ucx_addr_len, false, false},
        {"ctl_addr", F_U64, &r->ctl_addr, 0, NULL, false, false},
        {"ctl_rkey", F_BIN, r->ctl_rkey, sizeof(r->ctl_rkey), &r->ctl_rkey_len, false, false},
    };
    pdl_status_t st = parse_map("engine descriptor", buf, len, "pdlink-engine", f, (int)(sizeof(f) / sizeof(f[0])), err);
    if (st != PDL_OK)
        return st;
    int b = pdl_backend_parse(backend);
    if (b < 0)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "engine descriptor of '%s': unknown backend '%s'", r->key, backend);
    r->backend = (pdl_backend_kind_t)b;
    if (port > 65535)
        return pdl_error_set(err, PDL_ERR_PARSE, "engine descriptor of '%s': port %llu out of range", r->key,
                             (unsigned long long)port);
    r->port = (uint16_t)port;
    /* The encoder writes the three ucx fields together (and only for ucx); one without the others
     * would re-encode to different bytes and means a broken peer. */
    if ((r->ucx_addr_len > 0) != (r->ctl_rkey_len > 0) || (r->ucx_addr_len == 0 && r->ctl_addr != 0))
        return pdl_error_set(err, PDL_ERR_PARSE,
                             "engine descriptor of '%s': ucx_addr, ctl_addr and ctl_rkey go together", r->key);
    if (r->backend == PDL_BACKEND_UCX && r->ucx_addr_len == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "engine descriptor of '%s': backend ucx without ucx_addr", r->key);
    return PDL_OK;
}

pdl_status_t pdl__mem_desc_unpack(const void *buf, size_t len, pdl_rmem_t *rm, pdl_error_t *err)
{
    char kind[16] = "";
    uint64_t mem_type = PDL_MEM_TYPE_HOST;
    memset(rm, 0, sizeof(*rm));
    rm->fd = rm->slot = -1;
    field_t f[] = {
        {"engine", F_STR, rm->engine_key, sizeof(rm->engine_key), NULL, true, false},
        {"id", F_U64, &rm->id, 0, NULL, true, false},
        {"size", F_U64, &rm->size, 0, NULL, true, false},
        {"kind", F_STR, kind, sizeof(kind), NULL, true, false},
        {"addr", F_U64, &rm->addr, 0, NULL, false, false},
        {"fd", F_I64, &rm->fd, 0, NULL, false, false},
        {"pid", F_I64, &rm->pid, 0, NULL, false, false},
        {"slot", F_I64, &rm->slot, 0, NULL, false, false},
        {"rkey", F_BIN, rm->rkey, sizeof(rm->rkey), &rm->rkey_len, false, false},
        {"mem_type", F_U64, &mem_type, 0, NULL, false, false},
        {"ipc", F_BIN, rm->ipc, sizeof(rm->ipc), &rm->ipc_len, false, false},
        {"ipc_off", F_U64, &rm->ipc_off, 0, NULL, false, false},
    };
    pdl_status_t st = parse_map("memory descriptor", buf, len, "pdlink-mem", f, (int)(sizeof(f) / sizeof(f[0])), err);
    if (st != PDL_OK)
        return st;
    if (strcmp(kind, "memfd") == 0)
        rm->kind = PDL_MEM_MEMFD;
    else if (strcmp(kind, "user") == 0)
        rm->kind = PDL_MEM_USER;
    else
        return pdl_error_set(err, PDL_ERR_PARSE, "memory descriptor of engine '%s': unknown kind '%s'",
                             rm->engine_key, kind);
    if (mem_type > PDL_MEM_TYPE_ROCM)
        return pdl_error_set(err, PDL_ERR_PARSE, "memory descriptor of engine '%s': unknown memory type %llu",
                             rm->engine_key, (unsigned long long)mem_type);
    rm->type = (pdl_mem_type_t)mem_type;
    /* The encoder writes the handle and its offset together; a handle is exactly a CUipcMemHandle. */
    if ((rm->ipc_len > 0 && rm->ipc_len != PDL_CUDA_IPC_HANDLE) || (rm->ipc_len == 0 && rm->ipc_off != 0))
        return pdl_error_set(err, PDL_ERR_PARSE,
                             "memory descriptor of engine '%s': 'ipc' must be %d bytes and goes with 'ipc_off'",
                             rm->engine_key, PDL_CUDA_IPC_HANDLE);
    return PDL_OK;
}
