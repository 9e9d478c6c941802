// Replay progress: a bar redrawn in place when stdout is a terminal, plain lines with --verbose
// otherwise, nothing at all otherwise (logs and pipes stay clean).
#pragma once
#include <ostream>
#include <string>

namespace dflash {

class Progress {
 public:
  Progress(std::ostream& out, bool terminal, bool verbose) : out_(out), terminal_(terminal), verbose_(verbose) {}
  // One step of `label` is done: `done` of `total`.
  void update(const std::string& label, int done, int total);
  // Ends the bar's line (if one was drawn).
  void finish();

 private:
  std::ostream& out_;
  bool terminal_, verbose_;
  bool bar_drawn_ = false;
};

// True when file descriptor 1 is a terminal.
bool stdout_is_terminal();

}  // namespace dflash
