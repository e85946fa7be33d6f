// The config loader. Everything about a key lives in ONE row of kKeys below: its dotted
// name, type, default, documentation, and how it is stored in / read from Config. That
// table drives TOML parsing, SHARDMIX_* env names, --set, validation, config_to_toml and
// the Markdown reference (docs/configuration.md). To add a key: add a field to config.h,
// add a row here, regenerate the docs (REGENERATE_DOCS=1 shardmix_unit_tests
// --gtest_filter='Config*Docs*').
#include "common/config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <variant>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "common/shard_formats.h"
#include "common/trace.h"

extern char** environ;

namespace shardmix {
namespace {

enum class KeyType { kString, kInt, kUint, kBool, kDouble, kSize, kDuration, kCapacity, kEnum };

// A value after parsing from TOML or text, before it is stored in Config:
// kString/kEnum/kCapacity -> std::string (kCapacity: canonical text), kInt -> int64,
// kUint/kSize -> uint64, kDuration -> uint64 microseconds, kBool -> bool, kDouble -> double.
using Value = std::variant<std::string, std::int64_t, std::uint64_t, bool, double>;

constexpr std::uint64_t kU32Max = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t kI64Max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

struct KeySpec {
  std::string_view name;          // "section.key"
  KeyType type;
  std::string_view default_text;  // parsed like an env value
  std::string_view doc;
  std::string_view tradeoff;
  std::string_view choices;       // kEnum: "a|b|c"
  std::uint64_t min_uint;         // kUint/kSize: checked after all sources are merged
  std::uint64_t max_uint;         // kUint/kSize: checked when parsed (a type limit)
  double min_double;              // kDouble: inclusive range, checked after merging
  double max_double;
  bool required;                  // kString: must not be empty
  void (*set)(Config&, const Value&);
  Value (*get)(const Config&);
};

std::uint64_t as_u64(const Value& v) { return std::get<std::uint64_t>(v); }
std::uint32_t as_u32(const Value& v) { return static_cast<std::uint32_t>(std::get<std::uint64_t>(v)); }
const std::string& as_str(const Value& v) { return std::get<std::string>(v); }

std::uint64_t physical_ram_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size);
}

struct Capacity {
  std::uint64_t bytes = 0;
  std::string text;  // canonical: digits (bytes), a float with '.'/'e' (fraction), or a size
};
Result<Capacity> parse_capacity(std::string_view text);

#define SHARDMIX_U32_KEY(field) \
  [](Config& c, const Value& v) { c.field = as_u32(v); }, [](const Config& c) -> Value { return std::uint64_t{c.field}; }
#define SHARDMIX_U64_KEY(field) \
  [](Config& c, const Value& v) { c.field = as_u64(v); }, [](const Config& c) -> Value { return std::uint64_t{c.field}; }
#define SHARDMIX_USEC_KEY(field)                                                      \
  [](Config& c, const Value& v) { c.field = std::chrono::microseconds(as_u64(v)); },   \
      [](const Config& c) -> Value { return static_cast<std::uint64_t>(c.field.count()); }
#define SHARDMIX_DOUBLE_KEY(field) \
  [](Config& c, const Value& v) { c.field = std::get<double>(v); }, [](const Config& c) -> Value { return c.field; }
#define SHARDMIX_STR_KEY(field) \
  [](Config& c, const Value& v) { c.field = as_str(v); }, [](const Config& c) -> Value { return c.field; }

// clang-format off
const KeySpec kKeys[] = {
  {"dataset.path", KeyType::kString, "",
   "The dataset: the root folder (format = \"folder\"), the list file (\"filelist\"), or a directory of shards or one shard file (\"webdataset\": *.tar; \"tfrecord\": *.tfrecord, *.tfrecords).",
   "None; required. Put it on a parallel file system every node can read.",
   "", 0, 0, 0, 0, true, SHARDMIX_STR_KEY(dataset.path)},
  {"dataset.format", KeyType::kEnum, "folder",
   "How the dataset is laid out: \"folder\" = one subfolder per class (ImageNet style; label = index of the class folder in bytewise order); \"filelist\" = a text file of \"path label\" lines; \"webdataset\" = tar shards, members grouped into samples by key (dataset.sample_ext, dataset.label_ext); \"tfrecord\" = TFRecord files, one sample per record (CRCs verified; dataset.label_feature).",
   "\"folder\" needs no preparation but scanning lists every directory (split across daemons); \"filelist\" avoids directory listings on slow metadata servers but must be kept in sync by hand; the shard formats need a conversion step but turn millions of small files into few large ones (cheap metadata, sequential scans split by shard).",
   "folder|filelist|webdataset|tfrecord", 0, 0, 0, 0, false,
   [](Config& c, const Value& v) {
     const std::string& f = as_str(v);
     c.dataset.format = f == "filelist" ? DatasetFormat::kFileList
                        : f == "webdataset" ? DatasetFormat::kWebDataset
                        : f == "tfrecord"   ? DatasetFormat::kTfRecord
                                            : DatasetFormat::kFolder;
   },
   [](const Config& c) -> Value { return std::string(dataset_format_name(c.dataset.format)); }},
  {"dataset.placement", KeyType::kEnum, "balanced",
   "Which node caches which sample: \"balanced\" = largest samples first, each to the node with the fewest bytes (ties in a seeded order), so nodes hold nearly equal bytes and a mix of classes; \"spread\" = a seeded pseudo-random share of exact size per node, computed from the sample id alone (no sort, O(nodes) memory; byte balance is statistical); \"sorted\" = contiguous runs of sample ids, i.e. class-sorted shards.",
   "\"balanced\" equalises cache memory per node and keeps each node's share class-mixed (good micro-batch entropy even at low exchange_fraction), but is a global decision over all N sizes; \"spread\" mixes classes like balanced and is the placement that owner-side metadata needs (per-node metadata O(N/P), docs/decisions/0055); \"sorted\" is the worst case for local shuffles, kept for studies and comparisons.",
   "balanced|spread|sorted", 0, 0, 0, 0, false,
   [](Config& c, const Value& v) { c.dataset.placement = placement_policy_from_name(as_str(v)); },
   [](const Config& c) -> Value { return std::string(placement_policy_name(c.dataset.placement)); }},
  {"dataset.metadata", KeyType::kEnum, "global",
   "What each daemon holds of the catalog: \"global\" = every sample's entry and every node's layout on every daemon (O(N) per node); \"owner\" = only its own share's entries plus O(nodes) tables, the rest asked of the owners once per trainer plan, cold samples' storage locations included (owner-side metadata, docs/decisions/0063). \"owner\" needs dataset.placement = \"spread\" and, for now, a POSIX dataset.path, no cache rotation or slot reuse, and fault.peer_death = \"stop\"; a trainer that asks for the catalog (sample paths) gets one assembled from the owners for that request.",
   "\"global\" supports every feature but costs about 50 bytes a sample on every node (5 GB at 100 M samples); \"owner\" costs about 20-30 bytes per sample of the node's share, so metadata shrinks as nodes are added, at one control-plane round trip per trainer plan.",
   "global|owner", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(dataset.metadata)},
  {"dataset.max_sample_bytes", KeyType::kSize, "64MiB",
   "Largest sample accepted; a bigger file makes the scan fail with its name and size. Integer bytes or a size such as \"64MiB\".",
   "Higher admits huge outliers, which need equally large staging slots and skew the byte balance; lower catches stray files (videos, archives) in an image dataset early.",
   "", 1, std::numeric_limits<std::uint64_t>::max(), 0, 0, false, SHARDMIX_U64_KEY(dataset.max_sample_bytes)},
  {"dataset.sample_ext", KeyType::kString, "jpg,jpeg,png,webp,bin",
   "format = \"webdataset\": the extensions (after the first dot of a member's basename) of the member whose bytes are the sample, comma-separated, by preference: a sample uses the first one it has. A sample with none of them is skipped and counted.",
   "List only what the trainer decodes: a key whose data member is missing becomes a counted skip rather than wrong bytes; order matters when a sample has several (e.g. both .jpg and .png).",
   "", 0, 0, 0, 0, true, SHARDMIX_STR_KEY(dataset.sample_ext)},
  {"dataset.label_ext", KeyType::kString, "cls",
   "format = \"webdataset\": extension of the member holding the sample's label as an ASCII integer (0..2^31-1, whitespace allowed). A sample without it, or with a non-integer, is skipped and counted. \"\" = no label member: every label is 0.",
   "Labels drive the label-entropy figures and the entropy-aware mode; \"\" suits unlabelled data (pre-training), where every micro-batch then has entropy 0.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(dataset.label_ext)},
  {"dataset.label_feature", KeyType::kString, "",
   "format = \"tfrecord\": name of the int64_list feature of each record's tf.train.Example holding the label (exactly one value in 0..2^31-1); a record that is not an Example or lacks it is skipped and counted. \"\" = records are opaque bytes and every label is 0.",
   "Parsing the Example costs a pass over each record's bytes at scan time (not at serving time); leave it empty for records that are not tf.train.Example.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(dataset.label_feature)},
  {"dataset.strict", KeyType::kBool, "false",
   "Bad input. Found by the scan (a truncated tar, a bad TFRecord CRC, a record length beyond the end of its file, a sample without its data or label member, a shard that disappears during the scan): false = log a warning naming the file and byte offset, skip the sample (or the rest of the shard) and count it (start-up log, per-epoch statistics); true = start-up fails with that error. Found while serving (a cold sample's storage read fails twice: its file vanished, shrank or changed since the scan, or an I/O error): false = the sample is skipped this epoch (its batch goes out without it, Batch::skipped() names it, EpochStats::unreadable_samples counts it, the daemon logs the error with the file and offset); true = that trainer gets the error.",
   "false keeps a long job running on a dataset with a few damaged or vanishing files, training on the readable samples only (reported); true guarantees the job sees every sample of the dataset, or stops with an error naming the first one it could not read.",
   "", 0, 0, 0, 0, false,
   [](Config& c, const Value& v) { c.dataset.strict = std::get<bool>(v); },
   [](const Config& c) -> Value { return c.dataset.strict; }},

  {"batch.size", KeyType::kUint, "32",
   "Samples per trainer micro-batch.",
   "Larger batches amortise per-batch overhead (descriptors, credits) but the planned order and the label-entropy metric are measured per batch; match what the trainer uses.",
   "", 1, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(batch.size)},
  {"batch.drop_last", KeyType::kBool, "false",
   "true: every trainer gets floor(N / (trainers x batch.size)) full batches and the leftover samples are skipped this epoch (which ones changes every epoch); false: every sample is delivered exactly once per epoch and the last batch may be short (or empty on some trainers). Either way a batch is short by any sample whose file could not be read while serving (dataset.strict = false; Batch::skipped()).",
   "true gives every batch the same shape (simpler training step) at the cost of up to trainers x batch.size - 1 samples per epoch; false sees the whole dataset every epoch.",
   "", 0, 0, 0, 0, false,
   [](Config& c, const Value& v) { c.batch.drop_last = std::get<bool>(v); },
   [](const Config& c) -> Value { return c.batch.drop_last; }},

  {"shuffle.seed", KeyType::kUint, "0",
   "Seed of every random choice (placement order, epoch plans). Same seed and config give the same plan on every run. 0 .. 2^63-1 (TOML integers are signed).",
   "Fixed seed = reproducible runs; change it to get a different but equally good order.",
   "", 0, kI64Max, 0, 0, false, SHARDMIX_U64_KEY(shuffle.seed)},
  {"shuffle.exchange_fraction", KeyType::kDouble, "1.0",
   "Q in [0, 1]: the fraction of each node's share that is dealt out by a global permutation every epoch; the rest (1 - Q) stays with the node's own trainers.",
   "1.0 = a fresh global permutation every epoch (most entropy, most network traffic); 0.0 = trainers read only what their node caches (most locality, least entropy).",
   "", 0, 0, 0.0, 1.0, false,
   [](Config& c, const Value& v) { c.shuffle.exchange_fraction = std::get<double>(v); },
   [](const Config& c) -> Value { return c.shuffle.exchange_fraction; }},
  {"shuffle.window", KeyType::kUint, "0",
   "W, opportunistic ordering: when the trainer is about to starve, batch j may be completed with any ready sample from the undelivered planned positions before batch_begin(j) + size(j) + W. Batch sizes and exactly-once delivery do not change. 0 = exact planned order.",
   "0 is bit-for-bit reproducible but one slow remote read stalls the trainer; a window (e.g. 64 to 1024) lets fast samples overtake a slow one, at the cost of a run-dependent order within the window and W more samples of staging per trainer.",
   "", 0, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(shuffle.window)},
  {"shuffle.min_entropy", KeyType::kDouble, "0.0",
   "Entropy-aware mode: a floor in [0, 1] on the mean per-trainer micro-batch label entropy (docs/shuffle-quality.md). When > 0, each epoch uses the smallest exchange fraction, up to shuffle.exchange_fraction, whose planned batches reach the floor; 0 = off (exchange_fraction is used as is).",
   "A higher floor buys better-mixed micro-batches with network traffic; a lower one keeps more samples local. The chosen fraction is logged and reported per epoch.",
   "", 0, 0, 0.0, 1.0, false,
   [](Config& c, const Value& v) { c.shuffle.min_entropy = std::get<double>(v); },
   [](const Config& c) -> Value { return c.shuffle.min_entropy; }},

  {"cache.capacity", KeyType::kCapacity, "0.8",
   "RAM per node for the cache arena: integer bytes, a size such as \"8GiB\", or a fraction 0 < x <= 1 of physical RAM written with a decimal point (0.5). 0 = no limit beyond RAM. When a node's share of the dataset is larger, a seeded-random subset that fits stays resident and the rest is cold: read from storage (the shared file system) by the daemon whose trainer needs it, every epoch (docs/decisions/0015-storage-tier.md). Per node: a fraction gives each node its own byte count, and nodes may differ (the daemons exchange them at start-up).",
   "More cache keeps more of the dataset in RAM (fewer storage reads per epoch: the cold fraction is about 1 - nodes x capacity / dataset bytes) but leaves less memory for the trainers on the same node.",
   "", 0, std::numeric_limits<std::uint64_t>::max(), 0, 0, false,
   [](Config& c, const Value& v) {
     auto cap = parse_capacity(as_str(v));  // validated when the Value was made
     c.cache.capacity_text = cap.ok() ? cap->text : as_str(v);
     c.cache.capacity_bytes = cap.ok() ? cap->bytes : 0;
   },
   [](const Config& c) -> Value { return c.cache.capacity_text; }},
  {"cache.rotation_epochs", KeyType::kUint, "0",
   "When cache.capacity leaves samples cold: every this many epochs each node swaps in a new seeded-random resident set, loading only the samples that enter, behind a fence that no peer read or held batch crosses; samples in slots being rewritten are read from storage meanwhile. 0 = the resident set never changes. Ignored (with a warning) under fault.peer_death = \"degrade\": the fence needs every daemon alive (docs/decisions/0033-cache-rotation.md).",
   "Rotation gives every sample its turn in RAM across epochs (fairness; at shuffle.exchange_fraction < 1 a node's cold share changes) but does not raise the hit rate: each reload reads the entering samples from storage on top of the cold reads, and while a node reloads its changing samples come from storage too. Leave 0 unless the same samples must not always be the storage-bound ones.",
   "", 0, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(cache.rotation_epochs)},
  {"cache.reuse_rounds", KeyType::kUint, "0",
   "When cache.capacity leaves samples cold: split every epoch into this many rounds (by batch number; at most the batches per trainer) and, every round, re-choose each node's resident set from the known plan: slots of samples consumed this epoch are reused for samples needed in the next two rounds, and samples stay resident from one use to the next when that gap is short. Loaded behind the same fence as cache.rotation_epochs. 0 = off. Cannot be combined with cache.rotation_epochs. Ignored (with a warning) under fault.peer_death = \"degrade\" (docs/decisions/0035-slot-reuse-rounds.md).",
   "Experimental. It does not lower the storage reads per epoch below the static set's (each sample is used once an epoch, so at most cache.capacity of it can be served without a read); it moves most of them from the trainers' path into the owners' reloads, rounds ahead, and adds a fence (2 MPI messages per daemon pair) and a reload per round. Only worth trying when an epoch is many times longer than the read-ahead (service.prefetch + service.cold_readahead_batches batches) times the rounds; measured slower than the static set on the slow-storage benchmark (decision 0035).",
   "", 0, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(cache.reuse_rounds)},

  {"fabric.provider", KeyType::kString, "auto",
   "libfabric provider: \"auto\" (verbs when rdma-core lists an RDMA device, else tcp; a listed device whose verbs provider fi_getinfo rejects falls back to tcp with a warning), or a name such as tcp, shm, verbs, efa, cxi, which never falls back (docs/fabric.md, decision 0049).",
   "\"auto\" picks the fastest provider found; name one to pin behaviour across clusters or to debug.",
   "", 0, 0, 0, 0, true, SHARDMIX_STR_KEY(fabric.provider)},
  {"fabric.interface", KeyType::kString, "",
   "Only use the fabric domain/interface with this name (e.g. \"mlx5_0\", \"lo\"); \"\" = any.",
   "Pinning avoids a slow management NIC being picked first; leaving it empty is portable across node types.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(fabric.interface)},
  {"fabric.max_outstanding_reads", KeyType::kUint, "8",
   "Remote reads (fi_read) in flight per daemon; with 3 or more daemons one peer may hold at most all but one of them (a peer that stops answering cannot starve the others, decision 0032), so at least 2 are required there (also after the provider's tx size caps it). Failure detector heartbeats are not counted.",
   "More overlaps more network latency but uses more staging memory and completion-queue space; beyond ~8 gave nothing on the development machines.",
   "", 1, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(fabric.max_outstanding_reads)},
  {"fabric.max_read_segments", KeyType::kUint, "4",
   "Samples of one peer that one remote read may carry (a vectored fi_readmsg); capped by the provider's iov limits (4 on tcp here). shm always uses 1: its fast copy path takes one remote segment per read. 1 = one fi_read per sample.",
   "Fewer, larger operations cost fewer provider round trips and completions per sample (most for small samples); 1 is for providers whose vectored reads misbehave.",
   "", 1, 4, 0, 0, false, SHARDMIX_U32_KEY(fabric.max_read_segments)},
  {"fabric.netns", KeyType::kString, "",
   "Network namespace (a name under /run/netns) each daemon joins after MPI start-up and before opening the fabric; \"{rank}\" is replaced by the daemon's rank. \"\" = stay. For emulating a cluster on one machine (deploy/netns-cluster.sh).",
   "Lets one machine stand in for several nodes linked by a shaped network; leave empty on a real cluster.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(fabric.netns)},

  {"service.run_dir", KeyType::kString, "",
   "Directory for the daemon's socket and shared-memory names; \"\" = $SHARDMIX_RUN_DIR or /tmp/shardmix-<uid>.",
   "Must be node-local and shared by the daemon and its trainers; set it when several jobs share a node.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(service.run_dir)},
  {"service.trainers_per_node", KeyType::kUint, "1",
   "Trainer processes the daemon on each node serves (the epoch plan has nodes x trainers_per_node ranks).",
   "Must match the launch (e.g. 4 GPUs per node = 4); each trainer gets its own staging area and batch slots.",
   "", 1, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(service.trainers_per_node)},
  {"service.prefetch", KeyType::kUint, "4",
   "Batches prepared ahead and outstanding per trainer (flow-control credits).",
   "More hides fetch latency and stragglers but holds more staging memory and delays the release of cache slots.",
   "", 1, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(service.prefetch)},
  {"service.staging_bytes_per_trainer", KeyType::kSize, "256MiB",
   "Memory per trainer for samples that are not in the local cache (read from a peer or from storage). Integer bytes or a size such as \"256MiB\". Must hold the largest possible batch (checked at start-up).",
   "Staging for (prefetch + cold_readahead_batches, the latter only with cold samples) x batch.size non-local samples + shuffle.window lets the scheduler walk that far ahead; less is not an error, it only shortens the read-ahead; more RAM here is RAM taken from the cache.",
   "", 1, std::numeric_limits<std::uint64_t>::max(), 0, 0, false, SHARDMIX_U64_KEY(service.staging_bytes_per_trainer)},
  {"service.loader_threads", KeyType::kUint, "4",
   "Threads reading samples from storage (initial load and cold reads); also the threads per daemon scanning its class folders (folder format) at start-up.",
   "More threads hide parallel-file-system latency; too many compete with the trainers for CPU and the metadata server.",
   "", 1, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(service.loader_threads)},
  {"service.cold_readahead_batches", KeyType::kUint, "8",
   "Storage tier (a dataset larger than the nodes' cache.capacity): planned batches each trainer's scheduler stages beyond service.prefetch, so that reads of cold samples (cached on no node) are posted that far ahead of need and the storage readers (service.loader_threads) stay busy. Bounded by service.staging_bytes_per_trainer. Unused when every sample is cached.",
   "Deeper read-ahead hides storage latency and keeps storage at its bandwidth, but holds (prefetch + this) x batch.size non-local samples of staging per trainer; 0 = only the prefetch credits walk ahead (each cold read waits its turn behind the trainer).",
   "", 0, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(service.cold_readahead_batches)},
  {"service.open_shard_files", KeyType::kUint, "64",
   "Shard formats (webdataset, tfrecord): shard files each daemon keeps open for reading samples (start-up load, cache rotation reloads, cold reads), least recently used closed first; 0 = open the shard for every sample read. A cached descriptor is used only while its path still names the same file (one stat() per read), so a shard deleted or replaced under the job gives the same error or bytes as without the cache. Folder and filelist datasets always open per read.",
   "Each open() on a parallel file system is a metadata-server round trip; with the cache a shard costs one open (more after evictions) instead of one per sample. It holds up to that many file descriptors per daemon (it raises its soft open-files limit toward the hard one to fit them plus 64 of its own, and refuses to start naming this key if the hard limit is too low), and a deleted shard's disk space is freed only when its descriptor closes (on the next read of that shard, or by eviction).",
   "", 0, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(service.open_shard_files)},

  {"fault.peer_death", KeyType::kEnum, "stop",
   "What the surviving daemons do when a peer daemon dies or stops answering (detected within fault.peer_timeout, docs/operations.md): \"stop\" = every trainer gets an error naming the dead daemon rank and the daemons exit non-zero with that message; \"degrade\" = the survivors log the dead rank once (error level), read its samples from storage from then on (reads in flight retried from storage; the plan does not change), report it (shardmix_degraded_peers, storage_samples) and exit 0 without the shutdown barrier; the dead node's own trainers are gone, so this suits jobs whose surviving trainers can go on alone (elastic or independent trainers), not a fixed-size data-parallel job.",
   "stop never hides a fault and never hangs; degrade keeps the surviving trainers going at storage speed for the dead node's share of the samples.",
   "stop|degrade", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(fault.peer_death)},
  {"fault.peer_timeout", KeyType::kDuration, "10s",
   "A peer daemon that answers no read (heartbeat or sample) for this long is declared dead (a duration such as \"10s\"). A peer whose process died is usually found sooner: its connection breaks at the next heartbeat (one per peer every fault.peer_timeout / 10, at most 1 s).",
   "Shorter detects a dead node sooner but may declare a node dead that was only stalled (swapping, a long GC pause of a co-located process, a congested link).",
   "", 100000, std::numeric_limits<std::uint64_t>::max(), 0, 0, false, SHARDMIX_USEC_KEY(fault.peer_timeout)},

  {"inject.slow_peer_rank", KeyType::kInt, "-1",
   "Fault injection for tests and benchmarks: reads of samples owned by this daemon rank complete inject.slow_peer_delay late, as if that node were slow. -1 = none.",
   "None in production; it exists to show what shuffle.window buys under a straggling peer.",
   "", 0, 0, 0, 0, false,
   [](Config& c, const Value& v) { c.inject.slow_peer_rank = std::get<std::int64_t>(v); },
   [](const Config& c) -> Value { return c.inject.slow_peer_rank; }},
  {"inject.slow_peer_delay", KeyType::kDuration, "0ms",
   "Fault injection: the extra delay of each fetch from inject.slow_peer_rank (a duration such as \"20ms\").",
   "Larger delays make the straggler worse; 0 disables the injection.",
   "", 0, std::numeric_limits<std::uint64_t>::max(), 0, 0, false, SHARDMIX_USEC_KEY(inject.slow_peer_delay)},
  {"inject.storage_delay", KeyType::kDuration, "0ms",
   "Fault injection: each cold-sample read from storage holds its storage reader this much longer (a duration such as \"5ms\"), as a parallel file system's per-read latency would.",
   "None in production; it exists to show what service.cold_readahead_batches and service.loader_threads buy against storage latency on a machine whose storage is a warm page cache.",
   "", 0, std::numeric_limits<std::uint64_t>::max(), 0, 0, false, SHARDMIX_USEC_KEY(inject.storage_delay)},
  {"inject.load_delay", KeyType::kDuration, "0ms",
   "Fault injection: each loader thread sleeps this long after every sample it reads into the cache, as if storage were slow (a duration such as \"5ms\").",
   "Only for tests of a long load (e.g. SIGTERM while loading); 0 disables it.",
   "", 0, std::numeric_limits<std::uint64_t>::max(), 0, 0, false, SHARDMIX_USEC_KEY(inject.load_delay)},

  {"telemetry.stats_file", KeyType::kString, "",
   "Rank 0 appends, first, one job record ({\"job\": {...}}: nodes, trainers per node, dataset samples and sizes, the data-path config; shardmix-whatif rebuilds the job from it), then one JSON line per epoch of the whole job to this file (samples/s, GB/s, trainer stall, tier fractions, label entropy, affinity, Q, errors, skipped samples), once every trainer has finished the epoch; incomplete epochs are written at shutdown. \"{job}\" is replaced by the job id ($SLURM_JOB_ID, $PBS_JOBID, Open MPI's job id, else local-<pid of rank 0>). \"\" = off.",
   "Costs one small MPI message per trainer and epoch to rank 0, nothing per sample; put it on a shared file system to keep it after the job.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(telemetry.stats_file)},
  {"telemetry.prometheus_file", KeyType::kString, "",
   "Each daemon writes its counters in Prometheus text format to this file (atomically, every telemetry.interval, at each finished trainer epoch and at exit), for node_exporter's textfile collector: point it into the collector's directory and end it in \".prom\". \"{rank}\" and \"{job}\" are replaced. \"\" = off. The same text is served on demand by shardmix-stat.",
   "A file needs no port, no listener thread and no firewall rule on shared nodes; the price is a scrape delay of up to telemetry.interval plus node_exporter's own interval.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(telemetry.prometheus_file)},
  {"telemetry.interval", KeyType::kDuration, "10s",
   "How often the Prometheus file is rewritten between epoch ends (a duration such as \"10s\").",
   "Shorter gives fresher gauges (connected trainers, counters within an epoch) at the cost of more small file writes.",
   "", 1000, std::numeric_limits<std::uint64_t>::max(), 0, 0, false, SHARDMIX_USEC_KEY(telemetry.interval)},
  {"telemetry.trace_dir", KeyType::kString, "",
   "Every daemon and every trainer (the client library) records the journey of each batch and writes one Chrome trace-event JSON file here when it exits: daemon-<node>.json (epoch planning, each peer read from post to completion, storage reads, waits for staging space, epoch boundaries, staged bytes and reads in flight per peer) and trainer-<node>-<rank>.json (each wait for a batch and each hold of one, with its sample ids). Timestamps are CLOCK_REALTIME. shardmix-trace merge joins them into one file for Perfetto or chrome://tracing; shardmix-report --timeline draws it (docs/telemetry.md). Trainers learn the directory from the daemons' ready file. \"\" = off.",
   "Recording costs a clock read and a 64-byte append per event (a few per batch; bench/trace_overhead.sh measures what it costs); memory grows with the job unless telemetry.trace_sample_fraction thins it, up to telemetry.trace_max_events per thread. A node-local directory avoids a shared file system's metadata load at exit.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(telemetry.trace_dir)},
  {"telemetry.trace_sample_fraction", KeyType::kDouble, "1.0",
   "The share of batches telemetry.trace_dir records, chosen by a hash of (epoch, trainer rank, batch index), so the daemon's and the trainer's events of a batch are kept or dropped together. Planning and epoch boundaries are always recorded.",
   "1.0 records every batch (a full audit of the job); lower keeps long jobs' traces and memory small at the price of gaps between the kept batches.",
   "", 0, 0, 0.0, 1.0, false, SHARDMIX_DOUBLE_KEY(telemetry.trace_sample_fraction)},
  {"telemetry.trace_max_events", KeyType::kUint, "1048576",
   "The most trace events one recording thread keeps (64 bytes each, so 64 MiB at the default; at most 2^30). Events past the cap are dropped and counted; the process prints one warning naming both trace keys when it first happens, and the file's dropped_events says how many.",
   "Higher keeps more of a long job at 64 bytes per event per thread; a daemon records on its service thread, its fabric progress thread and each storage reader.",
   "", 1, trace::kMaxEventsPerThread, 0, 0, false, SHARDMIX_U64_KEY(telemetry.trace_max_events)},

  {"resume.checkpoint_dir", KeyType::kString, "",
   "A directory holding the checkpoint blob of every trainer rank of an earlier run (files *.ckpt, as shardmix-consume --checkpoint-dir writes them: rank-<R>.ckpt), all taken in the same epoch. At start-up the daemons re-deal the samples of that epoch that no old trainer was given among this job's trainers (any number of them), equal batch counts, each sample exactly once; trainers iterate that epoch (Client::resumed_epoch()) without a blob, later epochs follow the normal plan. \"\" = off.",
   "Needed only when the number of trainers changes: with the same world size each trainer restores its own blob (Client::epoch(e, blob)), which keeps the planned order and locality; the re-dealt epoch is a fresh global shuffle of what is left (peer reads regardless of shuffle.exchange_fraction).",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(resume.checkpoint_dir)},

  {"checkpoint.dir", KeyType::kString, "",
   "Model checkpoint absorption: the directory trainers' checkpoints (Client::save, shardmix.torch.save) drain to in the background, as <dir>/<name>/v<N>.smxckpt (temporary file, fsync, rename; a CRC32C in the header). Every daemon of the job uses it; put it on the shared file system. \"\" = off: a trainer's save is refused naming this key.",
   "A save returns once the bytes are in the node's RAM and in one peer daemon's RAM (a memory copy and a fabric read) instead of after the file system's write; the price is checkpoint.capacity of RAM taken from the cache, and a window in which the newest version is only in the RAM of two daemons (wait_durable closes it).",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(checkpoint.dir)},
  {"checkpoint.capacity", KeyType::kSize, "2GiB",
   "checkpoint.dir set: RAM per node for checkpoint versions not yet drained, the newest checkpoint.retain of each name, and the replicas this daemon holds for its peers. Taken from cache.capacity: the cache arena gets cache.capacity minus this (an error naming both keys if nothing is left). Integer bytes or a size such as \"8GiB\".",
   "More absorbs larger or more frequent checkpoints without back-pressure on save; every byte of it is a byte less of dataset cache (more storage reads when the dataset does not fit).",
   "", 1, std::numeric_limits<std::uint64_t>::max(), 0, 0, false, SHARDMIX_U64_KEY(checkpoint.capacity_bytes)},
  {"checkpoint.retain", KeyType::kUint, "2",
   "checkpoint.dir set: the newest versions of each checkpoint name kept, in RAM (once durable) and on disk (older files are removed after a newer version is durable).",
   "More keeps older versions to fall back to (a diverged run) at the cost of RAM and disk; 1 keeps only the newest.",
   "", 1, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(checkpoint.retain)},
  {"checkpoint.when_full", KeyType::kEnum, "wait",
   "checkpoint.dir set: a save that does not fit in checkpoint.capacity: \"wait\" = it waits, in order, until the drain frees room (a version larger than checkpoint.capacity is refused with an error naming that key); \"write_through\" = it is written straight to checkpoint.dir and returns when durable.",
   "wait bounds RAM and keeps saves fast while the drain keeps up; write_through never blocks on RAM but a save then costs the file system's write time, as without ShardMix.",
   "wait|write_through", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(checkpoint.when_full)},
  {"checkpoint.prefault", KeyType::kBool, "true",
   "checkpoint.dir set: true = the daemon allocates and zeroes all of checkpoint.capacity's pages at start, in the background (on Linux before 5.14, which lacks MADV_POPULATE_WRITE, it only allocates them, and each is zeroed at its first write), and keeps them for every checkpoint version it holds (its trainers' saves, its peers' replicas); false = each page is allocated when a version first needs it, and kept from then on. Either way the pages are reused from version to version (docs/decisions/0068).",
   "true makes the first save as fast as the later ones (a fresh page costs more than a copy into one already there: zeroing, and in a virtual machine a fault in the host) and a node that cannot give the memory says so in the log at start rather than at the first save; false leaves checkpoint.capacity unallocated until checkpoints need it.",
   "", 0, 0, 0, 0, false,
   [](Config& c, const Value& v) { c.checkpoint.prefault = std::get<bool>(v); },
   [](const Config& c) -> Value { return c.checkpoint.prefault; }},

  {"log.level", KeyType::kEnum, "info",
   "Daemon log level.",
   "debug/trace explain every decision but are verbose on many nodes; warn keeps logs short.",
   "trace|debug|info|warn|error", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(log.level)},
  {"log.components", KeyType::kString, "",
   "Per-component levels overriding log.level, as \"component=level\" pairs separated by commas, e.g. \"fabric=debug,service=warn\". Components: daemon, loader, fabric, service, telemetry.",
   "Debug one part of the daemon without drowning in the others' lines.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(log.components)},

  {"sim.link_gbps", KeyType::kDouble, "72.0",
   "Simulator only (shardmix-sim, docs/simulator.md): each node's NIC bandwidth in gigabits per second, per direction; a node's peer reads queue on its own link and on each owner's link. Default: about the 8.7-9.3 GB/s of raw tcp fi_read measured on a 16-core machine with one core per process.",
   "A faster link makes peer reads cheaper, so a higher shuffle.exchange_fraction costs less stall.",
   "", 0, 0, 1e-6, 1e9, false,
   [](Config& c, const Value& v) { c.sim.link_gbps = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.link_gbps; }},
  {"sim.link_latency_us", KeyType::kDouble, "15.0",
   "Simulator only: the latency of one read group (a batch's reads from peers), in microseconds, added once per group. Default: a busy-poll 64 B TCP round trip measured on a 16-core machine.",
   "Higher latency needs deeper service.prefetch to hide.",
   "", 0, 0, 0.0, 1e9, false,
   [](Config& c, const Value& v) { c.sim.link_latency_us = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.link_latency_us; }},
  {"sim.storage_gbps", KeyType::kDouble, "11.0",
   "Simulator only: each node's read bandwidth from storage in gigabits per second (cold samples, degraded reads and the modelled start-up load). Default: the 1.37 GB/s of 16 threads of cold reads measured on a 16-core machine.",
   "Slower storage makes cold samples and a dead peer's share stall trainers.",
   "", 0, 0, 1e-6, 1e9, false,
   [](Config& c, const Value& v) { c.sim.storage_gbps = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.storage_gbps; }},
  {"sim.storage_iops", KeyType::kDouble, "12000.0",
   "Simulator only: each node's storage reads per second; a group of k reads of B bytes takes max(B / bandwidth, k / IOPS). Default: 1.37 GB/s of 112 KiB reads.",
   "Few IOPS make small samples expensive to read from storage.",
   "", 0, 0, 1e-6, 1e12, false,
   [](Config& c, const Value& v) { c.sim.storage_iops = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.storage_iops; }},
  {"sim.trainer_samples_per_s", KeyType::kDouble, "2500.0",
   "Simulator only: how many samples one trainer computes per second (a batch takes batch size / this). Not measured (no GPU where ShardMix was measured): about one modern GPU on ResNet-50.",
   "Faster trainers need more input bandwidth per node.",
   "", 0, 0, 1e-6, 1e12, false,
   [](Config& c, const Value& v) { c.sim.trainer_samples_per_s = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.trainer_samples_per_s; }},
  {"sim.service_us_per_sample", KeyType::kDouble, "0.0",
   "Simulator only: CPU microseconds a daemon spends per sample it delivers to its trainers (staging, descriptors, the socket), one sample after another per node: a batch of n samples reaches its trainer n x this after the node's previous batch was served. 0 = free (the default; the daemons' CPU is not modelled).",
   "Where daemons and trainers share few cores, a data-bound job is bound by this CPU rather than by the link or storage.",
   "", 0, 0, 0.0, 1e9, false,
   [](Config& c, const Value& v) { c.sim.service_us_per_sample = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.service_us_per_sample; }},
  {"sim.straggler_fraction", KeyType::kDouble, "0.0",
   "Simulator only: the share of trainers (chosen with sim.dataset_seed) whose compute takes sim.straggler_factor times longer.",
   "Stragglers slow every synchronous step; they test how the pipeline copes, not the pipeline itself.",
   "", 0, 0, 0.0, 1.0, false,
   [](Config& c, const Value& v) { c.sim.straggler_fraction = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.straggler_fraction; }},
  {"sim.straggler_factor", KeyType::kDouble, "1.0",
   "Simulator only: compute time multiplier of a straggling trainer.",
   "1 = no stragglers.",
   "", 0, 0, 1.0, 1e6, false,
   [](Config& c, const Value& v) { c.sim.straggler_factor = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.straggler_factor; }},
  {"sim.fault_node", KeyType::kInt, "-1",
   "Simulator only: this node dies at sim.fault_time_s (its trainers stop; with fault.peer_death = degrade the survivors read its share from storage after fault.peer_timeout). -1 = none.",
   "Shows the detect time and what degraded mode costs.",
   "", 0, 0, 0, 0, false,
   [](Config& c, const Value& v) { c.sim.fault_node = std::get<std::int64_t>(v); },
   [](const Config& c) -> Value { return c.sim.fault_node; }},
  {"sim.fault_time_s", KeyType::kDouble, "0.0",
   "Simulator only: the simulated time, in seconds from the first epoch's start, at which sim.fault_node dies.",
   "Earlier faults leave more of the run degraded.",
   "", 0, 0, 0.0, 1e12, false,
   [](Config& c, const Value& v) { c.sim.fault_time_s = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.fault_time_s; }},
  {"sim.slow_link_node", KeyType::kInt, "-1",
   "Simulator only: this node's link bandwidth is divided by sim.slow_link_factor (-1 = none).",
   "Shows what one slow link costs a synchronous job.",
   "", 0, 0, 0, 0, false,
   [](Config& c, const Value& v) { c.sim.slow_link_node = std::get<std::int64_t>(v); },
   [](const Config& c) -> Value { return c.sim.slow_link_node; }},
  {"sim.slow_link_factor", KeyType::kDouble, "1.0",
   "Simulator only: the divisor of sim.slow_link_node's link bandwidth.",
   "1 = not slow.",
   "", 0, 0, 1.0, 1e9, false,
   [](Config& c, const Value& v) { c.sim.slow_link_factor = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.slow_link_factor; }},
  {"sim.classes", KeyType::kUint, "1000",
   "Simulator only: the number of labels of the synthetic dataset (drawn uniformly; ids are in label order, like a scanned catalog).",
   "More classes make micro-batch label entropy harder to reach at low exchange_fraction.",
   "", 1, kU32Max, 0, 0, false, SHARDMIX_U32_KEY(sim.classes)},
  {"sim.size_sigma", KeyType::kDouble, "0.5",
   "Simulator only: sample sizes are lognormal with median --median-kib and this sigma of ln(size).",
   "0 = every sample the same size; larger spreads sizes (and balanced placement has more to balance).",
   "", 0, 0, 0.0, 10.0, false,
   [](Config& c, const Value& v) { c.sim.size_sigma = std::get<double>(v); },
   [](const Config& c) -> Value { return c.sim.size_sigma; }},
  {"sim.dataset_seed", KeyType::kUint, "1",
   "Simulator only: seed of the synthetic sizes and labels and of the straggler choice (shuffle.seed still seeds the plans).",
   "Same seed and parameters = the same simulated dataset.",
   "", 0, kI64Max, 0, 0, false, SHARDMIX_U64_KEY(sim.dataset_seed)},
  {"sim.samples_per_shard", KeyType::kUint, "0",
   "Simulator only: 0 = a compact synthetic catalog (sizes and labels, 12 bytes a sample); N = the catalog of a shard format (webdataset, tfrecord) with N samples per shard: a shard index and an offset per sample and the shard paths, as the daemons of such a job hold it.",
   "Set it to compare the simulator's metadata_bytes_per_node_max with a real shard job's (bench/metadata.sh).",
   "", 0, kU32Max, 0, 0, false, SHARDMIX_U64_KEY(sim.samples_per_shard)},
  {"storage.s3.endpoint", KeyType::kString, "",
   "dataset.path = \"s3://BUCKET/PREFIX\": the S3 endpoint URL, such as \"http://127.0.0.1:9000\" or \"https://s3.eu-west-1.amazonaws.com\". \"\" = AWS_ENDPOINT_URL, else AWS's endpoint for the region (docs/s3.md).",
   "Point it at the store nearest the nodes: each request pays its round trip, which storage.s3.concurrency hides only up to the store's request rate.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(dataset.s3.endpoint)},
  {"storage.s3.addressing", KeyType::kEnum, "auto",
   "How the bucket is named in a request: \"path\" = ENDPOINT/BUCKET/KEY; \"virtual\" = BUCKET.ENDPOINT-HOST/KEY; \"auto\" = path-style for an endpoint given as an IP address or localhost (local and on-premises stores), else virtual-host.",
   "AWS is phasing out path-style for new buckets; many on-premises stores (Ceph RGW, MinIO) answer path-style without DNS set up for bucket names.",
   "auto|path|virtual", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(dataset.s3.addressing)},
  {"storage.s3.region", KeyType::kString, "",
   "The region requests are signed for (SigV4). \"\" = AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1.",
   "A wrong region is refused by the store with an error naming the endpoint; no trade-off beyond that.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(dataset.s3.region)},
  {"storage.s3.concurrency", KeyType::kUint, "64",
   "S3 requests each daemon keeps in flight (listing, scanning, the initial load and cold reads share them); driven by one thread over libcurl's multi interface, connections reused.",
   "Object stores answer each request in tens of milliseconds, so throughput is about concurrency x object size / latency until the store or the link saturates; more requests in flight cost a connection and a socket each and can draw 503 SlowDown throttling (retried with backoff).",
   "", 1, 4096, 0, 0, false, SHARDMIX_U32_KEY(dataset.s3.concurrency)},
  {"storage.s3.profile", KeyType::kString, "",
   "Credentials profile read from the credentials file (storage.s3.credentials_file). \"\" = AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) when set, else AWS_PROFILE, else profile \"default\". Secrets are never config keys.",
   "A profile keeps keys out of the job's environment; the environment suits short-lived session credentials.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(dataset.s3.profile)},
  {"storage.s3.connect_timeout", KeyType::kDuration, "5s",
   "Limit on opening one connection to the S3 endpoint; a timeout is retried like a reset.",
   "Short finds a dead endpoint fast; too short fails on a busy store's accept queue.",
   "", 1, std::numeric_limits<std::uint64_t>::max(), 0, 0, false, SHARDMIX_USEC_KEY(dataset.s3.connect_timeout)},
  {"storage.s3.credentials_file", KeyType::kString, "",
   "The AWS credentials file (INI: [profile] with aws_access_key_id, aws_secret_access_key, aws_session_token). \"\" = AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials.",
   "None; a per-job file keeps one job's keys apart from another's.",
   "", 0, 0, 0, 0, false, SHARDMIX_STR_KEY(dataset.s3.credentials_file)},
  {"storage.s3.max_attempts", KeyType::kUint, "6",
   "Attempts per S3 request before it fails for good: throttling (503 SlowDown, 429), other 5xx, timeouts and connection resets are retried after a jittered exponential backoff (50 ms doubling, at most 5 s); other 4xx are final. A request that still fails follows dataset.strict.",
   "More attempts ride out longer store hiccups but delay the error for an object that is really gone or broken.",
   "", 1, 100, 0, 0, false, SHARDMIX_U32_KEY(dataset.s3.max_attempts)},
  {"storage.s3.request_timeout", KeyType::kDuration, "60s",
   "Limit on one S3 request from start to the last byte; a timeout is retried.",
   "Must exceed the largest object's transfer time at the slowest expected rate; shorter abandons stuck requests sooner.",
   "", 1, std::numeric_limits<std::uint64_t>::max(), 0, 0, false, SHARDMIX_USEC_KEY(dataset.s3.request_timeout)},
  {"storage.s3.merge_gap", KeyType::kSize, "64KiB",
   "Shard formats (webdataset, tfrecord) on S3: samples of one shard object read together (the initial load, a batch's cold reads) whose ranges are at most this many bytes apart are fetched by one ranged GET; the bytes between are received and dropped. Integer bytes or a size such as \"64KiB\".",
   "Each GET saved is a round trip (tens of ms on S3) and a request the store counts against its rate; each byte of gap is transferred for nothing. Loading reads whole shards, whose gaps are the framing and the other members of a sample (about 1 KiB in a tar); cold reads of a batch are rarely near each other.",
   "", 0, 1ull << 30, 0, 0, false, SHARDMIX_U64_KEY(dataset.s3.merge_gap)},  // 1 GiB of unwanted bytes is never worth a request
  {"storage.s3.merge_max", KeyType::kSize, "16MiB",
   "Shard formats on S3: the largest ranged GET that merged samples make (storage.s3.merge_gap); a longer run of samples is split into GETs of at most this size. 0 = one GET per sample.",
   "Larger means fewer requests; smaller keeps more of storage.s3.concurrency busy on a few large shards and retries less after a failed transfer.",
   "", 0, 1ull << 36, 0, 0, false, SHARDMIX_U64_KEY(dataset.s3.merge_max)},  // 64 GiB: beyond any shard one GET should fetch
};
// clang-format on

#undef SHARDMIX_U32_KEY
#undef SHARDMIX_U64_KEY
#undef SHARDMIX_STR_KEY
#undef SHARDMIX_USEC_KEY

// A key's section is all before its last dot: "storage.s3.concurrency" is key concurrency of
// section [storage.s3] (a TOML table inside table storage).
std::string_view section_of(std::string_view name) { return name.substr(0, name.rfind('.')); }
std::string_view leaf_of(std::string_view name) { return name.substr(name.rfind('.') + 1); }

std::string env_name_of(std::string_view name) {
  std::string env = "SHARDMIX_";
  for (char ch : name) env += ch == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return env;
}

const KeySpec* find_key(std::string_view name) {
  for (const KeySpec& key : kKeys) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

std::vector<std::string_view> sections() {
  std::vector<std::string_view> out;
  for (const KeySpec& key : kKeys) {
    if (std::find(out.begin(), out.end(), section_of(key.name)) == out.end()) out.push_back(section_of(key.name));
  }
  return out;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// "; did you mean 'batch.size'?" or "".
std::string suggestion(std::string_view unknown, bool as_env) {
  std::string best;
  std::size_t best_distance = 4;  // suggest only close matches
  for (const KeySpec& key : kKeys) {
    const std::string candidate = as_env ? env_name_of(key.name) : std::string(key.name);
    const std::size_t d = edit_distance(unknown, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = as_env ? fmt::format("{} (for {})", candidate, key.name) : candidate;
    }
  }
  if (!as_env && unknown.find('.') == std::string_view::npos) {  // a section name
    for (const std::string_view section : sections()) {
      const std::size_t d = edit_distance(unknown, section);
      if (d < best_distance) {
        best_distance = d;
        best = std::string(section);
      }
    }
  }
  if (best.empty()) return "";
  return as_env ? fmt::format("; did you mean {}?", best) : fmt::format("; did you mean '{}'?", best);
}

std::string_view type_name(KeyType type) {
  switch (type) {
    case KeyType::kString: return "string";
    case KeyType::kInt: return "int";
    case KeyType::kUint: return "uint";
    case KeyType::kBool: return "bool";
    case KeyType::kDouble: return "double";
    case KeyType::kSize: return "size";
    case KeyType::kDuration: return "duration";
    case KeyType::kCapacity: return "size or fraction";
    case KeyType::kEnum: return "enum";
  }
  return "?";
}

// What the key accepts, for error messages.
std::string expectation(const KeySpec& key) {
  switch (key.type) {
    case KeyType::kString: return "a string";
    case KeyType::kInt: return "an integer";
    case KeyType::kUint: return fmt::format("an integer in {}..{}", key.min_uint, key.max_uint);
    case KeyType::kBool: return "a boolean (true or false)";
    case KeyType::kDouble: return "a number";
    case KeyType::kSize: return "a size (integer bytes or a string such as \"64MiB\")";
    case KeyType::kDuration: return "a duration with a unit (a string such as \"250ms\", \"1.5s\", \"100us\")";
    case KeyType::kCapacity:
      return "integer bytes, a size string such as \"8GiB\", or a fraction of RAM such as 0.5";
    case KeyType::kEnum: {
      std::string choices(key.choices);
      std::replace(choices.begin(), choices.end(), '|', ',');
      return fmt::format("one of {{{}}}", choices);
    }
  }
  return "?";
}

std::string_view trim(std::string_view s) {
  const auto not_space = [](char c) { return c != ' ' && c != '\t' && c != '\r' && c != '\n'; };
  while (!s.empty() && !not_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && !not_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Decimal or 0x-hex unsigned integer, whole string.
std::optional<std::uint64_t> parse_uint_text(std::string_view s) {
  s = trim(s);
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  if (s.empty() || s[0] == '-' || s[0] == '+') return std::nullopt;
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<std::int64_t> parse_int_text(std::string_view s) {
  s = trim(s);
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 10);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_double_text(std::string_view s) {
  s = trim(s);
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// Shortest text that reads back to the same double and that TOML reads as a float.
std::string double_text(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // "1" -> "1.0"; inf/nan keep
  return s;
}

// A decimal number "12", "1.5" (no sign, no exponent) split for exact scaling.
struct Decimal {
  std::uint64_t integer = 0;
  std::uint64_t fraction = 0;     // digits after the point
  std::uint64_t fraction_scale = 1;  // 10^digits
};
std::optional<Decimal> parse_decimal(std::string_view s) {
  Decimal d;
  const std::size_t dot = s.find('.');
  const std::string_view int_part = s.substr(0, dot);
  const std::string_view frac_part = dot == std::string_view::npos ? std::string_view() : s.substr(dot + 1);
  if (int_part.empty() && frac_part.empty()) return std::nullopt;
  if (!int_part.empty()) {
    if (!all_digits(int_part)) return std::nullopt;
    auto [ptr, ec] = std::from_chars(int_part.data(), int_part.data() + int_part.size(), d.integer);
    if (ec != std::errc()) return std::nullopt;
  }
  if (dot != std::string_view::npos) {
    if (frac_part.empty() || !all_digits(frac_part) || frac_part.size() > 18) return std::nullopt;
    std::from_chars(frac_part.data(), frac_part.data() + frac_part.size(), d.fraction);
    for (std::size_t i = 0; i < frac_part.size(); ++i) d.fraction_scale *= 10;
  }
  return d;
}

constexpr std::string_view kSizeUnitsHelp =
    "write bytes or a number with a unit: B, KB, KiB, MB, MiB, GB, GiB, TB, TiB";

// Bytes, or why `text` is not a size.
std::variant<std::uint64_t, std::string> size_or_reason(std::string_view text) {
  const std::string_view s = trim(text);
  std::size_t unit_start = 0;
  while (unit_start < s.size() && ((s[unit_start] >= '0' && s[unit_start] <= '9') || s[unit_start] == '.')) {
    ++unit_start;
  }
  const std::string_view number = s.substr(0, unit_start);
  const std::string unit = lower(trim(s.substr(unit_start)));
  if (number.empty()) return std::string(s.starts_with('-') ? "negative" : "no number");
  const auto decimal = parse_decimal(number);
  if (!decimal) return std::string("malformed number");
  static constexpr std::pair<std::string_view, std::uint64_t> kUnits[] = {
      {"", 1},          {"b", 1},           {"kb", 1000},     {"kib", 1ull << 10},      {"mb", 1000000},
      {"mib", 1ull << 20}, {"gb", 1000000000}, {"gib", 1ull << 30}, {"tb", 1000000000000ull}, {"tib", 1ull << 40},
  };
  std::uint64_t multiplier = 0;
  for (const auto& [name, mult] : kUnits) {
    if (unit == name) multiplier = mult;
  }
  if (multiplier == 0) return fmt::format("unknown unit '{}'", unit);
  // Exact: (integer * scale + fraction) * multiplier / scale, rounded down to whole bytes.
  // At most 2^63 - 1: a TOML integer is signed 64-bit, so a larger size could not be printed
  // into a config that loads again (the config fuzzer found 10446744073709551614).
  using U128 = unsigned __int128;
  constexpr U128 kMax = std::numeric_limits<std::int64_t>::max();
  if (static_cast<U128>(decimal->integer) * multiplier > kMax) return std::string("too large");
  const U128 scaled = (static_cast<U128>(decimal->integer) * decimal->fraction_scale + decimal->fraction) * multiplier;
  const U128 bytes = scaled / decimal->fraction_scale;
  if (bytes > kMax) return std::string("too large");
  return static_cast<std::uint64_t>(bytes);
}

constexpr std::string_view kDurationUnitsHelp = "write a number with a unit: us, ms, s, min, h";

// Microseconds (rounded down), or why `text` is not a duration. A unit is required except
// for a bare 0: "20" could mean seconds or milliseconds, and guessing wrong is silent.
std::variant<std::uint64_t, std::string> duration_or_reason(std::string_view text) {
  const std::string_view s = trim(text);
  std::size_t unit_start = 0;
  while (unit_start < s.size() && ((s[unit_start] >= '0' && s[unit_start] <= '9') || s[unit_start] == '.')) {
    ++unit_start;
  }
  const std::string_view number = s.substr(0, unit_start);
  const std::string unit = lower(trim(s.substr(unit_start)));
  if (number.empty()) return std::string(s.starts_with('-') ? "negative" : "no number");
  const auto decimal = parse_decimal(number);
  if (!decimal) return std::string("malformed number");
  static constexpr std::pair<std::string_view, std::uint64_t> kUnits[] = {
      {"us", 1}, {"ms", 1000}, {"s", 1000000}, {"min", 60000000}, {"h", 3600000000ull}};
  std::uint64_t multiplier = 0;
  for (const auto& [name, mult] : kUnits) {
    if (unit == name) multiplier = mult;
  }
  if (unit.empty() && decimal->integer == 0 && decimal->fraction == 0) return std::uint64_t{0};
  if (unit.empty()) return std::string("missing unit");
  if (multiplier == 0) return fmt::format("unknown unit '{}'", unit);
  using U128 = unsigned __int128;
  constexpr U128 kMax = std::numeric_limits<std::uint64_t>::max();
  if (static_cast<U128>(decimal->integer) * multiplier > kMax) return std::string("too large");
  const U128 usec =
      (static_cast<U128>(decimal->integer) * decimal->fraction_scale + decimal->fraction) * multiplier /
      decimal->fraction_scale;
  if (usec > kMax) return std::string("too large");
  return static_cast<std::uint64_t>(usec);
}

// A duration as printed back: the largest unit that divides it exactly.
std::string duration_text(std::uint64_t usec) {
  static constexpr std::pair<std::uint64_t, std::string_view> kUnits[] = {
      {3600000000ull, "h"}, {60000000, "min"}, {1000000, "s"}, {1000, "ms"}};
  if (usec == 0) return "0ms";
  for (const auto& [unit, name] : kUnits) {
    if (usec % unit == 0) return fmt::format("{}{}", usec / unit, name);
  }
  return fmt::format("{}us", usec);
}

bool is_fraction_text(std::string_view s) {
  // A number with a decimal point or exponent and no unit: "0.5", "1.0", "5e-1".
  s = trim(s);
  if (all_digits(s)) return false;
  return parse_double_text(s).has_value();
}

Result<Capacity> parse_capacity(std::string_view text) {
  const std::string_view s = trim(text);
  Capacity cap;
  if (all_digits(s)) {
    auto v = parse_uint_text(s);
    if (!v) return make_error(StatusCode::kInvalidArgument, "'{}' is out of range", s);
    cap.bytes = *v;
    cap.text = std::to_string(*v);
    return cap;
  }
  if (auto fraction = parse_double_text(s)) {
    const double x = *fraction;
    if (!(x > 0.0 && x <= 1.0)) {
      return make_error(StatusCode::kInvalidArgument,
                        "fraction of RAM {} is not in (0, 1] (write absolute sizes with a unit, e.g. \"8GiB\")", s);
    }
    cap.bytes = static_cast<std::uint64_t>(std::floor(x * static_cast<double>(physical_ram_bytes())));
    if (cap.bytes == 0) cap.bytes = 1;  // a fraction never means "no limit"
    cap.text = double_text(x);
    return cap;
  }
  auto size = size_or_reason(s);
  if (auto* why = std::get_if<std::string>(&size)) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not a size or a fraction of RAM: {} ({})", s, *why,
                      kSizeUnitsHelp);
  }
  cap.bytes = std::get<std::uint64_t>(size);
  cap.text = std::string(s);
  return cap;
}

// Size as printed back: a binary unit when exact (readable), else integer bytes.
std::string size_toml(std::uint64_t bytes) {
  static constexpr std::pair<std::uint64_t, std::string_view> kUnits[] = {
      {1ull << 40, "TiB"}, {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  if (bytes != 0) {
    for (const auto& [unit, name] : kUnits) {
      if (bytes % unit == 0) return fmt::format("\"{}{}\"", bytes / unit, name);
    }
  }
  return std::to_string(bytes);
}

std::string toml_quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04X}", c);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

std::string value_toml(const KeySpec& key, const Value& v) {
  switch (key.type) {
    case KeyType::kString:
    case KeyType::kEnum: return toml_quote(as_str(v));
    case KeyType::kInt: return std::to_string(std::get<std::int64_t>(v));
    case KeyType::kUint: return std::to_string(as_u64(v));
    case KeyType::kBool: return std::get<bool>(v) ? "true" : "false";
    case KeyType::kDouble: return double_text(std::get<double>(v));
    case KeyType::kSize: return size_toml(as_u64(v));
    case KeyType::kDuration: return toml_quote(duration_text(as_u64(v)));
    case KeyType::kCapacity: {
      const std::string& text = as_str(v);
      if (all_digits(text)) return text;                  // integer bytes
      if (is_fraction_text(text)) return double_text(*parse_double_text(text));  // float
      return toml_quote(text);                            // "8GiB"
    }
  }
  return "?";
}

bool enum_allows(const KeySpec& key, std::string_view value) {
  std::string_view choices = key.choices;
  while (!choices.empty()) {
    const std::size_t bar = choices.find('|');
    if (choices.substr(0, bar) == value) return true;
    if (bar == std::string_view::npos) break;
    choices.remove_prefix(bar + 1);
  }
  return false;
}

Status wrong_value(const KeySpec& key, std::string_view where, std::string_view got) {
  return make_error(StatusCode::kInvalidArgument, "config key '{}' {} expects {} (type {}), got {}", key.name,
                    where, expectation(key), type_name(key.type), got);
}

// Parses a value written as text (env var, --set, table default).
// Well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points above U+10FFFF).
bool is_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (std::size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

Result<Value> value_from_text(const KeySpec& key, std::string_view text, std::string_view where) {
  const auto got = [&] { return fmt::format("'{}'", text); };
  switch (key.type) {
    case KeyType::kString:
      // TOML holds only UTF-8, so anything else could not be printed back (--print-config).
      if (!is_utf8(text)) {
        return make_error(StatusCode::kInvalidArgument, "config key '{}' {}: the value is not valid UTF-8",
                          key.name, where);
      }
      return Value(std::string(text));
    case KeyType::kEnum: {
      const std::string v(trim(text));
      if (!enum_allows(key, v)) return wrong_value(key, where, got());
      return Value(v);
    }
    case KeyType::kInt: {
      auto v = parse_int_text(text);
      if (!v) return wrong_value(key, where, got());
      return Value(*v);
    }
    case KeyType::kUint: {
      auto v = parse_uint_text(text);
      if (!v || *v > key.max_uint) return wrong_value(key, where, got());
      return Value(*v);
    }
    case KeyType::kBool: {
      const std::string v = lower(trim(text));
      if (v == "true" || v == "1" || v == "yes" || v == "on") return Value(true);
      if (v == "false" || v == "0" || v == "no" || v == "off") return Value(false);
      return wrong_value(key, where, got());
    }
    case KeyType::kDouble: {
      auto v = parse_double_text(text);
      if (!v) return wrong_value(key, where, got());
      return Value(*v);
    }
    case KeyType::kSize: {
      auto size = size_or_reason(text);
      if (auto* why = std::get_if<std::string>(&size)) {
        return make_error(StatusCode::kInvalidArgument, "config key '{}' {}: '{}' is not a size: {} ({})", key.name,
                          where, text, *why, kSizeUnitsHelp);
      }
      if (std::get<std::uint64_t>(size) > key.max_uint) return wrong_value(key, where, got());
      return Value(std::get<std::uint64_t>(size));
    }
    case KeyType::kDuration: {
      auto usec = duration_or_reason(text);
      if (auto* why = std::get_if<std::string>(&usec)) {
        return make_error(StatusCode::kInvalidArgument, "config key '{}' {}: '{}' is not a duration: {} ({})",
                          key.name, where, text, *why, kDurationUnitsHelp);
      }
      return Value(std::get<std::uint64_t>(usec));
    }
    case KeyType::kCapacity: {
      auto cap = parse_capacity(text);
      if (!cap.ok()) {
        return make_error(StatusCode::kInvalidArgument, "config key '{}' {}: {}", key.name, where,
                          cap.status().message());
      }
      return Value(cap->text);
    }
  }
  return make_error(StatusCode::kInternal, "unhandled key type for '{}'", key.name);
}

std::string describe_node(const toml::node& node) {
  std::ostringstream os;
  switch (node.type()) {
    case toml::node_type::table: os << "a table"; break;
    case toml::node_type::array: os << "an array " << *node.as_array(); break;
    case toml::node_type::string: os << "string " << *node.as_string(); break;
    case toml::node_type::integer: os << "integer " << *node.as_integer(); break;
    case toml::node_type::floating_point: os << "float " << *node.as_floating_point(); break;
    case toml::node_type::boolean: os << "boolean " << *node.as_boolean(); break;
    case toml::node_type::date: os << "date " << *node.as_date(); break;
    case toml::node_type::time: os << "time " << *node.as_time(); break;
    case toml::node_type::date_time: os << "date-time " << *node.as_date_time(); break;
    default: os << "nothing"; break;
  }
  std::string s = os.str();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Parses a TOML value according to the key's type.
Result<Value> value_from_toml(const KeySpec& key, const toml::node& node, std::string_view where) {
  const auto wrong = [&] { return wrong_value(key, where, describe_node(node)); };
  switch (key.type) {
    case KeyType::kString:
      if (auto s = node.as_string()) return Value(std::string(s->get()));
      return wrong();
    case KeyType::kEnum:
      if (auto s = node.as_string(); s && enum_allows(key, s->get())) return Value(std::string(s->get()));
      return wrong();
    case KeyType::kInt:
      if (auto i = node.as_integer()) return Value(std::int64_t{i->get()});
      return wrong();
    case KeyType::kUint:
      if (auto i = node.as_integer(); i && i->get() >= 0 && static_cast<std::uint64_t>(i->get()) <= key.max_uint) {
        return Value(static_cast<std::uint64_t>(i->get()));
      }
      return wrong();
    case KeyType::kBool:
      if (auto b = node.as_boolean()) return Value(b->get());
      return wrong();
    case KeyType::kDouble:
      if (auto f = node.as_floating_point()) return Value(f->get());
      if (auto i = node.as_integer()) return Value(static_cast<double>(i->get()));
      return wrong();
    case KeyType::kSize:
      if (auto i = node.as_integer(); i && i->get() >= 0) return Value(static_cast<std::uint64_t>(i->get()));
      if (auto s = node.as_string()) return value_from_text(key, s->get(), where);
      return wrong();
    case KeyType::kDuration:
      if (auto i = node.as_integer(); i && i->get() == 0) return Value(std::uint64_t{0});
      if (auto s = node.as_string()) return value_from_text(key, s->get(), where);
      return wrong();
    case KeyType::kCapacity:
      if (auto i = node.as_integer(); i && i->get() >= 0) return value_from_text(key, std::to_string(i->get()), where);
      if (auto f = node.as_floating_point()) return value_from_text(key, double_text(f->get()), where);
      if (auto s = node.as_string()) return value_from_text(key, s->get(), where);
      return wrong();
  }
  return make_error(StatusCode::kInternal, "unhandled key type for '{}'", key.name);
}

// Where each key's current value came from, for validation messages.
using Origins = std::map<std::string_view, std::string>;

void apply(Config& config, Origins& origins, const KeySpec& key, const Value& value, std::string origin) {
  key.set(config, value);
  origins[key.name] = std::move(origin);
}

std::string where_in_file(const std::string& file, const toml::source_region& region) {
  if (region.begin.line == 0) return fmt::format("in {}", file);
  return fmt::format("in {}:{}", file, region.begin.line);
}

Status load_file(const std::string& file, Config& config, Origins& origins) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    return make_error(StatusCode::kNotFound, "config file '{}' does not exist", file);
  }
  toml::table root;
  try {
    root = toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    return make_error(StatusCode::kInvalidArgument, "{}:{}:{}: invalid TOML: {}", file, e.source().begin.line,
                      e.source().begin.column, e.description());
  } catch (const std::exception& e) {
    return make_error(StatusCode::kIoError, "config file '{}': {}", file, e.what());
  }
  const std::vector<std::string_view> known_sections = sections();
  auto known = [&](std::string_view section) {
    return std::find(known_sections.begin(), known_sections.end(), section) != known_sections.end();
  };
  // A table that holds only sections ([storage] holding [storage.s3]).
  auto is_parent = [&](std::string_view section) {
    return std::any_of(known_sections.begin(), known_sections.end(), [&](std::string_view s) {
      return s.size() > section.size() && s.starts_with(section) && s[section.size()] == '.';
    });
  };
  std::function<Status(const std::string&, const toml::node&, const toml::source_region&)> load_section =
      [&](const std::string& section, const toml::node& section_node, const toml::source_region& source) -> Status {
    const std::string where = where_in_file(file, source);
    if (!known(section) && !is_parent(section)) {
      return make_error(StatusCode::kInvalidArgument, "unknown config key '{}' {}{}", section, where,
                        suggestion(section, false));
    }
    const toml::table* table = section_node.as_table();
    if (table == nullptr) {
      return make_error(StatusCode::kInvalidArgument, "config key '{}' {} must be a table [{}], got {}", section,
                        where, section, describe_node(section_node));
    }
    for (auto&& [leaf_key, node] : *table) {
      const std::string name = fmt::format("{}.{}", section, leaf_key.str());
      if (node.is_table() && (known(name) || is_parent(name))) {
        SHARDMIX_RETURN_IF_ERROR(load_section(name, node, leaf_key.source()));
        continue;
      }
      const std::string key_where = where_in_file(file, leaf_key.source());
      const KeySpec* key = find_key(name);
      if (key == nullptr) {
        return make_error(StatusCode::kInvalidArgument, "unknown config key '{}' {}{}", name, key_where,
                          suggestion(name, false));
      }
      SHARDMIX_ASSIGN_OR_RETURN(Value value, value_from_toml(*key, node, key_where));
      apply(config, origins, *key, value, key_where);
    }
    return Status::ok_status();
  };
  for (auto&& [section_key, section_node] : root) {
    SHARDMIX_RETURN_IF_ERROR(load_section(std::string(section_key.str()), section_node, section_key.source()));
  }
  return Status::ok_status();
}

// An env name that is meant as a config key: it starts with a section's prefix
// (SHARDMIX_BATCH_...) or is a near miss of a key's env name (SHARDMIX_BATHC_SIZE).
// Other SHARDMIX_* names belong to other tools (the launch scripts' SHARDMIX_READY_TIMEOUT,
// SHARDMIX_DAEMON_CMD, SHARDMIX_BUILD_DIR, ...) and pass through the daemon's environment.
bool looks_like_config_key(std::string_view name) {
  for (const std::string_view section : sections()) {
    if (name.starts_with(env_name_of(section) + "_")) return true;
  }
  for (const KeySpec& key : kKeys) {
    if (edit_distance(name, env_name_of(key.name)) <= 2) return true;
  }
  return false;
}

Status load_env(const std::map<std::string, std::string>& env, Config& config, Origins& origins) {
  for (const auto& [name, text] : env) {
    if (!name.starts_with("SHARDMIX_")) continue;
    const KeySpec* key = nullptr;
    for (const KeySpec& candidate : kKeys) {
      if (env_name_of(candidate.name) == name) key = &candidate;
    }
    if (key == nullptr) {
      if (std::find(kNonConfigEnvVars.begin(), kNonConfigEnvVars.end(), name) != kNonConfigEnvVars.end()) continue;
      if (!looks_like_config_key(name)) continue;  // e.g. the launch scripts' SHARDMIX_READY_TIMEOUT
      return make_error(StatusCode::kInvalidArgument,
                        "unknown config key in environment variable {}{} (SHARDMIX_<SECTION>_* variables must name a "
                        "config key; the non-config ones are {})",
                        name, suggestion(name, true), fmt::join(kNonConfigEnvVars, ", "));
    }
    const std::string where = fmt::format("in environment variable {}", name);
    SHARDMIX_ASSIGN_OR_RETURN(Value value, value_from_text(*key, text, where));
    apply(config, origins, *key, value, where);
  }
  return Status::ok_status();
}

Status load_sets(const std::vector<std::string>& sets, Config& config, Origins& origins) {
  for (const std::string& set : sets) {
    const std::size_t eq = set.find('=');
    if (eq == std::string::npos) {
      return make_error(StatusCode::kInvalidArgument, "--set '{}' is not of the form section.key=value", set);
    }
    const std::string name(trim(std::string_view(set).substr(0, eq)));
    const std::string_view text = std::string_view(set).substr(eq + 1);
    const std::string where = fmt::format("in --set {}", set);
    const KeySpec* key = find_key(name);
    if (key == nullptr) {
      return make_error(StatusCode::kInvalidArgument, "unknown config key '{}' {}{}", name, where,
                        suggestion(name, false));
    }
    SHARDMIX_ASSIGN_OR_RETURN(Value value, value_from_text(*key, text, where));
    apply(config, origins, *key, value, where);
  }
  return Status::ok_status();
}

Status validate(const Config& config, const Origins& origins) {
  for (const KeySpec& key : kKeys) {
    const Value value = key.get(config);
    const auto origin_it = origins.find(key.name);
    const std::string origin = origin_it == origins.end() ? "default" : origin_it->second;
    switch (key.type) {
      case KeyType::kString:
        if (key.required && as_str(value).empty()) {
          return make_error(StatusCode::kInvalidArgument,
                            "config key '{}' must not be empty ({}); set it in the config file, with {} or with "
                            "--set {}=...",
                            key.name, origin == "default" ? "not set" : "empty " + origin, env_name_of(key.name),
                            key.name);
        }
        break;
      case KeyType::kUint:
      case KeyType::kSize:
        if (as_u64(value) < key.min_uint) {
          return make_error(StatusCode::kInvalidArgument, "config key '{}' must be >= {}, got {} ({})", key.name,
                            key.min_uint, as_u64(value), origin);
        }
        break;
      case KeyType::kDuration:  // stored in microseconds; said with a unit
        if (as_u64(value) < key.min_uint) {
          return make_error(StatusCode::kInvalidArgument, "config key '{}' must be at least {}, got {} ({})", key.name,
                            duration_text(key.min_uint), duration_text(as_u64(value)), origin);
        }
        break;
      case KeyType::kDouble: {
        const double v = std::get<double>(value);
        if (!(v >= key.min_double && v <= key.max_double)) {
          return make_error(StatusCode::kInvalidArgument, "config key '{}' must be in [{}, {}], got {} ({})",
                            key.name, key.min_double, key.max_double, v, origin);
        }
        break;
      }
      case KeyType::kEnum:
        if (!enum_allows(key, as_str(value))) {
          return make_error(StatusCode::kInvalidArgument, "config key '{}' must be {}, got '{}' ({})", key.name,
                            expectation(key), as_str(value), origin);
        }
        break;
      default: break;
    }
  }
  if (auto exts = parse_extension_list(config.dataset.sample_ext, "dataset.sample_ext"); !exts.ok()) {
    return exts.status();
  }
  if (config.cache.reuse_rounds > 0 && config.cache.rotation_epochs > 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "config keys 'cache.reuse_rounds' ({}) and 'cache.rotation_epochs' ({}) cannot both be set: reuse "
                      "rounds already change the resident set every round; set one of them to 0",
                      config.cache.reuse_rounds, config.cache.rotation_epochs);
  }
  if (config.dataset.metadata == "owner") {
    // Owner-side metadata (decision 0063): what the daemons' owner-side form does not have yet.
    const auto refuse = [](std::string_view key, std::string_view value, std::string_view why) {
      return make_error(StatusCode::kInvalidArgument,
                        "config key 'dataset.metadata' = \"owner\" does not work with '{}' = {} yet: {}; set "
                        "dataset.metadata = \"global\" or change '{}'",
                        key, value, why, key);
    };
    if (config.dataset.placement != PlacementPolicy::kSpread) {
      return refuse("dataset.placement", fmt::format("\"{}\"", placement_policy_name(config.dataset.placement)),
                    "an owner is found from the sample id only under \"spread\"");
    }
    if (config.dataset.path.starts_with("s3://")) {  // is_s3_path (common/s3_client.h)
      return refuse("dataset.path", fmt::format("\"{}\"", config.dataset.path), "S3 datasets need the global catalog");
    }
    if (config.cache.rotation_epochs > 0 || config.cache.reuse_rounds > 0) {
      return refuse(config.cache.rotation_epochs > 0 ? "cache.rotation_epochs" : "cache.reuse_rounds",
                    std::to_string(std::max(config.cache.rotation_epochs, config.cache.reuse_rounds)),
                    "rotation lays out every node's arena");
    }
    if (config.fault.peer_death != "stop") {
      return refuse("fault.peer_death", fmt::format("\"{}\"", config.fault.peer_death),
                    "a dead peer's samples are read from storage by path");
    }
  }
  if (!config.checkpoint.dir.empty() && config.cache.capacity_bytes != 0 &&
      config.checkpoint.capacity_bytes >= config.cache.capacity_bytes) {
    return make_error(StatusCode::kInvalidArgument,
                      "config key 'checkpoint.capacity' ({} bytes) must be less than 'cache.capacity' ({} bytes): "
                      "checkpoints take their RAM from the cache's budget and would leave the cache nothing",
                      config.checkpoint.capacity_bytes, config.cache.capacity_bytes);
  }
  if (config.sim.fault_node < -1 || config.sim.slow_link_node < -1) {
    return make_error(StatusCode::kInvalidArgument,
                      "config keys 'sim.fault_node' and 'sim.slow_link_node' must be -1 (none) or a node, got {} and {}",
                      config.sim.fault_node, config.sim.slow_link_node);
  }
  if (config.inject.slow_peer_rank < -1) {
    return make_error(StatusCode::kInvalidArgument, "config key 'inject.slow_peer_rank' must be -1 (none) or a rank, got {}",
                      config.inject.slow_peer_rank);
  }
  return Status::ok_status();
}

}  // namespace

std::string_view dataset_format_name(DatasetFormat format) {
  switch (format) {
    case DatasetFormat::kFolder: return "folder";
    case DatasetFormat::kFileList: return "filelist";
    case DatasetFormat::kWebDataset: return "webdataset";
    case DatasetFormat::kTfRecord: return "tfrecord";
  }
  return "folder";
}

const char* placement_policy_name(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kBalanced: return "balanced";
    case PlacementPolicy::kSorted: return "sorted";
    case PlacementPolicy::kSpread: return "spread";
  }
  return "balanced";
}

PlacementPolicy placement_policy_from_name(std::string_view name) {
  if (name == "sorted") return PlacementPolicy::kSorted;
  if (name == "spread") return PlacementPolicy::kSpread;
  return PlacementPolicy::kBalanced;
}

Result<std::uint64_t> parse_size(std::string_view text, std::string_view key) {
  auto size = size_or_reason(text);
  if (auto* why = std::get_if<std::string>(&size)) {
    return make_error(StatusCode::kInvalidArgument, "config key '{}': '{}' is not a size: {} ({})", key, text, *why,
                      kSizeUnitsHelp);
  }
  return std::get<std::uint64_t>(size);
}

Result<std::chrono::microseconds> parse_duration(std::string_view text, std::string_view key) {
  auto usec = duration_or_reason(text);
  if (auto* why = std::get_if<std::string>(&usec)) {
    return make_error(StatusCode::kInvalidArgument, "config key '{}': '{}' is not a duration: {} ({})", key, text,
                      *why, kDurationUnitsHelp);
  }
  return std::chrono::microseconds(std::get<std::uint64_t>(usec));
}

Result<Config> load_config(const std::string& file, const std::map<std::string, std::string>& env,
                           const std::vector<std::string>& sets) {
  Config config;
  Origins origins;
  for (const KeySpec& key : kKeys) {
    auto value = value_from_text(key, key.default_text, "(default)");
    if (!value.ok()) return value.status().with_context("bad default in config.cc's key table");
    key.set(config, *value);
  }
  if (!file.empty()) SHARDMIX_RETURN_IF_ERROR(load_file(file, config, origins));
  SHARDMIX_RETURN_IF_ERROR(load_env(env, config, origins));
  SHARDMIX_RETURN_IF_ERROR(load_sets(sets, config, origins));
  SHARDMIX_RETURN_IF_ERROR(validate(config, origins));
  return config;
}

std::map<std::string, std::string> environment_map() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view s(*entry);
    const std::size_t eq = s.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(s.substr(0, eq)), std::string(s.substr(eq + 1)));
  }
  return env;
}

std::string config_to_toml(const Config& config) {
  std::string out = "# ShardMix effective configuration (defaults < file < SHARDMIX_* env < --set).\n";
  for (const std::string_view section : sections()) {
    out += fmt::format("\n[{}]\n", section);
    for (const KeySpec& key : kKeys) {
      if (section_of(key.name) != section) continue;
      out += fmt::format("# {} Default: {}. Env: {}.\n", key.doc,
                         key.default_text.empty() ? "\"\"" : std::string(key.default_text), env_name_of(key.name));
      out += fmt::format("{} = {}\n", leaf_of(key.name), value_toml(key, key.get(config)));
    }
  }
  return out;
}

std::vector<ConfigKeyInfo> config_keys() {
  std::vector<ConfigKeyInfo> out;
  for (const KeySpec& key : kKeys) {
    out.push_back(ConfigKeyInfo{std::string(key.name), std::string(type_name(key.type)),
                                std::string(key.default_text), std::string(key.doc), std::string(key.tradeoff),
                                env_name_of(key.name)});
  }
  return out;
}

std::string config_reference_markdown() {
  std::string out;
  for (const std::string_view section : sections()) {
    out += fmt::format("### `[{}]`\n\n", section);
    for (const KeySpec& key : kKeys) {
      if (section_of(key.name) != section) continue;
      std::string type(type_name(key.type));
      if (key.type == KeyType::kEnum) {
        std::string choices;
        for (std::string_view rest = key.choices; !rest.empty();) {
          const std::size_t bar = rest.find('|');
          choices += fmt::format("{}`{}`", choices.empty() ? "" : ", ", rest.substr(0, bar));
          if (bar == std::string_view::npos) break;
          rest.remove_prefix(bar + 1);
        }
        type += ": " + choices;
      } else if (key.type == KeyType::kUint || key.type == KeyType::kSize) {
        if (key.max_uint == std::numeric_limits<std::uint64_t>::max()) {
          type += fmt::format(", >= {}", key.min_uint);
        } else {
          type += fmt::format(", {} .. {}", key.min_uint, key.max_uint);
        }
      } else if (key.type == KeyType::kDouble) {
        type += fmt::format(", {} .. {}", key.min_double, key.max_double);
      } else if (key.type == KeyType::kString && key.required) {
        type += ", required, non-empty";
      }
      out += fmt::format("#### `{}`\n\n", key.name);
      out += fmt::format("- type: {}\n", type);
      out += fmt::format("- default: `{}`\n", value_toml(key, *value_from_text(key, key.default_text, "")));
      out += fmt::format("- env: `{}`\n", env_name_of(key.name));
      out += fmt::format("- meaning: {}\n", key.doc);
      out += fmt::format("- trade-off: {}\n\n", key.tradeoff);
    }
  }
  return out;
}

}  // namespace shardmix
