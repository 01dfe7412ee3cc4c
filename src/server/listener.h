// Listening-socket settings shared by the server and the router.
#pragma once

#include <memory>

namespace httplib {
class Server;
}

namespace shardlm::server {

// httplib's defaults are wrong for a server: SO_REUSEPORT lets a second
// process bind a port that is in use (requests then split between two
// servers), and a listen backlog of 5 drops connections under a burst of
// clients. Call before binding; returns the holder of the listening fd.
std::shared_ptr<int> configure_listener(httplib::Server& server);
// Call after binding: raises the accept backlog of the listening socket.
void widen_backlog(const std::shared_ptr<int>& fd);
// Raises this process's open-file soft limit to its hard limit (a server
// holding 1,000 streams needs more than the common default of 1,024 fds).
// Returns the soft limit now in force.
long raise_open_file_limit();

}  // namespace shardlm::server
