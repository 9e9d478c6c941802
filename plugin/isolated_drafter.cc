#include "plugin/isolated_drafter.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>

#include "core/error.h"
#include "plugin/plugin_drafter.h"
#include "plugin/wire.h"

namespace dflash {
namespace {

enum Op : uint32_t { kReady = 1, kError, kAnswer, kPropose, kRelease, kReadKv };

void put_introspection(WireWriter& w, const Introspection& in) {
  for (bool b : {in.cache_view, in.slot_read, in.position_read, in.taps, in.attention_spans, in.path}) w.put<uint8_t>(b);
  w.put<uint64_t>(in.stages_not_given.size());
  for (const std::string& s : in.stages_not_given) w.put_string(s);
  w.put_string(in.why);
}

Introspection get_introspection(WireReader& r) {
  Introspection in;
  for (bool* b : {&in.cache_view, &in.slot_read, &in.position_read, &in.taps, &in.attention_spans, &in.path}) {
    *b = r.get<uint8_t>() != 0;
  }
  const uint64_t n = r.get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) in.stages_not_given.push_back(r.get_string());
  in.why = r.get_string();
  return in;
}

// The child's answer to an exception: its kind and words, rethrown as they were in the parent.
std::string error_payload(std::exception_ptr error) {
  WireWriter w;
  try {
    std::rethrow_exception(error);
  } catch (const DrafterFault& e) {
    w.put<uint32_t>(static_cast<uint32_t>(e.kind()));
    w.put_string(e.what());
    w.put_string(e.proposer());
    w.put_string(e.event());
    w.put_string(e.during());
  } catch (const HarnessError& e) {
    w.put<uint32_t>(static_cast<uint32_t>(e.kind()));
    w.put_string(e.what());
  } catch (const std::exception& e) {
    w.put<uint32_t>(static_cast<uint32_t>(ErrorKind::kInternal));
    w.put_string(std::string("plugin isolation: unexpected error in the plugin's process: ") + e.what());
  } catch (...) {
    w.put<uint32_t>(static_cast<uint32_t>(ErrorKind::kInternal));
    w.put_string("plugin isolation: an unknown exception in the plugin's process");
  }
  return w.bytes();
}

[[noreturn]] void rethrow_error(const std::string& payload) {
  WireReader r(payload.data(), payload.size());
  const auto kind = static_cast<ErrorKind>(r.get<uint32_t>());
  const std::string message = r.get_string();
  if (kind == ErrorKind::kDrafterFault) {
    const std::string proposer = r.get_string(), event = r.get_string();
    throw DrafterFault(proposer, event, r.get_string());
  }
  throw HarnessError(kind, message);
}

std::string signal_name(int sig) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* abbrev = sigabbrev_np(sig)) return std::string("SIG") + abbrev;
#endif
  return "signal " + std::to_string(sig);
}

// The child's side: `work` answers one request; returns when the parent closes the channel.
void serve(Channel& channel, const std::function<std::string(uint32_t, WireReader&)>& work) {
  for (;;) {
    uint32_t op = 0;
    std::string payload;
    if (channel.receive(&op, &payload, -1) != Channel::Wait::kMessage) break;
    std::string answer;
    uint32_t kind = kAnswer;
    try {
      WireReader in(payload.data(), payload.size());
      answer = work(op, in);
    } catch (...) {
      kind = kError;
      answer = error_payload(std::current_exception());
    }
    if (!channel.send(kind, answer)) break;
  }
}

// Forks a child that runs `child` with its end of `channel` and never returns.
pid_t fork_child(Channel& channel, const std::function<void()>& child) {
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = fork();
  if (pid < 0) throw internal_error(std::string("plugin isolation: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the harness gone, the child goes too
    channel.keep_child_end();
    try {
      child();
    } catch (...) {
    }
    std::_Exit(0);
  }
  channel.keep_parent_end();
  return pid;
}

// Reaps the child, waiting at most `ms` before killing it; its wait status.
int reap(pid_t pid, int ms) {
  int status = 0;
  for (int waited = 0; waited < ms; waited += 10) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || r < 0) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return status;
}

std::string how_it_ended(int status) {
  if (WIFSIGNALED(status)) return "plugin crashed: " + signal_name(WTERMSIG(status));
  if (WIFEXITED(status)) return "plugin exited with status " + std::to_string(WEXITSTATUS(status));
  return "plugin process ended";
}

}  // namespace

IsolatedDrafter::IsolatedDrafter(const std::string& plugin_path, const DrafterConfig& config,
                                 std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings,
                                 const std::string& drafter_dir, const std::string& target_path,
                                 const PluginOptions& options, double timeout_s)
    : PluginProposerBase(config, settings), name_("plugin:" + plugin_path),
      timeout_ms_(static_cast<int>(timeout_s * 1000.0)) {
  if (!(timeout_s > 0) || timeout_s > 86400) {
    throw bad_input("--plugin-timeout " + std::to_string(timeout_s) + ": expected seconds in (0, 86400]");
  }
  channel_ = std::make_unique<Channel>();
  child_ = fork_child(*channel_, [&] {
    std::unique_ptr<PluginDrafter> drafter;
    try {
      drafter = std::make_unique<PluginDrafter>(PluginLibrary::open(plugin_path), config, weights, settings, drafter_dir,
                                                target_path, options);
      WireWriter ready;
      ready.put_string(drafter->name());
      ready.put<uint64_t>(drafter->describe().size());
      for (const auto& [k, v] : drafter->describe()) {
        ready.put_string(k);
        ready.put_string(v);
      }
      put_introspection(ready, drafter->introspection());
      ready.put<uint8_t>(drafter->bf16_attention_partials());
      if (!channel_->send(kReady, ready.bytes())) std::_Exit(0);
    } catch (...) {
      channel_->send(kError, error_payload(std::current_exception()));
      std::_Exit(0);
    }
    serve(*channel_, [&](uint32_t op, WireReader& in) -> std::string {
      WireWriter out;
      if (op == kPropose) {
        drafter->set_block_g(in.get<int32_t>());
        const bool want_taps = in.get<uint8_t>() != 0;
        const uint64_t n = in.get<uint64_t>();
        std::vector<Tensor> ctx(n);
        std::vector<ProposeInput> batch(n);
        for (uint64_t i = 0; i < n; ++i) {
          batch[i].seq = in.get<int32_t>();
          batch[i].start = in.get<int64_t>();
          batch[i].anchor = in.get<int32_t>();
          ctx[i] = in.get_tensor();
          batch[i].ctx = &ctx[i];
        }
        const std::vector<ProposeOutput> outputs = drafter->propose(batch, want_taps);
        out.put<uint64_t>(outputs.size());
        for (const ProposeOutput& o : outputs) {
          out.put<int32_t>(o.seq);
          out.put<int32_t>(o.block_width);
          out.put_tensor(o.logits);
          out.put_vector(o.draft_tokens);
          out.put_string(o.path.mode);
          out.put<uint64_t>(o.taps.size());
          for (const Tap& tap : o.taps) {
            out.put_string(tap.name);
            out.put_tensor(tap.value);
          }
        }
        put_introspection(out, drafter->introspection());
      } else if (op == kRelease) {
        drafter->release_sequence(in.get<int32_t>());
      } else if (op == kReadKv) {
        const int layer = in.get<int32_t>(), seq = in.get<int32_t>();
        const std::optional<KvRows> rows = drafter->read_kv_at(layer, seq, in.get_vector<int64_t>());
        out.put<uint8_t>(rows.has_value());
        if (rows) {
          out.put_tensor(rows->k);
          out.put_tensor(rows->v);
        }
      } else {
        throw internal_error("plugin isolation: unknown request " + std::to_string(op));
      }
      return out.bytes();
    });
  });
  uint32_t op = 0;
  std::string payload;
  const Channel::Wait wait = channel_->receive(&op, &payload, timeout_ms_);
  if (wait == Channel::Wait::kTimeout) {
    kill(child_, SIGKILL);
    reap(child_, 1000);
    child_ = -1;
    throw DrafterFault(name_, "plugin hung: no answer in " + std::to_string(timeout_ms_ / 1000) + " s", "create");
  }
  if (wait == Channel::Wait::kClosed) child_died("create");
  if (op == kError) {
    reap(child_, 5000);
    child_ = -1;
    rethrow_error(payload);
  }
  WireReader ready(payload.data(), payload.size());
  name_ = ready.get_string();
  const uint64_t n = ready.get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    std::string k = ready.get_string();
    describe_.emplace_back(std::move(k), ready.get_string());
  }
  describe_.emplace_back("isolated", "child process " + std::to_string(child_) + ", timeout " +
                                         std::to_string(timeout_ms_ / 1000) + " s");
  introspection_ = get_introspection(ready);
  bf16_attention_partials_ = ready.get<uint8_t>() != 0;
}

IsolatedDrafter::~IsolatedDrafter() {
  if (channel_) channel_->close();  // the child destroys its drafter and exits
  if (child_ > 0) reap(child_, 5000);
}

void IsolatedDrafter::child_died(const std::string& during) const {
  dead_ = true;
  channel_->close();
  const int status = reap(child_, 2000);
  child_ = -1;
  throw DrafterFault(name_, how_it_ended(status), during);
}

std::string IsolatedDrafter::call(uint32_t op, const std::string& payload, const std::string& during) const {
  if (dead_ || child_ < 0) throw DrafterFault(name_, "plugin process is gone", during);
  if (!channel_->send(op, payload)) child_died(during);
  uint32_t answer_op = 0;
  std::string answer;
  const Channel::Wait wait = channel_->receive(&answer_op, &answer, timeout_ms_);
  if (wait == Channel::Wait::kClosed) child_died(during);
  if (wait == Channel::Wait::kTimeout) {
    dead_ = true;
    kill(child_, SIGKILL);
    channel_->close();
    reap(child_, 1000);
    child_ = -1;
    throw DrafterFault(name_, "plugin hung: no answer in " + std::to_string(timeout_ms_ / 1000) + " s (killed)", during);
  }
  if (answer_op == kError) rethrow_error(answer);
  return answer;
}

void IsolatedDrafter::set_block_g(int g) { block_g_ = g; }

void IsolatedDrafter::release_sequence(int seq) {
  WireWriter w;
  w.put<int32_t>(seq);
  call(kRelease, w.bytes(), "release of sequence " + std::to_string(seq));
  active_.erase(seq);
}

std::vector<ProposeOutput> IsolatedDrafter::propose(const std::vector<ProposeInput>& batch, bool want_taps) {
  WireWriter w;
  w.put<int32_t>(block_g_);
  w.put<uint8_t>(want_taps);
  w.put<uint64_t>(batch.size());
  for (const ProposeInput& in : batch) {
    if (in.ctx == nullptr) throw internal_error(name_ + ": propose of sequence " + std::to_string(in.seq) + " without context");
    w.put<int32_t>(in.seq);
    w.put<int64_t>(in.start);
    w.put<int32_t>(in.anchor);
    w.put_tensor(*in.ctx);
    active_.insert(in.seq);
  }
  const std::string answer = call(kPropose, w.bytes(), "propose of sequences " + sequence_list(batch));
  WireReader r(answer.data(), answer.size());
  std::vector<ProposeOutput> outputs(r.get<uint64_t>());
  for (ProposeOutput& o : outputs) {
    o.seq = r.get<int32_t>();
    o.block_width = r.get<int32_t>();
    o.logits = r.get_tensor();
    o.draft_tokens = r.get_vector<int32_t>();
    o.path.mode = r.get_string();
    const uint64_t taps = r.get<uint64_t>();
    for (uint64_t t = 0; t < taps; ++t) {
      std::string name = r.get_string();
      o.taps.push_back({std::move(name), r.get_tensor()});
    }
  }
  introspection_ = get_introspection(r);
  return outputs;
}

std::optional<KvRows> IsolatedDrafter::read_kv_at(int layer, int seq, const std::vector<int64_t>& positions) const {
  if (!introspection_.position_read) return std::nullopt;
  WireWriter w;
  w.put<int32_t>(layer);
  w.put<int32_t>(seq);
  w.put_vector(positions);
  const std::string answer =
      call(kReadKv, w.bytes(), "read_kv of layer " + std::to_string(layer) + ", sequence " + std::to_string(seq));
  WireReader r(answer.data(), answer.size());
  if (r.get<uint8_t>() == 0) return std::nullopt;
  KvRows rows;
  rows.k = r.get_tensor();
  rows.v = r.get_tensor();
  return rows;
}

void check_plugin_isolated(const std::string& plugin_path, double timeout_s) {
  Channel channel;
  const pid_t child = fork_child(channel, [&] {
    try {
      PluginLibrary::open(plugin_path);
      channel.send(kAnswer, "");
    } catch (...) {
      channel.send(kError, error_payload(std::current_exception()));
    }
  });
  uint32_t op = 0;
  std::string payload;
  const Channel::Wait wait = channel.receive(&op, &payload, static_cast<int>(timeout_s * 1000.0));
  if (wait == Channel::Wait::kTimeout) kill(child, SIGKILL);
  const int status = reap(child, 5000);
  if (wait == Channel::Wait::kTimeout) {
    throw DrafterFault("plugin:" + plugin_path, "plugin hung: no answer in " + std::to_string(static_cast<int>(timeout_s)) + " s",
                       "loading");
  }
  if (wait == Channel::Wait::kClosed) throw DrafterFault("plugin:" + plugin_path, how_it_ended(status), "loading");
  if (op == kError) rethrow_error(payload);
}

}  // namespace dflash
