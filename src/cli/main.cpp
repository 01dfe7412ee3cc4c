#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "core/error.h"

namespace shardlm::cli {

std::vector<CommandSetup>& command_registry() {
  static std::vector<CommandSetup> registry;
  return registry;
}

namespace {
int g_exit_code = 0;
}

void set_command_action(CLI::App* sub, std::function<int()> action) {
  sub->callback([action = std::move(action)] { g_exit_code = action(); });
}

}  // namespace shardlm::cli

int main(int argc, char** argv) {
  CLI::App app{"shardlm: serve large language models across any number of devices"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(SHARDLM_VERSION));
  for (auto setup : shardlm::cli::command_registry()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const shardlm::Error& e) {
    std::fflush(stdout);
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return shardlm::cli::g_exit_code;
}
