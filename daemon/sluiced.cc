// sluiced: a Sluice node. Wiring only: parse the command line and config, build the node, run.
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "base/release.h"
#include "node/node.h"
#include "sd_notify.h"

int main(int argc, char** argv) {
  CLI::App app{"sluiced: a Sluice rate-limit node", "sluiced"};
  app.set_version_flag("--version", "sluiced " + std::string(sluice::kThisVersion),
                       "print the release (CHANGELOG.md) and exit");
  std::string config_file;
  sluice::node::NodeOptions opt;
  std::string udp, tcp, admin, grpc, resp, rules, data_dir, log_level;
  unsigned threads = 0;
  bool check_only = false;
  bool init_data = false;
  bool repair_data = false;
  app.add_option("--config", config_file,
                 "config file (YAML, docs/operations.md); without one: the embedded default "
                 "(one node, loopback only, example rules)");
  app.add_option("--udp", udp, "UDP check listener, e.g. 127.0.0.1:7350 ('' disables)");
  app.add_option("--tcp", tcp, "TCP check listener, e.g. 127.0.0.1:7350 ('' disables)");
  app.add_option("--admin", admin, "admin HTTP listener, e.g. 127.0.0.1:7351 ('' disables)");
  app.add_option("--grpc", grpc,
                 "gRPC listener for Envoy's rate limit service, e.g. 127.0.0.1:8081 ('' disables)");
  app.add_option("--resp", resp,
                 "Redis protocol (RESP) listener for CL.THROTTLE and SLUICE.CHECK, e.g. "
                 "127.0.0.1:7352 ('' disables)");
  app.add_option("--rules", rules, "rules file (YAML, docs/rules.md)");
  std::string envoy_rules;
  app.add_option("--envoy-rules", envoy_rules,
                 "envoyproxy/ratelimit config: a YAML file or a directory of them "
                 "(docs/envoy-config.md)");
  app.add_option("--threads", threads, "worker threads")->check(CLI::Range(1, 256));
  app.add_option("--data-dir", data_dir,
                 "data directory: RocksDB snapshots and overrides ('' keeps everything in memory)");
  app.add_flag("--init-data", init_data,
               "create the data directory when it is missing or empty (a node's first start)");
  app.add_flag("--repair-data", repair_data,
               "run RocksDB's repair on the data directory, then exit (docs/operations.md)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  app.add_flag("--check", check_only, "validate the config and rules, then exit");
  CLI11_PARSE(app, argc, argv);

  if (config_file.empty()) {
    opt.init_data = true;  // the embedded default is for trying Sluice out: ./data on first run
  } else {
    if (const sluice::Status s = sluice::node::load_node_config(config_file, opt); !s.ok()) {
      std::fprintf(stderr, "sluiced: %s\n", s.message().c_str());
      return 2;
    }
  }
  // The command line wins over the file.
  if (app.count("--udp")) opt.udp_listen = udp;
  if (app.count("--tcp")) opt.tcp_listen = tcp;
  if (app.count("--admin")) opt.admin_listen = admin;
  if (app.count("--grpc")) opt.grpc_listen = grpc;
  if (app.count("--resp")) opt.resp_listen = resp;
  if (app.count("--rules")) opt.rules_file = rules;
  if (app.count("--envoy-rules")) opt.envoy_rules = envoy_rules;
  if (app.count("--threads")) opt.threads = threads;
  if (app.count("--data-dir")) opt.data_dir = data_dir;
  if (app.count("--log-level")) opt.log_level = log_level;
  if (init_data) opt.init_data = true;
  spdlog::set_level(spdlog::level::from_str(opt.log_level));

  if (repair_data) {
    if (const sluice::Status s = sluice::store::Store::repair(opt.data_dir); !s.ok()) {
      std::fprintf(stderr, "sluiced: %s\n", s.message().c_str());
      return 2;
    }
    std::printf("sluiced: repaired %s; start the node as usual\n", opt.data_dir.c_str());
    return 0;
  }
  // --check validates without touching the data directory (a running node may hold it).
  if (check_only) opt.data_dir.clear();

  // Under systemd (Type=notify): READY=1 once checks are answered, RELOADING=1 and READY=1 around
  // a SIGHUP reload, STOPPING=1 at the start of a stop. A failed notification is logged, not fatal.
  const auto notifier = sluice::daemon::ServiceNotifier::from_environment();
  if (notifier.enabled() && !check_only) {
    using sluice::node::NodeEvent;
    opt.on_event = [&notifier](NodeEvent event, std::string_view status) {
      std::string msg;
      switch (event) {
        case NodeEvent::kReady:
        case NodeEvent::kReloaded:
        case NodeEvent::kReloadFailed:  // the old rules still serve
          msg = "READY=1\n";
          break;
        case NodeEvent::kReloading:
          msg = "RELOADING=1\nMONOTONIC_USEC=" + std::to_string(sluice::daemon::monotonic_usec()) +
                "\n";
          break;
        case NodeEvent::kStopping:
          msg = "STOPPING=1\n";
          break;
      }
      msg.append("STATUS=").append(status);
      if (const std::string err = notifier.notify(msg); !err.empty()) spdlog::warn("{}", err);
    };
  }

  sluice::StatusOr<std::unique_ptr<sluice::node::Node>> node = sluice::node::Node::open(opt);
  if (!node.ok()) {
    std::fprintf(stderr, "sluiced: %s\n", node.message().c_str());
    spdlog::shutdown();
    return 2;
  }
  if (check_only) {
    std::printf("sluiced: config and rules are valid\n");
    return 0;
  }
  try {
    (*node)->run();  // throws when a listener cannot be bound
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluiced: %s\n", e.what());
    spdlog::shutdown();
    return 2;
  }
  spdlog::info("sluiced stopped");
  spdlog::shutdown();
  return 0;
}
