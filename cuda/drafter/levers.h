// The CUDA drafter's levers: ONE table (lever_table) names each lever (its key in
// CudaOptions::kernels and DFLASH_CUDA_KERNELS="stage=value,..."), what it chooses, its values, the
// typed KernelPlan field each value sets and what each value runs; a lever's first value is its
// default (what KernelPlan's initializer holds: cuda_kernel_plan_test checks both agree). Parsing,
// the errors and describe() all read it; docs/cuda-drafter.md's lever table says the same for
// readers.
//
// Only choices that ship or serve bisecting are levers: what `auto` picks (forced values are
// widths or forms auto picks elsewhere) and the plain fallbacks. Designs measured slower, values
// `auto` never picks and aliases are not; asking for one is an error listing the table's values.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cuda/drafter/kernel_plan.h"

namespace dflash {

class Lever {
 public:
  // One value of a lever: its name, the typed value it sets, and what then runs (with why it is
  // kept where it is not what auto picks).
  template <typename T>
  struct Value {
    const char* name;
    T value;
    const char* meaning;
  };
  struct Option {
    std::string name, meaning;
  };

  template <typename T>
  Lever(const char* stage, const char* chooses, T KernelPlan::*field, std::vector<Value<T>> values)
      : stage_(stage), chooses_(chooses) {
    for (const Value<T>& v : values) options_.push_back({v.name, v.meaning});
    set_ = [field, values](KernelPlan& plan, size_t option) { plan.*field = values[option].value; };
    held_ = [field, values](const KernelPlan& plan) {
      for (size_t i = 0; i < values.size(); ++i) {
        if (plan.*field == values[i].value) return static_cast<int>(i);
      }
      return -1;
    };
  }
  // What the plan resolved from this lever beyond its value (e.g. the attention kernel for
  // head_dim), appended by describe().
  Lever& resolved_by(std::function<std::string(const KernelPlan&)> resolved);

  const std::string& stage() const { return stage_; }
  const std::string& chooses() const { return chooses_; }
  const std::vector<Option>& options() const { return options_; }
  std::string option_names() const;  // "mma, cublaslt, simple"
  // Sets the option `name`; kBadInput "CUDA kernels: stage=name is not a value of stage (...)".
  void set(KernelPlan& plan, const std::string& name) const;
  // The option the plan holds (kInternal if it holds none: a fallback set a value the table lacks).
  const Option& held(const KernelPlan& plan) const;
  // describe()'s value: "name: meaning", then "; here: ..." where the plan resolved more.
  std::string describe(const KernelPlan& plan) const;

 private:
  std::string stage_, chooses_;
  std::vector<Option> options_;
  std::function<void(KernelPlan&, size_t)> set_;
  std::function<int(const KernelPlan&)> held_;
  std::function<std::string(const KernelPlan&)> resolved_;
};

// Every lever, in the order describe() lists them.
const std::vector<Lever>& lever_table();
// The lever of `stage`; kBadInput "CUDA kernels: unknown stage 'x' (every stage of the table)".
const Lever& find_lever(const std::string& stage);
// Sets each requested stage's value on `plan` (throws as find_lever and Lever::set).
void apply_levers(const std::map<std::string, std::string>& requested, KernelPlan* plan);
// ("kernel.<stage>", Lever::describe) for every lever of the table, in its order.
std::vector<std::pair<std::string, std::string>> describe_levers(const KernelPlan& plan);

}  // namespace dflash
