/* The minimal drafter plugin of docs/plugin.md: every logits row is zero except 1 at one token
 * (option token=N, default 0), which is then every draft token. It computes no DFlash drafter; it
 * exists to show that the ABI header is C99 and to give the ABI tests a plugin with no capabilities. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash/drafter_plugin.h"

#if defined(__GNUC__)
#define EXPORT __attribute__((visibility("default")))
#else
#define EXPORT
#endif

struct dflash_drafter {
  int32_t vocab, max_width, max_batch; /* max_width = max(gamma, 2) */
  int64_t ctx_features;                /* nT·Ht */
  int32_t token;
};

static dflash_status fail(dflash_status status, char* message, size_t size, const char* what, const char* detail) {
  if (size > 0) snprintf(message, size, "minimal: %s%s", what, detail);
  return status;
}

static dflash_status create(const dflash_create_args* args, dflash_drafter** out, char* message, size_t size) {
  struct dflash_drafter d;
  size_t i;
  if (args->struct_size != sizeof(dflash_create_args) || args->config->struct_size != sizeof(dflash_drafter_config) ||
      args->head->struct_size != sizeof(dflash_head_settings))
    return fail(DFLASH_STATUS_UNSUPPORTED, message, size, "struct sizes differ from this header's", "");
  d.vocab = args->config->vocab_size;
  d.max_width = args->head->gamma > 2 ? args->head->gamma : 2;
  d.max_batch = args->head->max_batch;
  d.ctx_features = (int64_t)args->config->num_target_layers * args->config->target_hidden_size;
  d.token = 0;
  for (i = 0; i < args->num_options; ++i) {
    const char* key = args->options[i].key;
    const char* value = args->options[i].value;
    char* end;
    long token;
    if (strcmp(key, "token") != 0) return fail(DFLASH_STATUS_BAD_INPUT, message, size, "unknown option ", key);
    token = strtol(value, &end, 10);
    if (*value == '\0' || *end != '\0' || token < 0 || token >= d.vocab)
      return fail(DFLASH_STATUS_BAD_INPUT, message, size, "token= wants a token id below vocab_size, got ", value);
    d.token = (int32_t)token;
  }
  *out = malloc(sizeof **out);
  if (*out == NULL) return fail(DFLASH_STATUS_INTERNAL, message, size, "out of memory", "");
  **out = d;
  return DFLASH_STATUS_OK;
}

static dflash_status propose(dflash_drafter* d, const dflash_propose_request* requests, dflash_propose_result* results,
                             size_t count, char* message, size_t size) {
  size_t i;
  if (count > (size_t)d->max_batch)
    return fail(DFLASH_STATUS_BAD_INPUT, message, size, "more sequences than max_batch", "");
  for (i = 0; i < count; ++i) { /* every check before any output: on an error nothing changes */
    if (requests[i].ctx_rows > 0 && requests[i].ctx_features != d->ctx_features)
      return fail(DFLASH_STATUS_BAD_INPUT, message, size, "context rows are not nT*Ht wide", "");
    if (results[i].logits_rows < d->max_width - 1)
      return fail(DFLASH_STATUS_BAD_INPUT, message, size, "logits buffer smaller than max(gamma, 2) - 1 rows", "");
  }
  for (i = 0; i < count; ++i) {
    int32_t width = requests[i].block_width, row;
    width = width < 2 ? 2 : width > d->max_width ? d->max_width : width;
    results[i].block_width = width;
    for (row = 0; row < width - 1; ++row) {
      float* logits = results[i].logits + (size_t)row * (size_t)d->vocab;
      memset(logits, 0, (size_t)d->vocab * sizeof *logits);
      logits[d->token] = 1.0f;
      results[i].draft_tokens[row] = d->token;
    }
  }
  return DFLASH_STATUS_OK;
}

static dflash_status release(dflash_drafter* d, int32_t seq, char* message, size_t size) {
  (void)d; /* it keeps no per-sequence state */
  (void)seq;
  (void)message;
  (void)size;
  return DFLASH_STATUS_OK;
}

static void destroy(dflash_drafter* d) { free(d); }

static const dflash_drafter_api api = {
    DFLASH_DRAFTER_ABI_VERSION, sizeof(dflash_drafter_api), 0 /* no capabilities */, "minimal",
    create, propose, release, destroy, NULL /* read_tap */, NULL /* read_kv */, NULL /* describe */
};

/* Its header's version is the only one it implements: asked for another, it returns its table all
 * the same, whose abi_version tells the harness so. */
EXPORT const dflash_drafter_api* dflash_drafter_get_api(uint32_t abi_version) {
  (void)abi_version;
  return &api;
}
