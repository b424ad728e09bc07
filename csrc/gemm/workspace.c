/* Workspace cache. Packed panels of a large GEMM are megabytes; fresh pages on every call
 * would cost more in page faults than the packing itself, so buffers are kept for reuse. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gemm/gemm_internal.h"

#define WS_SLOTS 6
#define WS_HUGE ((size_t)2 << 20)

static pthread_mutex_t ws_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *p;
    size_t size;
} ws_cache[WS_SLOTS];

/* A fork while another thread holds ws_lock would leave the child's copy locked forever:
 * the child starts with a fresh lock and an empty cache (the parent's buffers are leaked
 * there, not freed: they may be in use by the parent's threads' copies). */
static void ws_after_fork_child(void)
{
    pthread_mutex_init(&ws_lock, NULL);
    memset(ws_cache, 0, sizeof ws_cache);
}

__attribute__((constructor)) static void ws_register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, ws_after_fork_child);
}

static void *ws_alloc(size_t size)
{
    void *p = NULL;
    size_t align = size >= WS_HUGE ? WS_HUGE : ASYMO_ALIGN;
    if (posix_memalign(&p, align, size) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    /* Panels are streamed with large strides between slivers: huge pages spare TLB misses. */
    if (size >= WS_HUGE)
        madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

void *ws_acquire(size_t want, size_t *got)
{
    int best = -1;
    want = want >= WS_HUGE ? round_up(want, WS_HUGE) : round_up(want, 4096);
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_SLOTS; i++)
        if (ws_cache[i].p && ws_cache[i].size >= want
            && (best < 0 || ws_cache[i].size < ws_cache[best].size))
            best = i;
    if (best >= 0) {
        void *p = ws_cache[best].p;
        *got = ws_cache[best].size;
        ws_cache[best].p = NULL;
        ws_cache[best].size = 0;
        pthread_mutex_unlock(&ws_lock);
        return p;
    }
    pthread_mutex_unlock(&ws_lock);
    *got = want;
    return ws_alloc(want);
}

void ws_release(void *p, size_t size)
{
    int slot = -1;
    if (!p)
        return;
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_SLOTS; i++)
        if (!ws_cache[i].p) {
            slot = i;
            break;
        }
    if (slot < 0) { /* evict the smallest buffer if this one is larger */
        int small = 0;
        for (int i = 1; i < WS_SLOTS; i++)
            if (ws_cache[i].size < ws_cache[small].size)
                small = i;
        if (ws_cache[small].size < size) {
            free(ws_cache[small].p);
            slot = small;
        }
    }
    if (slot >= 0) {
        ws_cache[slot].p = p;
        ws_cache[slot].size = size;
        p = NULL;
    }
    pthread_mutex_unlock(&ws_lock);
    free(p);
}

int64_t asymo_gemm_workspace_bytes(void)
{
    int64_t total = 0;
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_SLOTS; i++)
        total += (int64_t)ws_cache[i].size;
    pthread_mutex_unlock(&ws_lock);
    return total;
}

void asymo_gemm_workspace_trim(void)
{
    pthread_mutex_lock(&ws_lock);
    for (int i = 0; i < WS_SLOTS; i++) {
        free(ws_cache[i].p);
        ws_cache[i].p = NULL;
        ws_cache[i].size = 0;
    }
    pthread_mutex_unlock(&ws_lock);
}

