#include "tools/progress.h"

#include <unistd.h>

namespace dflash {

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

void Progress::update(const std::string& label, int done, int total) {
  if (terminal_) {
    constexpr int kWidth = 30;
    const int filled = total > 0 ? done * kWidth / total : kWidth;
    out_ << "\r[" << std::string(filled, '#') << std::string(kWidth - filled, ' ') << "] " << label << " step "
         << done << "/" << total << "\x1b[K" << std::flush;
    bar_drawn_ = true;
  } else if (verbose_) {
    out_ << label << ": step " << done << "/" << total << "\n" << std::flush;
  }
}

void Progress::finish() {
  if (bar_drawn_) out_ << "\r\x1b[K" << std::flush;
  bar_drawn_ = false;
}

}  // namespace dflash
