/*
 * desc.c -- packing and unpacking of engine and memory descriptors (msgpack maps with string keys).
 *
 * Engine descriptor: {"magic":"pdlink-engine","v":1,"key","backend":"shm"|"tcp","host","port","pid",
 *                     "hostname","boot_id","ctl_fd"}
 * Memory descriptor: {"magic":"pdlink-mem","v":1,"engine","id","size","kind":"memfd"|"user","addr",
 *                     "fd","pid","slot"}
 * A map is order-free and unknown keys are ignored, so later versions can add fields; a different "v"
 * is PDL_ERR_MISMATCH, anything malformed is PDL_ERR_PARSE. The bytes come from a peer: every field is
 * type-checked and every string is bounded before it is copied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <msgpack.h>

#include "engine/backend.h"

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
    pack_str(pk, k);
    pack_str(pk, v);
}

static void pack_kv_u64(msgpack_packer *pk, const char *k, uint64_t v)
{
    pack_str(pk, k);
    msgpack_pack_uint64(pk, v);
}

static void pack_kv_i64(msgpack_packer *pk, const char *k, int64_t v)
{
    pack_str(pk, k);
    msgpack_pack_int64(pk, v);
}

static pdl_status_t take_sbuf(msgpack_sbuffer *sb, pdl_bytes_t *out, pdl_error_t *err)
{
    if (sb->data == NULL) {
        msgpack_sbuffer_destroy(sb);
        return pdl_error_set(err, PDL_ERR_NOMEM, "out of memory packing a descriptor");
    }
    out->data = (uint8_t *)sb->data; /* msgpack's sbuffer uses malloc/realloc, so free() releases it */
    out->len = sb->size;
    return PDL_OK;
}

pdl_status_t pdl__engine_desc_pack(const pdl_engine_t *e, pdl_bytes_t *out, pdl_error_t *err)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 10);
    pack_kv_str(&pk, "magic", "pdlink-engine");
    pack_kv_u64(&pk, "v", PDL_ENGINE_DESC_VERSION);
    pack_kv_str(&pk, "key", e->key);
    pack_kv_str(&pk, "backend", pdl_backend_name(e->backend));
    pack_kv_str(&pk, "host", e->host);
    pack_kv_u64(&pk, "port", e->port);
    pack_kv_i64(&pk, "pid", (int64_t)getpid());
    pack_kv_str(&pk, "hostname", e->hostname);
    pack_kv_str(&pk, "boot_id", e->boot_id);
    pack_kv_i64(&pk, "ctl_fd", e->ctl_fd);
    return take_sbuf(&sb, out, err);
}

pdl_status_t pdl__mem_desc_pack(const pdl_mem_t *m, pdl_bytes_t *out, pdl_error_t *err)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 10);
    pack_kv_str(&pk, "magic", "pdlink-mem");
    pack_kv_u64(&pk, "v", PDL_ENGINE_DESC_VERSION);
    pack_kv_str(&pk, "engine", m->engine->key);
    pack_kv_u64(&pk, "id", m->id);
    pack_kv_u64(&pk, "size", m->size);
    pack_kv_str(&pk, "kind", m->kind == PDL_MEM_MEMFD ? "memfd" : "user");
    pack_kv_u64(&pk, "addr", (uint64_t)(uintptr_t)m->ptr);
    pack_kv_i64(&pk, "fd", m->memfd);
    pack_kv_i64(&pk, "pid", (int64_t)getpid());
    pack_kv_i64(&pk, "slot", m->slot);
    return take_sbuf(&sb, out, err);
}

/* --- unpacking --- */

typedef struct field {
    const char *name;
    enum { F_STR, F_U64, F_I64 } type;
    void *dst;
    size_t cap; /* strings: capacity incl. NUL */
    bool required;
    bool seen;
} field_t;

static pdl_status_t parse_map(const char *what, const void *buf, size_t len, const char *magic, field_t *f,
                              int nf, pdl_error_t *err)
{
    if (buf == NULL || len == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: empty descriptor", what);
    if (len > 65536)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: descriptor of %zu bytes exceeds the 65536-byte limit", what,
                             len);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    pdl_status_t st = PDL_OK;
    if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || u.data.type != MSGPACK_OBJECT_MAP) {
        st = pdl_error_set(err, PDL_ERR_PARSE, "%s: not a msgpack map", what);
        goto out;
    }
    const msgpack_object_map *map = &u.data.via.map;
    bool magic_ok = false, have_v = false;
    uint64_t v = 0;
    for (uint32_t i = 0; i < map->size; i++) {
        const msgpack_object *k = &map->ptr[i].key, *val = &map->ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR)
            continue;
        const char *ks = k->via.str.ptr;
        uint32_t kn = k->via.str.size;
        if (kn == 5 && memcmp(ks, "magic", 5) == 0) {
            magic_ok = val->type == MSGPACK_OBJECT_STR && val->via.str.size == strlen(magic) &&
                       memcmp(val->via.str.ptr, magic, val->via.str.size) == 0;
            continue;
        }
        if (kn == 1 && ks[0] == 'v') {
            if (val->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
                have_v = true;
                v = val->via.u64;
            }
            continue;
        }
        for (int j = 0; j < nf; j++) {
            if (strlen(f[j].name) != kn || memcmp(f[j].name, ks, kn) != 0)
                continue;
            if (f[j].type == F_STR) {
                if (val->type != MSGPACK_OBJECT_STR || val->via.str.size >= f[j].cap) {
                    st = pdl_error_set(err, PDL_ERR_PARSE, "%s: field '%s' must be a string shorter than %zu bytes",
                                       what, f[j].name, f[j].cap);
                    goto out;
                }
                memcpy(f[j].dst, val->via.str.ptr, val->via.str.size);
                ((char *)f[j].dst)[val->via.str.size] = '\0';
                if (memchr(f[j].dst, '\0', val->via.str.size) != NULL) {
                    st = pdl_error_set(err, PDL_ERR_PARSE, "%s: field '%s' contains a NUL byte", what, f[j].name);
                    goto out;
                }
            } else if (f[j].type == F_U64) {
                if (val->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
                    st = pdl_error_set(err, PDL_ERR_PARSE, "%s: field '%s' must be a non-negative integer", what,
                                       f[j].name);
                    goto out;
                }
                *(uint64_t *)f[j].dst = val->via.u64;
            } else {
                if (val->type == MSGPACK_OBJECT_POSITIVE_INTEGER && val->via.u64 <= INT64_MAX)
                    *(int64_t *)f[j].dst = (int64_t)val->via.u64;
                else if (val->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
                    *(int64_t *)f[j].dst = val->via.i64;
                else {
                    st = pdl_error_set(err, PDL_ERR_PARSE, "%s: field '%s' must be an integer", what, f[j].name);
                    goto out;
                }
            }
            f[j].seen = true;
        }
    }
    if (!magic_ok) {
        st = pdl_error_set(err, PDL_ERR_PARSE, "%s: missing or wrong magic (expected \"%s\")", what, magic);
        goto out;
    }
    if (!have_v) {
        st = pdl_error_set(err, PDL_ERR_PARSE, "%s: missing version field 'v'", what);
        goto out;
    }
    if (v != PDL_ENGINE_DESC_VERSION) {
        st = pdl_error_set(err, PDL_ERR_MISMATCH,
                           "%s: descriptor version %llu, this pdlink speaks version %d; upgrade both sides to the "
                           "same pdlink release",
                           what, (unsigned long long)v, PDL_ENGINE_DESC_VERSION);
        goto out;
    }
    for (int j = 0; j < nf; j++) {
        if (f[j].required && !f[j].seen) {
            st = pdl_error_set(err, PDL_ERR_PARSE, "%s: missing field '%s'", what, f[j].name);
            goto out;
        }
    }
out:
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
        {"key", F_STR, r->key, sizeof(r->key), true, false},
        {"backend", F_STR, backend, sizeof(backend), true, false},
        {"host", F_STR, r->host, sizeof(r->host), true, false},
        {"port", F_U64, &port, 0, true, false},
        {"pid", F_I64, &r->pid, 0, true, false},
        {"hostname", F_STR, r->hostname, sizeof(r->hostname), true, false},
        {"boot_id", F_STR, r->boot_id, sizeof(r->boot_id), false, false},
        {"ctl_fd", F_I64, &r->ctl_fd, 0, false, false},
    };
    pdl_status_t st = parse_map("engine descriptor", buf, len, "pdlink-engine", f, (int)(sizeof(f) / sizeof(f[0])), err);
    if (st != PDL_OK)
        return st;
    if (r->key[0] == '\0')
        return pdl_error_set(err, PDL_ERR_PARSE, "engine descriptor: empty key");
    int b = pdl_backend_parse(backend);
    if (b < 0)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "engine descriptor of '%s': unknown backend '%s'", r->key, backend);
    r->backend = (pdl_backend_kind_t)b;
    if (port > 65535)
        return pdl_error_set(err, PDL_ERR_PARSE, "engine descriptor of '%s': port %llu out of range", r->key,
                             (unsigned long long)port);
    r->port = (uint16_t)port;
    return PDL_OK;
}

pdl_status_t pdl__mem_desc_unpack(const void *buf, size_t len, pdl_rmem_t *rm, pdl_error_t *err)
{
    char kind[16] = "";
    memset(rm, 0, sizeof(*rm));
    rm->fd = rm->slot = -1;
    field_t f[] = {
        {"engine", F_STR, rm->engine_key, sizeof(rm->engine_key), true, false},
        {"id", F_U64, &rm->id, 0, true, false},
        {"size", F_U64, &rm->size, 0, true, false},
        {"kind", F_STR, kind, sizeof(kind), true, false},
        {"addr", F_U64, &rm->addr, 0, false, false},
        {"fd", F_I64, &rm->fd, 0, false, false},
        {"pid", F_I64, &rm->pid, 0, false, false},
        {"slot", F_I64, &rm->slot, 0, false, false},
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
    return PDL_OK;
}
