// GradScaler's checkpoints: its state_dict in an archive, and the archive operators.
#include <ampactor/actors/checkpoint.h>
#include <ampactor/actors/grad_scaler.h>

#include <torch/csrc/api/include/torch/serialize/input-archive.h>
#include <torch/csrc/api/include/torch/serialize/output-archive.h>

namespace ampactor {

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  write_state_dict(state_dict(), archive);
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  load_state_dict(read_state_dict(archive));
}

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler) {
  scaler.save(archive);
  return archive;
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler) {
  scaler.load(archive);
  return archive;
}

}  // namespace ampactor
