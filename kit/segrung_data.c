/* A U-Net segmentation rung's data (seg-ckpt's and multi-gpu's): the synthetic segmentation
 * splits (made on first use, seeded), the engine's loader over them, and the held-out evaluation of a model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "segrung.h"

vl_status vl_segrung_open_split(vl_case_env *env, const vl_segrung *r, bool eval, vl_segset **out) {
  char dir[VL_KNOB_VAL_LEN + 128]; /* data_dir + the split's folder name: cannot be cut */
  long n = eval ? r->eval_images : r->train_images;
  uint64_t seed = (uint64_t)r->seed * 1000003u + (eval ? 7u : 0u);
  int dn = snprintf(dir, sizeof dir, "%s/s%lld-c%lld-%s-n%ld-seed%llu", r->data_dir, (long long)r->model.mc.image,
                    (long long)r->model.mc.classes, eval ? "eval" : "train", n, (unsigned long long)seed);
  if (dn < 0 || (size_t)dn >= sizeof dir)
    return vl_case_fail(env, VL_ERR_INVALID, "data_dir: path too long (limit %zu)", sizeof dir - 1);
  vl_segset_gen_cfg g;
  vl_segset_gen_cfg_default(&g);
  g.n = n;
  g.size = (int)r->model.mc.image;
  g.num_classes = (int)r->model.mc.classes;
  g.seed = seed;
  g.progress = vl_case_gen_progress;
  /* Made only in a new or empty folder: a damaged or foreign one is refused, never
   * overwritten. The data set's calls write their message into m. */
  vl_err m = {""};
  bool make = false;
  if (vl_segset_first_use(out, dir, &g, &make, &m) != VL_OK) return vl_case_fail(env, VL_ERR_IO, "%s", m.msg);
  if (!make) return VL_OK;
  vl_progress("generating %ld synthetic segmentation images (%lldx%lld) in %s", n,
              (long long)r->model.mc.image, (long long)r->model.mc.image, dir);
  if (vl_segset_generate(dir, &g, &m) || vl_segset_open(out, dir, &m))
    return vl_case_fail(env, VL_ERR_IO, "%s", m.msg);
  return VL_OK;
}

void vl_segrung_loader_cfg(const vl_segrung *r, vl_loader_cfg *lc, int64_t B, bool eval, vl_ctx *c) {
  vl_loader_cfg_default(lc);
  lc->batch = B;
  lc->masks = true;
  lc->crop = (int)r->model.mc.image;
  lc->workers = eval ? 0 : (int)r->workers;
  lc->prefetch = (int)r->prefetch;
  lc->persistent = true;
  lc->batched_collate = true;
  lc->drop_last = !eval;
  lc->shuffle = !eval;
  lc->seed = (uint64_t)r->seed;
  lc->on_corrupt = r->corrupt;
  lc->max_file_bytes = r->max_file_bytes;
  if (r->pinned && c->device == VL_DEV_CUDA) {
    lc->x_alloc = vl_case_pinned_alloc;
    lc->x_free = vl_case_pinned_free;
    lc->x_user = c;
  }
}

vl_status vl_segrung_evaluate(vl_case_env *env, vl_model *m, const vl_segrung *r, vl_segset *es, double *acc,
                          double *miou) {
  vl_ctx *c = m->c;
  const vl_resunet_cfg *mc = &r->model.mc;
  vl_loader_cfg lc;
  int64_t B = 8;
  vl_segrung_loader_cfg(r, &lc, B, true, c);
  vl_dataset ds = vl_segset_dataset(es);
  vl_loader *l = NULL;
  vl_err lerr = {""};
  vl_status s = vl_loader_create(&l, &lc, &ds, &lerr);
  if (s != VL_OK) return vl_case_fail(env, s, "%s", lerr.msg);
  int64_t K = mc->classes, HW = mc->image * mc->image;
  int64_t *conf = calloc((size_t)(K * K), sizeof *conf);
  int32_t *pred = malloc((size_t)(B * HW) * sizeof *pred);
  if (!conf || !pred) s = VL_ERR_OOM;
  if (s == VL_OK) s = vl_loader_start_epoch(l, 0);
  bool said = false; /* the message is the model's, not the loader's */
  while (s == VL_OK) {
    vl_batch_buf *b = NULL;
    if ((s = vl_loader_next(l, &b)) != VL_OK || !b) break;
    vl_batch in = {0};
    int64_t xs[4] = {b->n, mc->in_ch, mc->image, mc->image}; // (B, 3, H, W)
    vl_batch_add(&in, "images", VL_F32, 4, xs, b->x);
    s = vl_model_predict(m, &in, pred);
    if (s != VL_OK) {
      vl_case_fail(env, s, "evaluation: %s", c->err);
      said = true;
    }
    for (int64_t i = 0; s == VL_OK && i < b->n * HW; i++) conf[b->y[i] * K + pred[i]]++;
    vl_loader_release(l, b);
  }
  if (s != VL_OK && !said) {
    vl_loader_stats st;
    vl_loader_stats_get(l, &st);
    vl_case_fail(env, s, "evaluation data: %s", st.last_error);
  }
  int64_t hit = 0, tot = 0;
  double iou = 0;
  int nk = 0;
  for (int64_t k = 0; s == VL_OK && k < K; k++) {
    int64_t tp = conf[k * K + k], row = 0, col = 0;
    for (int64_t j = 0; j < K; j++) { row += conf[k * K + j]; col += conf[j * K + k]; }
    hit += tp;
    tot += row;
    if (row + col - tp > 0) { iou += (double)tp / (double)(row + col - tp); nk++; }
  }
  *acc = tot ? (double)hit / (double)tot : 0;
  *miou = nk ? iou / nk : 0;
  free(conf);
  free(pred);
  vl_loader_destroy(l);
  return s;
}

/* A step's accum micro-batches from the loader. The loader keeps a bounded pool of batch
 * buffers: micro-batches of one step are copied out (a memcpy each) and handed back at
 * once. The end of the epoch's data (a partial step) ends the loop. */
vl_status vl_segrung_next(void *user, long step, const vl_batch **mb, int *n, double *wait) {
  vl_segrung_feed *L = user;
  const vl_resunet_cfg *mc = &L->r->model.mc;
  size_t nxb = (size_t)(3 * mc->image * mc->image), nyb = (size_t)(mc->image * mc->image);
  for (long i = 0; i < L->r->accum; i++) {
    double w0 = vl_now();
    vl_batch_buf *h = NULL;
    vl_status s = vl_loader_next(L->l, &h);
    *wait += vl_now() - w0;
    if (s != VL_OK) return s;
    if (!h) { *n = 0; return VL_OK; }
    float *x = L->xs + (size_t)i * (size_t)L->r->batch * nxb;
    int32_t *y = L->ys + (size_t)i * (size_t)L->r->batch * nyb;
    memcpy(x, h->x, (size_t)h->n * nxb * sizeof(float));
    memcpy(y, h->y, (size_t)h->n * nyb * sizeof(int32_t));
    int64_t xsh[4] = {h->n, 3, mc->image, mc->image}, ysh[3] = {h->n, mc->image, mc->image};
    L->mb[i] = (vl_batch){0};
    vl_batch_add(&L->mb[i], "images", VL_F32, 4, xsh, x);
    vl_batch_add(&L->mb[i], "masks", VL_I32, 3, ysh, y);
    vl_loader_release(L->l, h);
  }
  *mb = L->mb;
  *n = (int)L->r->accum;
  return VL_OK;
}

vl_status vl_segrung_skip(vl_segrung_feed *L, long n) {
  for (long i = 0; i < n; i++) {
    vl_batch_buf *h = NULL;
    VL_TRY(vl_loader_next(L->l, &h));
    if (!h) break;
    vl_loader_release(L->l, h);
  }
  return VL_OK;
}
