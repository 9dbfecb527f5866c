/* The mimic's autograd model over storages (tape.h). */
#include "tape.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int64_t numel, bytes;
  const char *op;
  /* grad: a leaf's .grad; cast: its autocast copy; base: the storage a view keeps alive;
   * grad_bw: the backward pass that set .grad */
  int32_t refs, node, pend, grad, cast, base, grad_bw;
  int8_t esz, cat, rg, alive, leaf, nc; /* nc: its gradient arrives non-contiguous (a transposed view) */
} mt_t;

typedef struct {
  mt_bw bw;
  const char *op;
  mt_id in[4], saved[6], out;
  int nin, nsaved;
  int64_t ws[4]; /* SDPA on CUDA: the buffers its backward makes beside the gradients (bytes) */
  int holds; /* inside a checkpointed block: what it saved (as holders) */
} mt_node;

struct mt_tape {
  mt_t *t;
  int32_t nt, ct;
  mt_node *n;
  int32_t nn, cn;
  mt_ev *ev;
  int64_t nev, cev;
  mt_id *casts; /* the autocast weight cache */
  int32_t ncast, ccast;
  vl_mimic_sink sink;
  void *user;
  char phase;
  int step;
  int32_t nbw; /* backward passes so far */
  bool in_ckpt;          /* inside a checkpointed block's forward: nothing saved */
  int32_t recompute;     /* > 0: the next node a recomputed op's saves go to */
  int32_t rsaves, rtotal; /* the recomputation's saves so far, the block's holders */
  bool stopped;          /* the recomputation has stopped: ops make nothing */
  struct ckpt {
    int32_t first, last; /* the block's nodes */
    int32_t holders;     /* what its forward saved (as holders) */
    mt_id x;
    mt_block_fn fn;
    void *ctx;
    bool done;
  } *ck;
  int32_t nck, cck;
  mt_id *held;           /* what the graph keeps until the loss goes: leaves its AccumulateGrad
                            nodes hold (inputs made to require grad) */
  int nheld, cheld;
  int64_t live, cat[VL_MC_N];
  vl_mimic_result best;
  int64_t blas_ws;       /* > 0: each thread's cuBLAS handle takes a workspace this size from
                            the caching allocator at its first matmul (mt_blas_workspace) */
  bool ws_main, ws_bw;   /* taken: the main thread's (forward, optimizer), autograd's */
};

static void *grow(void *p, size_t n, size_t sz) {
  void *q = realloc(p, n * sz);
  if (!q) {
    fprintf(stderr, "vramlab: mimic: out of host memory\n");
    abort();
  }
  return q;
}

mt_tape *mt_new(vl_mimic_sink sink, void *user) {
  mt_tape *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->sink = sink;
  t->user = user;
  t->phase = 'f';
  t->nt = 1; /* id 0 is none */
  t->ct = 1024;
  t->t = grow(NULL, (size_t)t->ct, sizeof(mt_t));
  memset(&t->t[0], 0, sizeof(mt_t));
  t->nn = 1;
  t->cn = 1024;
  t->n = grow(NULL, (size_t)t->cn, sizeof(mt_node));
  return t;
}

void mt_free(mt_tape *t) {
  if (!t) return;
  free(t->ck);
  free(t->held);
  free(t->t);
  free(t->n);
  free(t->ev);
  free(t->casts);
  free(t);
}

void mt_phase(mt_tape *t, char phase) { t->phase = phase; }
void mt_step(mt_tape *t, int step) { t->step = step; }

static void event(mt_tape *t, mt_id id, int64_t bytes, const char *op) {
  if (t->nev == t->cev) {
    t->cev = t->cev ? 2 * t->cev : 4096;
    t->ev = grow(t->ev, (size_t)t->cev, sizeof(mt_ev));
  }
  t->ev[t->nev++] = (mt_ev){bytes > 0 ? id : -id, bytes > 0 ? bytes : -bytes};
  if (t->sink) {
    vl_mimic_event e = {op, t->phase, bytes};
    t->sink(t->user, &e);
  }
}

static mt_id make_as(mt_tape *t, const char *op, int64_t numel, int esz, int cat, bool rg, bool view) {
  if (t->nt == t->ct) {
    t->ct *= 2;
    t->t = grow(t->t, (size_t)t->ct, sizeof(mt_t));
  }
  mt_id id = t->nt++;
  mt_t *x = &t->t[id];
  memset(x, 0, sizeof *x);
  x->numel = numel;
  x->esz = (int8_t)esz;
  x->bytes = view ? 0 : numel * esz;
  x->op = op;
  x->cat = (int8_t)cat;
  x->rg = rg;
  x->refs = 1;
  x->alive = 1;
  if (!x->bytes) return id; /* a view: no storage of its own */
  t->live += x->bytes;
  t->cat[cat] += x->bytes;
  event(t, id, x->bytes, op);
  if (t->live > t->best.peak_bytes) {
    t->best.peak_bytes = t->live;
    memcpy(t->best.cat, t->cat, sizeof t->cat);
    t->best.peak_phase = t->phase;
    snprintf(t->best.peak_op, sizeof t->best.peak_op, "%s", op);
    t->best.peak_step = t->step;
  }
  return id;
}

static mt_id make(mt_tape *t, const char *op, int64_t numel, int esz, int cat, bool rg) {
  return make_as(t, op, numel, esz, cat, rg, false);
}

/* A tensor that a stopped recomputation does not make: no bytes, no events. */
static mt_id ghost(mt_tape *t, const char *op, int64_t numel, int esz) {
  return make_as(t, op, numel, esz, VL_MC_TEMP, false, true);
}

void mt_ref(mt_tape *t, mt_id x) {
  if (x) t->t[x].refs++;
}

void mt_drop(mt_tape *t, mt_id x) {
  if (!x) return;
  mt_t *s = &t->t[x];
  if (--s->refs > 0) return;
  s->alive = 0;
  if (!s->bytes) {
    mt_drop(t, s->base);
    return;
  }
  t->live -= s->bytes;
  t->cat[s->cat] -= s->bytes;
  event(t, x, -s->bytes, s->op);
}

void mt_noncontig_grad(mt_tape *t, mt_id x) { t->t[x].nc = 1; }

void mt_blas_workspace(mt_tape *t, int64_t bytes) { t->blas_ws = bytes; }

/* A matmul ran on this phase's thread: its cuBLAS handle's workspace, the first time. Not a
 * tensor (MemTracker and the live bytes do not see it): an allocation event the caching
 * allocator's replay counts, never freed (PyTorch keeps it for the handle's life). */
static void blas_used(mt_tape *t) {
  bool *done = t->phase == 'b' ? &t->ws_bw : &t->ws_main;
  if (!t->blas_ws || *done || t->stopped) return;
  *done = true;
  event(t, ghost(t, "cublas_workspace", t->blas_ws, 1), t->blas_ws, "cublas_workspace");
}

static bool is_matmul(const char *op) {
  return !strcmp(op, "mm") || !strcmp(op, "addmm") || !strcmp(op, "bmm") || !strcmp(op, "baddbmm");
}

int mt_esz(const mt_tape *t, mt_id x) { return t->t[x].esz; }
int64_t mt_numel(const mt_tape *t, mt_id x) { return t->t[x].numel; }
bool mt_requires_grad(const mt_tape *t, mt_id x) { return x && t->t[x].rg; }
void mt_set_cat(mt_tape *t, mt_id x, int cat) {
  mt_t *s = &t->t[x];
  t->cat[s->cat] -= s->bytes;
  s->cat = (int8_t)cat;
  t->cat[cat] += s->bytes;
}

mt_id mt_leaf(mt_tape *t, const char *op, int64_t numel, int esz, int cat, bool requires_grad) {
  mt_id x = make(t, op, numel, esz, cat, requires_grad);
  t->t[x].leaf = 1;
  return x;
}

static void hold(mt_tape *t, mt_id x) {
  if (!x) return;
  if (t->nheld == t->cheld) {
    t->cheld = t->cheld ? 2 * t->cheld : 64;
    t->held = grow(t->held, (size_t)t->cheld, sizeof(mt_id));
  }
  mt_ref(t, x);
  t->held[t->nheld++] = x;
}

void mt_input_requires_grad(mt_tape *t, mt_id x) {
  t->t[x].rg = 1;
  t->t[x].leaf = 1;
  hold(t, x);
}



mt_id mt_temp(mt_tape *t, const char *op, int64_t numel, int esz) {
  if (t->stopped) return ghost(t, op, numel, esz);
  return make(t, op, numel, esz, t->phase == 'f' ? VL_MC_ACT : VL_MC_TEMP, false);
}

static mt_id node(mt_tape *t, mt_bw bw, const char *op, mt_id out, const mt_id *in, int nin) {
  if (t->recompute > 0) { /* a recomputed op: its saves go to the forward's node */
    (void)bw, (void)op, (void)in, (void)nin, (void)out;
    return t->recompute++;
  }
  if (t->nn == t->cn) {
    t->cn *= 2;
    t->n = grow(t->n, (size_t)t->cn, sizeof(mt_node));
  }
  mt_node *n = &t->n[t->nn];
  memset(n, 0, sizeof *n);
  n->bw = bw;
  n->op = op;
  n->out = out;
  n->nin = nin;
  for (int i = 0; i < nin; i++) n->in[i] = in[i];
  if (out) t->t[out].node = t->nn;
  return t->nn++;
}

static void save(mt_tape *t, mt_node *n, mt_id x) {
  if (!x) return;
  if (t->in_ckpt) { /* under checkpoint: a holder, no reference */
    t->ck[t->nck].holders++;
    n->holds++;
    return;
  }
  mt_ref(t, x);
  n->saved[n->nsaved++] = x;
  /* the recomputation stops once every holder of the block is filled (early_stop) */
  if (t->recompute > 0 && ++t->rsaves >= t->rtotal) t->stopped = true;
}

/* What the op's formula saves of its inputs (autograd saves them before the op runs) into
 * in[], and whether it saves its output (after). */
static int input_saves(const mt_tape *t, mt_bw bw, mt_id a, mt_id b, mt_id c, mt_id *in, bool *out) {
  int n = 0;
  *out = bw == MT_BW_RELU || bw == MT_BW_RSQRT || bw == MT_BW_LOGSOFTMAX || bw == MT_BW_SOFTMAX;
  switch (bw) {
  case MT_BW_MM:
  case MT_BW_BMM:
  case MT_BW_BADDBMM:
  case MT_BW_MUL: /* each input saved when the other needs its gradient */
    if (mt_requires_grad(t, b)) in[n++] = a;
    if (mt_requires_grad(t, a)) in[n++] = b;
    break;
  case MT_BW_POW2:
  case MT_BW_SILU:
  case MT_BW_POOL:
  case MT_BW_GELU:
    in[n++] = a;
    break;
  case MT_BW_GN: /* input and weight (b; LayerNorm's bias c too) */
  case MT_BW_LN:
    in[n++] = a;
    in[n++] = b;
    if (bw == MT_BW_LN) in[n++] = c;
    break;
  case MT_BW_MSE:
    in[n++] = a;
    in[n++] = b;
    break;
  case MT_BW_CONV: /* one formula for input and weight: both saved (derivatives.yaml) */
  case MT_BW_BN:
    in[n++] = a;
    in[n++] = b;
    break;
  case MT_BW_EMBED:
  case MT_BW_NLL:
    in[n++] = b; /* the indices / the target */
    break;
  default:
    break;
  }
  return n;
}

mt_id mt_op(mt_tape *t, const char *op, mt_bw bw, int64_t numel, int esz, mt_id a, mt_id b, mt_id c) {
  if (t->stopped) return ghost(t, op, numel, esz);
  mt_id in[3] = {a, b, c};
  int nin = c ? 3 : b ? 2 : 1;
  bool rg = false;
  for (int i = 0; i < nin; i++) rg |= mt_requires_grad(t, in[i]);
  int cat = t->phase == 'f' ? VL_MC_ACT : VL_MC_TEMP;
  if (!rg) {
    mt_id out = make(t, op, numel, esz, cat, false);
    if (is_matmul(op)) blas_used(t);
    return out;
  }
  int32_t ni = node(t, bw, op, 0, in, nin);
  mt_id sv[3];
  bool save_out;
  int ns = input_saves(t, bw, a, b, c, sv, &save_out);
  for (int i = 0; i < ns; i++) save(t, &t->n[ni], sv[i]);
  if (t->stopped) return ghost(t, op, numel, esz); /* the recomputation stops before the op runs */
  mt_id out = make(t, op, numel, esz, cat, true);
  if (is_matmul(op)) blas_used(t); /* the output first (at::mm), then cuBLAS's handle */
  if (t->recompute == 0) {
    t->n[ni].out = out;
    t->t[out].node = ni;
  }
  if (save_out) save(t, &t->n[ni], out);
  return out;
}

void mt_chunk2(mt_tape *t, mt_id x, mt_id *lo, mt_id *hi) {
  int64_t h = t->t[x].numel / 2;
  if (t->stopped) {
    *lo = ghost(t, "split", h, t->t[x].esz);
    *hi = ghost(t, "split", h, t->t[x].esz);
    return;
  }
  bool rg = t->t[x].rg;
  mt_id v[2];
  for (int i = 0; i < 2; i++) {
    v[i] = make_as(t, "split", h, t->t[x].esz, VL_MC_ACT, rg, true);
    t->t[v[i]].base = x;
    mt_ref(t, x);
  }
  if (rg) { /* one node: out the first half, in[1] the second (its gradient read there) */
    mt_id in[2] = {x, v[1]};
    int32_t ni = node(t, MT_BW_SPLIT, "split", v[0], in, 2);
    if (t->recompute == 0) t->t[v[1]].node = ni;
  }
  *lo = v[0];
  *hi = v[1];
}

mt_id mt_slice(mt_tape *t, mt_id x, int64_t numel) {
  if (t->stopped) return ghost(t, "slice", numel, t->t[x].esz);
  mt_id v = make_as(t, "slice", numel, t->t[x].esz, VL_MC_ACT, t->t[x].rg, true);
  t->t[v].base = x;
  mt_ref(t, x);
  if (t->t[x].rg) node(t, MT_BW_SLICE, "slice", v, &x, 1);
  return v;
}

mt_id mt_inplace(mt_tape *t, const char *op, mt_bw bw, mt_id x, mt_id b) {
  if (t->stopped) return ghost(t, op, t->t[x].numel, t->t[x].esz);
  bool rg = t->t[x].rg || mt_requires_grad(t, b);
  mt_id v = make_as(t, op, t->t[x].numel, t->t[x].esz, VL_MC_ACT, rg, true);
  t->t[v].base = x;
  mt_ref(t, x);
  if (!rg) return v;
  mt_id in[2] = {x, b};
  int32_t ni = node(t, bw, op, v, in, b ? 2 : 1);
  mt_node *n = &t->n[ni];
  if (bw == MT_BW_RELU) save(t, n, v);
  return v;
}

void mt_aux(mt_tape *t, mt_id out, const char *op, int64_t numel, int esz) {
  if (t->stopped) return;
  int cat = t->phase == 'f' ? VL_MC_ACT : VL_MC_TEMP;
  mt_id a = make(t, op, numel, esz, cat, false);
  int32_t ni = t->recompute > 0 ? t->recompute - 1 : t->t[out].node;
  if (t->t[out].rg && ni > 0) save(t, &t->n[ni], a);
  mt_drop(t, a);
}

void mt_ckpt_begin(mt_tape *t, mt_id x) {
  if (t->nck == t->cck) {
    t->cck = t->cck ? 2 * t->cck : 64;
    t->ck = grow(t->ck, (size_t)t->cck, sizeof *t->ck);
  }
  t->ck[t->nck] = (struct ckpt){.first = t->nn, .x = x};
  mt_ref(t, x); /* the frame keeps the block's input until the block's backward is done */
  t->in_ckpt = true;
}

void mt_ckpt_end(mt_tape *t, mt_block_fn fn, void *ctx) {
  struct ckpt *c = &t->ck[t->nck];
  t->in_ckpt = false;
  if (t->nn - 1 < c->first) { /* nothing saved: no holder keeps the frame, its input goes */
    mt_drop(t, c->x);
    return;
  }
  t->nck++;
  c->last = t->nn - 1;
  c->fn = fn;
  c->ctx = ctx;
  t->in_ckpt = false;
}

mt_id mt_sdpa(mt_tape *t, const char *op, mt_id q, mt_id k, mt_id v, mt_id mask, int64_t lse_numel) {
  if (t->stopped) return ghost(t, op, t->t[q].numel, t->t[q].esz);
  int cat = t->phase == 'f' ? VL_MC_ACT : VL_MC_TEMP;
  if (!mt_requires_grad(t, q) && !mt_requires_grad(t, k) && !mt_requires_grad(t, v)) {
    /* nothing requires grad (torch.no_grad, frozen encoders): no node, nothing saved; the
     * logsumexp goes at once (lse_numel 0: a kernel that made none) */
    mt_id out = make(t, op, t->t[q].numel, t->t[q].esz, cat, false);
    mt_id lse = make(t, op, lse_numel, 4, cat, false);
    mt_drop(t, lse);
    return out;
  }
  mt_id in[3] = {q, k, v};
  int32_t ni = node(t, MT_BW_SDPA, op, 0, in, 3);
  save(t, &t->n[ni], q); /* the inputs before it runs */
  save(t, &t->n[ni], k);
  save(t, &t->n[ni], v);
  save(t, &t->n[ni], mask);
  if (t->stopped) return ghost(t, op, t->t[q].numel, t->t[q].esz);
  mt_id out = make(t, op, t->t[q].numel, t->t[q].esz, cat, true);
  mt_id lse = make(t, op, lse_numel, 4, cat, false);
  if (t->recompute == 0) {
    t->n[ni].out = out;
    t->t[out].node = ni;
  }
  save(t, &t->n[ni], out); /* the outputs after */
  save(t, &t->n[ni], lse);
  mt_drop(t, lse); /* only the node keeps it */
  return out;
}

void mt_flash_bw_buffers(mt_tape *t, mt_id out, int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk,
                         int64_t hd) {
  if (!out || t->t[out].node <= 0 || t->n[t->t[out].node].out != out) return; /* no graph */
  int64_t *ws = t->n[t->t[out].node].ws;
  int64_t hm = hd <= 128 ? 32 : 64; /* head_dim rounded up to this multiple */
  int64_t tq = (Tq + 127) / 128 * 128, hdr = (hd + hm - 1) / hm * hm;
  ws[0] = B * H * tq * 4;       /* softmax_d, fp32 */
  ws[1] = B * tq * H * hdr * 4; /* dq_accum, fp32 (the loop is always on) */
  if (Hkv != H) {               /* grouped KV: dK and dV at every query head, then summed */
    ws[2] = B * Tk * H * hd * t->t[out].esz;
    ws[3] = ws[2];
  }
}

mt_id mt_cast(mt_tape *t, mt_id x, int esz, bool autocast) {
  mt_t *s = &t->t[x];
  if (s->esz == esz) {
    mt_ref(t, x);
    return x;
  }
  bool cache = autocast && s->leaf && s->rg;
  if (cache && s->cast) {
    mt_ref(t, s->cast);
    return s->cast;
  }
  mt_id y = mt_op(t, "_to_copy", MT_BW_CAST, s->numel, esz, x, 0, 0);
  if (cache) {
    t->t[x].cast = y;
    mt_ref(t, y);
    if (t->ncast == t->ccast) {
      t->ccast = t->ccast ? 2 * t->ccast : 256;
      t->casts = grow(t->casts, (size_t)t->ccast, sizeof(mt_id));
    }
    t->casts[t->ncast++] = x;
  }
  return y;
}

void mt_autocast_exit(mt_tape *t) {
  for (int i = 0; i < t->ncast; i++) {
    mt_id x = t->casts[i], y = t->t[x].cast;
    t->t[x].cast = 0;
    mt_drop(t, y);
  }
  t->ncast = 0;
}

mt_id mt_grad(const mt_tape *t, mt_id p) { return t->t[p].grad; }
void mt_grad_none(mt_tape *t, mt_id p) {
  mt_id g = t->t[p].grad;
  t->t[p].grad = 0;
  mt_drop(t, g);
}

/* hands gradient g (one reference, the caller's) to tensor x */
static void give(mt_tape *t, mt_id x, mt_id g) {
  mt_t *s = &t->t[x];
  if (!s->rg) {
    mt_drop(t, g);
    return;
  }
  if (t->t[g].esz != s->esz) { /* validate_outputs: a gradient takes its input's dtype */
    mt_id c = make(t, "_to_copy", s->numel, s->esz, VL_MC_TEMP, false);
    s = &t->t[x]; /* make may move the table */
    mt_drop(t, g);
    g = c;
  }
  if (s->leaf) { /* AccumulateGrad */
    if (!s->grad) {
      s->grad_bw = t->nbw;
      if (t->t[g].refs == 1 && t->t[g].esz == s->esz) { /* stolen */
        s->grad = g;
        mt_set_cat(t, g, VL_MC_GRAD);
        return;
      }
      mt_id cl = make(t, "clone", s->numel, s->esz, VL_MC_GRAD, false);
      s = &t->t[x]; /* make may move the table */
      s->grad = cl;
    }
    if (s->grad_bw == t->nbw) { /* a second gradient in the same backward (a tied weight): out of
                                   place, variable.grad + new_grad (the trace shows it) */
      mt_id sum = make(t, "add", s->numel, s->esz, VL_MC_GRAD, false);
      mt_drop(t, s->grad);
      s = &t->t[x];
      s->grad = sum;
    }
    mt_drop(t, g); /* else added in place (a later micro-batch's) */
    return;
  }
  if (!s->pend) {
    s->pend = g;
    return;
  }
  mt_id sum = make(t, "add", s->numel, t->t[s->pend].esz, VL_MC_TEMP, false);
  s = &t->t[x]; /* make may move the table */
  mt_drop(t, s->pend);
  mt_drop(t, g);
  t->t[x].pend = sum;
}

static mt_id tmp(mt_tape *t, const char *op, int64_t numel, int esz) {
  return make(t, op, numel, esz, VL_MC_TEMP, false);
}

typedef struct {
  mt_id x[8], g[8];
  int n;
} gives;

static void defer(gives *q, mt_id x, mt_id g) {
  q->x[q->n] = x;
  q->g[q->n++] = g;
}

/* ViewBackward's reshape of a transposed gradient: a contiguous copy (a node of its own in
 * autograd, before the node that unpacks saved values) */
static void nc_copy(mt_tape *t, mt_node *n) {
  mt_t *o = &t->t[n->out];
  if (!n->out || !o->nc || !o->pend) return;
  mt_id g = o->pend;
  mt_id cg = tmp(t, "clone", t->t[g].numel, t->t[g].esz);
  mt_drop(t, g);
  t->t[n->out].pend = cg;
  t->t[n->out].nc = 0;
}

/* A node's backward: its formula's allocations, then its gradient and saved tensors let go,
 * then each input gradient handed on (accumulated), in the order the traces show. */
static void run_node(mt_tape *t, mt_node *n) {
  gives out = {.n = 0};
  nc_copy(t, n);
  mt_t *o = &t->t[n->out]; /* read before anything is allocated: make may move the table */
  mt_id g = o->pend;
  o->pend = 0;
  int64_t on = o->numel;
  if (!g) goto release;
  mt_id a = n->in[0], b = n->nin > 1 ? n->in[1] : 0, c = n->nin > 2 ? n->in[2] : 0;
  bool ra = mt_requires_grad(t, a), rb = mt_requires_grad(t, b), rc = mt_requires_grad(t, c);
  switch (n->bw) {
  case MT_BW_MM: {
    /* in the order the traces show */
    mt_id gc = rc ? tmp(t, "sum", t->t[c].numel, t->t[c].esz) : 0, ga = 0, gb = 0;
    if (c) /* AddmmBackward0: mat1's (the input's), then mat2's */
      ga = ra ? tmp(t, "mm", t->t[a].numel, t->t[g].esz) : 0;
    gb = rb ? tmp(t, "mm", t->t[b].numel, t->t[g].esz) : 0; /* MmBackward0: mat2's first */
    if (!c) ga = ra ? tmp(t, "mm", t->t[a].numel, t->t[g].esz) : 0;
    if (ga || gb) blas_used(t);
    if (gc) defer(&out, c, gc);
    if (gb) defer(&out, b, gb);
    if (ga) defer(&out, a, ga);
    break;
  }
  case MT_BW_MUL: {
    /* both products first, then the sums to the smaller input (MulBackward0) */
    mt_id fa = ra ? tmp(t, "mul", on, t->t[g].esz) : 0;
    mt_id fb = rb ? tmp(t, "mul", on, t->t[g].esz) : 0;
    if (fa && t->t[a].numel < on) {
      mt_id s = tmp(t, "sum", t->t[a].numel, t->t[a].esz);
      mt_drop(t, fa);
      fa = s;
    }
    if (fb && t->t[b].numel < on) {
      mt_id s = tmp(t, "sum", t->t[b].numel, t->t[b].esz);
      mt_drop(t, fb);
      fb = s;
    }
    if (fa) defer(&out, a, fa);
    if (fb) defer(&out, b, fb);
    break;
  }
  case MT_BW_MULS:
  case MT_BW_NEG:
  case MT_BW_SILU:
  case MT_BW_LOGSOFTMAX:
  case MT_BW_NLL:
  case MT_BW_MEAN:
  case MT_BW_SLICE:
  case MT_BW_EMBED: {
    static const char *name[] = {[MT_BW_MULS] = "mul", [MT_BW_NEG] = "neg", [MT_BW_SILU] = "silu_backward",
                                 [MT_BW_LOGSOFTMAX] = "_log_softmax_backward_data",
                                 [MT_BW_NLL] = "nll_loss_backward", [MT_BW_MEAN] = "div",
                                 [MT_BW_SLICE] = "slice_backward", [MT_BW_EMBED] = "embedding_dense_backward"};
    const char *nm = n->bw == MT_BW_NLL && strstr(n->op, "2d") ? "nll_loss2d_backward" : name[n->bw];
    if (ra) defer(&out, a, tmp(t, nm, t->t[a].numel, t->t[a].esz));
    break;
  }
  case MT_BW_DIVS:
  case MT_BW_GN:
  case MT_BW_LN:
  case MT_BW_GELU:
  case MT_BW_NEAREST:
  case MT_BW_MSE: {
    static const char *name[] = {[MT_BW_DIVS] = "div", [MT_BW_GN] = "native_group_norm_backward",
                                 [MT_BW_LN] = "native_layer_norm_backward", [MT_BW_GELU] = "gelu_backward",
                                 [MT_BW_NEAREST] = "upsample_nearest2d_backward", [MT_BW_MSE] = "mse_loss_backward"};
    if (ra) defer(&out, a, tmp(t, name[n->bw], t->t[a].numel, t->t[a].esz));
    break;
  }
  case MT_BW_BMM: {
    mt_id gb = rb ? tmp(t, "bmm", t->t[b].numel, t->t[g].esz) : 0;
    mt_id ga = ra ? tmp(t, "bmm", t->t[a].numel, t->t[g].esz) : 0;
    if (ga || gb) blas_used(t);
    if (gb) defer(&out, b, gb);
    if (ga) defer(&out, a, ga);
    break;
  }
  case MT_BW_BADDBMM: {
    mt_id x[2] = {a, b};
    bool r[2] = {ra, rb};
    for (int i = 0; i < 2; i++) {
      if (!r[i]) continue;
      mt_id m = tmp(t, "bmm", t->t[x[i]].numel, t->t[g].esz);
      blas_used(t);
      mt_id sc = tmp(t, "mul", t->t[x[i]].numel, t->t[g].esz);
      mt_drop(t, m);
      defer(&out, x[i], sc);
    }
    break;
  }
  case MT_BW_SOFTMAX:
    if (ra) defer(&out, a, tmp(t, "_softmax_backward_data", t->t[a].numel, t->t[g].esz));
    break;
  case MT_BW_SPLIT: { /* both halves' gradients (the second's pending on in[1]) into one cat */
    mt_id g2 = t->t[b].pend;
    t->t[b].pend = 0;
    rb = false;
    if (ra) defer(&out, a, tmp(t, "cat", t->t[a].numel, t->t[g].esz));
    mt_drop(t, g2);
    break;
  }
  case MT_BW_CAST:
    if (ra) defer(&out, a, tmp(t, "_to_copy", t->t[a].numel, t->t[a].esz));
    break;
  case MT_BW_CONV: {
    mt_id ga = ra ? tmp(t, "convolution_backward", t->t[a].numel, t->t[g].esz) : 0;
    mt_id gb = rb ? tmp(t, "convolution_backward", t->t[b].numel, t->t[g].esz) : 0;
    if (ga) defer(&out, a, ga);
    if (gb) defer(&out, b, gb);
    break;
  }
  case MT_BW_BN: {
    mt_id ga = ra ? tmp(t, "native_batch_norm_backward", t->t[a].numel, t->t[a].esz) : 0;
    mt_id gb = rb ? tmp(t, "native_batch_norm_backward", t->t[b].numel, t->t[b].esz) : 0;
    mt_id gc = rc ? tmp(t, "native_batch_norm_backward", t->t[c].numel, t->t[c].esz) : 0;
    if (ga) defer(&out, a, ga);
    if (gb) defer(&out, b, gb);
    if (gc) defer(&out, c, gc);
    break;
  }
  case MT_BW_RELU:
    if (ra) defer(&out, a, tmp(t, "threshold_backward", t->t[a].numel, t->t[g].esz));
    break;
  case MT_BW_POOL:
    if (ra) defer(&out, a, tmp(t, "max_pool2d_with_indices_backward", t->t[a].numel, t->t[a].esz));
    break;
  case MT_BW_UPSAMPLE:
    if (ra) defer(&out, a, tmp(t, "upsample_bilinear2d_backward", t->t[a].numel, t->t[a].esz));
    break;
  case MT_BW_POW2:
  case MT_BW_RSQRT:
    if (ra) {
      int64_t m = t->t[a].numel;
      mt_id p = tmp(t, "pow", m, t->t[a].esz), q = tmp(t, "mul", m, t->t[a].esz);
      mt_id r = tmp(t, "mul", m, t->t[a].esz);
      mt_drop(t, p);
      mt_drop(t, q);
      defer(&out, a, r);
    }
    break;
  case MT_BW_ADD:
  case MT_BW_CAT: /* views of g (CAT: slices; their own backward nodes copy them out) */
    for (int i = 0; i < n->nin; i++) {
      mt_id x = n->in[i];
      if (!mt_requires_grad(t, x)) continue;
      if (n->bw == MT_BW_ADD && t->t[x].numel < on) {
        defer(&out, x, tmp(t, "sum", t->t[x].numel, t->t[x].esz));
      } else {
        mt_ref(t, g);
        defer(&out, x, g);
      }
    }
    break;
  case MT_BW_NF4: {
    if (!ra) break;
    int64_t n4 = 2 * t->t[b].numel;
    mt_id am = tmp(t, "empty_like", n4 / 64, 4), w = tmp(t, "empty", n4, t->t[g].esz);
    mt_drop(t, am);
    mt_id ga = tmp(t, "mm", t->t[a].numel, t->t[g].esz);
    blas_used(t);
    mt_drop(t, w);
    defer(&out, a, ga);
    break;
  }
  case MT_BW_EXPAND: /* CloneBackward passes g on, ExpandBackward sums it to a's size */
    if (ra) defer(&out, a, tmp(t, "sum", t->t[a].numel, t->t[a].esz));
    break;
  case MT_BW_SDPA: {
    /* the forward's op + "_backward" */
    const char *bw = strstr(n->op, "for_cpu")     ? "_scaled_dot_product_flash_attention_for_cpu_backward"
                     : strstr(n->op, "efficient") ? "_scaled_dot_product_efficient_attention_backward"
                                                  : "_scaled_dot_product_flash_attention_backward";
    mt_id gq = ra ? tmp(t, bw, t->t[a].numel, t->t[a].esz) : 0;
    mt_id gk = rb ? tmp(t, bw, t->t[b].numel, t->t[b].esz) : 0;
    mt_id gv = rc ? tmp(t, bw, t->t[c].numel, t->t[c].esz) : 0;
    mt_id ws[4] = {0};
    for (int i = 0; i < 4; i++)
      if (n->ws[i]) ws[i] = tmp(t, bw, n->ws[i], 1);
    for (int i = 3; i >= 0; i--) /* the kernel's locals go at its return, the last made first */
      if (ws[i]) mt_drop(t, ws[i]);
    if (gq) defer(&out, a, gq);
    if (gk) defer(&out, b, gk);
    if (gv) defer(&out, c, gv);
    break;
  }
  }
  mt_drop(t, g);
release:
  for (int i = 0; i < n->nsaved; i++) mt_drop(t, n->saved[i]);
  n->nsaved = 0;
  for (int i = 0; i < out.n; i++) give(t, out.x[i], out.g[i]);
}

void mt_backward(mt_tape *t, mt_id loss) {
  t->nbw++;
  mt_t *l = &t->t[loss];
  l->pend = tmp(t, "ones_like", 1, l->esz);
  int32_t k = t->nck - 1; /* the checkpointed blocks, last first */
  for (int32_t i = t->nn - 1; i >= 1; i--) {
    while (k >= 0 && t->ck[k].first > t->ck[k].last) { /* a block without nodes: its frame goes */
      mt_drop(t, t->ck[k].x);
      k--;
    }
    if (k >= 0 && i <= t->ck[k].last && !t->ck[k].done && (t->n[i].holds > 0 || i == t->ck[k].first)) {
      /* unpacking the block's first saved value re-runs the block: the nodes after it that
       * saved nothing have run before */
      nc_copy(t, &t->n[i]);
      struct ckpt c = t->ck[k];
      t->ck[k].done = true;
      t->recompute = c.first;
      t->rsaves = 0;
      t->rtotal = c.holders;
      t->stopped = c.holders == 0;
      mt_id y = c.fn(c.ctx, c.x);
      t->recompute = 0;
      t->stopped = false;
      mt_drop(t, y);
      mt_autocast_exit(t); /* the recomputation ran in its own autocast region (checkpoint
                              restores the forward's), whose weight cache goes with it */
    }
    run_node(t, &t->n[i]);
    if (k >= 0 && i == t->ck[k].first) {
      mt_drop(t, t->ck[k].x);
      k--;
    }
  }
  for (; k >= 0; k--) mt_drop(t, t->ck[k].x);
  t->nck = 0;
  t->nn = 1; /* the graph is freed with the backward */
}

int mt_graph_mark(const mt_tape *t) { return t->nheld; }

void mt_release_graph(mt_tape *t, int mark) {
  for (int i = 0; i < mark; i++) { /* what the older graphs held, a leaf's .grad with it */
    mt_id x = t->held[i];
    if (t->t[x].refs == 1 && t->t[x].grad) mt_grad_none(t, x);
    mt_drop(t, x);
  }
  if (mark > 0 && t->nheld > mark) memmove(t->held, t->held + mark, (size_t)(t->nheld - mark) * sizeof(mt_id));
  t->nheld -= mark;
}

int64_t mt_live(const mt_tape *t) { return t->live; }

void mt_result(const mt_tape *t, vl_mimic_result *r) {
  *r = t->best;
  r->n_events = t->nev;
}

const mt_ev *mt_events(const mt_tape *t, int64_t *n) {
  *n = t->nev;
  return t->ev;
}
