/*
 * iov.h -- the two iovec-list steps every socket loop of the tcp backend takes: cut the list to what
 * one sendmsg/recvmsg may move, and advance it past the bytes a call moved. Pure and header-only, so
 * the hot loops in tcp.c and tcp_server.c inline them; tests/unit/test_engine_iov.c checks them
 * exhaustively over small lists.
 *
 * Why cut at all: a single call with a whole 64 MiB list keeps the socket locked while it copies and
 * delays window updates (the measured limits are next to TCP_SEND_CALL_MAX / TCP_RECV_CALL_MAX in
 * tcp.c and tcp_server.c), and the kernel refuses more than IOV_MAX entries.
 */
#ifndef PDL_ENGINE_IOV_H
#define PDL_ENGINE_IOV_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

/*
 * Take the first iovecs of v[0..n) while fewer than max_iov are taken and fewer than max_bytes bytes
 * are covered, and return how many (at least 1 when n, max_iov and max_bytes are all > 0). If the last
 * one taken reaches past max_bytes it is shortened in place so the list covers exactly max_bytes, and
 * its full length is stored in *saved_p for pdl__iov_uncap; otherwise *saved_p is 0. Zero-length
 * iovecs are taken like any other.
 */
static inline size_t pdl__iov_cap(struct iovec *v, size_t n, size_t max_iov, size_t max_bytes, size_t *saved_p)
{
    size_t k = 0, bytes = 0;
    while (k < n && k < max_iov && bytes < max_bytes)
        bytes += v[k++].iov_len;
    *saved_p = 0;
    if (bytes > max_bytes) {
        *saved_p = v[k - 1].iov_len;
        v[k - 1].iov_len -= bytes - max_bytes;
    }
    return k;
}

/* Undo pdl__iov_cap's shortening of v[k - 1] (nothing when saved is 0). */
static inline void pdl__iov_uncap(struct iovec *v, size_t k, size_t saved)
{
    if (saved != 0)
        v[k - 1].iov_len = saved;
}

/*
 * Consume `done` bytes from v[*i_p..n): fully consumed iovecs advance *i_p, a partly consumed one has
 * its base and length moved past the consumed part. Stops at n even if `done` is larger. Zero-length
 * iovecs after the last consumed byte stay in place.
 */
static inline void pdl__iov_advance(struct iovec *v, size_t *i_p, size_t n, size_t done)
{
    size_t i = *i_p;
    while (done > 0 && i < n) {
        if (done >= v[i].iov_len) {
            done -= v[i].iov_len;
            i++;
        } else {
            v[i].iov_base = (uint8_t *)v[i].iov_base + done;
            v[i].iov_len -= done;
            done = 0;
        }
    }
    *i_p = i;
}

#endif /* PDL_ENGINE_IOV_H */
