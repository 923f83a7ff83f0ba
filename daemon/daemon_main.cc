#include "daemon/daemon_main.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "daemon/config.h"
#include "daemon/config_host.h"
#include "protocol/base/logging.h"

namespace kvtier {
namespace {

volatile sig_atomic_t g_early_sighup = 0;

}  // namespace

int DaemonMain(int argc, char** argv, Daemon::TestHooks hooks) {
  // SIGHUP's default kills. Until the daemon's reload handler is in place (Daemon::Open), a
  // SIGHUP is remembered here and raised again once it is. A disposition, not a signal
  // mask: a mask is per thread, and threads that began before main (a sanitizer runtime's)
  // would still take the default action.
  struct sigaction early {};
  early.sa_handler = [](int) { g_early_sighup = 1; };
  sigemptyset(&early.sa_mask);
  ::sigaction(SIGHUP, &early, nullptr);
  CLI::App app{"kvtierd: node-local KV-cache tiering daemon for LLM inference hosts"};
  std::string config_path, node_name;
  bool print_default = false, version = false, check = false;
  app.add_option("-c,--config", config_path, "YAML config file (default: the embedded default)");
  app.add_option("--node-name", node_name,
                 "This node's name (the config's node_name, which it overrides): in a pod, the node's "
                 "from the downward API");
  app.add_flag("--print-default-config", print_default, "Print every config key with its default and exit");
  app.add_flag("--check-config", check, "Validate the config and exit");
  app.add_flag("-V,--version", version, "Print the version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (version) {
    std::printf("kvtierd %s\n", kVersion);
    return 0;
  }
  if (print_default) {
    std::fputs(DefaultConfigYaml().c_str(), stdout);
    return 0;
  }
  Result<std::string> text = config_path.empty() ? DefaultConfigYaml() : ReadConfigFile(config_path);
  if (!text.ok()) {
    KVTIER_LOG(ERROR) << text.status().message();
    return 2;
  }
  auto config = ParseConfig(*text);
  if (!config.ok()) {
    KVTIER_LOG(ERROR) << (config_path.empty() ? config.status() : config.status().WithContext(config_path)).message();
    return 2;
  }
  if (!node_name.empty()) {
    if (Status st = CheckNodeName(node_name); !st.ok()) {
      KVTIER_LOG(ERROR) << "--node-name: " << st.message();
      return 2;
    }
    config->node_name = node_name;
  }
  if (check) {
    std::vector<std::string> warnings;
    Status st = CheckConfigOnHost(*config, ReadHostMemory(), &warnings);
    for (const std::string& w : warnings) KVTIER_LOG(WARNING) << w;
    if (!st.ok()) {
      KVTIER_LOG(ERROR) << st.message();
      return 2;
    }
    std::printf("config OK\n");
    return 0;
  }
  auto daemon = Daemon::Open(*config, std::move(hooks));
  if (!daemon.ok()) {
    KVTIER_LOG(ERROR) << "cannot start: " << daemon.status().ToString();
    return 1;
  }
  if (!config_path.empty()) (*daemon)->EnableReload(config_path, std::move(*text));
  if (g_early_sighup) ::raise(SIGHUP);  // one that came meanwhile is now a reload
  Status st = (*daemon)->Run();
  return st.ok() ? 0 : 1;
}

}  // namespace kvtier
