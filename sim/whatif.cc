#include "sim/whatif.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "sim/simulator.h"

namespace shardmix::sim {
namespace {

// The stats file's lines are flat JSON objects (the job record nests one level). A small
// reader for exactly that: objects, strings, numbers, true/false/null; arrays are parsed and
// dropped. No JSON library is among the project's dependencies, and this is all it needs.
struct Json;
using JsonObject = std::map<std::string, std::shared_ptr<Json>>;
struct Json {
  std::variant<std::monostate, bool, double, std::string, JsonObject> value;
};

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : text_(text) {}

  Result<Json> parse() {
    auto v = value();
    if (!v.ok()) return v.status();
    skip_space();
    if (at_ != text_.size()) return fail("trailing characters");
    return v;
  }

 private:
  Status fail(std::string_view what) const {
    return make_error(StatusCode::kInvalidArgument, "not JSON: {} at column {}", what, at_ + 1);
  }
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\r' || text_[at_] == '\n')) ++at_;
  }
  bool take(char c) {
    skip_space();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  Result<std::string> string() {
    if (!take('"')) return fail("expected a string");
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      char c = text_[at_++];
      if (c == '\\') {
        if (at_ >= text_.size()) break;
        char e = text_[at_++];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'u': {
            if (at_ + 4 > text_.size()) return fail("short \\u escape");
            const unsigned code = std::strtoul(std::string(text_.substr(at_, 4)).c_str(), nullptr, 16);
            at_ += 4;
            out += code < 0x80 ? static_cast<char>(code) : '?';  // the writer escapes control characters only
            break;
          }
          default: out += e;
        }
      } else {
        out += c;
      }
    }
    if (!take('"')) return fail("unterminated string");
    return out;
  }
  Result<Json> value() {
    skip_space();
    if (at_ >= text_.size()) return fail("unexpected end");
    const char c = text_[at_];
    if (c == '{') {
      ++at_;
      JsonObject object;
      if (take('}')) return Json{std::move(object)};
      do {
        auto key = string();
        if (!key.ok()) return key.status();
        if (!take(':')) return fail("expected ':'");
        auto v = value();
        if (!v.ok()) return v.status();
        object[*key] = std::make_shared<Json>(std::move(*v));
      } while (take(','));
      if (!take('}')) return fail("expected ',' or '}'");
      return Json{std::move(object)};
    }
    if (c == '[') {
      ++at_;
      if (take(']')) return Json{};
      do {
        auto v = value();
        if (!v.ok()) return v.status();
      } while (take(','));
      if (!take(']')) return fail("expected ',' or ']'");
      return Json{};
    }
    if (c == '"') {
      auto s = string();
      if (!s.ok()) return s.status();
      return Json{std::move(*s)};
    }
    for (auto [word, json] : {std::pair{std::string_view("true"), Json{true}}, std::pair{std::string_view("false"), Json{false}},
                              std::pair{std::string_view("null"), Json{}}}) {
      if (text_.substr(at_, word.size()) == word) {
        at_ += word.size();
        return json;
      }
    }
    const std::string rest(text_.substr(at_, 64));
    char* end = nullptr;
    const double x = std::strtod(rest.c_str(), &end);
    if (end == rest.c_str()) return fail("expected a value");
    at_ += static_cast<std::size_t>(end - rest.c_str());
    return Json{x};
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

// Field access that names the file, line and field in its errors.
class Fields {
 public:
  Fields(const JsonObject& object, const std::string& where) : object_(object), where_(where) {}

  Result<double> number(const std::string& name) const {
    auto it = object_.find(name);
    if (it == object_.end()) return make_error(StatusCode::kInvalidArgument, "{}: no field \"{}\"", where_, name);
    if (const double* x = std::get_if<double>(&it->second->value)) return *x;
    if (std::holds_alternative<std::monostate>(it->second->value)) return 0.0;  // NaN is written as null
    return make_error(StatusCode::kInvalidArgument, "{}: field \"{}\" is not a number", where_, name);
  }
  Result<std::uint64_t> count(const std::string& name) const {
    auto x = number(name);
    if (!x.ok()) return x.status();
    if (*x < 0) return make_error(StatusCode::kInvalidArgument, "{}: field \"{}\" is negative", where_, name);
    return static_cast<std::uint64_t>(std::llround(*x));
  }
  Result<bool> boolean(const std::string& name) const {
    auto it = object_.find(name);
    if (it == object_.end()) return make_error(StatusCode::kInvalidArgument, "{}: no field \"{}\"", where_, name);
    if (const bool* b = std::get_if<bool>(&it->second->value)) return *b;
    return make_error(StatusCode::kInvalidArgument, "{}: field \"{}\" is not true or false", where_, name);
  }
  std::string text(const std::string& name) const {
    auto it = object_.find(name);
    if (it == object_.end()) return {};
    const std::string* s = std::get_if<std::string>(&it->second->value);
    return s != nullptr ? *s : std::string();
  }
  const JsonObject* object(const std::string& name) const {
    auto it = object_.find(name);
    return it == object_.end() ? nullptr : std::get_if<JsonObject>(&it->second->value);
  }

 private:
  const JsonObject& object_;
  const std::string& where_;
};

#define WHATIF_TRY(var, expr)            \
  auto var##_r = (expr);                 \
  if (!var##_r.ok()) return var##_r.status(); \
  const auto var = *var##_r

Result<StatsJob> parse_job(const JsonObject& o, const std::string& where) {
  Fields f(o, where);
  StatsJob job;
  WHATIF_TRY(nodes, f.count("nodes"));
  WHATIF_TRY(tpn, f.count("trainers_per_node"));
  WHATIF_TRY(samples, f.count("samples"));
  WHATIF_TRY(bytes, f.count("bytes"));
  WHATIF_TRY(median, f.count("median_sample_bytes"));
  WHATIF_TRY(mean, f.number("mean_sample_bytes"));
  WHATIF_TRY(sigma, f.number("ln_size_sigma"));
  WHATIF_TRY(classes, f.count("classes"));
  if (nodes == 0 || tpn == 0 || samples == 0 || median == 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: the job record needs nodes, trainers_per_node, samples and median_sample_bytes above 0", where);
  }
  job.nodes = static_cast<std::uint32_t>(nodes);
  job.trainers_per_node = static_cast<std::uint32_t>(tpn);
  job.samples = samples;
  job.bytes = bytes;
  job.median_sample_bytes = median;
  job.mean_sample_bytes = mean;
  job.ln_size_sigma = sigma;
  job.classes = classes;
  job.provider = f.text("provider");
  const JsonObject* config = f.object("config");
  if (config == nullptr) return make_error(StatusCode::kInvalidArgument, "{}: the job record has no \"config\" object", where);
  for (const auto& [key, value] : *config) {
    const std::string* s = std::get_if<std::string>(&value->value);
    if (s == nullptr) return make_error(StatusCode::kInvalidArgument, "{}: config \"{}\" is not a string", where, key);
    job.config.emplace_back(key, *s);
  }
  return job;
}

Result<StatsEpoch> parse_epoch(const JsonObject& o, const std::string& where) {
  Fields f(o, where);
  StatsEpoch e;
  WHATIF_TRY(epoch, f.count("epoch"));
  WHATIF_TRY(complete, f.boolean("complete"));
  WHATIF_TRY(reporting, f.count("trainers_reporting"));
  WHATIF_TRY(seconds, f.number("seconds"));
  WHATIF_TRY(samples, f.count("samples"));
  WHATIF_TRY(local, f.count("local_samples"));
  WHATIF_TRY(peer, f.count("peer_samples"));
  WHATIF_TRY(storage, f.count("storage_samples"));
  WHATIF_TRY(peer_bytes, f.count("peer_bytes"));
  WHATIF_TRY(stall, f.number("stall_seconds"));
  WHATIF_TRY(fetch_wait, f.number("fetch_wait_seconds"));
  e.epoch = epoch;
  e.complete = complete;
  e.trainers_reporting = static_cast<std::uint32_t>(reporting);
  e.seconds = seconds;
  e.samples = samples;
  e.local_samples = local;
  e.peer_samples = peer;
  e.storage_samples = storage;
  e.peer_bytes = peer_bytes;
  e.stall_seconds = stall;
  e.fetch_wait_seconds = fetch_wait;
  return e;
}

// Epochs after the first (which includes connection set-up), or all if there is one.
std::vector<StatsEpoch> measured_epochs(const std::vector<StatsEpoch>& epochs) {
  std::vector<StatsEpoch> out;
  for (const StatsEpoch& e : epochs) {
    if (e.complete && e.epoch >= 1 && e.seconds > 0) out.push_back(e);
  }
  if (out.empty()) {
    for (const StatsEpoch& e : epochs) {
      if (e.complete && e.seconds > 0) out.push_back(e);
    }
  }
  return out;
}

WhatifFigures figures_of(const std::vector<StatsEpoch>& epochs) {
  WhatifFigures f;
  double seconds = 0, trainer_seconds = 0, stall = 0;
  std::uint64_t samples = 0, local = 0, peer = 0, storage = 0;
  for (const StatsEpoch& e : epochs) {
    seconds += e.seconds;
    trainer_seconds += e.seconds * e.trainers_reporting;
    stall += e.stall_seconds;
    samples += e.samples;
    local += e.local_samples;
    peer += e.peer_samples;
    storage += e.storage_samples;
  }
  f.epochs = static_cast<std::uint32_t>(epochs.size());
  if (seconds > 0) f.samples_per_s = static_cast<double>(samples) / seconds;
  if (trainer_seconds > 0) f.stall_fraction = stall / trainer_seconds;
  if (samples > 0) {
    f.tier_local = static_cast<double>(local) / static_cast<double>(samples);
    f.tier_peer = static_cast<double>(peer) / static_cast<double>(samples);
    f.tier_storage = static_cast<double>(storage) / static_cast<double>(samples);
  }
  return f;
}

// The simulator's epochs after the first (its first starts with empty staging), weighted
// like the measured ones: samples over time.
WhatifFigures figures_of(const SimResult& r) {
  WhatifFigures f;
  double seconds = 0, stall_time = 0, local = 0, peer = 0, storage = 0;
  std::uint64_t samples = 0;
  for (const SimEpochResult& e : r.epochs) {
    if (e.epoch == 0 && r.epochs.size() > 1) continue;
    seconds += e.sim_seconds;
    stall_time += e.stall_fraction * e.sim_seconds;
    samples += e.samples;
    local += e.tier_local * static_cast<double>(e.samples);
    peer += e.tier_peer * static_cast<double>(e.samples);
    storage += e.tier_storage * static_cast<double>(e.samples);
    ++f.epochs;
  }
  if (seconds > 0) {
    f.samples_per_s = static_cast<double>(samples) / seconds;
    f.stall_fraction = stall_time / seconds;
  }
  if (samples > 0) {
    f.tier_local = local / static_cast<double>(samples);
    f.tier_peer = peer / static_cast<double>(samples);
    f.tier_storage = storage / static_cast<double>(samples);
  }
  return f;
}

std::string figures_json(const WhatifFigures& f) {
  return fmt::format(
      "{{\"samples_per_s\": {:.6g}, \"stall_fraction\": {:.6g}, \"tier_local\": {:.6g}, \"tier_peer\": {:.6g}, "
      "\"tier_storage\": {:.6g}, \"epochs\": {}}}",
      f.samples_per_s, f.stall_fraction, f.tier_local, f.tier_peer, f.tier_storage, f.epochs);
}

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

}  // namespace

Result<StatsFile> read_stats_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(StatusCode::kNotFound, "cannot open stats file {}", path);
  StatsFile file;
  bool have_job = false;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, number);
    auto json = JsonReader(line).parse();
    if (!json.ok()) return make_error(StatusCode::kInvalidArgument, "{}: {}", where, json.status().message());
    const JsonObject* object = std::get_if<JsonObject>(&json->value);
    if (object == nullptr) return make_error(StatusCode::kInvalidArgument, "{}: not a JSON object", where);
    Fields fields(*object, where);
    if (const JsonObject* job = fields.object("job")) {
      auto parsed = parse_job(*job, where);
      if (!parsed.ok()) return parsed.status();
      // A stats file is opened for appending: a later job's record starts its own epochs.
      file.job = std::move(*parsed);
      file.epochs.clear();
      have_job = true;
      continue;
    }
    if (!have_job) {
      return make_error(StatusCode::kInvalidArgument,
                        "{}: an epoch line before any job record (a stats file from before the job record was written?)",
                        where);
    }
    auto epoch = parse_epoch(*object, where);
    if (!epoch.ok()) return epoch.status();
    file.epochs.push_back(*epoch);
  }
  if (!have_job) return make_error(StatusCode::kInvalidArgument, "{}: no job record ({{\"job\": ...}} line)", path);
  if (measured_epochs(file.epochs).empty()) {
    return make_error(StatusCode::kInvalidArgument, "{}: no complete epoch after the job record", path);
  }
  return file;
}

Result<std::vector<std::string>> read_calibration(const std::string& path) {
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return make_error(StatusCode::kInvalidArgument, "calibration file {}: {} (line {})", path, e.description(),
                      e.source().begin.line);
  }
  std::vector<std::string> sets;
  for (const auto& [section, node] : table) {
    if (section.str() != "sim" || !node.is_table()) {
      return make_error(StatusCode::kInvalidArgument, "calibration file {}: only a [sim] table is allowed, found \"{}\"",
                        path, section.str());
    }
    for (const auto& [key, value] : *node.as_table()) {
      std::string text;
      if (auto d = value.value<double>(); d && !value.is_string()) {
        text = value.is_integer() ? fmt::format("{}", *value.value<std::int64_t>()) : fmt::format("{}", *d);
      } else if (auto s = value.value<std::string>()) {
        text = *s;
      } else {
        return make_error(StatusCode::kInvalidArgument, "calibration file {}: sim.{} is not a number or string", path,
                          key.str());
      }
      sets.push_back(fmt::format("sim.{}={}", key.str(), text));
    }
  }
  // Unknown keys and wrong types are errors naming the key: the config loader checks them.
  auto env = std::map<std::string, std::string>{{"SHARDMIX_DATASET_PATH", "(synthetic)"}};
  auto config = load_config("", env, sets);
  if (!config.ok()) return make_error(StatusCode::kInvalidArgument, "calibration file {}: {}", path, config.status().message());
  return sets;
}

Result<WhatifResult> run_whatif(const WhatifOptions& options) {
  auto stats = read_stats_file(options.stats_path);
  if (!stats.ok()) return stats.status();
  WhatifResult result;
  result.job = stats->job;
  const std::vector<StatsEpoch> epochs = measured_epochs(stats->epochs);
  result.measured = figures_of(epochs);

  std::vector<std::string> model;
  if (!options.calibration_path.empty()) {
    auto calibration = read_calibration(options.calibration_path);
    if (!calibration.ok()) return calibration.status();
    model = *calibration;
  }
  auto calibrated = [&](std::string_view key) {
    return std::any_of(model.begin(), model.end(), [&](const std::string& s) { return s.rfind(key, 0) == 0; });
  };
  // Fit 1: the trainers' compute rate. A trainer's epoch is its compute plus its stall, so
  // its samples over (epoch time - its mean stall) is its compute rate (including its own
  // per-batch overhead, which is what the simulator's trainer model stands for).
  double trainer_samples = 0, compute_seconds = 0;
  for (const StatsEpoch& e : epochs) {
    if (e.trainers_reporting == 0) continue;
    trainer_samples += static_cast<double>(e.samples) / e.trainers_reporting;
    compute_seconds += e.seconds - e.stall_seconds / e.trainers_reporting;
  }
  double epoch_seconds = 0;
  for (const StatsEpoch& e : epochs) epoch_seconds += e.seconds;
  // A run that stalled nearly all the time says little about compute: keep the calibration's.
  if (compute_seconds > 0.05 * epoch_seconds && trainer_samples > 0) {
    result.fitted_trainer_samples_per_s = trainer_samples / compute_seconds;
    model.push_back(fmt::format("sim.trainer_samples_per_s={}", result.fitted_trainer_samples_per_s));
  }
  // Fit 2: the effective peer rate, peer bytes over the daemons' summed wait for them, when
  // the calibration does not give sim.link_gbps (a lower bound: overlapping reads count
  // their waits twice).
  if (!calibrated("sim.link_gbps=")) {
    double peer_bytes = 0, wait = 0;
    for (const StatsEpoch& e : epochs) {
      peer_bytes += static_cast<double>(e.peer_bytes);
      wait += e.fetch_wait_seconds;
    }
    if (peer_bytes > 0 && wait > 0) {
      result.fitted_link_gbps = peer_bytes * 8 / wait / 1e9;
      model.push_back(fmt::format("sim.link_gbps={}", result.fitted_link_gbps));
    }
  }
  if (!calibrated("sim.size_sigma=")) model.push_back(fmt::format("sim.size_sigma={}", stats->job.ln_size_sigma));
  if (!calibrated("sim.classes=") && stats->job.classes > 0) {
    model.push_back(fmt::format("sim.classes={}", stats->job.classes));
  }
  result.model_sets = model;

  const std::uint32_t sim_epochs =
      options.epochs > 0 ? options.epochs : std::clamp<std::uint32_t>(static_cast<std::uint32_t>(stats->epochs.size()), 2, 4);
  auto simulate = [&](std::uint32_t nodes, const std::vector<std::string>& changes) -> Result<SimResult> {
    std::vector<std::string> sets = model;
    for (const auto& [key, value] : stats->job.config) sets.push_back(key + "=" + value);
    sets.insert(sets.end(), changes.begin(), changes.end());
    sets.push_back(fmt::format("service.trainers_per_node={}", stats->job.trainers_per_node));
    auto env = std::map<std::string, std::string>{{"SHARDMIX_DATASET_PATH", "(synthetic)"}};
    auto config = load_config("", env, sets);
    if (!config.ok()) return config.status();
    SimOptions so;
    so.nodes = nodes;
    so.trainers_per_node = stats->job.trainers_per_node;
    so.samples = stats->job.samples;
    so.median_kib = static_cast<double>(stats->job.median_sample_bytes) / 1024.0;
    so.epochs = sim_epochs;
    so.config = *config;
    return run_simulation(so);
  };
  auto reproduced = simulate(stats->job.nodes, {});
  if (!reproduced.ok()) return reproduced.status();
  result.reproduced = figures_of(*reproduced);
  result.reproduced_exactly_once = reproduced->exactly_once;

  result.predicted_nodes = options.nodes > 0 ? options.nodes : stats->job.nodes;
  result.changes = options.sets;
  auto predicted = simulate(result.predicted_nodes, options.sets);
  if (!predicted.ok()) return predicted.status();
  result.predicted = figures_of(*predicted);
  result.predicted_exactly_once = predicted->exactly_once;
  return result;
}

std::string to_json(const WhatifResult& r) {
  std::vector<std::string> model, changes;
  for (const auto& s : r.model_sets) model.push_back(quoted(s));
  for (const auto& s : r.changes) changes.push_back(quoted(s));
  return fmt::format(
      "{{\"nodes\": {}, \"trainers_per_node\": {}, \"samples\": {}, \"median_sample_bytes\": {}, "
      "\"fitted_trainer_samples_per_s\": {:.6g}, \"fitted_link_gbps\": {:.6g}, \"model\": [{}], "
      "\"measured\": {}, \"reproduced\": {}, \"reproduced_exactly_once\": {}, \"predicted_nodes\": {}, "
      "\"changes\": [{}], \"predicted\": {}, \"predicted_exactly_once\": {}}}",
      r.job.nodes, r.job.trainers_per_node, r.job.samples, r.job.median_sample_bytes, r.fitted_trainer_samples_per_s,
      r.fitted_link_gbps, fmt::join(model, ", "), figures_json(r.measured), figures_json(r.reproduced),
      r.reproduced_exactly_once ? "true" : "false", r.predicted_nodes, fmt::join(changes, ", "),
      figures_json(r.predicted), r.predicted_exactly_once ? "true" : "false");
}

}  // namespace shardmix::sim
