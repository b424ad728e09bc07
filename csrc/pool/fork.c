/* Fork handling. Only the forking thread exists in a child: every pool's workers are gone
 * and its locks may be held by threads that no longer exist. A registry of live pools lets
 * the child reset each one to a fresh state; workers start again on its first job. */
#include "pool/pool_internal.h" /* first: it defines _GNU_SOURCE */
#include <string.h>

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static asymo_pool *registry_head = NULL;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void atfork_prepare(void) { pthread_mutex_lock(&registry_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&registry_lock); }

static void pool_reset_after_fork(asymo_pool *p)
{
    mutex_init_adaptive(&p->shared_lock);
    pthread_mutex_init(&p->life_lock, NULL);
    pthread_mutex_init(&p->start_lock, NULL);
    pthread_cond_init(&p->start_cond, NULL);
    pthread_mutex_init(&p->stats_lock, NULL);
    p->shared_head = NULL;
    atomic_store(&p->sleepers, 0);
    atomic_store(&p->stop, 0);
    atomic_store(&p->threads_alive, 0);
    for (int i = 0; i < p->nworkers; i++) {
        worker_t *w = &p->workers[i];
        mutex_init_adaptive(&w->q.lock);
        rq_clear(&w->q);
        atomic_store(&w->d.top, 0);
        atomic_store(&w->d.bottom, 0);
        w->thread_started = 0;
        atomic_store(&w->pinned, 0);
        atomic_store(&w->claimed, 0);
        /* a superseded task was running in a thread the child does not have */
        atomic_store(&w->bk_state, 0);
        zero_counters(w);
    }
}

static void atfork_child(void)
{
    pthread_mutex_init(&registry_lock, NULL);
    for (asymo_pool *p = registry_head; p; p = p->reg_next)
        pool_reset_after_fork(p);
    pool_tls_pool = NULL;
    pool_tls_worker = -1;
    pool_tls_helping = 0;
}

static void register_atfork(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* A new pool; the fork handlers are installed with the first one. */
void registry_add(asymo_pool *p)
{
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&registry_lock);
    p->reg_prev = NULL;
    p->reg_next = registry_head;
    if (registry_head)
        registry_head->reg_prev = p;
    registry_head = p;
    pthread_mutex_unlock(&registry_lock);
}

void registry_remove(asymo_pool *p)
{
    pthread_mutex_lock(&registry_lock);
    if (p->reg_prev)
        p->reg_prev->reg_next = p->reg_next;
    else if (registry_head == p)
        registry_head = p->reg_next;
    if (p->reg_next)
        p->reg_next->reg_prev = p->reg_prev;
    pthread_mutex_unlock(&registry_lock);
}
