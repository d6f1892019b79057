#include "base/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "base/error.h"
#include "base/hmac.h"

namespace loom {
namespace {

// POSIX names have one leading slash and no other; NAME_MAX bounds the rest.
constexpr size_t kMaxTagLen = 64;

// Closes an fd on every exit path.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

// Out of space on /dev/shm is the usual cause of shm failures in containers (Docker gives
// 64 MB by default); say so with the figures rather than leave the user with an errno.
std::string spaceHint(int err) {
  if (err != ENOSPC && err != ENOMEM && err != EFBIG && err != EBUSY) return "";
  struct statvfs vfs;
  if (statvfs("/dev/shm", &vfs) != 0) return "";
  unsigned long long freeBytes = static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize;
  unsigned long long total = static_cast<unsigned long long>(vfs.f_blocks) * vfs.f_frsize;
  return strprintf(" (/dev/shm has %llu of %llu bytes free; enlarge it, e.g. docker "
                   "--shm-size, or reduce the buffer sizes)",
                   freeBytes, total);
}

std::string withSlash(const std::string& name) {
  return name.empty() || name[0] != '/' ? "/" + name : name;
}

// Names carry the creator's pid namespace and pid ("loom-<ns>-<pid>-<tag>-<random>"), so a
// later process can tell which names a killed process left behind.
std::string pidNamespaceTag() {
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return "0";
  return strprintf("%llx", static_cast<unsigned long long>(st.st_ino));
}

}  // namespace

bool processGone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = fopen(path, "r");
  if (!f) return false;
  char buf[512] = {};
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* close = strrchr(buf, ')');  // "pid (comm) state ...": comm may hold spaces
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

int ShmSegment::sweepDead() {
  std::string prefix = "loom-" + pidNamespaceTag() + "-";
  int removed = 0;
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    if (strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
    char* end = nullptr;
    long pid = strtol(e->d_name + prefix.size(), &end, 10);
    if (pid <= 0 || !end || *end != '-') continue;
    if (!processGone(static_cast<pid_t>(pid))) continue;
    if (shm_unlink(withSlash(e->d_name).c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

namespace {

// Segments this process has mapped, by name. Ranks that are threads of one process open
// the segment their peer created: they share the creator's mapping instead of mapping the
// same memory again at another address. Besides a mapping saved, each shared word then has
// one address, which ThreadSanitizer needs to pair the FIFO's release and acquire.
struct Mapping {
  void* data;
  size_t size;
  int refs;
};
std::mutex& mappingsMu() {
  static auto* mu = new std::mutex;  // outlives static destruction
  return *mu;
}
std::map<std::string, Mapping>& mappings() {
  static auto* m = new std::map<std::string, Mapping>;
  return *m;
}

void releaseMapping(void* data, size_t size, const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(mappingsMu());
    auto it = mappings().find(name);
    if (it != mappings().end() && it->second.data == data) {
      if (--it->second.refs > 0) return;
      size = it->second.size;
      mappings().erase(it);
    }
  }
  munmap(data, size);
}

}  // namespace

ShmSegment::~ShmSegment() {
  if (data_) releaseMapping(data_, size_, name_);
  if (owner_ && linked_) shm_unlink(name_.c_str());
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept
    : data_(o.data_), size_(o.size_), name_(std::move(o.name_)), owner_(o.owner_),
      linked_(o.linked_) {
  o.data_ = nullptr;
  o.size_ = 0;
  o.owner_ = false;
  o.linked_ = false;
}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    ShmSegment old(std::move(*this));  // releases the current segment when it goes
    data_ = o.data_;
    size_ = o.size_;
    name_ = std::move(o.name_);
    owner_ = o.owner_;
    linked_ = o.linked_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.owner_ = false;
    o.linked_ = false;
  }
  return *this;
}

ShmSegment ShmSegment::create(const std::string& tag, size_t size) {
  LOOM_CHECK_ARG(size > 0, "shared memory segment '%s': size must be positive", tag.c_str());
  LOOM_CHECK_ARG(tag.size() <= kMaxTagLen && tag.find('/') == std::string::npos,
                 "shared memory tag '%s' must be at most %zu characters without '/'",
                 tag.c_str(), kMaxTagLen);
  uint8_t rnd[16];  // 128 bits: the name cannot be guessed by another local user
  randomBytes(rnd, sizeof(rnd));
  std::string name = "/loom-" + pidNamespaceTag() + "-" + std::to_string(getpid()) + "-" + tag +
                     "-" + hex(rnd, sizeof(rnd));

  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    int err = errno;
    LOOM_THROW(kSystemError, "cannot create shared memory segment /dev/shm%s of %zu bytes: %s%s",
               name.c_str(), size, strerror(err), spaceHint(err).c_str());
  }
  FdGuard guard{fd};
  ShmSegment seg;
  seg.name_ = name;
  seg.owner_ = true;
  seg.linked_ = true;  // from here the destructor unlinks on any failure below

  auto fail = [&](const char* step, int err) {
    LOOM_THROW(kSystemError, "shared memory segment /dev/shm%s of %zu bytes: %s failed: %s%s",
               name.c_str(), size, step, strerror(err), spaceHint(err).c_str());
  };
  // The umask may have narrowed the mode further, never widened it; make it exact.
  if (fchmod(fd, 0600) != 0) fail("fchmod", errno);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) fail("ftruncate", errno);
  // tmpfs allocates lazily, so a full /dev/shm would otherwise surface as SIGBUS on first
  // touch; reserving the pages now turns that into an error message here.
  // fallocate(2), not posix_fallocate: glibc's emulation would write every page.
  if (fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0 && errno != EOPNOTSUPP &&
      errno != ENOSYS)
    fail("fallocate", errno);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("mmap", errno);
  seg.data_ = p;
  seg.size_ = size;
  std::lock_guard<std::mutex> lock(mappingsMu());
  mappings()[name] = Mapping{p, size, 1};
  return seg;
}

ShmSegment ShmSegment::open(const std::string& nameIn, size_t size) {
  std::string name = withSlash(nameIn);
  LOOM_CHECK_ARG(size > 0, "shared memory segment /dev/shm%s: size must be positive",
                 name.c_str());
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0)
    throwErrno("cannot open shared memory segment /dev/shm%s (%zu bytes)", name.c_str(), size);
  FdGuard guard{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) throwErrno("fstat of shared memory segment /dev/shm%s", name.c_str());
  if (static_cast<unsigned long long>(st.st_size) < size)
    LOOM_THROW(kSystemError,
               "shared memory segment /dev/shm%s holds %lld bytes but %zu were expected",
               name.c_str(), static_cast<long long>(st.st_size), size);
  ShmSegment seg;
  seg.size_ = size;
  seg.name_ = name;
  seg.linked_ = true;
  {
    std::lock_guard<std::mutex> lock(mappingsMu());
    auto it = mappings().find(name);
    if (it != mappings().end() && it->second.size >= size) {  // created by this process
      ++it->second.refs;
      seg.data_ = it->second.data;
      return seg;
    }
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    throwErrno("mmap of shared memory segment /dev/shm%s (%zu bytes)", name.c_str(), size);
  seg.data_ = p;
  return seg;
}

void ShmSegment::unlink() {
  if (!linked_) return;
  linked_ = false;
  // ENOENT means a peer removed it already, which is the outcome wanted.
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT)
    throwErrno("shm_unlink(/dev/shm%s)", name_.c_str());
}

}  // namespace loom
