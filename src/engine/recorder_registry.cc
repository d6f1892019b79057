#include "engine/recorder_registry.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/log.h"
#include "engine/flight_recorder.h"

namespace loom {
namespace {

BoolKnob kDumpOnSignal("LOOM_DUMP_ON_SIGNAL", "", true,
                       "SIGUSR1 writes every communicator's flight recorder to LOOM_DUMP_DIR "
                       "(only when LOOM_DUMP_DIR is set and the program has no SIGUSR1 "
                       "handler of its own)");

std::mutex& registryMu() {
  static auto* mu = new std::mutex;  // never destroyed: recorders may outlive static teardown
  return *mu;
}
std::vector<FlightRecorder*>& registry() {
  static auto* r = new std::vector<FlightRecorder*>;
  return *r;
}

// The handler only writes to an eventfd; a thread of ours does the dumping.
int gSignalFd = -1;
pid_t gSignalPid = 0;  // a forked child's signals are not its parent's business

void onSignal(int) {
  if (gSignalFd < 0 || getpid() != gSignalPid) return;
  int saved = errno;
  uint64_t one = 1;
  ssize_t n = write(gSignalFd, &one, sizeof(one));
  (void)n;
  errno = saved;
}

void dumpThread(int fd) {
  for (;;) {
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof(v));
    if (n != sizeof(v)) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    forEachRecorder([](const FlightRecorder& r) { r.dumpOnEvent("SIGUSR1"); });
  }
}

// Under the registry's lock, at each registration until it is installed in this process
// (LOOM_DUMP_DIR may be set later; a forked child needs a thread of its own).
void installSignalHandler() {
  if (gSignalPid == getpid() || !kDumpOnSignal.get() || FlightRecorder::dumpDir().empty()) return;
  struct sigaction old{};
  if (sigaction(SIGUSR1, nullptr, &old) != 0) return;
  bool ours = !(old.sa_flags & SA_SIGINFO) && old.sa_handler == onSignal;
  bool isDefault = !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL;
  if (!isDefault && !ours) {
    LOOM_INFO(kLogInit, "SIGUSR1 has a handler already: flight recorder dumps on SIGUSR1 are off");
    return;
  }
  int fd = eventfd(0, EFD_CLOEXEC);
  if (fd < 0) return;
  if (gSignalFd >= 0) close(gSignalFd);  // the parent's, inherited across fork
  gSignalFd = fd;
  gSignalPid = getpid();
  std::thread(dumpThread, fd).detach();
  struct sigaction sa{};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  LOOM_INFO(kLogInit, "SIGUSR1 writes every communicator's flight recorder to LOOM_DUMP_DIR");
}

}  // namespace

void registerRecorder(FlightRecorder* r) {
  std::lock_guard<std::mutex> lock(registryMu());
  installSignalHandler();
  registry().push_back(r);
}

void unregisterRecorder(FlightRecorder* r) {
  std::lock_guard<std::mutex> lock(registryMu());
  auto& v = registry();
  v.erase(std::remove(v.begin(), v.end(), r), v.end());
}

void forEachRecorder(const std::function<void(const FlightRecorder&)>& fn) {
  std::lock_guard<std::mutex> lock(registryMu());
  for (FlightRecorder* r : registry()) fn(*r);
}

}  // namespace loom
