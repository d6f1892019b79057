#include "base/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "base/config.h"
#include "base/error.h"

namespace loom {
namespace {

StringKnob kDebug("LOOM_DEBUG", "NCCL_DEBUG", "",
                  "Log level: VERSION, WARN, INFO or TRACE (empty: errors only via return codes)");
StringKnob kDebugSubsys("LOOM_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV,RAS",
                        "Comma-separated subsystems to log (INIT,COLL,P2P,SHM,NET,GRAPH,TUNING,"
                        "ENV,ALLOC,CALL,PROXY,BOOTSTRAP,RAS,ALL); a leading ^ excludes the list");
StringKnob kDebugFile("LOOM_DEBUG_FILE", "NCCL_DEBUG_FILE", "",
                      "Write the log to this file instead of stdout; %h = hostname, %p = pid");

struct LogState {
  std::mutex mu;
  bool initialized = false;
  std::atomic<int> level{-1};
  std::atomic<uint64_t> mask{0};
  FILE* out = stdout;
  char host[64] = {0};
};

LogState& state() {
  static LogState* s = new LogState();  // never destroyed: logging may run during exit
  return *s;
}

thread_local int tlsRank = -1;

uint64_t parseSubsys(const std::string& spec) {
  static const struct { const char* name; uint64_t bit; } kNames[] = {
      {"INIT", kLogInit},   {"COLL", kLogColl},   {"P2P", kLogP2p},
      {"SHM", kLogShm},     {"NET", kLogNet},     {"GRAPH", kLogGraph},
      {"TUNING", kLogTuning}, {"ENV", kLogEnv},   {"ALLOC", kLogAlloc},
      {"CALL", kLogCall},   {"PROXY", kLogProxy}, {"BOOTSTRAP", kLogBootstrap},
      {"RAS", kLogRas},     {"ALL", kLogAll}};
  bool invert = !spec.empty() && spec[0] == '^';
  uint64_t mask = 0;
  size_t pos = invert ? 1 : 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string tok = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    for (auto& c : tok) c = static_cast<char>(toupper(c));
    for (const auto& n : kNames)
      if (tok == n.name) mask |= n.bit;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return invert ? ~mask : mask;
}

void initLocked(LogState& s) {
  std::string lvl = kDebug.get();
  for (auto& c : lvl) c = static_cast<char>(toupper(c));
  int level = 0;
  if (lvl == "VERSION") level = 1;
  else if (lvl == "WARN") level = 2;
  else if (lvl == "INFO") level = 3;
  else if (lvl == "ABORT") level = 4;
  else if (lvl == "TRACE") level = 5;
  gethostname(s.host, sizeof(s.host) - 1);
  if (char* dot = strchr(s.host, '.')) *dot = '\0';
  if (s.out != stdout && s.out != stderr) fclose(s.out);
  s.out = stdout;
  std::string file = kDebugFile.get();
  if (!file.empty() && level > 0) {
    std::string path;
    for (size_t i = 0; i < file.size(); ++i) {
      if (file[i] == '%' && i + 1 < file.size()) {
        char c = file[++i];
        if (c == 'h') path += s.host;
        else if (c == 'p') path += std::to_string(getpid());
        else if (c == '%') path += '%';
        else { path += '%'; path += c; }
      } else {
        path += file[i];
      }
    }
    if (FILE* f = fopen(path.c_str(), "w")) {
      setlinebuf(f);
      s.out = f;
    }
  }
  s.mask.store(parseSubsys(kDebugSubsys.get()));
  s.level.store(level);
  s.initialized = true;
}

void ensureInit() {
  LogState& s = state();
  if (s.level.load(std::memory_order_acquire) >= 0) return;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) {
    try {
      initLocked(s);
    } catch (const Error&) {
      s.level.store(0);
    }
  }
}

}  // namespace

bool logEnabled(LogLevel level, uint64_t subsys) {
  ensureInit();
  LogState& s = state();
  int l = s.level.load(std::memory_order_relaxed);
  if (static_cast<int>(level) > l) return false;
  // WARN and VERSION are shown whatever the subsystem filter says, as in NCCL.
  if (level == LogLevel::kWarn || level == LogLevel::kVersion) return true;
  return (s.mask.load(std::memory_order_relaxed) & subsys) != 0;
}

void logMessage(LogLevel level, uint64_t subsys, const char* file, int line, const char* fmt,
                ...) {
  (void)subsys;
  LogState& s = state();
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  long tid = syscall(SYS_gettid);
  const char* tag = level == LogLevel::kWarn ? "WARN" : level == LogLevel::kTrace ? "TRACE" : "INFO";
  std::lock_guard<std::mutex> lock(s.mu);
  if (level == LogLevel::kVersion) {
    fprintf(s.out, "%s\n", msg);
  } else if (level == LogLevel::kTrace) {
    const char* base = strrchr(file, '/');
    fprintf(s.out, "%s:%d:%ld [%d] NCCL %s %s:%d %s\n", s.host, getpid(), tid, tlsRank, tag,
            base ? base + 1 : file, line, msg);
  } else {
    fprintf(s.out, "%s:%d:%ld [%d] NCCL %s %s\n", s.host, getpid(), tid, tlsRank, tag, msg);
  }
  fflush(s.out);
}

void logReset() {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.initialized = false;
  s.level.store(-1, std::memory_order_release);
}

void setLogRank(int rank) { tlsRank = rank; }
int logRank() { return tlsRank; }

FILE* takeStdoutForReport() {
  fflush(stdout);
  int fd = dup(STDOUT_FILENO);
  FILE* out = fd >= 0 ? fdopen(fd, "w") : nullptr;
  if (!out) {
    if (fd >= 0) close(fd);
    return stdout;
  }
  dup2(STDERR_FILENO, STDOUT_FILENO);
  return out;
}

}  // namespace loom
