// Copies of a fixture with one trace tensor rewritten: expectations corrupted on purpose.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dflash::cli_test {

// Copies the fixture directory `source` to `destination` (files made writable).
void copy_fixture(const std::string& source, const std::string& destination);

// Rewrites trace tensor `name` of the fixture in `dir`: F32 tensors through `edit_f32`, I32 through
// `edit_i32` (the other may be empty). Every other tensor keeps its bytes.
void edit_trace_tensor(const std::string& dir, const std::string& name,
                       const std::function<void(std::vector<float>&)>& edit_f32,
                       const std::function<void(std::vector<int32_t>&)>& edit_i32 = {});

}  // namespace dflash::cli_test
