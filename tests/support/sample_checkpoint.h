// One valid checkpoint blob value, with every field set and both exception lists filled
// (a redealt epoch, shuffle.window 4), for the tests and fuzz seeds of proto/checkpoint.h.
#pragma once

#include "proto/checkpoint.h"

namespace shardmix::test_support {

inline proto::Checkpoint sample_checkpoint() {
  return proto::Checkpoint{.flags = proto::kCheckpointRedealt, .plan_digest = 0x1234, .num_samples = 1000,
                           .seed = 99, .nodes = 2, .trainers_per_node = 2, .batch_size = 8, .drop_last = true,
                           .window = 4, .rank = 3, .world_size = 4, .epoch = 2, .batches_consumed = 3,
                           .samples_consumed = 24, .early = {25, 30}, .late = {20, 23}};
}

}  // namespace shardmix::test_support
