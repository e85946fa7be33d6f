// shardmix-ckpt: a trainer's model checkpoints from the shell, through the client API
// (Client::save, wait_durable, load, list; docs/decisions/0056). Runs as one trainer rank,
// like shardmix-consume (SHARDMIX_RANK/_WORLD_SIZE or the launcher's variables).
//   shardmix-ckpt save NAME --file F [--kill-after-save]   prints "saved NAME@V (N bytes)"
//   shardmix-ckpt wait NAME                                 prints "durable NAME"
//   shardmix-ckpt load NAME --out F                         prints "loaded NAME@V (N bytes)"
//   shardmix-ckpt list                                      prints "NAME@V" per version
// --kill-after-save: SIGKILL this process as soon as save returned (the fault tests: a
// trainer killed right after its save must not lose the checkpoint).
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "client/client.h"
#include "common/command_line.h"

int main(int argc, char** argv) {
  CLI::App app{"shardmix-ckpt: save, wait for, load and list model checkpoints held by this node's daemon"};
  app.require_subcommand(1);
  std::string name, file, out;
  bool kill_after = false;
  CLI::App* save = app.add_subcommand("save", "Save a file's bytes as the next version of NAME");
  save->add_option("name", name, "Checkpoint name")->required();
  save->add_option("--file", file, "The bytes to save")->required();
  save->add_flag("--kill-after-save", kill_after, "SIGKILL this process right after save returns");
  CLI::App* wait = app.add_subcommand("wait", "Wait until NAME's newest version is durable");
  wait->add_option("name", name, "Checkpoint name")->required();
  CLI::App* load = app.add_subcommand("load", "Write NAME's newest version to a file");
  load->add_option("name", name, "Checkpoint name")->required();
  load->add_option("--out", out, "Where to write the bytes")->required();
  CLI::App* list = app.add_subcommand("list", "List the versions the daemon knows");
  if (auto rc = shardmix::parse_command_line(app, argc, argv)) return *rc;
  try {
    shardmix::Client client = shardmix::Client::connect();
    if (save->parsed()) {
      std::ifstream in(file, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "shardmix-ckpt: cannot read %s\n", file.c_str());
        return 1;
      }
      const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const std::uint64_t version = client.save(name, bytes);
      if (kill_after) std::raise(SIGKILL);
      fmt::print("saved {}@{} ({} bytes)\n", name, version, bytes.size());
    } else if (wait->parsed()) {
      client.wait_durable(name);
      fmt::print("durable {}\n", name);
    } else if (load->parsed()) {
      const shardmix::LoadedCheckpoint loaded = client.load(name);
      std::ofstream written(out, std::ios::binary);
      written.write(reinterpret_cast<const char*>(loaded.bytes().data()),
                    static_cast<std::streamsize>(loaded.bytes().size()));
      if (!written.flush()) {
        std::fprintf(stderr, "shardmix-ckpt: cannot write %s\n", out.c_str());
        return 1;
      }
      fmt::print("loaded {}@{} ({} bytes)\n", name, loaded.version(), loaded.bytes().size());
    } else if (list->parsed()) {
      for (const shardmix::CheckpointVersion& v : client.list()) fmt::print("{}@{}\n", v.name, v.version);
    }
  } catch (const shardmix::Error& e) {
    std::fprintf(stderr, "shardmix-ckpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
