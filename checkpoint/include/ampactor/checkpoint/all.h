// ampactor::checkpoint, whole. Checkpoint files: state_dict I/O, atomic writes, the screens that
// check a file first.
#pragma once

#include <ampactor/checkpoint/checkpoint.h>
