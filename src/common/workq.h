/*
 * workq.h -- a FIFO of jobs served by a fixed set of threads (internal to libpdlink).
 *
 * The one mutex/condvar queue of pdlink: the engine's worker pool, each connector rank's transfer
 * lanes and the HTTP listeners' request workers are all a pdl_workq_t. Jobs are intrusive (embed a
 * pdl_workq_item_t), so queueing never allocates.
 *
 * Two kinds: a fixed queue (pdl__workq_start) runs its threads from the start and queueing never
 * fails; an elastic one (pdl__workq_start_elastic) starts a thread only when a job finds none idle,
 * up to a maximum, so a listener sized for thousands of slow requests costs nothing while quiet, and
 * its jobs are offered (pdl__workq_offer), which can be refused.
 *
 * Stop: pdl__workq_stop lets the threads drain what is queued -- every job still runs, with
 * `stopping` true so the owner can fail it quickly instead of doing the work -- and joins them.
 * Nothing is left in the queue afterwards, so the owner frees no stray jobs.
 */
#ifndef PDL_COMMON_WORKQ_H
#define PDL_COMMON_WORKQ_H

#include <pthread.h>
#include <stdbool.h>

#include "pdlink/status.h"

typedef struct pdl_workq_item {
    struct pdl_workq_item *next;
} pdl_workq_item_t;

/* Runs one job on a queue thread; `stopping` is true once pdl__workq_stop was called. The job is the
 * function's to free (or to hand on). */
typedef void (*pdl_workq_run_fn)(void *arg, pdl_workq_item_t *job, bool stopping);
/* Runs on each queue thread just before it exits (thread-owned resources, e.g. socket caches). */
typedef void (*pdl_workq_exit_fn)(void *arg);

typedef struct pdl_workq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pdl_workq_item_t *head, *tail;
    bool stop;
    pdl_workq_run_fn run;
    pdl_workq_exit_fn on_exit;
    void *arg;
    pthread_t *threads;       /* [max_threads], the first nthreads started */
    int nthreads, max_threads;
    int idle, queued;         /* threads waiting for a job; jobs waiting for a thread */
    size_t stack_size;        /* elastic: the threads' stack (0: the default) */
    char who[48];             /* the queue's name in its log lines, e.g. "http workers" */
} pdl_workq_t;

/* Initialise q and start `nthreads` threads (1..64) running run(arg, job, stopping); on_exit may be
 * NULL. Fails with PDL_ERR_NOMEM or PDL_ERR_SYSTEM naming `who`; then q holds nothing to release.
 * On success the caller must call pdl__workq_stop. */
pdl_status_t pdl__workq_start(pdl_workq_t *q, int nthreads, pdl_workq_run_fn run, pdl_workq_exit_fn on_exit, void *arg,
                              const char *who, pdl_error_t *err);
/* An elastic queue: no thread yet, up to max_threads (1..65536) started by pdl__workq_offer with
 * `stack_size` bytes of stack (0: the default). Fails with PDL_ERR_INVALID or PDL_ERR_NOMEM naming
 * `who`; on success the caller must call pdl__workq_stop. */
pdl_status_t pdl__workq_start_elastic(pdl_workq_t *q, int max_threads, size_t stack_size, pdl_workq_run_fn run,
                                      void *arg, const char *who, pdl_error_t *err);
/* Elastic queues: queue `job`, first starting a thread when no idle one is left for it and fewer than
 * max_threads run. admit(job) (NULL: none) runs under the queue's lock just before the job is queued,
 * so the owner can change the job's state before any thread sees it. Returns false -- nothing queued,
 * admit not called -- when the queue is stopping, or has no thread and cannot start one (logged). */
bool pdl__workq_offer(pdl_workq_t *q, pdl_workq_item_t *job, void (*admit)(pdl_workq_item_t *job));
/* Threads started, threads running a job and jobs waiting, read together. */
void pdl__workq_stats(pdl_workq_t *q, int *threads, int *busy, int *queued);
/* Fixed queues: append one job (never fails; the queue borrows the item until `run` gets it). */
void pdl__workq_push(pdl_workq_t *q, pdl_workq_item_t *job);
/* Append a chain of n linked jobs (first..last, last->next ignored) under one lock. */
void pdl__workq_push_chain(pdl_workq_t *q, pdl_workq_item_t *first, pdl_workq_item_t *last, int n);
/* Run what is queued (stopping = true), join the threads and release q. Safe on a zeroed q. */
void pdl__workq_stop(pdl_workq_t *q);

#endif /* PDL_COMMON_WORKQ_H */
