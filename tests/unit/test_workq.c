/*
 * test_workq.c -- the job queue (src/common/workq.c): FIFO order on one thread, every job run exactly
 * once, stop draining with `stopping` set, and the elastic kind: threads started only for jobs that
 * find none idle, never more than the maximum, offers refused once stopping, admit run before a thread
 * sees the job. No timing: blocked jobs are held by a gate the test opens.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/workq.h"

typedef struct job {
    pdl_workq_item_t item;
    int id;
    int admitted; /* set by admit, checked by the run function */
} job_t;

typedef struct sink {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int order[256];
    int n, stopping_runs, unadmitted;
    bool gate_open; /* jobs block in run until the test opens the gate */
    int blocked;    /* jobs waiting at the gate */
} sink_t;

static void sink_init(sink_t *s, bool gate_open)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->gate_open = gate_open;
}

static void sink_destroy(sink_t *s)
{
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

static void run(void *arg, pdl_workq_item_t *item, bool stopping)
{
    sink_t *s = arg;
    job_t *j = (job_t *)(void *)((char *)item - offsetof(job_t, item));
    pthread_mutex_lock(&s->mu);
    s->blocked++;
    pthread_cond_broadcast(&s->cv);
    while (!s->gate_open)
        pthread_cond_wait(&s->cv, &s->mu);
    s->blocked--;
    s->order[s->n++] = j->id;
    s->stopping_runs += stopping;
    s->unadmitted += j->admitted == 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void wait_blocked(sink_t *s, int n)
{
    pthread_mutex_lock(&s->mu);
    while (s->blocked < n)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void wait_done(sink_t *s, int n)
{
    pthread_mutex_lock(&s->mu);
    while (s->n < n)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Until every started thread waits for a job (they get there right after their last job returns). */
static void wait_idle(pdl_workq_t *q)
{
    for (;;) {
        int threads, busy, queued;
        pdl__workq_stats(q, &threads, &busy, &queued);
        if (busy == 0 && queued == 0)
            return;
        sched_yield();
    }
}

static void open_gate(sink_t *s)
{
    pthread_mutex_lock(&s->mu);
    s->gate_open = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void mark_admitted(pdl_workq_item_t *item) { ((job_t *)(void *)((char *)item - offsetof(job_t, item)))->admitted = 1; }

static void fixed_one_thread_is_fifo(void **state)
{
    (void)state;
    sink_t s;
    sink_init(&s, true);
    pdl_workq_t q;
    assert_int_equal(pdl__workq_start(&q, 1, run, NULL, &s, "test", NULL), PDL_OK);
    job_t jobs[100];
    for (int i = 0; i < 100; i++) {
        jobs[i].id = i;
        jobs[i].admitted = 1;
        pdl__workq_push(&q, &jobs[i].item);
    }
    wait_done(&s, 100);
    for (int i = 0; i < 100; i++)
        assert_int_equal(s.order[i], i);
    pdl__workq_stop(&q);
    assert_int_equal(s.stopping_runs, 0);
    sink_destroy(&s);
}

static void *stop_thread(void *arg)
{
    pdl__workq_stop(arg);
    return NULL;
}

static void fixed_stop_drains_with_stopping(void **state)
{
    (void)state;
    sink_t s;
    sink_init(&s, false);
    pdl_workq_t q;
    assert_int_equal(pdl__workq_start(&q, 2, run, NULL, &s, "test", NULL), PDL_OK);
    job_t jobs[10];
    for (int i = 0; i < 10; i++) {
        jobs[i].id = i;
        jobs[i].admitted = 1;
    }
    /* A chain of 10 under one lock: two threads block at the gate, eight stay queued. */
    for (int i = 0; i < 9; i++)
        jobs[i].item.next = &jobs[i + 1].item;
    pdl__workq_push_chain(&q, &jobs[0].item, &jobs[9].item, 10);
    wait_blocked(&s, 2);
    int threads, busy, queued;
    pdl__workq_stats(&q, &threads, &busy, &queued);
    assert_int_equal(threads, 2);
    assert_int_equal(busy, 2);
    assert_int_equal(queued, 8);
    /* Stop while they block; once the stop is seen, let them go: the eight queued jobs still run, with
     * `stopping` set, and stop returns only after all of them. */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stop_thread, &q), 0);
    for (bool seen = false; !seen; sched_yield()) {
        pthread_mutex_lock(&q.mu);
        seen = q.stop;
        pthread_mutex_unlock(&q.mu);
    }
    open_gate(&s);
    pthread_join(t, NULL);
    assert_int_equal(s.n, 10);
    assert_int_equal(s.stopping_runs, 8);
    sink_destroy(&s);
}

static void elastic_starts_threads_only_when_needed(void **state)
{
    (void)state;
    sink_t s;
    sink_init(&s, false);
    pdl_workq_t q;
    assert_int_equal(pdl__workq_start_elastic(&q, 3, 0, run, &s, "test", NULL), PDL_OK);
    int threads, busy, queued;
    pdl__workq_stats(&q, &threads, &busy, &queued);
    assert_int_equal(threads, 0); /* nothing offered, nothing started */
    job_t jobs[6];
    for (int i = 0; i < 6; i++) {
        jobs[i].id = i;
        jobs[i].admitted = 0;
        assert_true(pdl__workq_offer(&q, &jobs[i].item, mark_admitted));
    }
    wait_blocked(&s, 3);
    pdl__workq_stats(&q, &threads, &busy, &queued);
    assert_int_equal(threads, 3); /* capped at the maximum: the other three wait */
    assert_int_equal(busy, 3);
    assert_int_equal(queued, 3);
    open_gate(&s);
    wait_done(&s, 6);
    /* At the maximum, one more job waits for one of the three. */
    job_t more = {.id = 6};
    assert_true(pdl__workq_offer(&q, &more.item, mark_admitted));
    wait_done(&s, 7);
    pdl__workq_stats(&q, &threads, &busy, &queued);
    assert_int_equal(threads, 3);
    assert_int_equal(queued, 0);
    assert_int_equal(s.unadmitted, 0);
    pdl__workq_stop(&q);
    assert_int_equal(s.stopping_runs, 0);
    sink_destroy(&s);
}

static void elastic_idle_thread_serves_before_growing(void **state)
{
    (void)state;
    sink_t s;
    sink_init(&s, true);
    pdl_workq_t q;
    assert_int_equal(pdl__workq_start_elastic(&q, 8, 256 * 1024, run, &s, "test", NULL), PDL_OK);
    job_t jobs[20];
    for (int i = 0; i < 20; i++) {
        jobs[i].id = i;
        assert_true(pdl__workq_offer(&q, &jobs[i].item, mark_admitted));
        wait_done(&s, i + 1);
        wait_idle(&q); /* one at a time, each offered to a thread that is waiting again */
    }
    int threads, busy, queued;
    pdl__workq_stats(&q, &threads, &busy, &queued);
    assert_int_equal(threads, 1);
    pdl__workq_stop(&q);
    sink_destroy(&s);
}

static void elastic_refuses_after_stop_and_bad_sizes(void **state)
{
    (void)state;
    sink_t s;
    sink_init(&s, true);
    pdl_workq_t q;
    pdl_error_t err;
    assert_int_equal(pdl__workq_start_elastic(&q, 0, 0, run, &s, "pool", &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "pool"));
    assert_int_equal(pdl__workq_start_elastic(&q, 65537, 0, run, &s, "pool", &err), PDL_ERR_INVALID);
    assert_int_equal(pdl__workq_start_elastic(&q, 2, 0, run, &s, "pool", NULL), PDL_OK);
    /* Stop while offers may still come: set stop the way pdl__workq_stop does, then offer. */
    pthread_mutex_lock(&q.mu);
    q.stop = true;
    pthread_mutex_unlock(&q.mu);
    job_t j = {.id = 1};
    assert_false(pdl__workq_offer(&q, &j.item, mark_admitted));
    assert_int_equal(j.admitted, 0); /* refused: admit did not run */
    pdl__workq_stop(&q);
    assert_int_equal(s.n, 0);
    sink_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fixed_one_thread_is_fifo),
        cmocka_unit_test(fixed_stop_drains_with_stopping),
        cmocka_unit_test(elastic_starts_threads_only_when_needed),
        cmocka_unit_test(elastic_idle_thread_serves_before_growing),
        cmocka_unit_test(elastic_refuses_after_stop_and_bad_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
