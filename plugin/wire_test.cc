// The isolation's message layout: what is written reads back equal, and a short message is refused
// rather than read past its end.
#include "plugin/wire.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace dflash {
namespace {

TEST(Wire, RoundTrip) {
  WireWriter w;
  w.put<int32_t>(-7);
  w.put_string("L0.q");
  w.put_tensor(Tensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  w.put_vector(std::vector<int64_t>{5, 9});
  WireReader r(w.bytes().data(), w.bytes().size());
  EXPECT_EQ(r.get<int32_t>(), -7);
  EXPECT_EQ(r.get_string(), "L0.q");
  const Tensor t = r.get_tensor();
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.values, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(r.get_vector<int64_t>(), (std::vector<int64_t>{5, 9}));
}

TEST(Wire, ShortMessageIsRefused) {
  WireWriter w;
  w.put_tensor(Tensor({4}, {1, 2, 3, 4}));
  for (size_t cut : {size_t{0}, size_t{4}, w.bytes().size() - 1}) {
    WireReader r(w.bytes().data(), cut);
    EXPECT_THROW(r.get_tensor(), HarnessError) << "cut at " << cut;
  }
  // A length field larger than the message: refused before any allocation of that size.
  WireWriter huge;
  huge.put<uint64_t>(uint64_t{1} << 60);
  WireReader r(huge.bytes().data(), huge.bytes().size());
  EXPECT_THROW(r.get_vector<float>(), HarnessError);
}

}  // namespace
}  // namespace dflash
