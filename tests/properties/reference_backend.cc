#include "reference/reference_drafter.h"
#include "tests/properties/backends.h"

namespace dflash::prop {

Backend reference_backend() {
  Backend b;
  b.name = "reference";
  b.make = make_reference_drafter;
  b.precisions = {Precision::kFp64, Precision::kFp32, Precision::kBf16, Precision::kFp8};
  return b;
}

Backend reference_backend(Precision precision) {
  Backend b = reference_backend();
  b.name = std::string("reference-") + precision_name(precision);
  b.precisions = {precision};
  return b;
}

}  // namespace dflash::prop
