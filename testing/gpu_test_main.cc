// The main of every GPU test binary: the device CTest assigned (testing/gpu_test_device.h), then
// the tests. Child processes a test starts inherit the same device.
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "testing/gpu_test_device.h"

int main(int argc, char** argv) {
  std::string error;
  if (!dflash::apply_ctest_gpu_allocation(&error)) {
    std::cerr << "error: " << error << "\n";
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
