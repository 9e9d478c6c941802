/* Checks the Rust forwarding plugin (dflash_forward.rs) over the minimal C plugin: loads PLUGIN.so, asks
 * for ABI version 2 and, as a harness newer than the plugin would, for version 3, then creates a drafter
 * with token=5 and runs one batched propose. Usage: forward_check PLUGIN.so EXPECTED_NAME (with
 * DFLASH_FORWARD_TO naming the minimal plugin). Exit 0 when every check holds, 1 otherwise. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "dflash/drafter_plugin.h"

enum { kVocab = 8, kGamma = 4, kToken = 5, kFeatures = 4 };
static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "forward_check: FAIL: %s\n", what);
    ++failures;
  }
}

int main(int argc, char** argv) {
  void *library, *symbol;
  dflash_drafter_get_api_fn get_api;
  const dflash_drafter_api* api;
  int32_t layer_ids[1] = {1};
  dflash_drafter_config config;
  dflash_head_settings head;
  dflash_option options[1] = {{"token", "5"}}, bad_option[1] = {{"tokn", "5"}};
  dflash_create_args args;
  dflash_drafter* drafter = NULL;
  char message[256] = "";
  float ctx[2 * kFeatures] = {0}, logits[2][(kGamma - 1) * kVocab];
  int32_t tokens[2][kGamma - 1];
  dflash_propose_request requests[2];
  dflash_propose_result results[2];
  int i, row, column;

  if (argc != 3) {
    fprintf(stderr, "usage: forward_check PLUGIN.so EXPECTED_NAME\n");
    return 2;
  }
  library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "forward_check: FAIL: cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  symbol = dlsym(library, "dflash_drafter_get_api");
  memcpy(&get_api, &symbol, sizeof get_api); /* ISO C has no cast from void* to a function pointer */
  if (get_api == NULL || (api = get_api(DFLASH_DRAFTER_ABI_VERSION)) == NULL) {
    fprintf(stderr, "forward_check: FAIL: no dflash_drafter_get_api, or it returned NULL\n");
    return 1;
  }
  printf("forward_check: get_api(2): name \"%s\", abi_version %u, struct_size %u (this header's %u)\n", api->name,
         api->abi_version, api->struct_size, (unsigned)sizeof(dflash_drafter_api));
  expect(strcmp(api->name, argv[2]) == 0, "the table's name is not the expected one");
  expect(api->abi_version == 2 && api->struct_size == sizeof(dflash_drafter_api), "not a version-2 table");
  expect(get_api(3) != NULL && get_api(3)->abi_version == 2, "get_api(3) does not answer with its version 2");

  memset(&config, 0, sizeof config);
  config.struct_size = sizeof config;
  config.hidden_size = config.target_hidden_size = kFeatures;
  config.vocab_size = kVocab;
  config.num_target_layers = 1;
  config.target_layer_ids = layer_ids;
  memset(&head, 0, sizeof head);
  head.struct_size = sizeof head;
  head.gamma = kGamma;
  head.max_batch = 2;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.config = &config;
  args.head = &head;
  args.options = bad_option;
  args.num_options = 1;
  expect(api->create(&args, &drafter, message, sizeof message) == DFLASH_STATUS_BAD_INPUT && strstr(message, "tokn"),
         "an unknown option is not refused by name");
  printf("forward_check: create with tokn=5: \"%s\"\n", message);
  args.options = options;
  if (api->create(&args, &drafter, message, sizeof message) != DFLASH_STATUS_OK) {
    fprintf(stderr, "forward_check: FAIL: create: %s\n", message);
    return 1;
  }

  for (i = 0; i < 2; ++i) {
    memset(&requests[i], 0, sizeof requests[i]);
    requests[i].seq = 7 * i;
    requests[i].anchor = 1;
    requests[i].start = 1;
    requests[i].block_width = 9; /* clamped to gamma */
    requests[i].ctx_rows = 1;
    requests[i].ctx_features = kFeatures;
    requests[i].ctx = ctx + i * kFeatures;
    memset(&results[i], 0, sizeof results[i]);
    results[i].seq = requests[i].seq;
    results[i].logits_rows = kGamma - 1;
    results[i].logits = logits[i];
    results[i].draft_tokens = tokens[i];
    memset(logits[i], 0xff, sizeof logits[i]); /* NaN: a row left unwritten shows */
    memset(tokens[i], 0xff, sizeof tokens[i]);
  }
  if (api->propose(drafter, requests, results, 2, message, sizeof message) != DFLASH_STATUS_OK) {
    fprintf(stderr, "forward_check: FAIL: propose: %s\n", message);
    return 1;
  }
  for (i = 0; i < 2; ++i) {
    expect(results[i].block_width == kGamma, "the width is not clamped to gamma");
    for (row = 0; row < kGamma - 1; ++row) {
      expect(tokens[i][row] == kToken, "a draft token is not the option's token");
      for (column = 0; column < kVocab; ++column)
        expect(logits[i][row * kVocab + column] == (column == kToken ? 1.0f : 0.0f), "a logit is not the constant");
    }
  }
  printf("forward_check: propose of sequences [0, 7]: widths %d, %d; draft tokens %d %d %d\n", results[0].block_width,
         results[1].block_width, tokens[1][0], tokens[1][1], tokens[1][2]);
  expect(api->release(drafter, 7, message, sizeof message) == DFLASH_STATUS_OK, "release failed");
  api->destroy(drafter);
  dlclose(library);
  printf("forward_check: %s (%d failed checks)\n", failures ? "FAIL" : "pass", failures);
  return failures ? 1 : 0;
}
