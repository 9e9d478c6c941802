// `dflash-harness inspect PATH`: what a fixture, a drafter checkpoint or a .safetensors file holds.
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>

#include "core/config.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "fixtures/fixture.h"
#include "tools/commands.h"
#include "tools/hints.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

void print_geometry(const DrafterConfig& c) {
  std::cout << "geometry: H " << c.hidden_size << ", layers " << c.num_layers << ", heads " << c.num_heads << "/"
            << c.num_kv_heads << ", head_dim " << c.head_dim << ", intermediate " << c.intermediate_size << ", vocab "
            << c.vocab_size << ", block_size " << c.block_size << ", mask_token_id " << c.mask_token_id << "\n";
  std::cout << "          target_layer_ids [";
  for (size_t i = 0; i < c.target_layer_ids.size(); ++i) std::cout << (i ? ", " : "") << c.target_layer_ids[i];
  std::cout << "], rms_norm_eps " << c.rms_norm_eps << ", attention_bias " << (c.attention_bias ? "yes" : "no")
            << ", rope " << (c.rope.type == RopeConfig::Type::kYarn ? "yarn" : "default") << " theta "
            << c.rope.theta;
  if (c.rope.type == RopeConfig::Type::kYarn) {
    std::cout << " factor " << c.rope.factor << " from " << c.rope.original_max_position_embeddings;
  }
  std::cout << "\n";
}

void print_tensors(const TensorStore& store) {
  const std::vector<std::string> names = store.names();
  std::cout << "tensors (" << names.size() << ") in " << store.description() << ":\n";
  for (const std::string& name : names) {
    const TensorInfo& info = store.file_of(name).info(name);
    std::cout << "  " << name << "  " << dtype_name(info.dtype) << " " << shape_string(info.shape) << "\n";
  }
}

void inspect_fixture(const std::string& path) {
  const Fixture f = read_fixture(path);
  std::cout << "fixture: " << f.name << " (" << f.dir << ")\n";
  if (!f.description.empty()) std::cout << "description: " << f.description << "\n";
  std::cout << "expectations computed in: " << f.expect_precision << "\n";
  std::cout << "head: gamma " << f.head.gamma << ", ctx_cap " << f.head.ctx_cap << ", max_batch " << f.head.max_batch
            << ", kv_page_size " << f.head.kv_page_size << "\n";
  print_geometry(f.config);
  int proposes = 0, releases = 0, entries = 0, with_logits = 0, with_tokens = 0, taps = 0;
  int64_t ctx_rows = 0;
  std::set<int> sequences, widths;
  for (const FixtureStep& s : f.steps) {
    if (s.kind == FixtureStep::Kind::kRelease) {
      ++releases;
      continue;
    }
    ++proposes;
    for (const ProposeEntry& e : s.propose) {
      ++entries;
      sequences.insert(e.seq);
      widths.insert(e.block_width);
      ctx_rows += e.ctx.rows();
      if (e.expect) {
        with_logits += e.expect->logits.has_value();
        with_tokens += e.expect->draft_tokens.has_value();
        taps += static_cast<int>(e.expect->taps.size());
      }
    }
  }
  std::cout << "steps: " << f.steps.size() << " (" << proposes << " proposes, " << releases << " releases), "
            << entries << " sequence proposes over " << sequences.size() << " sequences, " << ctx_rows
            << " context rows\n";
  std::cout << "requested widths:";
  for (int w : widths) std::cout << " " << w;
  std::cout << "\nexpectations: logits " << with_logits << ", draft tokens " << with_tokens << ", taps " << taps << "\n";
  for (size_t i = 0; i < f.steps.size(); ++i) {
    const FixtureStep& s = f.steps[i];
    std::cout << "  step " << i << ": ";
    if (s.kind == FixtureStep::Kind::kRelease) {
      std::cout << "release";
      for (int seq : s.release) std::cout << " " << seq;
    } else {
      std::cout << "propose";
      for (const ProposeEntry& e : s.propose) {
        std::cout << " [seq " << e.seq << ", " << e.ctx.rows() << " rows, start " << e.start << ", width "
                  << e.block_width << "]";
      }
    }
    std::cout << "\n";
  }
  print_tensors(TensorStore::open(f.drafter_dir));
}

int run_inspect(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec) && fs::exists(p / "fixture.json", ec)) {
    inspect_fixture(path);
  } else if (p.filename() == "fixture.json") {
    inspect_fixture(path);
  } else if (fs::is_directory(p, ec) && fs::exists(p / "config.json", ec)) {
    std::cout << "drafter checkpoint: " << path << "\n";
    print_geometry(load_drafter_config(path));
    print_tensors(TensorStore::open(path));
  } else if (p.extension() == ".safetensors" || (p.extension() == ".json" && fs::exists(p, ec))) {
    print_tensors(TensorStore::open(path));
  } else {
    if (!fs::exists(p, ec)) check_fixture_path(path);  // "no such file or directory", with a near name
    throw bad_input(path + ": not a fixture (a directory with fixture.json), a drafter checkpoint (a directory "
                           "with config.json) or a .safetensors file");
  }
  return kExitPass;
}

}  // namespace

Command add_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Summarize a fixture or a drafter checkpoint: geometry, tensors with dtype and shape, steps");
  cmd->add_option("path", *path, "A fixture directory, a drafter checkpoint directory or a .safetensors file")
      ->required();
  return {cmd, [path] { return run_inspect(*path); }};
}

}  // namespace dflash
