// kvtierd: the kvtier daemon. Parses flags, loads the config and runs the Daemon.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "daemon/config.h"
#include "daemon/daemon.h"
#include "protocol/base/logging.h"

int main(int argc, char** argv) {
  CLI::App app{"kvtierd: node-local KV-cache tiering daemon for LLM inference hosts"};
  std::string config_path;
  bool print_default = false, version = false, check = false;
  app.add_option("-c,--config", config_path, "YAML config file (default: the embedded default)");
  app.add_flag("--print-default-config", print_default, "Print every config key with its default and exit");
  app.add_flag("--check-config", check, "Validate the config and exit");
  app.add_flag("-V,--version", version, "Print the version and exit");
  CLI11_PARSE(app, argc, argv);

  if (version) {
    std::printf("kvtierd %s\n", kvtier::kVersion);
    return 0;
  }
  if (print_default) {
    std::fputs(kvtier::DefaultConfigYaml().c_str(), stdout);
    return 0;
  }
  auto config = config_path.empty() ? kvtier::ParseConfig(kvtier::DefaultConfigYaml())
                                    : kvtier::LoadConfigFile(config_path);
  if (!config.ok()) {
    KVTIER_LOG(ERROR) << config.status().message();
    return 2;
  }
  if (check) {
    std::printf("config OK\n");
    return 0;
  }
  auto daemon = kvtier::Daemon::Open(*config);
  if (!daemon.ok()) {
    KVTIER_LOG(ERROR) << "cannot start: " << daemon.status().ToString();
    return 1;
  }
  kvtier::Status st = (*daemon)->Run();
  return st.ok() ? 0 : 1;
}
