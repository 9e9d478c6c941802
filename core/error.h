// One error type for the whole harness. Every failure says what, where and why; its kind decides
// the command-line exit code (docs/cli.md: 0 pass, 1 mismatch, 2 bad input, 3 internal error,
// 125 cannot run).
#pragma once
#include <cstdio>
#include <stdexcept>
#include <string>

namespace dflash {

enum class ErrorKind {
  kBadInput,       // malformed file, wrong shape/dtype, bad config key, NaN, context gap: exit 2
  kPoolExhausted,  // the paged KV pool cannot serve a request (that request only): exit 2
  kUnsupported,    // valid input this build or machine cannot run (no GPU, head_dim not built): exit 125
  kInternal,       // a broken invariant inside the harness itself (a bug): exit 3
  kDrafterFault,   // the drafter under test crashed, hung or failed a call: that fixture fails, exit 1
};

// The exit codes of the command-line tools (docs/cli.md), usable by `git bisect run`.
constexpr int kExitPass = 0;
constexpr int kExitMismatch = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitInternal = 3;
constexpr int kExitCannotRun = 125;

class HarnessError : public std::runtime_error {
 public:
  HarnessError(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// A drafter under test that crashed, hung or failed (a plugin, docs/plugin.md): the replay records it
// as that fixture's failure, "plugin crashed: SIGSEGV during step 3, propose of sequences [0, 2]".
class DrafterFault : public HarnessError {
 public:
  // proposer: its name(); event: "plugin crashed: SIGSEGV"; during: "propose of sequences [0, 2]".
  DrafterFault(const std::string& proposer, const std::string& event, const std::string& during)
      : HarnessError(ErrorKind::kDrafterFault, proposer + ": " + event + " during " + during),
        proposer_(proposer),
        event_(event),
        during_(during) {}
  const std::string& proposer() const { return proposer_; }
  const std::string& event() const { return event_; }
  const std::string& during() const { return during_; }

 private:
  std::string proposer_, event_, during_;
};

// Shorthands used everywhere: `throw bad_input("trace.safetensors: tensor 's0.q0.ctx': ...")`.
inline HarnessError bad_input(const std::string& message) { return HarnessError(ErrorKind::kBadInput, message); }
inline HarnessError unsupported(const std::string& message) { return HarnessError(ErrorKind::kUnsupported, message); }
inline HarnessError internal_error(const std::string& message) { return HarnessError(ErrorKind::kInternal, message); }

// Exit code a command-line tool returns for an error of this kind.
inline int exit_code_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kUnsupported: return kExitCannotRun;
    case ErrorKind::kInternal: return kExitInternal;
    case ErrorKind::kDrafterFault: return kExitMismatch;
    default: return kExitBadInput;
  }
}

// The main() of a small program (benchmarks, timing tools): returns main_impl(argc, argv), or
// prints a HarnessError as "program: message" and returns its exit code.
template <typename MainImpl>
int run_program(const char* program, MainImpl&& main_impl, int argc, char** argv) {
  try {
    return main_impl(argc, argv);
  } catch (const HarnessError& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return exit_code_for(e.kind());
  }
}

}  // namespace dflash
