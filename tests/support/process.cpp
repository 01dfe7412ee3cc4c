#include "support/process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

namespace shardlm::testing {

CommandResult run_command(const std::string& command, bool merge_stderr) {
  static std::atomic<int> counter{0};
  CommandResult r;
  std::filesystem::path err_file;
  std::string full = command;
  if (merge_stderr) {
    full = "{ " + command + "; } 2>&1";
  } else {
    err_file = std::filesystem::temp_directory_path() /
               ("shardlm_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".stderr");
    full = "{ " + command + "; } 2>" + shell_quote(err_file.string());
  }
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 65536> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (!merge_stderr) {
    r.err = read_text_file(err_file);
    std::error_code ec;
    std::filesystem::remove(err_file, ec);
  }
  return r;
}

std::string shell_quote(const std::string& text) {
  std::string q = "'";
  for (char c : text) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

namespace {
bool loopback_port_free(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}
}  // namespace

int free_loopback_ports(int n) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int first = free_loopback_port();
    bool all = first + n - 1 <= 65535;
    for (int k = 1; k < n && all; ++k) all = loopback_port_free(first + k);
    if (all) return first;
  }
  return free_loopback_port();
}

pid_t spawn_logged(const std::vector<std::string>& args, const std::string& log_path) {
  std::vector<std::string> copy = args;  // execv wants mutable strings
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* log = std::fopen(log_path.c_str(), "w");
    if (log) {
      dup2(fileno(log), 2);
      dup2(fileno(log), 1);
    }
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace shardlm::testing
