/*
 * workq.c -- the FIFO job queue and its threads (workq.h).
 */
#include "common/workq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

static void *workq_main(void *arg)
{
    pdl_workq_t *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->head == NULL && !q->stop) {
            q->idle++;
            pthread_cond_wait(&q->cv, &q->mu);
            q->idle--;
        }
        pdl_workq_item_t *j = q->head;
        if (j == NULL)
            break; /* stopping and drained */
        q->head = j->next;
        if (q->head == NULL)
            q->tail = NULL;
        q->queued--;
        bool stopping = q->stop;
        pthread_mutex_unlock(&q->mu);
        j->next = NULL;
        q->run(q->arg, j, stopping);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    if (q->on_exit != NULL)
        q->on_exit(q->arg);
    return NULL;
}

/* Zero q, check the size, allocate the thread table; no thread yet. */
static pdl_status_t init(pdl_workq_t *q, int max_threads, int limit, pdl_workq_run_fn run, pdl_workq_exit_fn on_exit,
                         void *arg, const char *who, pdl_error_t *err)
{
    memset(q, 0, sizeof(*q));
    if (max_threads < 1 || max_threads > limit)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: %d threads, expected 1..%d", who, max_threads, limit);
    q->threads = calloc((size_t)max_threads, sizeof(pthread_t));
    if (q->threads == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "%s: out of memory for %d threads", who, max_threads);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->run = run;
    q->on_exit = on_exit;
    q->arg = arg;
    q->max_threads = max_threads;
    snprintf(q->who, sizeof(q->who), "%s", who);
    return PDL_OK;
}

pdl_status_t pdl__workq_start(pdl_workq_t *q, int nthreads, pdl_workq_run_fn run, pdl_workq_exit_fn on_exit, void *arg,
                              const char *who, pdl_error_t *err)
{
    pdl_status_t st = init(q, nthreads, 64, run, on_exit, arg, who, err);
    if (st != PDL_OK)
        return st;
    for (int i = 0; i < nthreads; i++) {
        if (pthread_create(&q->threads[i], NULL, workq_main, q) != 0) {
            pdl__workq_stop(q); /* joins the ones already started */
            return pdl_error_set(err, PDL_ERR_SYSTEM, "%s: cannot start thread %d of %d", who, i, nthreads);
        }
        q->nthreads++;
    }
    return PDL_OK;
}

pdl_status_t pdl__workq_start_elastic(pdl_workq_t *q, int max_threads, size_t stack_size, pdl_workq_run_fn run,
                                      void *arg, const char *who, pdl_error_t *err)
{
    pdl_status_t st = init(q, max_threads, 65536, run, NULL, arg, who, err);
    if (st == PDL_OK)
        q->stack_size = stack_size;
    return st;
}

/* Under q->mu. */
static void append(pdl_workq_t *q, pdl_workq_item_t *first, pdl_workq_item_t *last, int n)
{
    last->next = NULL;
    if (q->tail)
        q->tail->next = first;
    else
        q->head = first;
    q->tail = last;
    q->queued += n;
}

bool pdl__workq_offer(pdl_workq_t *q, pdl_workq_item_t *job, void (*admit)(pdl_workq_item_t *job))
{
    pthread_mutex_lock(&q->mu);
    if (q->idle <= q->queued && q->nthreads < q->max_threads && !q->stop) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        if (q->stack_size != 0)
            pthread_attr_setstacksize(&attr, q->stack_size);
        if (pthread_create(&q->threads[q->nthreads], &attr, workq_main, q) == 0)
            q->nthreads++;
        else
            pdl_warn("%s: cannot start a worker thread (%d running): jobs wait for a running one", q->who, q->nthreads);
        pthread_attr_destroy(&attr);
    }
    if (q->nthreads == 0 || q->stop) {
        pthread_mutex_unlock(&q->mu);
        return false;
    }
    if (admit != NULL)
        admit(job);
    append(q, job, job, 1);
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return true;
}

void pdl__workq_stats(pdl_workq_t *q, int *threads, int *busy, int *queued)
{
    pthread_mutex_lock(&q->mu);
    *threads = q->nthreads;
    *busy = q->nthreads - q->idle;
    *queued = q->queued;
    pthread_mutex_unlock(&q->mu);
}

void pdl__workq_push_chain(pdl_workq_t *q, pdl_workq_item_t *first, pdl_workq_item_t *last, int n)
{
    pthread_mutex_lock(&q->mu);
    append(q, first, last, n);
    /* One job wakes one thread; a chain may keep all of them busy. */
    if (n == 1)
        pthread_cond_signal(&q->cv);
    else
        pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void pdl__workq_push(pdl_workq_t *q, pdl_workq_item_t *job) { pdl__workq_push_chain(q, job, job, 1); }

void pdl__workq_stop(pdl_workq_t *q)
{
    if (q->threads == NULL)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->nthreads; i++)
        pthread_join(q->threads[i], NULL);
    free(q->threads);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    memset(q, 0, sizeof(*q));
}
