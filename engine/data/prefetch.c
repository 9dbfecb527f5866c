/* The prefetching batch producer (vramlab/prefetch.h): one mutex, one condition variable,
 * a ring of slots. Slot s holds batch k with k % slots == s; a worker may fill batch k once
 * the consumer has released batch k - slots from that slot. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramlab/prefetch.h"

typedef enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY } slot_state;

typedef struct {
  void *buf;
  int64_t k;         /* batch it holds or is being filled with */
  slot_state state;
  vl_status status;  /* of the fill */
  vl_err err;
} slot;

struct vl_prefetch {
  vl_prefetch_cfg cfg;
  int n_slots;
  slot *slots;
  int64_t next_k;    /* the consumer's next batch */
  int64_t released;  /* batches the consumer has given back: slot of k is free for k < released + n_slots */
  bool held;         /* the consumer holds batch next_k - 1 */
  bool stop;
  vl_status failed;  /* sticky: a fill failed and was delivered */
  vl_err failed_err;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t *threads;
  int n_threads;
  struct worker_arg { vl_prefetch *p; int w; } *args;
};

size_t vl_prefetch_host_bytes(const vl_prefetch_cfg *c) {
  int slots = c->workers > 0 ? c->workers * c->prefetch + 1 : 1;
  return (size_t)slots * c->buf_bytes;
}

static vl_status fill_one(vl_prefetch *p, int w, int64_t k, slot *s) {
  s->err.msg[0] = 0;
  vl_status st = p->cfg.fill(p->cfg.user, w, k, s->buf, &s->err);
  if (st != VL_OK && !s->err.msg[0]) vl_err_set(&s->err, st, "batch %lld: %s", (long long)k, vl_status_name(st));
  return st;
}

static void *worker(void *arg) {
  struct worker_arg *a = arg;
  vl_prefetch *p = a->p;
  int W = p->cfg.workers;
  for (int64_t k = a->w; k < p->cfg.n_batches; k += W) {
    slot *s = &p->slots[k % p->n_slots];
    pthread_mutex_lock(&p->mu);
    /* batch k - n_slots, the slot's previous batch, must have been given back */
    while (!p->stop && k >= p->released + p->n_slots) pthread_cond_wait(&p->cv, &p->mu);
    if (p->stop) { pthread_mutex_unlock(&p->mu); break; }
    s->k = k;
    s->state = SLOT_FILLING;
    pthread_mutex_unlock(&p->mu);
    vl_status st = fill_one(p, a->w, k, s);
    pthread_mutex_lock(&p->mu);
    s->status = st;
    s->state = SLOT_READY;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  return NULL;
}

vl_status vl_prefetch_create(vl_prefetch **out, const vl_prefetch_cfg *cfg, vl_err *err) {
  *out = NULL;
  if (!cfg->fill || cfg->buf_bytes == 0 || cfg->n_batches < 0 || cfg->workers < 0 ||
      cfg->workers > VL_PREFETCH_MAX_WORKERS || cfg->prefetch < 1 || cfg->prefetch > 1024) {
    return vl_err_set(err, VL_ERR_INVALID,
                      "prefetch: workers %d (0..%d), prefetch %d (1..1024), %zu-byte buffers, %lld batches",
                      cfg->workers, VL_PREFETCH_MAX_WORKERS, cfg->prefetch, cfg->buf_bytes,
                      (long long)cfg->n_batches);
  }
  vl_prefetch *p = calloc(1, sizeof *p);
  if (!p) return vl_err_set(err, VL_ERR_OOM, "prefetch: no host memory");
  p->cfg = *cfg;
  p->n_slots = cfg->workers > 0 ? cfg->workers * cfg->prefetch + 1 : 1;
  p->slots = calloc((size_t)p->n_slots, sizeof *p->slots);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  size_t bytes = (cfg->buf_bytes + 63) / 64 * 64;
  for (int i = 0; p->slots && i < p->n_slots; i++) {
    p->slots[i].buf = aligned_alloc(64, bytes);
    if (!p->slots[i].buf) break;
    p->slots[i].k = -1;
  }
  if (!p->slots || !p->slots[p->n_slots - 1].buf) {
    vl_prefetch_destroy(p);
    return vl_err_set(err, VL_ERR_OOM, "prefetch: no host memory for %d buffers of %zu bytes",
                      cfg->workers * cfg->prefetch + 1, cfg->buf_bytes);
  }
  if (cfg->workers > 0) {
    p->threads = calloc((size_t)cfg->workers, sizeof *p->threads);
    p->args = calloc((size_t)cfg->workers, sizeof *p->args);
    if (!p->threads || !p->args) {
      vl_prefetch_destroy(p);
      return vl_err_set(err, VL_ERR_OOM, "prefetch: no host memory for %d workers", cfg->workers);
    }
    for (int w = 0; w < cfg->workers; w++) {
      p->args[w] = (struct worker_arg){p, w};
      if (pthread_create(&p->threads[w], NULL, worker, &p->args[w])) {
        vl_prefetch_destroy(p);
        return vl_err_set(err, VL_ERR_BACKEND, "prefetch: cannot start worker %d", w);
      }
      p->n_threads++;
    }
  }
  *out = p;
  return VL_OK;
}

vl_status vl_prefetch_next(vl_prefetch *p, void **buf, int64_t *k, double *wait, vl_err *err) {
  *buf = NULL;
  *wait = 0;
  if (p->failed != VL_OK) return vl_err_set(err, p->failed, "%s", p->failed_err.msg);
  if (p->held) return vl_err_set(err, VL_ERR_INVALID, "prefetch: batch %lld was not released", (long long)(p->next_k - 1));
  if (p->next_k >= p->cfg.n_batches) return VL_OK; /* the end */
  int64_t kk = p->next_k;
  slot *s = &p->slots[kk % p->n_slots];
  if (p->cfg.workers == 0) {
    s->k = kk;
    s->status = fill_one(p, 0, kk, s);
  } else {
    double t0 = vl_now();
    pthread_mutex_lock(&p->mu);
    while (!(s->state == SLOT_READY && s->k == kk)) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    *wait = vl_now() - t0;
  }
  if (s->status != VL_OK) {
    p->failed = s->status;
    p->failed_err = s->err;
    return vl_err_set(err, s->status, "%s", s->err.msg);
  }
  p->held = true;
  p->next_k++;
  *buf = s->buf;
  *k = kk;
  return VL_OK;
}

void vl_prefetch_release(vl_prefetch *p, void *buf) {
  (void)buf;
  if (!p->held) return;
  pthread_mutex_lock(&p->mu);
  p->slots[(p->next_k - 1) % p->n_slots].state = SLOT_FREE;
  p->held = false;
  p->released = p->next_k;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void vl_prefetch_destroy(vl_prefetch *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
  for (int i = 0; p->slots && i < p->n_slots; i++) free(p->slots[i].buf);
  free(p->slots);
  free(p->threads);
  free(p->args);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}
