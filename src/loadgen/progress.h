// Live progress on stderr: a redrawn bar when stderr is a terminal, else a
// line at every 10% of requests or 10 s (logs stay readable).
#pragma once

#include <cstdio>

#include "loadgen/runner.h"

namespace shardlm::loadgen {

class ProgressBar {
 public:
  ProgressBar(std::FILE* out, bool is_tty) : out_(out), is_tty_(is_tty) {}
  void update(const ProgressSnapshot& s);
  void finish();  // ends the bar's line

 private:
  std::FILE* out_;
  bool is_tty_;
  bool drawn_ = false;
  int64_t last_decile_ = -1;
  double last_line_s_ = 0.0;
};

}  // namespace shardlm::loadgen
