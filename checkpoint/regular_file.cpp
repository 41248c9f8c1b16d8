// Reading a file a checkpoint names, and nothing else: a directory, a FIFO (which blocks the
// reader until a writer comes) or a device such as /dev/zero (which never ends) is refused.
#include <ampactor/checkpoint/checkpoint.h>
#include <ampactor/core/errors.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ampactor {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& what, const std::string& path, const std::string& why) {
  throw ScalerError(errc::bad_checkpoint, what + " '" + path + "' " + why);
}

}  // namespace

int open_regular_file(const std::string& path, const std::string& what, std::uint64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) refuse(what, path, std::string("cannot be opened: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    const bool stated = S_ISREG(st.st_mode) || st.st_mode != 0;
    ::close(fd);
    refuse(what, path,
           stated ? std::string("is ") + kind_of(st.st_mode) + ", not a regular file"
                  : std::string("cannot be examined: ") + std::strerror(err));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  *size = std::uint64_t(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what,
                              std::uint64_t limit) {
  std::uint64_t size = 0;
  const int fd = open_regular_file(path, what, &size);
  if (size > limit) {
    ::close(fd);
    refuse(what, path,
           "is " + std::to_string(size) + " bytes, more than the " + std::to_string(limit) +
               " expected");
  }
  std::string bytes(std::size_t(size), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      refuse(what, path, std::string("cannot be read: ") + std::strerror(err));
    }
    if (n == 0) break;  // shrunk meanwhile: what is there
    done += std::size_t(n);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

}  // namespace ampactor
