/*
 * shm.c -- transfer backend for two processes on one host.
 *
 * Memory pdlink allocated (memfd) is mapped by the peer: at session open the initiator opens
 * /proc/<pid>/fd/<fd> of the owner's memfd (allowed for root and for the same uid, the same check as
 * ptrace) and maps it MAP_SHARED once; a batch is then plain memcpy, split over the
 * engine's workers when it is large (one memcpy thread does not fill memory bandwidth here, two do).
 * Memory the caller registered itself is copied with process_vm_readv/process_vm_writev, up to IOV_MAX
 * iovecs per call: with small iovecs one call per iovec is bound by the cost of the system call, so the
 * batch is handed to the kernel in as few calls as possible.
 *
 * The mapping is not populated at open: MAP_POPULATE of a whole region (124 MiB per rank for
 * llama-3.1-8b in `pdlink run`) took 20-180 ms inside the first pull from each producer, holding the
 * process' mmap lock while the other ranks' first pulls queued behind it. A pull that opens
 * its own session faults in only the pages of its blocks; a session opened ahead of need (the
 * connector's prewarm) is populated by pdl_session_prefault on that background thread
 * (MADV_POPULATE_WRITE, which takes the mmap lock for reading only).
 *
 * There is no server: the owner never sees the requests. Checks therefore happen on the initiator:
 * ranges against the size in the owner's memory descriptor (engine.c), liveness of the registration
 * against the owner's live table (a memfd of PDL_SHM_SLOTS ids the owner clears on deregistration,
 * mapped read-only here), and liveness of the owner through a pidfd (immune to pid reuse).
 * Semantics when the owner dies or deregisters: every batch posted afterwards fails (NOT_FOUND at once
 * after a deregistration; PEER_GONE once the pidfd, polled at most every SHM_ALIVE_CHECK_NS = 1 ms,
 * reports the exit). A batch already running on a mapped memfd completes, because the mapping keeps the pages
 * alive -- the bytes copied are the last bytes the owner wrote. A running process_vm batch fails with
 * PEER_GONE when the owner exits. A stopped (SIGSTOP) owner does not stall shm transfers at all.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/clock.h"
#include "engine/backend.h"
#include "engine/liveness.h"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

/* Below this a batch runs on one thread (inside post, see inline_max): waking workers costs more than
 * it saves (measured: a 1 MiB batch of 256 x 4 KiB took 167 us split over two workers, ~60 us inline). */
#define SHM_SPLIT_MIN_BYTES (4u << 20)

/* The owner's liveness is polled through its pidfd at most this often: the poll is a system call, and
 * small batches are short enough for it to matter (UCX completes a 4 KiB shm get in ~90 ns here). A
 * batch posted within this window after the owner died still copies from the mapping, which stays
 * valid; process_vm batches fail with ESRCH regardless. */
#define SHM_ALIVE_CHECK_NS 1000000ull

typedef struct shm_remote {
    int pidfd;
    const _Atomic uint64_t *ctl;
    _Atomic uint64_t alive_at_ns; /* last time the pidfd said "alive" */
    _Atomic bool dead;
} shm_remote_t;

typedef struct shm_session {
    uint8_t *map; /* the owner's memfd region, or NULL for user memory */
    size_t map_len;
} shm_session_t;

static int open_peer_fd(int64_t pid, int64_t fd, int flags)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%" PRId64 "/fd/%" PRId64, pid, fd);
    return open(path, flags | O_CLOEXEC);
}

static pdl_status_t shm_remote_add(pdl_engine_t *e, pdl_remote_t *r, pdl_error_t *err)
{
    if (r->boot_id[0] && e->boot_id[0] ? strcmp(r->boot_id, e->boot_id) != 0
                                       : strcmp(r->hostname, e->hostname) != 0)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "engine %s: remote engine %s runs on host %s, not on this host (%s); the %s backend "
                             "needs both engines on one host (use tcp)",
                             e->key, r->key, r->hostname, e->hostname, e->ops->name);
    if (r->pid <= 0 || r->pid > INT_MAX || r->ctl_fd < 0 || r->ctl_fd > INT_MAX)
        return pdl_error_set(err, PDL_ERR_PARSE, "engine %s: remote engine %s: bad pid %" PRId64 " or ctl_fd %" PRId64,
                             e->key, r->key, r->pid, r->ctl_fd);
    shm_remote_t *sr = calloc(1, sizeof(*sr));
    if (sr == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    sr->pidfd = pdl__proc_pidfd(r->pid, r->pid_start);
    if (sr->pidfd < 0) {
        int en = errno;
        free(sr);
        if (en == ESTALE)
            return pdl_error_set(err, PDL_ERR_PEER_GONE,
                                 "peer gone: engine %s: remote engine %s: pid %" PRId64 " is not the process that "
                                 "sent its descriptor (another start time: it exited and the pid was reused, or "
                                 "it runs in another pid namespace)",
                                 e->key, r->key, r->pid);
        return pdl_error_set(err, en == ESRCH ? PDL_ERR_PEER_GONE : PDL_ERR_SYSTEM,
                             "engine %s: remote engine %s: pidfd_open(%" PRId64 "): %s", e->key, r->key, r->pid,
                             strerror(en));
    }
    int fd = open_peer_fd(r->pid, r->ctl_fd, O_RDONLY);
    if (fd < 0) {
        int en = errno;
        close(sr->pidfd);
        free(sr);
        return pdl_error_set(err, en == ENOENT || en == ESRCH ? PDL_ERR_PEER_GONE : PDL_ERR_SYSTEM,
                             "engine %s: remote engine %s: open /proc/%" PRId64 "/fd/%" PRId64
                             " (its registration table): %s%s",
                             e->key, r->key, r->pid, r->ctl_fd, strerror(en),
                             en == EACCES || en == EPERM ? " (shm needs the same uid, or root)" : "");
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < PDL_CTL_BYTES) {
        close(fd);
        close(sr->pidfd);
        free(sr);
        return pdl_error_set(err, PDL_ERR_MISMATCH,
                             "engine %s: remote engine %s: its control table is smaller than this pdlink's (%zu "
                             "bytes): another pdlink version; run the same version on both sides",
                             e->key, r->key, (size_t)PDL_CTL_BYTES);
    }
    void *p = mmap(NULL, PDL_CTL_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        int en = errno;
        close(sr->pidfd);
        free(sr);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: remote engine %s: mmap of its registration table: %s",
                             e->key, r->key, strerror(en));
    }
    sr->ctl = p;
    r->bk = sr;
    return PDL_OK;
}

static void shm_remote_free(pdl_engine_t *e, pdl_remote_t *r)
{
    (void)e;
    shm_remote_t *sr = r->bk;
    if (sr == NULL)
        return;
    munmap((void *)sr->ctl, PDL_CTL_BYTES);
    close(sr->pidfd);
    free(sr);
    r->bk = NULL;
}

static bool peer_dead(shm_remote_t *sr)
{
    if (atomic_load_explicit(&sr->dead, memory_order_relaxed))
        return true;
    uint64_t now = pdl__clock_now_ns();
    if (pdl__clock_since(now, atomic_load_explicit(&sr->alive_at_ns, memory_order_relaxed)) < SHM_ALIVE_CHECK_NS)
        return false;
    if (pdl__proc_exited(sr->pidfd)) {
        atomic_store(&sr->dead, true);
        return true;
    }
    atomic_store_explicit(&sr->alive_at_ns, now, memory_order_relaxed);
    return false;
}

static pdl_status_t shm_session_check(pdl_session_t *s, pdl_error_t *err)
{
    shm_remote_t *sr = s->remote->bk;
    pdl_engine_t *e = s->engine;
    if (s->remote->removed)
        return pdl_error_set(err, PDL_ERR_PEER_GONE, "peer gone: engine %s: remote engine %s was removed", e->key,
                             s->rmem.engine_key);
    if (peer_dead(sr))
        return pdl_error_set(err, PDL_ERR_PEER_GONE, "peer gone: engine %s: remote engine %s (pid %" PRId64 ") exited",
                             e->key, s->rmem.engine_key, s->rmem.pid);
    if (s->rmem.slot < 0 || s->rmem.slot >= PDL_SHM_SLOTS ||
        atomic_load_explicit(&sr->ctl[s->rmem.slot], memory_order_acquire) != s->rmem.id)
        return pdl_error_set(err, PDL_ERR_NOT_FOUND,
                             "engine %s: region %" PRIu64 " of engine %s is not registered any more", e->key,
                             s->rmem.id, s->rmem.engine_key);
    return PDL_OK;
}

static pdl_status_t shm_session_open(pdl_session_t *s, pdl_error_t *err)
{
    pdl_engine_t *e = s->engine;
    if (s->rmem.pid != s->remote->pid)
        return pdl_error_set(err, PDL_ERR_MISMATCH,
                             "engine %s: region %" PRIu64 " names pid %" PRId64 " but engine %s runs as pid %" PRId64,
                             e->key, s->rmem.id, s->rmem.pid, s->remote->key, s->remote->pid);
    pdl_status_t st = shm_session_check(s, err);
    if (st != PDL_OK)
        return st;
    shm_session_t *ss = calloc(1, sizeof(*ss));
    if (ss == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    if (s->rmem.kind == PDL_MEM_MEMFD) {
        if (s->rmem.size > SIZE_MAX / 2 || s->rmem.fd < 0 || s->rmem.fd > INT_MAX) {
            free(ss);
            return pdl_error_set(err, PDL_ERR_PARSE, "engine %s: region %" PRIu64 " of engine %s: bad size or fd",
                                 e->key, s->rmem.id, s->rmem.engine_key);
        }
        int fd = open_peer_fd(s->rmem.pid, s->rmem.fd, O_RDWR);
        if (fd < 0) {
            int en = errno;
            free(ss);
            return pdl_error_set(err, en == ENOENT || en == ESRCH ? PDL_ERR_PEER_GONE : PDL_ERR_SYSTEM,
                                 "engine %s: open /proc/%" PRId64 "/fd/%" PRId64 " (region %" PRIu64
                                 " of engine %s): %s",
                                 e->key, s->rmem.pid, s->rmem.fd, s->rmem.id, s->rmem.engine_key, strerror(en));
        }
        struct stat sb;
        if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < s->rmem.size) {
            close(fd);
            free(ss);
            return pdl_error_set(err, PDL_ERR_MISMATCH,
                                 "engine %s: region %" PRIu64 " of engine %s claims %" PRIu64
                                 " bytes but its memfd is smaller",
                                 e->key, s->rmem.id, s->rmem.engine_key, s->rmem.size);
        }
        void *p = mmap(NULL, s->rmem.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) {
            int en = errno;
            free(ss);
            return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: mmap of region %" PRIu64 " of engine %s: %s", e->key,
                                 s->rmem.id, s->rmem.engine_key, strerror(en));
        }
        ss->map = p;
        ss->map_len = s->rmem.size;
    }
    s->bk = ss;
    return PDL_OK;
}

static void shm_session_close(pdl_session_t *s)
{
    shm_session_t *ss = s->bk;
    if (ss == NULL)
        return;
    if (ss->map)
        munmap(ss->map, ss->map_len);
    free(ss);
    s->bk = NULL;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels say EINVAL and the fallback below runs */
#endif

static pdl_status_t shm_session_prefault(pdl_session_t *s, pdl_error_t *err)
{
    shm_session_t *ss = s->bk;
    if (ss == NULL || ss->map == NULL)
        return PDL_OK; /* process_vm: nothing mapped here */
    /* Writable page-table entries: a WRITE would otherwise take a second (write) fault per page. */
    if (madvise(ss->map, ss->map_len, MADV_POPULATE_WRITE) == 0)
        return PDL_OK;
    int en = errno;
    if (en != EINVAL)
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: populating region %" PRIu64 " of engine %s: %s",
                             s->engine->key, s->rmem.id, s->rmem.engine_key, strerror(en));
    /* A kernel without MADV_POPULATE_*: read one byte per page (the owner's data must not change). */
    long pg = sysconf(_SC_PAGESIZE);
    volatile const uint8_t *m = ss->map;
    uint8_t sink = 0;
    for (size_t o = 0; o < ss->map_len; o += (size_t)pg)
        sink ^= m[o];
    (void)sink;
    return PDL_OK;
}

static int shm_plan(pdl_session_t *s, pdl_op_t op, uint64_t bytes, size_t n)
{
    (void)op;
    (void)n;
    int w = s->engine->num_workers;
    if (bytes < SHM_SPLIT_MIN_BYTES || w == 1)
        return 1;
    uint64_t by_size = bytes / (SHM_SPLIT_MIN_BYTES / 2);
    return by_size < (uint64_t)w ? (int)by_size : w;
}

/* Copy with process_vm_readv/writev, IOV_MAX iovecs a call; a short count resumes mid-iovec. */
static pdl_status_t run_vm(pdl_session_t *s, pdl_batch_t *b, const pdl_chunk_t *c, pdl_error_t *err)
{
    struct iovec liov[IOV_MAX], riov[IOV_MAX];
    uint8_t *local = s->local->ptr;
    size_t i = c->first, end = c->first + c->count;
    uint64_t skip = 0; /* bytes of descriptor i already copied */
    while (i < end) {
        if (atomic_load(&b->cancel))
            return pdl_error_set(err, PDL_ERR_BAD_STATE, "engine %s: batch cancelled", s->engine->key);
        int k = 0;
        size_t want = 0;
        for (size_t j = i; j < end && k < IOV_MAX; j++, k++) {
            uint64_t o = j == i ? skip : 0;
            const pdl_desc_t *d = &b->d[j];
            liov[k] = (struct iovec){local + d->local_off + o, d->len - o};
            riov[k] = (struct iovec){(void *)(uintptr_t)(s->rmem.addr + d->remote_off + o), d->len - o};
            want += d->len - o;
        }
        ssize_t got = b->op == PDL_OP_READ ? process_vm_readv((pid_t)s->rmem.pid, liov, (unsigned long)k, riov,
                                                              (unsigned long)k, 0)
                                           : process_vm_writev((pid_t)s->rmem.pid, liov, (unsigned long)k, riov,
                                                               (unsigned long)k, 0);
        if (got < 0 || (got == 0 && want > 0)) {
            int en = got < 0 ? errno : EFAULT;
            const pdl_desc_t *d = &b->d[i];
            if (en == ESRCH) { /* exited (a zombie has no memory either): every later batch fails too */
                atomic_store(&((shm_remote_t *)s->remote->bk)->dead, true);
                return pdl_error_set(err, PDL_ERR_PEER_GONE,
                                     "peer gone: engine %s: remote engine %s (pid %" PRId64 ") exited during %s of region %" PRIu64,
                                     s->engine->key, s->rmem.engine_key, s->rmem.pid,
                                     b->op == PDL_OP_READ ? "read" : "write", s->rmem.id);
            }
            return pdl_error_set(err, en == EFAULT ? PDL_ERR_TRANSPORT : PDL_ERR_SYSTEM,
                                 "engine %s: process_vm_%s [%" PRIu64 ", +%" PRIu64 ") of region %" PRIu64
                                 " of engine %s (pid %" PRId64 "): %s",
                                 s->engine->key, b->op == PDL_OP_READ ? "readv" : "writev", d->remote_off + skip,
                                 d->len - skip, s->rmem.id, s->rmem.engine_key, s->rmem.pid, strerror(en));
        }
        uint64_t left = (uint64_t)got;
        while (left > 0) {
            uint64_t rem = b->d[i].len - skip;
            if (left >= rem) {
                left -= rem;
                i++;
                skip = 0;
            } else {
                skip += left;
                left = 0;
            }
        }
    }
    return PDL_OK;
}

static const pdl_grant_pub_t *remote_grants(const pdl_session_t *s)
{
    return (const pdl_grant_pub_t *)((const uint8_t *)((shm_remote_t *)s->remote->bk)->ctl + PDL_CTL_LIVE_BYTES);
}

/*
 * The fence before a copy of descriptors [first, first + count) of b: the grant it names must be live
 * for this registration and op, cover every one of those descriptors' remote ranges (the owner's
 * published ranges, never anything the batch says), and still be the slot seen after the ranges were
 * read (they are read without a lock). Refusals name the batch's own range and grant only.
 */
static pdl_status_t grant_enter(pdl_session_t *s, const pdl_batch_t *b, size_t first, size_t count, uint64_t *slot,
                                uint64_t *seq, pdl_error_t *err)
{
    if (b->grant[0] == '\0')
        return PDL_OK;
    const pdl_grant_pub_t *pub = remote_grants(s);
    const char *opn = b->op == PDL_OP_READ ? "read" : "write";
    if (pub->layout != PDL_GRANT_PUB_LAYOUT)
        return pdl_error_set(err, PDL_ERR_DENIED,
                             "engine %s: %s of region %" PRIu64 " of engine %s denied: its grant table has another "
                             "layout (another pdlink version; run the same version on both sides)",
                             s->engine->key, opn, s->rmem.id, s->rmem.engine_key);
    unsigned gop = b->op == PDL_OP_READ ? PDL_GRANT_READ : PDL_GRANT_WRITE;
    if (!pdl__grant_pub_find(pub, b->grant, s->rmem.id, gop, slot, seq))
        return pdl_error_set(err, PDL_ERR_DENIED,
                             "engine %s: grant %s is not live on region %" PRIu64 " of engine %s (the owner revoked "
                             "it: it gave up the transfer, e.g. after its release or its timeout)",
                             s->engine->key, b->grant, s->rmem.id, s->rmem.engine_key);
    for (size_t i = first; i < first + count; i++) {
        const pdl_desc_t *d = &b->d[i];
        if (!pdl__grant_pub_covers(pub, *slot, d->remote_off, d->len)) {
            if (!pdl__grant_pub_still(pub, *slot, *seq))
                break; /* the list changed under us: report the revocation below */
            return pdl_error_set(err, PDL_ERR_DENIED,
                                 "engine %s: %s [%" PRIu64 ", +%" PRIu64 ") of region %" PRIu64
                                 " of engine %s denied: it is outside its grant %s",
                                 s->engine->key, opn, d->remote_off, d->len, s->rmem.id, s->rmem.engine_key, b->grant);
        }
    }
    if (!pdl__grant_pub_still(pub, *slot, *seq))
        return pdl_error_set(err, PDL_ERR_DENIED,
                             "engine %s: grant %s is not live on region %" PRIu64 " of engine %s (revoked while the "
                             "%s was being checked)",
                             s->engine->key, b->grant, s->rmem.id, s->rmem.engine_key, opn);
    return PDL_OK;
}

/* The whole batch (cuda runs a batch as one chunk). */
pdl_status_t pdl__shm_grant_enter(pdl_session_t *s, const pdl_batch_t *b, uint64_t *slot, uint64_t *seq, pdl_error_t *err)
{
    return grant_enter(s, b, 0, b->n, slot, seq, err);
}

pdl_status_t pdl__shm_grant_leave(pdl_session_t *s, const pdl_batch_t *b, uint64_t slot, uint64_t seq, pdl_error_t *err)
{
    if (b->grant[0] && !pdl__grant_pub_still(remote_grants(s), slot, seq))
        return pdl_error_set(err, PDL_ERR_DENIED,
                             "engine %s: grant %s on region %" PRIu64 " of engine %s was revoked during the %s: the "
                             "owner may have reused those blocks, so the %s is void",
                             s->engine->key, b->grant, s->rmem.id, s->rmem.engine_key,
                             b->op == PDL_OP_READ ? "read" : "write", b->op == PDL_OP_READ ? "data read" : "write");
    return PDL_OK;
}

static pdl_status_t shm_run_chunk(pdl_session_t *s, pdl_batch_t *b, int idx, pdl_error_t *err)
{
    const pdl_chunk_t *c = &b->chunks[idx];
    shm_session_t *ss = s->bk;
    uint64_t slot = 0, seq = 0;
    pdl_status_t st = grant_enter(s, b, c->first, c->count, &slot, &seq, err);
    if (st == PDL_OK)
        st = ss->map ? pdl__chunk_copy_mapped(s, b, c, ss->map, err) : run_vm(s, b, c, err);
    return st == PDL_OK ? pdl__shm_grant_leave(s, b, slot, seq, err) : st;
}

pdl_status_t pdl__shm_remote_add(pdl_engine_t *e, pdl_remote_t *r, pdl_error_t *err)
{
    return shm_remote_add(e, r, err);
}

void pdl__shm_remote_free(pdl_engine_t *e, pdl_remote_t *r) { shm_remote_free(e, r); }

pdl_status_t pdl__shm_session_check(pdl_session_t *s, pdl_error_t *err) { return shm_session_check(s, err); }

const pdl_backend_ops_t pdl__shm_ops = {
    .name = "shm",
    .caps = PDL_BACKEND_CAP_LIVE_TABLE,
    .inline_max = SHM_SPLIT_MIN_BYTES,
    .remote_add = shm_remote_add,
    .remote_free = shm_remote_free,
    .session_open = shm_session_open,
    .session_close = shm_session_close,
    .session_prefault = shm_session_prefault,
    .session_check = shm_session_check,
    .plan = shm_plan,
    .run_chunk = shm_run_chunk,
};
