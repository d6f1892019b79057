// The TCP control stream beside a connection whose data moves by other means (UCX, verbs):
// it carries the connection's set-up, the sender's goodbye when it closes, and, by
// ending, the news that the peer's process is gone, which the data path itself may
// report late or never (a receive waits for data that will not come).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "base/error.h"
#include "base/socket.h"
#include "base/time.h"

namespace loom {

constexpr uint64_t kGoodbyeMagic = 0x4c55435842594521ull;
constexpr double kDrainSec = 5;  // a message sent before its sender's goodbye may take this
                                 // long to arrive (it travels on another connection)
constexpr double kGraceSec = 1;  // the end of a control stream waits this long for data the
                                 // other connection still carries

// A sender's last word on the control stream.
struct Goodbye {
  uint64_t magic;
  uint64_t sent;  // messages handed over for good; none after them will come
};

class PeerControl {
 protected:
  PeerControl(Socket control, std::string who)
      : control_(std::move(control)), who_(std::move(who)) {
    control_.setNonBlocking(true);
  }

  // Reads what the control stream holds, at most every millisecond: `into` (if any)
  // fills with the peer's goodbye; true once the peer has closed the stream.
  bool pollControl(Goodbye* into, size_t* have) {
    uint64_t now = nowNs();
    if (now - lastPoll_ < 1000000) return eof_;
    lastPoll_ = now;
    while (!eof_) {
      // Past the goodbye (or with none due) only the end of the stream may come.
      char scratch[sizeof(Goodbye)];
      bool full = !into || *have == sizeof(Goodbye);
      char* at = full ? scratch : reinterpret_cast<char*>(into) + *have;
      size_t room = full ? sizeof(scratch) : sizeof(Goodbye) - *have;
      bool eof = false;
      size_t n;
      try {
        n = control_.tryRecv(at, room, who_.c_str(), &eof);
      } catch (const Error&) {
        eof = true;  // reset: the peer's process is gone
        n = 0;
      }
      if (eof) markEnded();
      if (n == 0) break;
      if (full)
        LOOM_THROW(kRemoteError, "%s: unexpected data on the control stream", who_.c_str());
      *have += n;
    }
    return eof_;
  }

  // A receive (message `seq`) its sender will never match fails. The goodbye says how
  // many messages are on their way: later receives fail at once, earlier ones get
  // kDrainSec to arrive. A stream closed without a goodbye means the sender's process
  // died: what it sent before gets kGraceSec.
  void checkSender(uint64_t seq) {
    if (!pollControl(&bye_, &byeBytes_)) return;
    bool said = byeBytes_ == sizeof(bye_) && bye_.magic == kGoodbyeMagic;
    if (said && seq >= bye_.sent)
      LOOM_THROW(kRemoteError, "%s: the peer closed the connection after its %llu messages",
                 who_.c_str(), static_cast<unsigned long long>(bye_.sent));
    if (!endedFor(said ? kDrainSec : kGraceSec)) return;
    if (said)
      LOOM_THROW(kRemoteError, "%s: message %llu, sent before the peer closed the connection, "
                 "did not arrive within %.0f s", who_.c_str(),
                 static_cast<unsigned long long>(seq), kDrainSec);
    LOOM_THROW(kRemoteError, "%s: the peer's connection closed without a goodbye (process "
               "exited?)", who_.c_str());
  }

  // A sender's last word: `sent` messages are on their way. Quietly nothing when the
  // receiver is gone already.
  void sayGoodbye(uint64_t sent) {
    Goodbye g{kGoodbyeMagic, sent};
    try {
      control_.sendAll(&g, sizeof(g), Deadline::in(1), who_.c_str());
    } catch (const Error&) {
    }
  }

  void markEnded() {
    eof_ = true;
    eofAt_ = nowNs();
  }
  // Whether the control stream ended more than `sec` ago.
  bool endedFor(double sec) const { return eof_ && nowNs() - eofAt_ > sec * 1e9; }

  Socket control_;
  std::string who_;
  uint64_t lastPoll_ = 0;
  bool eof_ = false;
  uint64_t eofAt_ = 0;
  Goodbye bye_{};  // a receiver's: what its sender said on closing
  size_t byeBytes_ = 0;
};

}  // namespace loom
