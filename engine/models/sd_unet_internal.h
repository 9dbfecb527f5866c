/* The SD U-Net's internals shared by its files: the model struct, its blocks and the
 * nodes of the forward graph (sd_unet.c: build, step, API; sd_unet_blocks.c: the LoRA
 * linear (over sd_lora.c), ResnetBlock2D, Transformer2DModel, the samplers and the head,
 * forward and backward). Not a public header.
 *
 * Shapes: B the batch of the step, a node's output (B, C, H, W) NCHW; T = H*W tokens,
 * R = B*T rows of a transformer's token layout (B, T, C); L context tokens. Activations
 * and gradients in the `acts` dtype unless marked fp32. */
#ifndef VRAMLAB_SD_UNET_INTERNAL_H
#define VRAMLAB_SD_UNET_INTERNAL_H

#include "vramlab/sd_encoders.h"
#include "vramlab/sd_unet.h"

/* A linear layer: frozen weight (out, in) and optional bias (indices into m->fz), optional
 * LoRA factors A (r, in), B (out, r) (indices into m->lora, -1 when absent). */
typedef struct {
  int w, b, la, lb;
  int64_t in, out;
} sd_lin;

/* ResnetBlock2D; cin counts the skip's channels of an up block (norm1's input). */
typedef struct {
  int n1w, n1b, c1w, c1b, tw, tb, n2w, n2b, c2w, c2b, scw, scb; /* scw -1: identity */
  int64_t cin, cout;
  vl_tensor cat;      // (B, cin, H, W) [h, skip] of an up resnet: norm1's input
  vl_tensor n1;       // (B, cin, H, W) norm1 output: SiLU's input
  vl_tensor m1, r1;   // (B*G) fp32 norm1 mean, 1/std
  vl_tensor c1;       // (B, cout, H, W) conv1 + bias + time embedding: norm2's input
  vl_tensor n2;       // (B, cout, H, W) norm2 output: SiLU's input
  vl_tensor m2, r2;   // (B*G) fp32 norm2 mean, 1/std
} sd_resnet;

/* Transformer2DModel with one BasicTransformerBlock. Sub-layer a: 0 attn1 (self), 1 attn2
 * (cross, keys and values from the context), 2 the feed-forward. */
typedef struct {
  int gnw, gnb, piw, pib, pow, pob;
  int lnw[3], lnb[3];
  sd_lin at[2][4];      /* attn1, attn2: to_q, to_k, to_v, to_out.0 */
  sd_lin ff1, ff2;      /* ff.net.0.proj (C -> 8C), ff.net.2 (4C -> C) */
  int64_t C;
  /* per step: which gradients backward needs (sd_unet.c sets them before forward) */
  bool need_dh[3];      /* gradient of sub-layer a's input h[a] */
  bool bwd_sub[3];      /* sub-layer a runs a backward */
  vl_tensor gm, gr;     // (B*G) fp32 GroupNorm mean, 1/std
  vl_tensor h[3];       // (B, T, C) residual stream: after proj_in, after attn1, after attn2
  vl_tensor ln[2];      // (B, T, C) norm1, norm2 outputs: LoRA inputs of q (k, v)
  vl_tensor lm[3], lr[3]; // (B*T) fp32 LayerNorm mean, 1/std
  vl_tensor q[2];       // (B, T, C)
  vl_tensor k[2], v[2]; // (B, T, C) attn1; (B, L, C) attn2
  vl_tensor o[2];       // (B, T, C) attention output: to_out's input
  vl_tensor xa[2][4];   // (B*T or B*L, r) LoRA x A^T of each linear, for dB
  vl_attn_saved sv[2];  /* attention probabilities (classic) or log-sum-exp (efficient) */
  vl_tensor ffh;        // (B, T, 8C) ff.net.0.proj output: GEGLU's input
} sd_xformer;

typedef enum { SD_CONV_IN = 0, SD_RESNET, SD_XFORMER, SD_DOWN, SD_UP, SD_OUT } sd_kind;

/* One node of the forward graph, in forward order. */
typedef struct {
  sd_kind kind;
  int ix;               /* m->res / m->xf index of a resnet / transformer */
  int w, b, gw, gb;     /* conv (and conv_norm_out) params of the other kinds */
  int in, skip;         /* node of the main input (-1: the latents), of the skip (-1) */
  int64_t C, H, W;      /* output channels, side */
  int64_t cin, hin, win; /* main input */
  int lvl, lvl_in;      /* resolution level of the output, of the input: side = h >> lvl */
  /* per step (set by plan_step) */
  bool sink;            /* owns a gradient sink: LoRA factors, or the context with ctx_grad */
  bool bwd;             /* needs the gradient of its output */
  bool gin;             /* needs the gradient of its main input */
  bool ck;              /* checkpointed: forward keeps nothing, backward re-runs it */
  bool keep;            /* forward keeps what backward reads */
  int fwd_last;         /* last node reading the output in forward */
  int bwd_free;         /* node whose backward frees the output (-1: freed in forward) */
  vl_tensor out;        // (B, C, H, W) output
  vl_tensor dskip;      // (B, C, H, W) gradient of the output through its skip connection
  vl_tensor n, nm, nr;  // SD_OUT: (B, C_in, H, W) conv_norm_out output, (B*G) fp32 stats
} sd_node;

struct vl_sd_unet {
  vl_ctx *c;
  vl_sd_unet_cfg cfg;
  vl_sd_params fz;      /* frozen, state_dict order */
  vl_param *lora;       /* trainable, n_lora */
  vl_sd_pinfo *lora_info;
  int n_lora, cap_lora;
  int t1w, t1b, t2w, t2b; /* time_embedding.linear_1, linear_2 */
  sd_resnet *res;
  int n_res;
  sd_xformer *xf;
  int n_xf;
  sd_node *nodes;
  int n_nodes;
  /* the step */
  int64_t B, L;         /* batch, context tokens */
  bool train, in_step;
  vl_tensor xin;        // (B, in_ch, H, W) latents in the acts dtype when converted
  vl_tensor temb;       // (B, 4 ch[0]) SiLU(time embedding): what time_emb_proj reads
  vl_tensor ctxc;       // (B, L, ctx_dim) context in the acts dtype when converted
  vl_tensor ctxv;       /* a view (not owned) of the caller's context */
  const vl_tensor *ctx; /* the context the step reads: &ctxc, or &ctxv in the acts dtype */
  vl_tensor dctx;       // (B, L, ctx_dim) fp32 dL/dcontext (ctx_grad)
  vl_tensor g;          // gradient flowing back: the shape of the output it is the gradient of
  vl_tensor tmp[6];     // a block's short-lived tensors; shapes at each use
  vl_tensor lt;         // (rows, r) LoRA dxa in lin_bwd
};

enum { SD_KEEP = 1, SD_RERUN = 2 }; /* block forward modes */

/* ---- sd_unet_blocks.c --------------------------------------------------------------- */
vl_param *sd_fz(vl_sd_unet *m, int i);
vl_status sd_act(vl_sd_unet *m, vl_tensor *t, vl_mem_cat cat, int64_t d0, int64_t d1, int64_t d2);
vl_status sd_f32(vl_sd_unet *m, vl_tensor *t, vl_mem_cat cat, int64_t n);
void sd_free(vl_sd_unet *m, vl_tensor *t);
void sd_move(vl_tensor *dst, vl_tensor *src);

vl_status sd_time_embed(vl_sd_unet *m, const vl_tensor *t, vl_mem_cat cat);
vl_status sd_conv_in_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x);
vl_status sd_resnet_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x, const vl_tensor *skip,
                        int mode);
vl_status sd_resnet_bwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x, sd_node *skip_node);
vl_status sd_xformer_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x, int mode);
vl_status sd_xformer_bwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x);
vl_status sd_down_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x);
vl_status sd_down_bwd(vl_sd_unet *m, sd_node *nd);
vl_status sd_up_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x);
vl_status sd_up_bwd(vl_sd_unet *m, sd_node *nd);
vl_status sd_out_fwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x, vl_tensor *pred);
vl_status sd_out_bwd(vl_sd_unet *m, sd_node *nd, const vl_tensor *x, const vl_tensor *dpred);
void sd_resnet_clear(vl_sd_unet *m, sd_resnet *r);
void sd_xformer_clear(vl_sd_unet *m, sd_xformer *X);

#endif
