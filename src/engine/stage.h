/*
 * stage.h -- device memory moved through pinned host staging windows, for the tcp backend's sockets
 * (stage.c). Only src/engine/ sources include this file.
 *
 * A stage serves one direction at a time: out (device -> host: the bytes of a list of device ranges,
 * handed out window by window in order, for sending) or in (host -> device: windows the caller fills
 * from the socket, each copied to its ranges of the device list once full). Two windows alternate, so
 * the device copy of one runs while the other is on the socket. The CPU only reads and writes the
 * pinned windows; the device ranges are addresses it never dereferences.
 *
 * A stage is used by one thread at a time. Every call makes the engine's CUDA context current with
 * push/pop. Errors are sticky until the next begin: once a copy failed, later calls return it.
 *
 * Waiting for a copy: a stage made with `nowait` never blocks on the device: out_next, in_window and
 * in_end return PDL_INPROGRESS (nothing handed out, err untouched) while the copy they need runs, and
 * the caller asks again later (the tcp owner's server thread, which serves other connections
 * meanwhile). Otherwise they wait (the initiator's driving thread). abort and destroy always wait.
 */
#ifndef PDL_ENGINE_STAGE_H
#define PDL_ENGINE_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "engine/cudadrv.h"

/* Bytes per staging window. */
#define PDL_STAGE_WINDOW (2u << 20)

typedef struct pdl_stage pdl_stage_t;

/* Two windows of pinned host memory (cuMemHostAlloc), two of device memory (for the gather) and two
 * streams in `d`'s context (pdl__cudadrv_ctx first). `key` (borrowed: it must outlive the stage)
 * names the engine in messages; `nowait`: see above. PDL_ERR_NOMEM, PDL_ERR_SYSTEM (an allocation of
 * the driver failed). */
pdl_status_t pdl__stage_create(pdl_cudadrv_t *d, const char *key, bool nowait, pdl_stage_t **out, pdl_error_t *err);
/* Wait for the copies in flight, then free everything. Accepts NULL. */
void pdl__stage_destroy(pdl_stage_t *st);

/*
 * Start moving the bytes of the device ranges v[0..n) (iov_base is a device address; the list is
 * copied), out (to_host) or in. Out queues the copies of the first two windows at once. The previous
 * transfer must be finished (out: every window taken; in: pdl__stage_in_end) or abandoned
 * (pdl__stage_abort). PDL_ERR_NOMEM, PDL_ERR_TRANSPORT (a copy could not be queued).
 */
pdl_status_t pdl__stage_begin(pdl_stage_t *st, bool to_host, const struct iovec *v, size_t n, pdl_error_t *err);
/* Out: the next window of bytes, in order, in host memory (queues the copy of the window after the next
 * into the buffer the previous window used, since the caller is done with it, then waits for the next
 * window's copy). *len is 0 once every byte was handed out. PDL_ERR_TRANSPORT when a copy failed;
 * nowait: PDL_INPROGRESS. */
pdl_status_t pdl__stage_out_next(pdl_stage_t *st, uint8_t **p, size_t *len, pdl_error_t *err);
/* In: the window to receive the next bytes into (waits until the copy that last used its buffer
 * finished; nowait: PDL_INPROGRESS until then); *len is what it takes, 0 once every byte was handed out. */
pdl_status_t pdl__stage_in_window(pdl_stage_t *st, uint8_t **p, size_t *len, pdl_error_t *err);
/* In: the window from pdl__stage_in_window is full: queue its copy to the device. */
pdl_status_t pdl__stage_in_commit(pdl_stage_t *st, pdl_error_t *err);
/* In: wait until every committed window is in device memory (nowait: PDL_INPROGRESS until then). */
pdl_status_t pdl__stage_in_end(pdl_stage_t *st, pdl_error_t *err);
/* Either direction: wait for the copies in flight and forget the transfer (its error too). */
void pdl__stage_abort(pdl_stage_t *st);

#endif /* PDL_ENGINE_STAGE_H */
