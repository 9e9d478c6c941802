#include "plugin/plugin_drafter.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/kv_pages.h"
#include "core/stages.h"

namespace dflash {
namespace {

constexpr size_t kMessageSize = 4096;
// The largest tap read back (1 GiB of floats): a shape past it is the plugin's fault, not an allocation.
constexpr int64_t kTapElements = int64_t{1} << 28;

std::string capability_list(const PluginLibrary& library) {
  std::string out;
  const std::pair<uint64_t, const char*> caps[] = {
      {DFLASH_CAP_TAPS, "taps"},     {DFLASH_CAP_KV_READ, "kv-read"},
      {DFLASH_CAP_DESCRIBE, "describe"}, {DFLASH_CAP_PATH, "path"},
      {DFLASH_CAP_TENSOR_PARALLEL, "tensor-parallel"}, {DFLASH_CAP_BF16_ATTENTION_PARTIALS, "bf16-attention-partials"}};
  for (const auto& [bit, name] : caps) {
    if (library.has(bit)) out += (out.empty() ? "" : ",") + std::string(name);
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::string sequence_list(const std::vector<ProposeInput>& batch) {
  std::string out = "[";
  for (size_t i = 0; i < batch.size(); ++i) out += (i ? ", " : "") + std::to_string(batch[i].seq);
  return out + "]";
}

PluginDrafter::PluginDrafter(std::shared_ptr<const PluginLibrary> library, const DrafterConfig& config,
                             std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings,
                             const std::string& drafter_dir, const std::string& target_path,
                             const PluginOptions& options)
    : PluginProposerBase(config, settings), library_(std::move(library)) {
  name_ = library_->name() + "-" + precision_name(settings_.precision);
  // A drafter that cannot run the ranks asked for would run TP = 1 and pass as TP = N.
  if (settings_.tp_size > 1 && library_->abi_version() < 2) {
    throw unsupported(name_ + ": --tp " + std::to_string(settings_.tp_size) +
                      ": the plugin implements drafter plugin ABI version 1, which has no tensor-parallel fields "
                      "(version 2 and DFLASH_CAP_TENSOR_PARALLEL, docs/plugin.md)");
  }
  if (settings_.tp_size > 1 && !library_->has(DFLASH_CAP_TENSOR_PARALLEL)) {
    throw unsupported(name_ + ": --tp " + std::to_string(settings_.tp_size) +
                      ": the plugin does not announce DFLASH_CAP_TENSOR_PARALLEL, so it runs one rank (docs/plugin.md)");
  }
  args_ = make_create_args(config_, std::move(weights), settings_, drafter_dir, target_path, options,
                           library_->abi_version());
  char message[kMessageSize] = {0};
  const int status = library_->api().create(&args_->args, &drafter_, message, sizeof message);
  check(status, message, "create");
  if (drafter_ == nullptr) throw DrafterFault(name_, "plugin failed: create returned OK and no drafter", "create");
}

PluginDrafter::~PluginDrafter() {
  if (drafter_ != nullptr) library_->api().destroy(drafter_);
}

void PluginDrafter::check(int status, const char* message, const std::string& during) const {
  if (status == DFLASH_STATUS_OK) return;
  std::string text(message, strnlen(message, kMessageSize));
  if (text.empty()) text = "(no message)";
  switch (status) {
    case DFLASH_STATUS_BAD_INPUT: throw bad_input(name_ + ": " + during + ": " + text);
    case DFLASH_STATUS_UNSUPPORTED: throw unsupported(name_ + ": " + during + ": " + text);
    case DFLASH_STATUS_INTERNAL: throw DrafterFault(name_, "plugin failed: " + text, during);
    default:
      throw DrafterFault(name_, "plugin failed: status " + std::to_string(status) + " is not one the call returns (" + text + ")",
                         during);
  }
}

void PluginDrafter::release_sequence(int seq) {
  char message[kMessageSize] = {0};
  check(library_->api().release(drafter_, seq, message, sizeof message), message,
        "release of sequence " + std::to_string(seq));
  active_.erase(seq);
}

std::vector<ProposeOutput> PluginDrafter::propose(const std::vector<ProposeInput>& batch, bool want_taps) {
  const int64_t V = config_.vocab_size;
  const int64_t capacity = std::max(settings_.gamma, 2) - 1;
  const std::string during = "propose of sequences " + sequence_list(batch);
  std::vector<dflash_propose_request> requests(batch.size());
  std::vector<dflash_propose_result> results(batch.size());
  std::vector<std::vector<float>> logits(batch.size(), std::vector<float>(static_cast<size_t>(capacity * V)));
  std::vector<std::vector<int32_t>> tokens(batch.size(), std::vector<int32_t>(static_cast<size_t>(capacity), -1));
  for (size_t i = 0; i < batch.size(); ++i) {
    const ProposeInput& in = batch[i];
    if (in.ctx == nullptr) throw internal_error(name_ + ": propose of sequence " + std::to_string(in.seq) + " without context");
    dflash_propose_request& r = requests[i];
    r.seq = in.seq;
    r.anchor = in.anchor;
    r.start = in.start;
    r.block_width = block_g_;
    r.want_taps = want_taps && library_->has(DFLASH_CAP_TAPS);
    r.ctx_rows = in.ctx->rows();
    r.ctx_features = in.ctx->cols();
    r.ctx = in.ctx->values.data();
    dflash_propose_result& o = results[i];
    o.seq = in.seq;
    o.logits_rows = capacity;
    o.logits = logits[i].data();
    o.draft_tokens = tokens[i].data();
    o.path = DFLASH_PATH_UNREPORTED;
    active_.insert(in.seq);
  }
  char message[kMessageSize] = {0};
  check(library_->api().propose(drafter_, requests.data(), results.data(), batch.size(), message, sizeof message),
        message, during);
  std::vector<ProposeOutput> out(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    ProposeOutput& o = out[i];
    o.seq = batch[i].seq;
    o.block_width = results[i].block_width;
    // A width past the buffer is read as far as the buffer goes; the clamp invariant names it.
    const int64_t rows = std::clamp<int64_t>(int64_t{results[i].block_width} - 1, 0, capacity);
    logits[i].resize(static_cast<size_t>(rows * V));
    o.logits = Tensor({rows, V}, std::move(logits[i]));
    o.draft_tokens.assign(tokens[i].begin(), tokens[i].begin() + rows);
    o.path.mode = library_->has(DFLASH_CAP_PATH) ? path_mode_name(results[i].path) : "unreported";
    if (want_taps && library_->has(DFLASH_CAP_TAPS)) {
      for (const std::string& stage : forward_stage_order(config_.num_layers, config_.dflash2.enabled, settings_.tp_size)) {
        if (stage == "logits") continue;
        bool given = false;
        Tensor value = read_tap(o.seq, stage, &given);
        if (given) o.taps.push_back({stage, std::move(value)});
      }
    }
    if (want_taps) o.taps.push_back({"logits", o.logits});  // the logits stage is the output itself
  }
  return out;
}

Tensor PluginDrafter::read_tap(int seq, const std::string& stage, bool* given) {
  const std::string during = "read_tap of '" + stage + "', sequence " + std::to_string(seq);
  char message[kMessageSize] = {0};
  int32_t ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  const auto& api = library_->api();
  int status = api.read_tap(drafter_, seq, stage.c_str(), nullptr, 0, &ndim, shape, message, sizeof message);
  *given = status != DFLASH_STATUS_NOT_AVAILABLE;
  if (!*given) {
    if (std::find(stages_not_given_.begin(), stages_not_given_.end(), stage) == stages_not_given_.end()) {
      stages_not_given_.push_back(stage);
    }
    return {};
  }
  check(status, message, during);
  if (ndim < 0 || ndim > 4) throw DrafterFault(name_, "plugin failed: tap shape of " + std::to_string(ndim) + " dimensions", during);
  std::vector<int64_t> dims(shape, shape + ndim);
  int64_t numel = 1;
  for (int64_t d : dims) {
    if (d < 0 || d > kTapElements || numel * std::max<int64_t>(d, 1) > kTapElements) {
      throw DrafterFault(name_, "plugin failed: tap shape " + shape_string(dims) + " is negative or past " +
                                    std::to_string(kTapElements) + " elements", during);
    }
    numel *= d;
  }
  std::vector<float> values(static_cast<size_t>(numel));
  status = api.read_tap(drafter_, seq, stage.c_str(), values.data(), values.size(), &ndim, shape, message, sizeof message);
  check(status, message, during);
  return Tensor(dims, std::move(values));
}

std::optional<KvRows> PluginDrafter::read_kv_at(int layer, int seq, const std::vector<int64_t>& positions) const {
  if (!library_->has(DFLASH_CAP_KV_READ)) return std::nullopt;
  const int64_t n = static_cast<int64_t>(positions.size()), kv = config_.kv_dim();
  std::vector<float> k(static_cast<size_t>(n * kv)), v(static_cast<size_t>(n * kv));
  char message[kMessageSize] = {0};
  check(library_->api().read_kv(drafter_, layer, seq, positions.data(), positions.size(), k.data(), v.data(), message,
                                sizeof message),
        message, "read_kv of layer " + std::to_string(layer) + ", sequence " + std::to_string(seq));
  return KvRows{Tensor({n, kv}, std::move(k)), Tensor({n, kv}, std::move(v))};
}

Introspection PluginDrafter::introspection() const {
  Introspection in;
  in.cache_view = false;
  in.slot_read = false;
  in.attention_spans = false;
  in.position_read = library_->has(DFLASH_CAP_KV_READ);
  in.taps = library_->has(DFLASH_CAP_TAPS);
  in.path = library_->has(DFLASH_CAP_PATH);
  in.stages_not_given = stages_not_given_;
  in.why = "plugin ABI version " + std::to_string(library_->abi_version()) + ", capabilities " +
           capability_list(*library_);
  return in;
}

bool PluginDrafter::bf16_attention_partials() const { return library_->has(DFLASH_CAP_BF16_ATTENTION_PARTIALS); }

std::vector<std::pair<std::string, std::string>> PluginDrafter::describe() const {
  std::vector<std::pair<std::string, std::string>> out = {
      {"plugin", library_->path()},
      {"abi", std::to_string(library_->abi_version())},
      {"capabilities", capability_list(*library_)},
      {"precision", precision_name(settings_.precision)},
  };
  if (!library_->has(DFLASH_CAP_DESCRIBE)) return out;
  const char* text = library_->api().describe(drafter_);
  nlohmann::json j = nlohmann::json::parse(text != nullptr ? text : "", nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    out.emplace_back("describe", "(the plugin's describe() is not a JSON object)");
    return out;
  }
  for (const auto& [key, value] : j.items()) out.emplace_back(key, value.is_string() ? value.get<std::string>() : value.dump());
  return out;
}

}  // namespace dflash
