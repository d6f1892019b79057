// What the diagnosis tests share: running a command-line tool and reading its output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace loomtest {

// "python3 <source>/<script> ": the start of a command line running one of the Python tools.
inline std::string pythonTool(const char* script) {
  std::string cmd = "python3 ";
  cmd.append(LOOM_SOURCE_DIR).append("/").append(script).append(" ");
  return cmd;
}

// Runs `cmd` through the shell; returns its stdout and stderr, and its exit status in *rc.
inline std::string runTool(const std::string& cmd, int* rc = nullptr) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return "popen failed";
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int st = pclose(p);
  if (rc) *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

}  // namespace loomtest
