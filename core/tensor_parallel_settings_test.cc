// The refusals of docs/spec/tensor-parallel.md §1 (checks 1-6), with the contract's texts, and the
// geometries it admits (split and replicated KV heads).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/proposer.h"

namespace dflash {
namespace {

// A small geometry with the given head counts, intermediate size and vocabulary.
DrafterConfig geometry(int nh, int nkv, int intermediate, int vocab) {
  DrafterConfig c;
  c.hidden_size = 32;
  c.num_layers = 1;
  c.num_heads = nh;
  c.num_kv_heads = nkv;
  c.head_dim = 8;
  c.intermediate_size = intermediate;
  c.vocab_size = vocab;
  c.block_size = 4;
  c.target_layer_ids = {0};
  c.target_hidden_size = 32;
  c.max_position_embeddings = 4096;
  return c;
}

struct Refusal {
  const char* what;
  DrafterConfig config;
  int tp_size;
  std::string message;  // the whole message, "cfg.json" for {config}
};

TEST(TensorParallelSettings, EveryRefusalOfSection1WithItsText) {
  const std::vector<Refusal> cases = {
      {"check 1: N not in {1,2,4,8}", geometry(8, 2, 96, 64), 3, "tp_size 3 is not supported: expected 1, 2, 4 or 8"},
      {"check 1: N = 0", geometry(8, 2, 96, 64), 0, "tp_size 0 is not supported: expected 1, 2, 4 or 8"},
      {"check 1: N = 16", geometry(16, 16, 96, 64), 16, "tp_size 16 is not supported: expected 1, 2, 4 or 8"},
      {"check 3: heads", geometry(6, 6, 96, 64), 4,
       "cfg.json: key 'num_attention_heads' = 6 is not divisible by tp_size 4; refusing"},
      {"check 4: KV heads", geometry(12, 6, 96, 64), 4,
       "cfg.json: key 'num_key_value_heads' = 6 and tp_size 4: neither divides the other (KV heads are split when "
       "tp_size divides them and replicated when they divide tp_size); refusing"},
      {"check 5: intermediate", geometry(8, 8, 100, 64), 8,
       "cfg.json: key 'intermediate_size' = 100 is not divisible by tp_size 8; refusing"},
      {"check 6: vocabulary", geometry(8, 8, 96, 500), 8,
       "cfg.json: key 'vocab_size' = 500 is not divisible by tp_size 8 (the vocabulary is not padded); refusing"},
      {"order: heads before intermediate", geometry(6, 6, 100, 500), 4,
       "cfg.json: key 'num_attention_heads' = 6 is not divisible by tp_size 4; refusing"},
  };
  for (const Refusal& c : cases) {
    SCOPED_TRACE(c.what);
    HeadSettings s;
    s.tp_size = c.tp_size;
    try {
      s.resolved(c.config, "cfg.json");
      ADD_FAILURE() << "not refused";
    } catch (const HarnessError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_EQ(std::string(e.what()), c.message);
    }
  }
}

TEST(TensorParallelSettings, ReduceDtypeParsesTwoNamesAndRefusesTheRest) {
  EXPECT_EQ(parse_tp_reduce_dtype("fp32"), TpReduceDtype::kFp32);
  EXPECT_EQ(parse_tp_reduce_dtype("bf16"), TpReduceDtype::kBf16);
  for (const char* bad : {"fp16", "", "BF16", "fp32 "}) {
    try {
      parse_tp_reduce_dtype(bad);
      ADD_FAILURE() << "'" << bad << "' not refused";
    } catch (const HarnessError& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("tp_reduce_dtype '") + bad + "' is not supported: expected 'fp32' or 'bf16'");
    }
  }
}

TEST(TensorParallelSettings, SplitAndReplicatedKvHeadsAreAdmitted) {
  HeadSettings s;
  for (int n : {1, 2, 4, 8}) {
    s.tp_size = n;
    EXPECT_EQ(s.resolved(geometry(8, 2, 96, 64), "cfg.json").tp_size, n);  // split at 2, replicated at 4, 8
    EXPECT_EQ(s.resolved(geometry(8, 8, 96, 64), "cfg.json").tp_size, n);  // split
  }
}

}  // namespace
}  // namespace dflash
