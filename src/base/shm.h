// POSIX shared-memory segments: created mode 0600 under an unguessable name, mapped, and
// unlinked as soon as every peer has mapped them, so a SIGKILLed job leaves nothing in
// /dev/shm. RAII: the mapping is released by the destructor.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace loom {

// Whether a process no longer runs: gone, or killed and not yet reaped by its parent
// (a zombie holds its pid until then, and its peers notice its death before that).
bool processGone(pid_t pid);

class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Creates "/loom-<tag>-<random hex>" of `size` bytes (zero-filled), mode 0600, mapped.
  static ShmSegment create(const std::string& tag, size_t size);
  // Maps an existing segment by name; throws kSystemError naming it if absent.
  static ShmSegment open(const std::string& name, size_t size);

  void unlink();  // removes the name (idempotent); the mapping stays valid
  // Unlinks names that processes of this pid namespace created and did not live to
  // unlink (SIGKILL during connection setup). Returns how many it removed; every
  // communicator's init sweeps too, so another process may have removed them first.
  static int sweepDead();
  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool valid() const { return data_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;   // created here: unlink on destruction if still named
  bool linked_ = false;  // the name still exists as far as this object knows
};

}  // namespace loom
