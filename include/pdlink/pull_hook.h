/*
 * pull_hook.h -- a consumer pull that runs caller work on each rank as soon as that rank's bytes are in
 * (an extension of connector.h's pdl_instance_pull; the two share everything else).
 *
 * Why: a consumer usually touches what it received right away (pdlink-node verifies every byte). Done
 * after pdl_pull_wait, that is one thread reading every rank's KV back from memory after all ranks
 * finished. Done in the hook, it runs on each rank's worker right after that rank's reads, in parallel
 * over the ranks, while the bytes are still in that core's cache.
 *
 * Contract:
 *   - `fn(arg, tp_rank)` runs on consumer rank tp_rank's worker thread once that rank's reads of this
 *     pull all completed successfully and its releases were sent (the producer is never kept waiting for
 *     the hook). It is not called for a rank whose read failed or that was stopped by shutdown.
 *   - The rank counts as finished only when fn returned: pdl_pull_wait returning PDL_OK means every
 *     rank's fn ran and returned, and everything fn wrote is visible to the waiting thread.
 *   - Calls for different ranks run concurrently: fn must only touch per-rank state (or lock).
 *   - `arg` belongs to the pull from a successful call on: `free_fn(arg)` (may be NULL) runs when the
 *     pull's last reference goes, after the last fn returned: in pdl_pull_free, or on a rank worker
 *     shortly after it (a worker drops its reference just after its rank finished), also when the caller
 *     gave up waiting (a timeout) and freed the pull while ranks were still working. Between
 *     pdl_pull_wait returning PDL_OK and pdl_pull_free the caller may read what fn wrote into `arg`; not
 *     after pdl_pull_free. On a failed call the caller keeps `arg`.
 */
#ifndef PDLINK_PULL_HOOK_H
#define PDLINK_PULL_HOOK_H

#include "pdlink/connector.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*pdl_pull_rank_fn)(void *arg, int tp_rank);

pdl_status_t pdl_instance_pull_hooked(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                      const uint32_t *local_blocks, size_t n, pdl_pull_rank_fn fn, void *arg,
                                      void (*free_fn)(void *arg), pdl_pull_t **pull_out, pdl_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_PULL_HOOK_H */
