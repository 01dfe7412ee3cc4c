#include "server/listener.h"

#include <httplib.h>
#include <sys/resource.h>
#include <sys/socket.h>

namespace shardlm::server {

std::shared_ptr<int> configure_listener(httplib::Server& server) {
  auto fd = std::make_shared<int>(-1);
  server.set_socket_options([fd](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // restart after TIME_WAIT; no port sharing
    *fd = sock;
  });
  return fd;
}

void widen_backlog(const std::shared_ptr<int>& fd) {
  if (fd && *fd >= 0) ::listen(*fd, 1024);  // Linux updates the backlog of a listening socket
}

long raise_open_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return -1;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return static_cast<long>(lim.rlim_cur);
}

}  // namespace shardlm::server
