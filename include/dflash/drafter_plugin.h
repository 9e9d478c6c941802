/* The drafter plugin ABI, version 2 (docs/plugin.md): how an engine's own DFlash drafter is put under
 * dflash-harness's checks. C99, no C++ types; a plugin is a shared library exporting
 *
 *   const dflash_drafter_api* dflash_drafter_get_api(uint32_t abi_version);
 *
 * which returns its table of version `abi_version` when it implements that version, otherwise its own
 * table (whose abi_version then names the version it does implement); NULL only when it cannot run.
 *
 * Memory. Everything the harness passes (config, settings, tensor views, requests, option strings) is
 * owned by the harness: the tensor views and the create arguments stay valid until destroy returns,
 * everything else for the duration of the call. Outputs go into buffers the harness owns and sizes
 * (logits, draft tokens, taps, K/V rows). The one pointer a plugin returns, describe()'s text, is the
 * plugin's and must stay valid until the next call on that drafter.
 *
 * Threads. The harness calls one drafter from one thread at a time (never two calls on one drafter at
 * once); a plugin may use threads of its own inside a call. Drafters of one plugin are independent.
 *
 * Status. Every call returns a dflash_status and, unless it is DFLASH_STATUS_OK, a NUL-terminated message
 * in `message` (at most message_size bytes, terminator included) that the harness prints verbatim. */
#ifndef DFLASH_DRAFTER_PLUGIN_H
#define DFLASH_DRAFTER_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DFLASH_DRAFTER_ABI_VERSION 2u

typedef enum dflash_status {
  DFLASH_STATUS_OK = 0,
  DFLASH_STATUS_BAD_INPUT = 1,     /* a request the drafter refuses (a gap in the context, a full pool) */
  DFLASH_STATUS_UNSUPPORTED = 2,   /* valid, but not something this drafter runs (a precision, a geometry) */
  DFLASH_STATUS_INTERNAL = 3,      /* the drafter itself failed (a kernel error, a broken invariant) */
  DFLASH_STATUS_NOT_AVAILABLE = 4  /* read_tap only: this drafter does not give that stage */
} dflash_status;

/* Element types of tensor views; values as in safetensors. */
typedef enum dflash_dtype {
  DFLASH_DTYPE_F32 = 0,
  DFLASH_DTYPE_BF16 = 1,
  DFLASH_DTYPE_F16 = 2,
  DFLASH_DTYPE_F64 = 3,
  DFLASH_DTYPE_I32 = 4,
  DFLASH_DTYPE_I64 = 5,
  DFLASH_DTYPE_F8_E4M3 = 6,
  DFLASH_DTYPE_U8 = 7
} dflash_dtype;

/* The numbers the drafter is asked to compute with (docs/spec/drafter.md §6). */
typedef enum dflash_precision {
  DFLASH_PRECISION_FP64 = 0,
  DFLASH_PRECISION_FP32 = 1,
  DFLASH_PRECISION_BF16 = 2,
  DFLASH_PRECISION_FP8 = 3, /* per-row E4M3 weights of q/k/v/o/gate/up/down and lm_head, bf16 activations */
  DFLASH_PRECISION_W8A8 = 4 /* FP8 plus those GEMMs' input rows as per-token E4M3 (docs/spec/drafter.md §6) */
} dflash_precision;

/* Which execution path produced a propose's outputs (announce DFLASH_CAP_PATH to report it). */
typedef enum dflash_path {
  DFLASH_PATH_UNREPORTED = 0,
  DFLASH_PATH_CPU = 1,
  DFLASH_PATH_EAGER = 2,         /* kernels launched one by one */
  DFLASH_PATH_GRAPH_CAPTURE = 3, /* a graph captured in this propose and launched */
  DFLASH_PATH_GRAPH_REPLAY = 4   /* a graph captured earlier, launched with this propose's values */
} dflash_path;

/* Optional entry points, each announced by its flag in dflash_drafter_api.capabilities. */
#define DFLASH_CAP_TAPS ((uint64_t)1 << 0)     /* read_tap */
#define DFLASH_CAP_KV_READ ((uint64_t)1 << 1)  /* read_kv */
#define DFLASH_CAP_DESCRIBE ((uint64_t)1 << 2) /* describe */
#define DFLASH_CAP_PATH ((uint64_t)1 << 3)     /* dflash_propose_result.path is filled */
/* Version 2: the drafter runs head.tp_size > 1 as docs/spec/tensor-parallel.md states; without it the
 * harness never asks for more than one rank. */
#define DFLASH_CAP_TENSOR_PARALLEL ((uint64_t)1 << 4)
/* Version 2: the drafter stores its attention's split-KV partials as bf16 (as FlashInfer's and vLLM's
 * split-KV kernels do): no entry point; the tolerance model counts that rounding on its side. */
#define DFLASH_CAP_BF16_ATTENTION_PARTIALS ((uint64_t)1 << 5)

/* The dtype of the row-parallel partials and their sum (docs/spec/tensor-parallel.md §1, §4). */
typedef enum dflash_tp_reduce {
  DFLASH_TP_REDUCE_FP32 = 0,
  DFLASH_TP_REDUCE_BF16 = 1
} dflash_tp_reduce;

/* A read-only tensor, row-major, in host memory. */
typedef struct dflash_tensor_view {
  const char* name;  /* checkpoint name without "model.", e.g. "layers.0.self_attn.q_proj.weight" */
  int32_t dtype;     /* dflash_dtype */
  int32_t ndim;      /* 0 (a scalar) .. 4 */
  int64_t shape[4];
  const void* data;
} dflash_tensor_view;

/* The drafter config (docs/spec/drafter.md §1). config_json is the whole config.json, for the keys
 * past these fields (rope_scaling, the DFlash2 keys of docs/spec/dflash2.md §1). */
typedef struct dflash_drafter_config {
  uint32_t struct_size; /* sizeof(dflash_drafter_config) of the harness */
  int32_t hidden_size, num_layers, num_heads, num_kv_heads, head_dim, intermediate_size, vocab_size;
  int32_t block_size, mask_token_id, target_hidden_size, max_position_embeddings;
  int32_t attention_bias, tie_word_embeddings, dflash2; /* 0 or 1 */
  int32_t num_target_layers;
  const int32_t* target_layer_ids; /* num_target_layers entries, 0-based */
  double rms_norm_eps, rope_theta;
  const char* config_json;
} dflash_drafter_config;

/* The head settings (docs/spec/drafter.md §5), resolved: gamma and pool_pages are never -1 or 0. */
typedef struct dflash_head_settings {
  uint32_t struct_size;
  int32_t gamma;        /* maximum block width */
  int64_t ctx_cap;      /* context positions kept per sequence; 0 only when uncapped */
  int32_t uncapped;     /* 1: every position is kept */
  int32_t max_batch;    /* most sequences one propose serves */
  int32_t kv_page_size; /* tokens per cache page */
  int32_t pool_pages;   /* pages per layer pool */
  int32_t precision;    /* dflash_precision */
  /* Version 2 (version 1's struct ends above, DFLASH_HEAD_SETTINGS_V1_SIZE bytes): */
  int32_t tp_size;         /* tensor-parallel ranks: 1, 2, 4 or 8; > 1 only with DFLASH_CAP_TENSOR_PARALLEL */
  int32_t tp_reduce_dtype; /* dflash_tp_reduce; no effect at tp_size 1 */
} dflash_head_settings;

/* sizeof(dflash_head_settings) in ABI version 1, whose last field is `precision`: what the harness
 * passes as head->struct_size to a version-1 plugin. tp_size lies inside version 1's tail padding,
 * so a reader of version 2's fields tests struct_size >= sizeof(dflash_head_settings). */
#define DFLASH_HEAD_SETTINGS_V1_SIZE 40u

typedef struct dflash_option {
  const char* key;
  const char* value;
} dflash_option;

typedef struct dflash_create_args {
  uint32_t struct_size;
  const dflash_drafter_config* config;
  const dflash_head_settings* head;
  const char* drafter_dir; /* the checkpoint directory (config.json, model.safetensors), or NULL */
  const char* target_path; /* the target's tensors (embed_tokens, lm_head), or NULL */
  /* Every drafter tensor (docs/spec/drafter.md §2), then embed_tokens.weight and lm_head.weight (F32; an
   * NVFP4 head as lm_head.weight U8 codes, lm_head.weight_scale F8_E4M3, lm_head.weight_scale_2 F32 and,
   * when present, lm_head.input_scale F32, docs/spec/nvfp4-lm-head.md). */
  const dflash_tensor_view* tensors;
  size_t num_tensors;
  const dflash_option* options; /* --plugin-option KEY=VALUE, in the order given */
  size_t num_options;
} dflash_create_args;

/* One sequence's part of a propose. A sequence id seen for the first time starts a sequence. */
typedef struct dflash_propose_request {
  int32_t seq;
  int32_t anchor;       /* anchor token id */
  int64_t start;        /* absolute position of the anchor */
  int32_t block_width;  /* requested; the drafter clamps it to [2, max(gamma, 2)]; equal in one propose */
  int32_t want_taps;    /* 1: the harness reads this propose's taps (DFLASH_CAP_TAPS); 0: it reads none */
  int64_t ctx_rows;     /* C: new context rows, positions start-C .. start-1 */
  int64_t ctx_features; /* nT·Ht */
  const float* ctx;     /* [C, nT·Ht] target hidden states, fp32 */
} dflash_propose_request;

/* One sequence's outputs, in buffers the harness owns. */
typedef struct dflash_propose_result {
  int32_t seq;           /* set by the harness, the request's */
  int32_t block_width;   /* set by the drafter: the clamped width B it ran at */
  int64_t logits_rows;   /* capacity in rows of V floats (max(gamma, 2) - 1) */
  float* logits;         /* the drafter writes B - 1 rows of V */
  int32_t* draft_tokens; /* the drafter writes B - 1 tokens (argmax of each row, or the DFlash2 walk) */
  int32_t path;          /* dflash_path, with DFLASH_CAP_PATH */
  int32_t reserved;
} dflash_propose_result;

typedef struct dflash_drafter dflash_drafter; /* the plugin's own */

typedef struct dflash_drafter_api {
  uint32_t abi_version; /* DFLASH_DRAFTER_ABI_VERSION of the plugin's header */
  uint32_t struct_size; /* sizeof(dflash_drafter_api) of the plugin's header */
  uint64_t capabilities;
  const char* name; /* e.g. "my-engine-fp8"; reports say "plugin:<name>" */

  dflash_status (*create)(const dflash_create_args* args, dflash_drafter** out, char* message, size_t message_size);
  /* One batched call over `count` distinct sequences (at most max_batch). On an error no sequence may
   * change. */
  dflash_status (*propose)(dflash_drafter* drafter, const dflash_propose_request* requests,
                           dflash_propose_result* results, size_t count, char* message, size_t message_size);
  /* Frees the sequence's cache; the id may start a new sequence later. */
  dflash_status (*release)(dflash_drafter* drafter, int32_t seq, char* message, size_t message_size);
  void (*destroy)(dflash_drafter* drafter);

  /* DFLASH_CAP_TAPS: the stage `stage` (docs/spec/drafter.md §7 names: "ctx_proj", "L0.q", ...) of the
   * last propose of `seq`. Writes its shape into ndim/shape; with values != NULL and capacity (floats)
   * large enough, also its values. DFLASH_STATUS_NOT_AVAILABLE: this drafter does not give that stage. */
  dflash_status (*read_tap)(dflash_drafter* drafter, int32_t seq, const char* stage, float* values,
                            size_t capacity, int32_t* ndim, int64_t shape[4], char* message, size_t message_size);
  /* DFLASH_CAP_KV_READ: layer `layer`'s stored K and V of sequence `seq` at `count` absolute positions,
   * as fp32 rows [count, nkv·d] into k and v (the values the attention reads, dequantized). */
  dflash_status (*read_kv)(dflash_drafter* drafter, int32_t layer, int32_t seq, const int64_t* positions,
                           size_t count, float* k, float* v, char* message, size_t message_size);
  /* DFLASH_CAP_DESCRIBE: a JSON object of strings (levers, precision, kernels), printed in reports. */
  const char* (*describe)(dflash_drafter* drafter);
} dflash_drafter_api;

typedef const dflash_drafter_api* (*dflash_drafter_get_api_fn)(uint32_t abi_version);

#ifdef __cplusplus
}
#endif
#endif /* DFLASH_DRAFTER_PLUGIN_H */
