// NcclGroup's host side (nccl_group.h), on any machine: a group of more ranks than visible GPUs is
// refused naming both numbers (no GPU at all in CI: 0 visible, with the runtime's reason), a
// non-positive size is bad input, and with a GPU, an NCCL that cannot be loaded is refused naming
// the library.
#include "cuda/tp/nccl_group.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dflash {
namespace {

std::string refusal(int ranks, ErrorKind* kind) {
  try {
    NcclGroup::open(ranks);
  } catch (const HarnessError& e) {
    *kind = e.kind();
    return e.what();
  }
  return "";
}

void expect_one_rank_more_refused() {
  std::string why;
  const int visible = visible_gpus(&why);
  std::printf("[tp] visible GPUs: %d%s\n", visible, why.empty() ? "" : (" (" + why + ")").c_str());
  ErrorKind kind = ErrorKind::kInternal;
  const std::string text = refusal(visible + 1, &kind);
  EXPECT_EQ(kind, ErrorKind::kUnsupported) << text;
  const std::string n = std::to_string(visible + 1);
  EXPECT_NE(text.find("tp_size " + n + " needs " + n + " visible GPUs, one per rank; " + std::to_string(visible) +
                      " visible"),
            std::string::npos)
      << text;
  for (int ranks : {0, -2}) {
    EXPECT_NE(refusal(ranks, &kind).find("tp_size " + std::to_string(ranks) + " (must be >= 1)"), std::string::npos);
    EXPECT_EQ(kind, ErrorKind::kBadInput);
  }
}

// Anywhere (CI has no GPU: 0 visible).
TEST(NcclGroup, RefusesMoreRanksThanVisibleGpus) { expect_one_rank_more_refused(); }

// In the GPU gate (label gpu): one GPU visible, tp 2 refused.
TEST(NcclGroup, OnADeviceRefusesOneRankMore) {
  std::string why;
  if (visible_gpus(&why) < 1) GTEST_SKIP() << "needs a visible GPU (" << why << "); RefusesMoreRanksThanVisibleGpus covers 0";
  expect_one_rank_more_refused();
}

TEST(NcclGroup, NamesALibraryThatCannotLoad) {
  std::string why;
  if (visible_gpus(&why) < 1) GTEST_SKIP() << "needs one visible GPU to get past the device count (" << why << ")";
  setenv("DFLASH_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  ErrorKind kind = ErrorKind::kInternal;
  const std::string text = refusal(1, &kind);
  unsetenv("DFLASH_NCCL_LIBRARY");
  EXPECT_EQ(kind, ErrorKind::kUnsupported) << text;
  EXPECT_NE(text.find("NCCL could not be loaded (/nonexistent/libnccl.so.2: "), std::string::npos) << text;
}

}  // namespace
}  // namespace dflash
