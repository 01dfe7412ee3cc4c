#include "loadgen/sweep.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"

extern char** environ;

namespace shardlm::loadgen {

namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, ',')) {
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    parts.push_back(part);
  }
  return parts;
}

}  // namespace

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& flag) {
  std::vector<int64_t> out;
  for (const auto& part : split_commas(text)) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || v < 1)
      fail(ErrorCode::kInvalidArgument, flag, " ", text, ": '", part,
           "' is not a positive integer; expected e.g. 1,2,4,8");
    out.push_back(v);
  }
  if (out.empty()) fail(ErrorCode::kInvalidArgument, flag, " is empty; expected e.g. 1,2,4,8");
  return out;
}

std::vector<double> parse_double_list(const std::string& text, const std::string& flag) {
  std::vector<double> out;
  for (const auto& part : split_commas(text)) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size())
      fail(ErrorCode::kInvalidArgument, flag, " ", text, ": '", part, "' is not a number; expected e.g. 50,90,99");
    out.push_back(v);
  }
  if (out.empty()) fail(ErrorCode::kInvalidArgument, flag, " is empty; expected e.g. 50,90,99");
  return out;
}

std::vector<SweepPoint> run_sweep(const BenchConfig& config, const std::vector<SampleRequest>& requests,
                                  const std::vector<int64_t>& concurrencies, const RunHooks& hooks,
                                  const std::function<void(int64_t)>& before_each,
                                  const std::function<void(const SweepPoint&)>& after_each) {
  return run_sweep(
      config, [&requests](size_t) { return requests; }, concurrencies, hooks, before_each, after_each);
}

std::vector<SweepPoint> run_sweep(const BenchConfig& config,
                                  const std::function<std::vector<SampleRequest>(size_t)>& make_requests,
                                  const std::vector<int64_t>& concurrencies, const RunHooks& hooks,
                                  const std::function<void(int64_t)>& before_each,
                                  const std::function<void(const SweepPoint&)>& after_each) {
  BenchConfig c = config;
  if (std::find(c.percentiles.begin(), c.percentiles.end(), 99.0) == c.percentiles.end())
    c.percentiles.push_back(99.0);
  c.model = resolve_model(c);  // query /v1/models once, not per point
  std::vector<SweepPoint> points;
  for (int64_t conc : concurrencies) {
    if (hooks.stop != nullptr && hooks.stop->load()) break;
    if (before_each) before_each(conc);
    c.max_concurrency = conc;
    SweepPoint p;
    p.concurrency = conc;
    p.result = run_benchmark(c, make_requests(points.size()), hooks);
    points.push_back(std::move(p));
    if (after_each) after_each(points.back());
    if (points.back().result.interrupted) break;
  }
  return points;
}

std::string format_sweep_table(const std::vector<SweepPoint>& points) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%11s %10s %15s %15s %15s %8s\n", "concurrency", "req/s",
                "output tok/s", "p99 TTFT (ms)", "p99 TPOT (ms)", "failed");
  out += line;
  for (const auto& p : points) {
    const auto& m = p.result.metrics;
    std::snprintf(line, sizeof(line), "%11lld %10.2f %15.2f %15.2f %15.2f %8lld\n",
                  static_cast<long long>(p.concurrency), m.request_throughput, m.output_throughput,
                  m.ttft.percentile_ms(99.0), m.tpot.percentile_ms(99.0), static_cast<long long>(m.failed));
    out += line;
  }
  return out;
}

namespace {

std::string gnuplot_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "''";
    else out += c;
  }
  return out + "'";
}

// Runs `gnuplot script`; returns its exit status (127 when it cannot start).
int run_gnuplot(const std::string& script, const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::string prog = "gnuplot";
  char* argv[] = {prog.data(), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return 127;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

}  // namespace

void write_sweep_plot(const std::vector<SweepPoint>& points, const std::string& png_path,
                      const std::string& title) {
  if (points.empty()) fail(ErrorCode::kInvalidArgument, "no sweep points to plot into ", png_path);
  std::string dat = png_path + ".dat", gp = png_path + ".gp", log = png_path + ".log";
  {
    std::ofstream out(dat);
    if (!out) fail(ErrorCode::kIo, "cannot write ", dat, " (for --plot); check the directory exists");
    out << "# concurrency req_per_s output_tok_per_s p99_ttft_ms p99_tpot_ms\n";
    for (const auto& p : points) {
      const auto& m = p.result.metrics;
      out << p.concurrency << " " << m.request_throughput << " " << m.output_throughput << " "
          << m.ttft.percentile_ms(99.0) << " " << m.tpot.percentile_ms(99.0) << "\n";
    }
  }
  for (const char* terminal : {"pngcairo size 900,800 font 'sans,10'", "png size 900,800"}) {
    {
      std::ofstream out(gp);
      if (!out) fail(ErrorCode::kIo, "cannot write ", gp, " (for --plot)");
      // Two stacked panels sharing the throughput axis; each point is labelled
      // with its concurrency.
      out << "set terminal " << terminal << "\n"
          << "set output " << gnuplot_quote(png_path) << "\n"
          << "d = " << gnuplot_quote(dat) << "\n"
          << "set multiplot layout 2,1 title " << gnuplot_quote(title) << " noenhanced\n"
          << "set grid\nset key off\nset xrange [0:*]\nset yrange [0:*]\n"
          << "set offsets 0, graph 0.08, graph 0.2, 0\n"
          << "set xlabel 'output throughput (tok/s)'\n"
          << "set ylabel 'p99 TTFT (ms)'\n"
          << "plot d using 3:4 with linespoints pt 7 ps 1.2 lw 2 lc rgb '#1f77b4', \\\n"
          << "     d using 3:4:(sprintf('c=%d', $1)) with labels offset 0,1\n"
          << "set ylabel 'p99 TPOT (ms)'\n"
          << "plot d using 3:5 with linespoints pt 5 ps 1.2 lw 2 lc rgb '#d62728', \\\n"
          << "     d using 3:5:(sprintf('c=%d', $1)) with labels offset 0,1\n"
          << "unset multiplot\n";
    }
    int rc = run_gnuplot(gp, log);
    if (rc == 127)
      fail(ErrorCode::kNotFound, "--plot needs gnuplot, which is not on PATH; install it "
           "(Debian: apt-get install gnuplot-nox) or drop --plot");
    if (rc == 0) {
      std::remove(log.c_str());
      return;
    }
  }
  std::ifstream in(log);
  std::stringstream why;
  why << in.rdbuf();
  fail(ErrorCode::kIo, "gnuplot could not render ", png_path, " (script ", gp, "): ", why.str());
}

}  // namespace shardlm::loadgen
