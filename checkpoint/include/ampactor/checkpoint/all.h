// ampactor::checkpoint, whole. Checkpoint files: state_dict I/O, atomic writes, the screens that
// check a file first, a sharded run's files (check, consolidate, re-shard).
#pragma once

#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/checkpoint/sharded_checkpoint.h>
