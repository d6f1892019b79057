// libFuzzer target: a rank's side of the rendezvous, i.e. what loom::Bootstrap makes of the
// root's reply. A fake root in this process reads the rank's hello and answers with the
// input: either as raw bytes (a stranger or a corrupt stream) or, when the first byte is
// odd, as a reply header and address table built from the input and correctly signed
// with the job's secret (a root that knows the secret but misbehaves). The rank must end
// in a value or a loom::Error, never a crash, hang or sanitizer report.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "base/error.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/root.h"
#include "bootstrap/wire.h"
#include "fuzz/fuzz_net.h"

namespace {

constexpr int kRanks = 2;
loom::Socket gListener;
loom::JobId gJob;

// The reply the input describes, for the hello the rank sent.
std::vector<uint8_t> buildReply(const uint8_t* data, size_t size, const loom::RootHello& hello) {
  FuzzedDataProvider in(data, size);
  bool sign = in.ConsumeIntegral<uint8_t>() & 1;
  if (!sign) return in.ConsumeRemainingBytes<uint8_t>();
  loom::RootReplyHeader r{};
  r.magic = in.ConsumeBool() ? loom::kUniqueIdMagic : in.ConsumeIntegral<uint32_t>();
  r.version = in.ConsumeBool() ? loom::kWireVersion : in.ConsumeIntegral<uint16_t>();
  r.status = in.ConsumeIntegralInRange<uint16_t>(0, 4);
  r.nranks = in.ConsumeBool() ? kRanks : in.ConsumeIntegral<int32_t>();
  size_t tableBytes = in.ConsumeIntegralInRange<size_t>(0, 3 * sizeof(sockaddr_storage));
  std::vector<uint8_t> table = in.ConsumeBytes<uint8_t>(tableBytes);
  loom::Digest mac = loom::replyMac(gJob, hello, r, table.data(), table.size());
  memcpy(r.mac, mac.data(), sizeof(r.mac));
  std::vector<uint8_t> out(sizeof(r));
  memcpy(out.data(), &r, sizeof(r));
  out.insert(out.end(), table.begin(), table.end());
  return out;
}

void fakeRoot(const uint8_t* data, size_t size) {
  loom::Socket s = gListener.accept(loom::Deadline::in(10));
  if (!s.isOpen()) return;
  loom::RootHello hello{};
  try {
    s.recvAll(&hello, sizeof(hello), loom::Deadline::in(10), "fake root");
  } catch (const loom::Error&) {
    return;
  }
  std::vector<uint8_t> reply = buildReply(data, size, hello);
  loomfuzz::sendSome(s.fd(), reply.data(), reply.size());
  // Closing ends any read the rank still has pending.
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("NCCL_DEBUG", "", 1);
  setenv("LOOM_BOOTSTRAP_TIMEOUT", "10", 1);
  loom::SocketAddr a = loom::SocketAddr::parse("127.0.0.1:0", "fake root");
  gListener = loom::Socket::listen(a);
  gJob.root = a;
  memset(gJob.secret, 0x3c, sizeof(gJob.secret));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::thread root(fakeRoot, data, size);
  try {
    loom::Bootstrap rank(gJob, 0, kRanks, nullptr);
    // Accepted: the table must be usable as addresses.
    for (int r = 0; r < kRanks; ++r) (void)rank.peerAddr(r).str();
  } catch (const loom::Error&) {
  }
  root.join();
  return 0;
}
