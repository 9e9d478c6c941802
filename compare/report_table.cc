#include "compare/report_table.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compare/acceptance_text.h"
#include "compare/text_format.h"

namespace dflash {
namespace {

std::string fixture_label(const ReplayResult& r) { return dflash::fixture_label(r.fixture_name, r.fixture_dir); }

std::string pad(const std::string& s, size_t width) { return s.size() >= width ? s : s + std::string(width - s.size(), ' '); }

// "3 graph replays, 1 capture, 2 eager of 6 proposes" (or "6 cpu").
std::string path_summary(const ProposerSummary& p) {
  const auto count = [&](const char* mode) {
    auto it = p.path_counts.find(mode);
    return it == p.path_counts.end() ? 0 : it->second;
  };
  int total = 0;
  for (const auto& entry : p.path_counts) total += entry.second;
  if (count("cpu") == total) return std::to_string(total) + " cpu";
  return std::to_string(count("graph-replay")) + " graph replays, " + std::to_string(count("graph-capture")) +
         " captures, " + std::to_string(count("eager")) + " eager of " + std::to_string(total) + " proposes";
}

// The actual side's graph replays out of its proposes ("3/6"), or "cpu" for the reference.
std::string graph_replays(const ProposerSummary& p) {
  int total = 0;
  for (const auto& entry : p.path_counts) total += entry.second;
  auto cpu = p.path_counts.find("cpu");
  if (cpu != p.path_counts.end() && cpu->second == total) return "cpu";
  auto replays = p.path_counts.find("graph-replay");
  return std::to_string(replays == p.path_counts.end() ? 0 : replays->second) + "/" + std::to_string(total);
}

std::string precisions_of(const ReplayResult& result, const PairSummary& pair) {
  const std::string actual = result.proposers[pair.actual_lane].precision;
  const std::string expected =
      pair.expected_lane < 0 ? result.expect_precision : result.proposers[pair.expected_lane].precision;
  return expected + "/" + actual;
}

void print_stage_line(std::ostream& out, const StageCheck& s) {
  out << "    " << pad(s.stage, 16) << (s.passed ? "ok   " : "FAIL ");
  if (!s.shape_ok) {
    out << s.shape_detail << "\n";
    return;
  }
  const TensorMetrics& m = s.metrics;
  out << "err/bound " << pad(format_number(s.ratio), 9) << " relRMS " << pad(format_number(m.max_row_rel_rms), 9) << "(<= "
      << pad(format_number(s.bound.rel_rms) + ")", 10) << " maxRel " << pad(format_number(m.max_rel), 9) << "(<= "
      << pad(format_number(s.bound.max_rel) + ")", 10) << " NMSE " << pad(format_number(m.nmse), 9) << " cos " << pad(format_number(m.cosine, "%.6f"), 9)
      << " bf16ulp " << m.max_bf16_ulp;
  if (m.non_finite > 0) {
    out << " non-finite " << m.non_finite << " (first at row " << m.first_non_finite.row << ", column "
        << m.first_non_finite.col << ")";
  }
  out << "\n";
}

void print_sequence_walk(std::ostream& out, const ReplayResult& result, const SequenceResult& seq, bool up_to_failure) {
  out << "  [" << result.pairs[seq.pair].label << "] step " << seq.step << ", sequence " << seq.seq << ", start "
      << seq.start << ", width " << seq.block_width << " (requested " << seq.requested_width << "), window "
      << seq.window << "\n";
  for (const StageCheck& s : seq.stages) {
    print_stage_line(out, s);
    if (up_to_failure && !s.passed) break;
  }
  if (seq.tokens) {
    out << "    draft tokens: " << seq.tokens->agree << " agree, " << seq.tokens->excused << " tie-excused, "
        << seq.tokens->mismatch << " mismatch\n";
    for (const TokenRow& row : seq.tokens->rows) {
      if (row.verdict == TokenVerdict::kAgree) continue;
      out << "      row " << row.row << ": expected " << row.expected << ", actual " << row.actual << " ("
          << token_verdict_name(row.verdict) << ": gap " << format_number(row.gap) << ", threshold " << format_number(row.threshold)
          << ")\n";
    }
  }
  for (const std::string& problem : seq.problems) out << "    problem: " << problem << "\n";
}

// The stage column: a failing comparison's first divergence (forward order, earliest step), else
// the worst stage of the comparison(s).
std::string stage_cell(const PairTotals& t) {
  if (t.first_divergence) {
    const Divergence& d = *t.first_divergence;
    std::string cell = "first: " + d.stage;
    if (t.first_divergence_ratio > 0) cell += " " + format_number(t.first_divergence_ratio);
    return cell + " (step " + std::to_string(d.step) + ")";
  }
  return t.worst_stage.empty() ? "-" : "worst: " + t.worst_stage + " " + format_number(t.worst_ratio);
}

}  // namespace

void print_replay_table(std::ostream& out, const std::vector<FixtureOutcome>& outcomes) {
  const std::vector<std::string> header = {"fixture", "backend (comparison)", "precision", "steps", "stage (error/bound)",
                                           "max TV", "tokens a/e/m", "graph replays", "verdict"};
  std::vector<std::vector<std::string>> rows;
  for (const FixtureOutcome& outcome : outcomes) {
    if (!outcome.result) {
      rows.push_back({outcome.path, "-", "-", "-", "-", "-", "-", "-", "could not run: " + outcome.error});
      continue;
    }
    const ReplayResult& r = *outcome.result;
    const std::string steps = std::to_string(r.steps_run) + "/" + std::to_string(r.total_steps);
    if (r.pairs.empty()) {
      rows.push_back(
          {fixture_label(r), "(nothing compared)", "-", steps, "-", "-", "-", "-", r.passed() ? "PASS" : "FAIL"});
      continue;
    }
    if (r.passed()) {  // one line: every comparison, the worst stage of any, the tokens summed
      std::string labels, precisions, replays;
      std::set<int> lanes;
      PairTotals worst;
      std::vector<int> all_pairs;
      for (size_t p = 0; p < r.pairs.size(); ++p) {
        const PairTotals t = pair_totals(r, static_cast<int>(p));
        all_pairs.push_back(static_cast<int>(p));
        labels += (p ? "; " : "") + r.pairs[p].label;
        precisions += (p ? "; " : "") + precisions_of(r, r.pairs[p]);
        if (lanes.insert(r.pairs[p].actual_lane).second) {
          replays += (replays.empty() ? "" : "; ") + graph_replays(r.proposers[r.pairs[p].actual_lane]);
        }
        if (!t.worst_stage.empty() && (worst.worst_stage.empty() || t.worst_ratio > worst.worst_ratio)) {
          worst.worst_stage = t.worst_stage;
          worst.worst_ratio = t.worst_ratio;
        }
        worst.agree += t.agree;
        worst.excused += t.excused;
        worst.mismatch += t.mismatch;
      }
      rows.push_back({fixture_label(r), labels, precisions, steps, stage_cell(worst), max_tv_cell(r, all_pairs),
                      std::to_string(worst.agree) + "/" + std::to_string(worst.excused) + "/" +
                          std::to_string(worst.mismatch),
                      replays, "PASS"});
      continue;
    }
    for (size_t p = 0; p < r.pairs.size(); ++p) {
      const PairTotals t = pair_totals(r, static_cast<int>(p));
      const bool pair_ok = t.failed_sequences == 0;
      const bool faulted = r.drafter_fault && r.proposers[r.pairs[p].actual_lane].name == r.drafter_fault->proposer;
      rows.push_back({fixture_label(r), r.pairs[p].label, precisions_of(r, r.pairs[p]), steps,
                      faulted && !t.first_divergence ? r.drafter_fault->text() : stage_cell(t),
                      max_tv_cell(r, {static_cast<int>(p)}),
                      std::to_string(t.agree) + "/" + std::to_string(t.excused) + "/" + std::to_string(t.mismatch),
                      graph_replays(r.proposers[r.pairs[p].actual_lane]),
                      pair_ok && !r.drafter_fault && r.invariant_failures.empty() && r.acceptance.failures.empty()
                          ? "PASS"
                          : "FAIL"});
    }
  }
  std::vector<size_t> widths(header.size());
  for (size_t c = 0; c < header.size(); ++c) {
    widths[c] = header[c].size();
    for (const auto& row : rows) widths[c] = std::max(widths[c], row[c].size());
  }
  const auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) out << (c ? "  " : "") << pad(cells[c], c + 1 < cells.size() ? widths[c] : 0);
    out << "\n";
  };
  line(header);
  std::vector<std::string> rule;
  for (size_t w : widths) rule.push_back(std::string(w, '-'));
  line(rule);
  for (const auto& row : rows) line(row);
  print_acceptance_lines(out, outcomes);
}

void print_levers(std::ostream& out, const ReplayResult& result) {
  for (size_t lane = 0; lane < result.proposers.size(); ++lane) {
    const ProposerSummary& p = result.proposers[lane];
    out << "  drafter " << p.name << " (" << p.precision << "):";
    for (const auto& [key, value] : p.levers) out << " " << key << "=" << value;
    out << "\n";
    out << "    path per step:";
    for (const StepPath& path : result.paths) {
      if (path.lane != static_cast<int>(lane)) continue;
      out << " " << path.step << ":" << path.mode << (path.pdl ? "+pdl" : "") << (path.taps_from_second_pass ? "+taps2" : "");
    }
    out << " (" << path_summary(p) << ")\n";
    for (const std::string& line : p.checks_not_run) out << "    not run: " << line << "\n";
  }
}

void print_drafter_settings(std::ostream& out, const std::vector<FixtureOutcome>& outcomes, bool full) {
  // Per drafter (name and precision), in order of appearance: each fixture's describe().
  struct Drafter {
    std::string name, precision;
    std::vector<std::pair<std::string, const ProposerSummary*>> runs;  // (fixture, its settings)
  };
  std::vector<Drafter> drafters;
  for (const FixtureOutcome& outcome : outcomes) {
    if (!outcome.result) continue;
    const ReplayResult& r = *outcome.result;
    for (const ProposerSummary& p : r.proposers) {
      auto it = std::find_if(drafters.begin(), drafters.end(),
                             [&](const Drafter& d) { return d.name == p.name && d.precision == p.precision; });
      if (it == drafters.end()) it = drafters.insert(drafters.end(), Drafter{p.name, p.precision, {}});
      it->runs.emplace_back(fixture_label(r), &p);
    }
  }
  for (const Drafter& d : drafters) {
    out << "drafter " << d.name << " (" << d.precision << ")";
    std::vector<std::string> not_run;  // every fixture's, once each
    for (const auto& run : d.runs) {
      for (const std::string& line : run.second->checks_not_run) {
        if (std::find(not_run.begin(), not_run.end(), line) == not_run.end()) not_run.push_back(line);
      }
    }
    const auto print_not_run = [&] {
      for (const std::string& line : not_run) out << "  not run: " << line << "\n";
    };
    if (!full) {
      out << " (-v lists its settings)\n";
      print_not_run();
      continue;
    }
    out << ":\n";
    print_not_run();
    std::vector<std::string> keys;  // in order of first appearance
    for (const auto& run : d.runs) {
      for (const auto& lever : run.second->levers) {
        if (std::find(keys.begin(), keys.end(), lever.first) == keys.end()) keys.push_back(lever.first);
      }
    }
    for (const std::string& key : keys) {
      std::vector<std::pair<std::string, std::string>> values;  // (fixture, value)
      for (const auto& [fixture, summary] : d.runs) {
        auto it = std::find_if(summary->levers.begin(), summary->levers.end(),
                               [&](const auto& lever) { return lever.first == key; });
        values.emplace_back(fixture, it == summary->levers.end() ? std::string("(not set)") : it->second);
      }
      const bool same = std::all_of(values.begin(), values.end(), [&](const auto& v) { return v.second == values[0].second; });
      out << "  " << key << ": ";
      if (same) {
        out << values[0].second << "\n";
        continue;
      }
      for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i].first << " " << values[i].second;
      out << "\n";
    }
  }
}

void print_result_report(std::ostream& out, const ReplayResult& result) {
  out << "\n" << fixture_label(result) << ": " << (result.passed() ? "PASS" : "FAIL") << "\n";
  print_levers(out, result);
  if (result.first_divergence) {
    out << "  " << describe_divergence(*result.first_divergence) << "\n";
    for (const SequenceResult& seq : result.sequences) {
      if (seq.step == result.first_divergence->step && seq.seq == result.first_divergence->seq &&
          result.pairs[seq.pair].label == result.first_divergence->pair) {
        print_sequence_walk(out, result, seq, /*up_to_failure=*/true);
        break;
      }
    }
  }
  if (result.drafter_fault) out << "  " << result.drafter_fault->proposer << ": " << result.drafter_fault->text() << "\n";
  for (const InvariantFailure& f : result.invariant_failures) {
    out << "  invariant '" << f.invariant << "' broken after step " << f.step << " by " << f.proposer << ": "
        << f.detail << "\n";
  }
  print_acceptance_failures(out, result);
}

bool print_bisect_report(std::ostream& out, const ReplayResult& result, int step, int seq) {
  bool found = false;
  print_levers(out, result);
  for (const SequenceResult& s : result.sequences) {
    if (s.step != step || s.seq != seq) continue;
    found = true;
    if (s.divergence) {
      out << "  " << describe_divergence(*s.divergence) << "\n";
    } else {
      out << "  [" << result.pairs[s.pair].label << "] step " << step << ", sequence " << seq
          << ": every stage within its bound\n";
    }
    print_sequence_walk(out, result, s, /*up_to_failure=*/false);
  }
  for (const InvariantFailure& f : result.invariant_failures) {
    if (f.step == step) out << "  invariant '" << f.invariant << "' broken by " << f.proposer << ": " << f.detail << "\n";
  }
  return found;
}

}  // namespace dflash
