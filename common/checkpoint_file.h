// Checkpoint versions on the file system (checkpoint.dir; docs/decisions/0053): the drain's
// write and the reads of what it wrote. Layout: <dir>/<name>/v<version>.smxckpt, each file a
// 24-byte header (magic "SMXCKPT1", payload bytes u64, CRC32C of the payload u32, zero
// u32; little-endian) then the payload. A version is written to a hidden temporary file in
// the same directory, fsync'ed, renamed over its final name and the directory fsync'ed, so
// a reader sees the whole previous file set or the whole new one, never a torn file; the
// checksum catches what the rename cannot (bit rot, a file copied in by hand).
// Thread-safety: free functions; concurrent writes of different versions are safe, and two
// daemons writing the same version write the same bytes (the rename makes it idempotent).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/checkpoint_store.h"
#include "common/status.h"

namespace shardmix {

inline constexpr std::size_t kCheckpointFileHeaderBytes = 24;
inline constexpr std::size_t kMaxCheckpointNameBytes = 200;

// A name is one path component of letters, digits, '.', '_' and '-', at most 200 bytes,
// not starting with '.' (hidden names are the drain's temporary files). The error names it.
Status validate_checkpoint_name(std::string_view name);

std::filesystem::path checkpoint_file_path(const std::filesystem::path& dir, const CheckpointId& id);

// Writes `bytes` as version `id` under `dir` (temp file, fsync, rename, fsync of the
// directory). Any failure removes the temporary file and is an kIoError naming the
// checkpoint, the directory and the failed step ("writing checkpoint m@3 to /ckpt: write
// /ckpt/m/.v3.smxckpt.tmp-123: No space left on device"); a file from before is untouched.
Status write_checkpoint_file(const std::filesystem::path& dir, const CheckpointId& id,
                             std::span<const std::uint8_t> bytes);

// Reads version `id` and checks its header and checksum: kNotFound if it is not there,
// kCorrupt (naming the file) if it does not verify.
Result<std::vector<std::uint8_t>> read_checkpoint_file(const std::filesystem::path& dir, const CheckpointId& id);

// Every complete version under `dir` (temporary files skipped), in (name, version) order.
// A missing `dir` is an empty list.
Result<std::vector<CheckpointId>> list_checkpoint_files(const std::filesystem::path& dir);

// Removes the files of `name` older than its newest `retain` versions on disk, once a newer
// version is durable: the file system keeps the same number of versions as RAM does.
// Returns the removed versions; a failure to remove is an error naming the file.
Result<std::vector<CheckpointId>> remove_superseded_checkpoint_files(const std::filesystem::path& dir,
                                                                     std::string_view name, std::uint32_t retain);

}  // namespace shardmix
