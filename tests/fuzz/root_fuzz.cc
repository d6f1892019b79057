// libFuzzer target: the bootstrap root's wire. One root (loom::startRoot on 127.0.0.1)
// serves the whole run; each input is one stranger's connection: its bytes are sent, the
// stranger half-closes, and the root must hang up on it within 5 s. A root that died,
// hung or accepted a stranger fails the run (abort), as would any sanitizer report.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "base/hmac.h"
#include "bootstrap/root.h"
#include "fuzz/fuzz_net.h"

namespace {

loom::SocketAddr gRoot;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The root logs every stranger it drops; the fuzzer would drown in it.
  setenv("NCCL_DEBUG", "", 1);
  loom::JobId job;
  job.root = loom::SocketAddr::parse("127.0.0.1:0", "fuzz root");
  loom::randomBytes(job.secret, sizeof(job.secret));
  loom::startRoot(job);
  gRoot = job.root;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = loomfuzz::connectTo(gRoot);
  if (fd < 0) {
    fprintf(stderr, "root_fuzz: the root at %s stopped accepting connections\n", gRoot.str().c_str());
    abort();
  }
  loomfuzz::sendSome(fd, data, size);
  shutdown(fd, SHUT_WR);
  if (!loomfuzz::waitClosed(fd, 5000)) {
    fprintf(stderr, "root_fuzz: the root kept a stranger's connection open for 5 s (%zu bytes)\n", size);
    abort();
  }
  close(fd);
  return 0;
}
