// Checkpoint files: atomic writes, checked loading (the zip and pickle screens first), the state
// dicts of LocalGradScaler and of PyTorch's files, and the archive operators of LocalGradScaler.
#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include "archive_screen.h"
#include "pickle_dict.h"
#include "zip_check.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/api/include/torch/serialize/input-archive.h>
#include <torch/csrc/api/include/torch/serialize/output-archive.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <vector>

namespace ampactor {

namespace {

constexpr const char* float_keys[] = {"scale", "growth_factor", "backoff_factor"};
constexpr const char* int_keys[] = {"growth_interval", "_growth_tracker"};

/// The first line of a LibTorch error (its text goes on with a C++ backtrace).
std::string first_line(const std::string& what) {
  return what.substr(0, what.find('\n'));
}

[[noreturn]] void io_error(const std::string& what, const std::string& path) {
  throw ScalerError(errc::bad_checkpoint,
                    what + " '" + path + "': " + std::string(std::strerror(errno)));
}

/// This host's name as it goes into a temporary file's name: letters, digits and '-' only.
std::string host_tag() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "host";
  std::string out;
  for (const char* c = name; *c; ++c)
    out += std::isalnum(static_cast<unsigned char>(*c)) || *c == '-' ? *c : '-';
  return out.empty() ? "host" : out;
}

/// Removes the temporaries of `path` left by writers on this host that are gone (killed
/// mid-write): PATH.tmp.HOST.PID.XXXXXX whose PID no longer exists. Another host's, or a live
/// writer's, stay.
void remove_stale_temporaries(const std::string& path, const std::string& host) {
  const std::string::size_type slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const std::string prefix =
      (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp." + host + ".";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;  // creating the temporary names the problem
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (pid <= 0 || *end != '.') continue;
    if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to tell
    ::unlink((slash == std::string::npos ? name : dir + name).c_str());
  }
  ::closedir(d);
}

/// A file beside `path`, written in full and flushed to the disk, then renamed over `path`; the
/// directory is flushed too, so the rename itself survives a power cut. Each writer has a
/// temporary of its own (PATH.tmp.HOST.PID.XXXXXX), so writers of one path never share one: the
/// published file is always one writer's whole checkpoint, the last rename's. A writer killed
/// mid-write leaves its temporary, which the next write on this host removes.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)) {
    const std::string host = host_tag();
    remove_stale_temporaries(path_, host);
    tmp_ = path_ + ".tmp." + host + "." + std::to_string(::getpid()) + ".XXXXXX";
    fd_ = ::mkostemp(tmp_.data(), O_CLOEXEC);
    if (fd_ < 0) io_error("cannot create checkpoint file", tmp_);
    ::fchmod(fd_, 0644);  // mkostemp makes it 0600; a checkpoint is for others to read too
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  /// LibTorch's zip writer calls this, also from its destructor (the zip's directory), where an
  /// exception would terminate the process: a failed write (a full disk, a file size limit) is
  /// remembered and reported by check() or commit(), once the writer is done.
  std::size_t write(const void* data, std::size_t n) noexcept {
    const char* p = static_cast<const char*>(data);
    for (std::size_t left = n; left > 0 && !error_;) {
      const ssize_t w = ::write(fd_, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) error_ = errno;
      if (w > 0) p += w, left -= static_cast<std::size_t>(w);
    }
    return n;
  }
  /// Throws ScalerError(bad_checkpoint) naming the file if a write failed.
  void check() const {
    if (!error_) return;
    errno = error_;
    io_error("cannot write checkpoint file", tmp_);
  }
  void commit() {
    check();
    if (::fsync(fd_) != 0) io_error("cannot flush checkpoint file", tmp_);
    if (::close(fd_) != 0) {
      fd_ = -1;
      io_error("cannot close checkpoint file", tmp_);
    }
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) io_error("cannot rename checkpoint to", path_);
    committed_ = true;
    const std::string::size_type slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
    const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) ::fsync(d), ::close(d);
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int error_ = 0;  // errno of the first failed write
  bool committed_ = false;
};

/// Bytes in memory, for LibTorch's zip reader.
class MemoryReader : public caffe2::serialize::ReadAdapterInterface {
 public:
  MemoryReader(const char* data, std::size_t size) : data_(data), size_(size) {}
  std::size_t size() const override { return size_; }
  std::size_t read(std::uint64_t pos, void* buf, std::size_t n, const char*) const override {
    if (pos >= size_) return 0;
    n = std::min<std::size_t>(n, size_ - pos);
    std::memcpy(buf, data_ + pos, n);
    return n;
  }

 private:
  const char* data_;
  std::size_t size_;
};

}  // namespace

void write_state_dict(const StateDict& sd, torch::serialize::OutputArchive& archive) {
  for (const auto& [key, value] : sd) {
    if (const auto* d = std::get_if<double>(&value))
      archive.write(key, c10::IValue(*d));
    else
      archive.write(key, c10::IValue(std::get<std::int64_t>(value)));
  }
}

StateDict read_state_dict(torch::serialize::InputArchive& archive) {
  StateDict sd;
  auto read = [&](const char* key) {
    c10::IValue v;
    if (!archive.try_read(key, v)) return;
    if (v.isDouble())
      sd.set(key, v.toDouble());
    else if (v.isInt())
      sd.set(key, v.toInt());
    else
      throw ScalerError(
          errc::bad_state_dict,
          std::string("state_dict['") + key + "'] must be a float or an int, got " + v.tagKind());
  };
  for (const char* k : float_keys)
    read(k);
  for (const char* k : int_keys)
    read(k);
  return sd;
}

void save_atomically(torch::serialize::OutputArchive& archive, const std::string& path) {
  AtomicFile file(path);
  try {
    archive.save_to([&](const void* data, std::size_t n) { return file.write(data, n); });
  } catch (const ScalerError&) {
    throw;
  } catch (const std::exception& e) {
    file.check();  // a failed write is the cause, when there was one
    throw ScalerError(errc::bad_checkpoint,
                      "cannot write checkpoint '" + path + "': " + first_line(e.what()));
  }
  file.commit();
}

void save_text_atomically(const std::string& text, const std::string& path) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

void load_checkpoint(torch::serialize::InputArchive& archive, const std::string& path) {
  // Read first, so that a missing file is named as such rather than as a bad archive.
  const std::string bytes = read_regular_file(path, "checkpoint");
  load_checkpoint(archive, bytes.data(), bytes.size(), path);
}

void load_checkpoint(torch::serialize::InputArchive& archive, const char* data, std::size_t size,
                     const std::string& name) {
  std::vector<internal::ZipEntry> entries;
  if (const std::string damage = internal::zip_damage(data, size, &entries); !damage.empty())
    throw ScalerError(errc::bad_checkpoint,
                      "checkpoint '" + name + "' is truncated or corrupt: " + damage);
  // LibTorch's reader compiles the archive's code and unpickles without bounds checks: it reads
  // only what ampactor's checkpoints hold.
  try {
    std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
    internal::screen_archive(data, entries, [&](const internal::ZipEntry& e) {
      try {
        if (!zip)
          zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(
              std::make_shared<MemoryReader>(data, size));
        auto [bytes, n] = zip->getRecord(e.name.substr(e.name.find('/') + 1));
        return std::string(static_cast<const char*>(bytes.get()), n);
      } catch (const std::exception& x) {
        throw internal::ArchiveProblem("record '" + internal::shown(e.name) +
                                       "' does not inflate: " + first_line(x.what()));
      }
    });
  } catch (const internal::ArchiveProblem& e) {
    throw ScalerError(errc::bad_checkpoint,
                      "checkpoint '" + name + "' is not one ampactor writes: " + e.what());
  }
  try {
    torch::serialize::InputArchive fresh;
    fresh.load_from(data, size);
    archive = std::move(fresh);
  } catch (const std::exception& e) {
    throw ScalerError(errc::bad_checkpoint,
                      "checkpoint '" + name + "' is truncated or corrupt: " + first_line(e.what()));
  }
}

StateDict read_torch_state_dict(const std::string& path) {
  const std::string bytes = read_regular_file(path, "state_dict file");
  return read_torch_state_dict(bytes.data(), bytes.size(), path);
}

StateDict read_torch_state_dict(const char* data, std::size_t size, const std::string& name) {
  std::vector<internal::ZipEntry> entries;
  if (const std::string damage = internal::zip_damage(data, size, &entries); !damage.empty())
    throw ScalerError(errc::bad_checkpoint,
                      "'" + name + "' is not a whole file written by torch.save: " + damage);
  // torch.save stores every record as it is, so every one was checked against its CRC.
  for (const internal::ZipEntry& e : entries)
    if (e.deflated)
      throw ScalerError(errc::bad_checkpoint,
                        "'" + name + "' is not a file written by torch.save: " + "entry '" +
                            internal::shown(e.name) + "' is compressed");
  // The pickle comes out of the (CRC-checked) zip through LibTorch's reader and is read by
  // ampactor's own strict one, never by LibTorch's unpickler.
  std::vector<char> pickle;
  try {
    std::istringstream in(std::string(data, size));
    caffe2::serialize::PyTorchStreamReader zip(&in);
    auto [bytes, n] = zip.getRecord("data.pkl");
    const char* p = static_cast<const char*>(bytes.get());
    pickle.assign(p, p + n);
  } catch (const std::exception& e) {
    throw ScalerError(errc::bad_checkpoint, "'" + name + "' is not a file written by torch.save: " +
                                                first_line(e.what()));
  }
  StateDict sd;
  try {
    sd = internal::unpickle_state_dict(pickle.data(), pickle.size());
  } catch (const internal::PickleProblem& e) {
    throw ScalerError(errc::bad_checkpoint,
                      "'" + name + "' is not a GradScaler state_dict: " + e.what());
  }
  return sd;
}

void write_torch_state_dict(const StateDict& sd, const std::string& path) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  // torch's own order, which torch.save keeps.
  for (const char* k :
       {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}) {
    if (!sd.contains(k)) continue;
    const StateDict::Value& v = sd.at(k);
    if (const auto* d = std::get_if<double>(&v))
      dict.insert(k, *d);
    else
      dict.insert(k, std::get<std::int64_t>(v));
  }
  for (const auto& [key, v] : sd) {
    if (dict.contains(key)) continue;
    if (const auto* d = std::get_if<double>(&v))
      dict.insert(key, *d);
    else
      dict.insert(key, std::get<std::int64_t>(v));
  }
  // LibTorch's pickle_save tags the dict with its TorchScript type, a global that torch.load's
  // default weights_only mode refuses: pickle it untagged, a plain dict of floats and ints.
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* p, std::size_t n) { pickled.insert(pickled.end(), p, p + n); }, nullptr,
      nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(dict);
  pickler.stop();
  AtomicFile file(path);
  {
    caffe2::serialize::PyTorchStreamWriter zip(
        [&](const void* p, std::size_t n) { return file.write(p, n); });
    zip.writeRecord("data.pkl", pickled.data(), pickled.size());
    zip.writeRecord("byteorder", "little", 6);
  }  // the zip's directory is written here
  file.commit();
}

void LocalGradScaler::save(torch::serialize::OutputArchive& archive) const {
  write_state_dict(state_dict(), archive);
}

void LocalGradScaler::load(torch::serialize::InputArchive& archive) {
  load_state_dict(read_state_dict(archive));
}

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const LocalGradScaler& scaler) {
  scaler.save(archive);
  return archive;
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           LocalGradScaler& scaler) {
  scaler.load(archive);
  return archive;
}

}  // namespace ampactor
