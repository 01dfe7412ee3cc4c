// Which way of holding connections serves 1,000 streams with less memory
// and lower TTFT (issue 12): the real HttpServer (cpp-httplib, one thread
// per open connection from the on-demand WorkerPool) against a minimal
// epoll event loop (one thread), both fed tokens by the same CadenceEngine
// (a step every --step-us, --max-num-seqs streams per step, like the engine
// loop), both answering OpenAI-shaped SSE. Each server runs in its own
// process (this binary re-executed with --serve), so its peak RSS (VmHWM)
// and thread count are its own; one epoll client thread in this process
// opens every connection at once. Loopback only, bounded by --timeout-s.
//
//   connections_bench [--connections 1000] [--max-num-seqs 256,1000] [--tokens 16]
//                     [--step-us 20000] [--repeat 2] [--timeout-s 120]
// --max-num-seqs takes a list: 256 queues most streams behind the running
// ones (as `serve --max-num-seqs 256`); 1000 runs them all at once, so TTFT
// is the connection handling alone plus the wait for the next step.
// Prints a table; exits 1 if a stream of either server did not complete.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/cadence_backend.h"
#include "bench/cadence_engine.h"
#include "bench/epoll_sse_server.h"
#include "bench/sse_load_client.h"
#include "server/http_server.h"
#include "server/listener.h"

namespace {

using namespace shardlm;

struct Options {
  int connections = 1000;
  std::vector<int64_t> max_num_seqs_list = {256, 1000};  // one table block per value
  int64_t max_num_seqs = 256;
  int64_t tokens = 16;
  int64_t step_us = 20000;
  int repeat = 2;
  int timeout_s = 120;
  std::string serve;  // child mode: "pool" or "epoll"
  int ready_fd = -1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "connections_bench: %s\nusage: connections_bench [--connections N] [--max-num-seqs S] [--tokens T] "
               "[--step-us U] [--repeat R] [--timeout-s S]\n",
               why.c_str());
  std::exit(2);
}

int64_t int_flag(const std::string& name, const char* value, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < lo || v > hi)
    usage(name + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + value + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(a + " needs a value (or is not a flag of this bench)");
    const char* v = argv[++i];
    if (a == "--connections") o.connections = static_cast<int>(int_flag(a, v, 1, 20000));
    else if (a == "--max-num-seqs") {
      o.max_num_seqs_list.clear();
      std::string list = v;
      for (size_t at = 0; at <= list.size();) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        o.max_num_seqs_list.push_back(int_flag(a, list.substr(at, comma - at).c_str(), 1, 100000));
        at = comma + 1;
      }
      o.max_num_seqs = o.max_num_seqs_list[0];
    }
    else if (a == "--tokens") o.tokens = int_flag(a, v, 1, 10000);
    else if (a == "--step-us") o.step_us = int_flag(a, v, 100, 10'000'000);
    else if (a == "--repeat") o.repeat = static_cast<int>(int_flag(a, v, 1, 20));
    else if (a == "--timeout-s") o.timeout_s = static_cast<int>(int_flag(a, v, 1, 3600));
    else if (a == "--serve") o.serve = v;
    else if (a == "--ready-fd") o.ready_fd = static_cast<int>(int_flag(a, v, 0, 1 << 20));
    else usage("unknown flag " + a);
  }
  if (!o.serve.empty() && o.serve != "pool" && o.serve != "epoll") usage("--serve expects pool or epoll, got " + o.serve);
  return o;
}

// Child: serve until killed. Writes the bound port to ready_fd.
int serve(const Options& o) {
  server::raise_open_file_limit();
  bench::CadenceEngine engine(o.max_num_seqs, std::chrono::microseconds(o.step_us));
  auto ready = [&](int port) {
    const std::string line = std::to_string(port) + "\n";
    (void)!write(o.ready_fd, line.data(), line.size());
    close(o.ready_fd);
  };
  if (o.serve == "epoll") {
    bench::EpollSseServer s(engine);
    s.bind(0);
    ready(s.port());
    s.run();
    return 0;
  }
  bench::CadenceBackend backend(engine);
  server::ServerOptions so;
  so.port = 0;
  so.served_model_names = {"m"};
  server::HttpServer s(backend, so);
  s.bind();
  ready(s.port());
  s.run();
  return 0;
}

struct ProcStatus {
  double rss_mib = 0, hwm_mib = 0;
  int threads = 0;
};

ProcStatus read_status(pid_t pid) {
  ProcStatus st;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") in >> st.rss_mib, st.rss_mib /= 1024;
    else if (key == "VmHWM:") in >> st.hwm_mib, st.hwm_mib /= 1024;
    else if (key == "Threads:") in >> st.threads;
    in.ignore(1 << 20, '\n');
  }
  return st;
}

double pct(std::vector<double> xs, double q) {
  if (xs.empty()) return -1;
  std::sort(xs.begin(), xs.end());
  size_t k = static_cast<size_t>(q / 100.0 * static_cast<double>(xs.size() - 1) + 0.5);
  return xs[std::min(k, xs.size() - 1)];
}

struct Row {
  std::string server;
  int completed = 0;
  std::string first_error;
  double idle_rss_mib = 0, peak_rss_mib = 0;
  int idle_threads = 0, peak_threads = 0;
  double headers_p50_ms = 0, headers_p99_ms = 0, ttft_p50_ms = 0, ttft_p99_ms = 0, wall_s = 0;
};

Row measure(const Options& o, const std::string& kind, const char* self) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const std::string ready = std::to_string(fds[1]);
    const std::string seqs = std::to_string(o.max_num_seqs), step = std::to_string(o.step_us);
    execl(self, self, "--serve", kind.c_str(), "--ready-fd", ready.c_str(), "--max-num-seqs", seqs.c_str(), "--step-us",
          step.c_str(), static_cast<char*>(nullptr));
    std::perror("connections_bench: exec");
    _exit(127);
  }
  close(fds[1]);
  Row row;
  row.server = kind;
  pollfd p{fds[0], POLLIN, 0};
  char buf[32] = {};
  if (poll(&p, 1, 30000) != 1 || read(fds[0], buf, sizeof buf - 1) <= 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    throw std::runtime_error("the " + kind + " server did not start");
  }
  close(fds[0]);
  const int port = std::atoi(buf);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ProcStatus idle = read_status(pid);
  row.idle_rss_mib = idle.rss_mib;
  row.idle_threads = idle.threads;

  std::atomic<bool> sampling{true};
  std::atomic<int> peak_threads{idle.threads};
  std::thread sampler([&] {
    while (sampling) {
      peak_threads = std::max(peak_threads.load(), read_status(pid).threads);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<bench::StreamResult> results =
      bench::run_sse_clients(port, o.connections, o.tokens, std::chrono::seconds(o.timeout_s));
  row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sampling = false;
  sampler.join();
  ProcStatus end = read_status(pid);
  row.peak_rss_mib = end.hwm_mib;
  row.peak_threads = std::max(peak_threads.load(), end.threads);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);

  std::vector<double> ttft, headers;
  for (const auto& r : results) {
    if (r.ok) {
      ++row.completed;
      ttft.push_back(r.ttft_s * 1e3);
      headers.push_back(r.headers_s * 1e3);
    } else if (row.first_error.empty()) {
      row.first_error = r.error;
    }
  }
  row.headers_p50_ms = pct(headers, 50);
  row.headers_p99_ms = pct(headers, 99);
  row.ttft_p50_ms = pct(ttft, 50);
  row.ttft_p99_ms = pct(ttft, 99);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  if (!o.serve.empty()) {
    if (o.ready_fd < 0) usage("--serve needs --ready-fd");
    return serve(o);
  }
  server::raise_open_file_limit();
  std::printf("connections_bench: %d streams of %lld tokens, a step every %.1f ms; loopback\n", o.connections,
              static_cast<long long>(o.tokens), o.step_us / 1e3);
  std::printf("%-6s %7s %5s %9s %8s %8s %7s %7s %8s %8s %8s %8s %6s\n", "server", "running", "round", "completed",
              "idle RSS", "peak RSS", "idle", "peak", "headers", "headers", "TTFT", "TTFT", "wall");
  std::printf("%-6s %7s %5s %9s %8s %8s %7s %7s %8s %8s %8s %8s %6s\n", "", "", "", "", "MiB", "MiB", "threads",
              "threads", "p50 ms", "p99 ms", "p50 ms", "p99 ms", "s");
  bool all_ok = true;
  for (int64_t seqs : o.max_num_seqs_list) {
    o.max_num_seqs = seqs;
    for (int round = 1; round <= o.repeat; ++round) {
      for (const char* kind : {"pool", "epoll"}) {
        Row r;
        try {
          r = measure(o, kind, "/proc/self/exe");
        } catch (const std::exception& e) {
          std::fprintf(stderr, "connections_bench: %s\n", e.what());
          return 1;
        }
        std::printf("%-6s %7lld %5d %4d/%-4d %8.1f %8.1f %7d %7d %8.1f %8.1f %8.1f %8.1f %6.2f\n", r.server.c_str(),
                    static_cast<long long>(seqs), round, r.completed, o.connections, r.idle_rss_mib, r.peak_rss_mib,
                    r.idle_threads, r.peak_threads, r.headers_p50_ms, r.headers_p99_ms, r.ttft_p50_ms, r.ttft_p99_ms,
                    r.wall_s);
        std::fflush(stdout);
        if (r.completed != o.connections) {
          all_ok = false;
          std::fprintf(stderr, "connections_bench: %s: %d streams failed, e.g. %s\n", r.server.c_str(),
                       o.connections - r.completed, r.first_error.c_str());
        }
      }
    }
  }
  std::printf("pool = HttpServer (cpp-httplib + WorkerPool, a thread per open connection); "
              "epoll = one event-loop thread (bench/epoll_sse_server.cpp); running = streams per step\n");
  return all_ok ? 0 : 1;
}
