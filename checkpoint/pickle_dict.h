// A strict reader of the one pickle a GradScaler state_dict file holds: a dict of str to float or
// int (what torch.save writes with pickle protocols 2 to 5). Not LibTorch's unpickler, which
// trusts length fields (a corrupt one made it allocate 4 GiB) and accepts far more than a
// state_dict. Not installed.
#pragma once

#include <cstddef>
#include <stdexcept>

#include <ampactor/core/state_dict.h>

namespace ampactor::internal {

/// Why a pickle is not a state_dict; what() says what and where (a byte offset).
class PickleProblem : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The dict pickled in `data`. Throws PickleProblem on anything else: an opcode a dict of floats
/// and ints does not need, a length past the end, a key that is not a str, a value that is not a
/// float or an int (bool included), a stack that does not end as one dict.
StateDict unpickle_state_dict(const char* data, std::size_t size);

}  // namespace ampactor::internal
