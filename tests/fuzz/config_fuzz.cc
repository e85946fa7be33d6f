// Fuzz target: common/config, the daemon's configuration from all three outside sources.
//
// Input: TOML text, optionally followed by a NUL byte and environment lines (NAME=value,
// one per line), optionally followed by another NUL byte and --set arguments (one per
// line). The TOML goes to load_config through a memfd (load_config reads files only;
// /proc/self/fd/N names it), the rest as the env map and the --set list.
//
// Checks beyond "no crash, no UB": a failure is kInvalidArgument with a message (the
// other codes mean I/O trouble or a bug); a success round-trips through --print-config:
// config_to_toml(c) loads back to exactly c (the promise in config.h) and prints the same
// text again. Each --set value that parses as a size re-parses from its decimal form to
// the same number.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "tests/fuzz/fuzz.h"

namespace {

using namespace shardmix;

// A memfd holding one text; path() is a name that open() and stat() accept.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(memfd_create(name, MFD_CLOEXEC)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& write(std::string_view text) {
    FUZZ_CHECK(ftruncate(fd_, 0) == 0, "ftruncate");
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = pwrite(fd_, text.data() + done, text.size() - done, static_cast<off_t>(done));
      FUZZ_CHECK(n > 0, "pwrite to memfd");
      done += static_cast<std::size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    out.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static MemFile input_file("fuzz-config");
  static MemFile printed_file("fuzz-config-printed");
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string_view toml = text, env_text, set_text;
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    toml = text.substr(0, nul);
    env_text = text.substr(nul + 1);
    if (const std::size_t nul2 = env_text.find('\0'); nul2 != std::string_view::npos) {
      set_text = env_text.substr(nul2 + 1);
      env_text = env_text.substr(0, nul2);
    }
  }
  std::map<std::string, std::string> env;
  for (std::string_view line : lines_of(env_text)) {
    const std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    env[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  std::vector<std::string> sets;
  for (std::string_view line : lines_of(set_text)) {
    sets.emplace_back(line);
    const std::string_view value = line.substr(line.find('=') == std::string_view::npos ? 0 : line.find('=') + 1);
    if (auto bytes = parse_size(value, "fuzz"); bytes.ok()) {
      auto again = parse_size(std::to_string(*bytes), "fuzz");
      FUZZ_CHECK(again.ok() && *again == *bytes, "parse_size('" + std::string(value) + "') = " +
                                                     std::to_string(*bytes) + " does not re-parse from digits");
    }
  }

  const std::string file = toml.empty() ? std::string() : input_file.write(toml);
  auto config = load_config(file, env, sets);
  if (!config.ok()) {
    FUZZ_CHECK(config.status().code() == StatusCode::kInvalidArgument && !config.status().message().empty(),
               "unexpected failure: " + config.status().to_string());
    return 0;
  }
  const std::string printed = config_to_toml(*config);
  auto reloaded = load_config(printed_file.write(printed), {}, {});
  FUZZ_CHECK(reloaded.ok(), "the printed config does not load: " + reloaded.status().to_string() + "\n" + printed);
  FUZZ_CHECK(*reloaded == *config, "the printed config loads to a different config:\n" + printed);
  FUZZ_CHECK(config_to_toml(*reloaded) == printed, "printing is not stable:\n" + printed);
  return 0;
}

namespace shardmix::fuzz {

Seeds seeds() {
  using namespace std::string_view_literals;
  Seeds out;
  auto defaults = load_config("", {}, {"dataset.path=/data/imagenet"});
  FUZZ_CHECK(defaults.ok(), defaults.status().to_string());
  out.emplace_back("printed-defaults", to_bytes(config_to_toml(*defaults)));
  out.emplace_back("handwritten", to_bytes(R"([dataset]
path = "/data/list.txt"
format = "filelist"
placement = "sorted"
max_sample_bytes = "2MiB"
[batch]
size = 64
drop_last = true
[shuffle]
seed = 9223372036854775807
exchange_fraction = 0.25
[cache]
capacity = 0.5
[fabric]
provider = "tcp"
interface = "lo"
[service]
trainers_per_node = 4
staging_bytes_per_trainer = 1073741824
[log]
level = "debug"
)"));
  out.emplace_back("inline-tables", to_bytes("dataset = { path = '/d', format = 'folder' }\n"
                                             "cache.capacity = \"8GiB\"\nbatch.size = 1\n"));
  // Every key through the environment and through --set, at its default.
  std::string env_block, set_block;
  for (const ConfigKeyInfo& key : config_keys()) {
    const std::string value = key.name == "dataset.path" ? "/d" : key.default_text;
    env_block += key.env_name + "=" + value + "\n";
    set_block += key.name + "=" + value + "\n";
  }
  out.emplace_back("every-key-env", to_bytes(std::string("\0", 1) + env_block));
  out.emplace_back("every-key-set", to_bytes(std::string("\0\0", 2) + set_block));
  out.emplace_back("all-sources",
                   to_bytes("[batch]\nsize = 8\n\0SHARDMIX_BATCH_SIZE=16\nSHARDMIX_RUN_DIR=/x\n\0"
                            "dataset.path=/d\nbatch.size=32\ncache.capacity=1.5GiB\n"sv));
  return out;
}

}  // namespace shardmix::fuzz
