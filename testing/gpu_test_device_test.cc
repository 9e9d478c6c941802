// CTest's GPU allocation mapped to CUDA_VISIBLE_DEVICES (testing/gpu_test_device.h).
#include <gtest/gtest.h>

#include <string>

#include "testing/gpu_test_device.h"

namespace dflash {
namespace {

std::string device_for(const std::string& allocation, const std::string& visible) {
  std::string device, error;
  EXPECT_TRUE(visible_device_for(allocation, visible, &device, &error)) << error;
  return device;
}

std::string error_for(const std::string& allocation, const std::string& visible) {
  std::string device, error;
  EXPECT_FALSE(visible_device_for(allocation, visible, &device, &error)) << "accepted as " << device;
  return error;
}

TEST(GpuTestDevice, TheAllocatedIdBecomesTheVisibleDevice) {
  EXPECT_EQ(device_for("id:0,slots:1", ""), "0");
  EXPECT_EQ(device_for("id:3,slots:1", ""), "3");
  EXPECT_EQ(device_for("id:12", ""), "12");
}

TEST(GpuTestDevice, AnIdIndexesAnExistingVisibleList) {
  EXPECT_EQ(device_for("id:1,slots:1", "4,6,7"), "6");
  EXPECT_EQ(device_for("id:0,slots:1", "GPU-8f3a"), "GPU-8f3a");
}

TEST(GpuTestDevice, MalformedOrOutOfRangeAllocationsAreRefusedByName) {
  for (const char* bad : {"", "slots:1", "id:,slots:1", "id:x,slots:1", "gpu:0"}) {
    const std::string error = error_for(bad, "");
    EXPECT_NE(error.find("CTEST_RESOURCE_GROUP_0_GPUS"), std::string::npos) << error;
  }
  const std::string error = error_for("id:3,slots:1", "0,1");
  EXPECT_NE(error.find("CUDA_VISIBLE_DEVICES=0,1"), std::string::npos) << error;
}

}  // namespace
}  // namespace dflash
