/* Per-thread scratch for convolution tasks (conv/scratch.h). */
#include "conv/scratch.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    void *buf[ASYMO_SCRATCH_SLOTS];
    size_t cap[ASYMO_SCRATCH_SLOTS];
} thread_scratch;

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int key_ok;

static void release(void *p)
{
    thread_scratch *s = (thread_scratch *)p;
    if (s) {
        for (int i = 0; i < ASYMO_SCRATCH_SLOTS; i++)
            free(s->buf[i]);
        free(s);
    }
}

static void init_key(void)
{
    key_ok = pthread_key_create(&key, release) == 0;
}

void *asymo_conv_scratch(int slot, size_t bytes)
{
    if (slot < 0 || slot >= ASYMO_SCRATCH_SLOTS)
        return NULL;
    pthread_once(&once, init_key);
    if (!key_ok)
        return NULL;
    thread_scratch *s = (thread_scratch *)pthread_getspecific(key);
    if (!s) {
        s = (thread_scratch *)calloc(1, sizeof *s);
        if (!s || pthread_setspecific(key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap[slot] < bytes) {
        void *p = NULL;
        if (posix_memalign(&p, 128, bytes) != 0)
            return NULL;
        free(s->buf[slot]);
        s->buf[slot] = p;
        s->cap[slot] = bytes;
    }
    return s->buf[slot];
}
