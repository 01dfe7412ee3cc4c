// Subcommand registry. Each src/cli/cmd_<name>.cpp defines a setup function
// that adds its CLI11 subcommand and sets a callback returning the exit code:
//
//   static void setup(CLI::App& app) {
//     auto* sub = app.add_subcommand("verify", "Check that a model directory is whole");
//     auto opts = std::make_shared<VerifyOptions>();
//     sub->add_option("model", opts->dir, "...")->required();
//     set_command_action(sub, [opts] { return run_verify(*opts); });
//   }
//   SHARDLM_REGISTER_COMMAND(setup);
//
// Exit codes: 0 success, 1 failure (an Error reaching main prints
// "error: <message>"), 2 usage error (bad flags), as `verify` documents.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace shardlm::cli {

using CommandSetup = void (*)(CLI::App& app);

std::vector<CommandSetup>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(CommandSetup setup) { command_registry().push_back(setup); }
};

// Runs action when `sub` is the subcommand given; its return value becomes
// the process exit code.
void set_command_action(CLI::App* sub, std::function<int()> action);

}  // namespace shardlm::cli

#define SHARDLM_REGISTER_COMMAND(fn) \
  static ::shardlm::cli::CommandRegistrar shardlm_registrar_##fn(fn)
