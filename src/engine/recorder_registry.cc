#include "engine/recorder_registry.h"

#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

struct Registry {
  std::mutex mu;
  std::vector<FlightRecorder*> recorders;
};

// Never destroyed (recorders may outlive static teardown). A forked child starts with a new
// one: the parent's recorders are not its own, and the parent's lock may have been held by
// one of its threads at the fork.
std::atomic<Registry*> gRegistry{nullptr};

void resetInChild();

Registry& registry() {
  Registry* r = gRegistry.load(std::memory_order_acquire);
  if (r) return *r;
  static std::once_flag once;
  std::call_once(once, [] {
    gRegistry.store(new Registry, std::memory_order_release);
    pthread_atfork(nullptr, nullptr, resetInChild);
  });
  return *gRegistry.load(std::memory_order_acquire);
}

// The handler only writes to an eventfd; a thread of ours does the dumping. Lock-free
// atomics are safe to read in a signal handler.
std::atomic<int> gSignalFd{-1};
std::atomic<pid_t> gSignalPid{0};  // a forked child's signals are not its parent's business
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<pid_t>::is_always_lock_free);

void resetInChild() {
  gRegistry.store(new Registry, std::memory_order_release);  // the parent's is left behind
  int fd = gSignalFd.exchange(-1);
  if (fd >= 0) close(fd);
  gSignalPid.store(0);
}

void onSignal(int) {
  int fd = gSignalFd.load();
  if (fd < 0 || getpid() != gSignalPid.load()) return;
  int saved = errno;
  uint64_t one = 1;
  ssize_t n = write(fd, &one, sizeof(one));
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
  if (gSignalPid.load() == getpid() || !kDumpOnSignal.get() || FlightRecorder::dumpDir().empty())
    return;
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
  gSignalFd.store(fd);
  gSignalPid.store(getpid());
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
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  installSignalHandler();
  reg.recorders.push_back(r);
}

void unregisterRecorder(FlightRecorder* r) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::erase(reg.recorders, r);
}

void forEachRecorder(const std::function<void(const FlightRecorder&)>& fn) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (FlightRecorder* r : reg.recorders) fn(*r);
}

}  // namespace loom
