// What many suites need to drive the CLI as a user does: run a shell
// command and capture its output, find a free port, read the environment
// the test runner sets (SHARDLM_CLI, SHARDLM_BINARY_DIR, SHARDLM_SOURCE_DIR).
// Linked into every shardlm_test binary.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace shardlm::testing {

struct CommandResult {
  int rc = -1;          // exit status; -1 when killed by a signal or not started
  std::string out;      // stdout (and stderr when merged)
  std::string err;      // stderr, unless merged
  double seconds = 0.0;
};

// Runs `command` with /bin/sh. merge_stderr: stderr goes into out (2>&1).
// Otherwise stderr is captured through a private temporary file.
CommandResult run_command(const std::string& command, bool merge_stderr = false);

// 'text' quoted for /bin/sh.
std::string shell_quote(const std::string& text);

// The file's bytes, or "" when it cannot be read.
std::string read_text_file(const std::filesystem::path& path);

// $name, or fallback when unset or empty.
std::string env_or(const char* name, const std::string& fallback);

// A loopback TCP port nobody listens on now (the kernel picks it and it is
// released at once; good enough for tests that start a server right after).
int free_loopback_port();
// The first of n consecutive loopback ports nobody listens on now (for
// servers that take port + i, such as one per data-parallel replica).
int free_loopback_ports(int n);

// Starts args[0] (a path, not searched) with args[1..] in a child process
// whose stdout and stderr go to log_path; returns its pid. The caller waits
// for it (waitpid) or kills it.
pid_t spawn_logged(const std::vector<std::string>& args, const std::string& log_path);

// Polls `done` until it holds, or `limit` passes (then false). For states
// that send no event (a gauge in /metrics, another process, a counter in a
// fake), polled often enough not to add latency. `limit` is a deadline for
// a broken test, never a timing: the caller's failure message says what it
// waited for.
template <class Condition>
bool wait_until(Condition done, std::chrono::milliseconds limit = std::chrono::seconds(60),
                std::chrono::milliseconds every = std::chrono::milliseconds(2)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return done();
    std::this_thread::sleep_for(every);
  }
  return true;
}

}  // namespace shardlm::testing
