#include "loadgen/progress.h"

#include <string>

namespace shardlm::loadgen {

void ProgressBar::update(const ProgressSnapshot& s) {
  double frac = s.n_total > 0 ? static_cast<double>(s.n_done) / static_cast<double>(s.n_total) : 0.0;
  double rate = s.elapsed_s > 0 ? static_cast<double>(s.n_done) / s.elapsed_s : 0.0;
  if (is_tty_) {
    constexpr int kWidth = 30;
    int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(out_, "\r\x1b[2K%3.0f%% [%s] %lld/%lld done, %lld in flight, %lld failed, %.1f s, %.2f req/s",
                 frac * 100.0, bar.c_str(), static_cast<long long>(s.n_done), static_cast<long long>(s.n_total),
                 static_cast<long long>(s.n_in_flight), static_cast<long long>(s.n_failed), s.elapsed_s, rate);
    drawn_ = true;
  } else {
    int64_t decile = s.n_total > 0 ? s.n_done * 10 / s.n_total : 0;
    if (decile == last_decile_ && s.elapsed_s - last_line_s_ < 10.0) return;
    last_decile_ = decile;
    last_line_s_ = s.elapsed_s;
    std::fprintf(out_, "progress: %lld/%lld done, %lld in flight, %lld failed, %.1f s\n",
                 static_cast<long long>(s.n_done), static_cast<long long>(s.n_total),
                 static_cast<long long>(s.n_in_flight), static_cast<long long>(s.n_failed), s.elapsed_s);
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (is_tty_ && drawn_) std::fprintf(out_, "\n");
  drawn_ = false;
  last_decile_ = -1;
  last_line_s_ = 0.0;
  std::fflush(out_);
}

}  // namespace shardlm::loadgen
