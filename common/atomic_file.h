// Replacing a small file so that a reader sees the old contents or the new, never part of
// them: write `path`.tmp, then rename it over `path`. For files that readers poll (the
// daemon's ready file, Prometheus textfiles, trace files); no fsync, so a crash of the
// node may lose the new contents (checkpoint_file.cc syncs, as checkpoints need).
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace shardmix {

// `private_file`: mode 0600, else the umask's. Errors name the file and the failed step.
Status write_file_atomically(const std::string& path, std::string_view text, bool private_file = false);

}  // namespace shardmix
