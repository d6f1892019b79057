// The other collectives and point-to-point across ranks: broadcast and reduce from every
// root, all-gather and reduce-scatter in and out of place, all-to-all, gather, scatter,
// and send/recv groups (ring exchange, self, several messages per peer, mixed with a
// collective).
#include <nccl.h>

#include <vector>

#include "core/core_util.h"

namespace loomtest {
namespace {

class CollectivesTest : public CoreTest {};

// A value that names its origin: (rank, index) -> distinct int32.
int32_t tag(int rank, size_t i) { return static_cast<int32_t>(rank * 1000003 + i * 7 + 1); }

// One small count and one spanning several 256 KiB FIFO slots (not a multiple of 8).
constexpr size_t kCounts[] = {3, 200003};

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  run([](int rank, int nranks, ncclComm_t comm) {
    for (size_t count : kCounts)
      for (int root = 0; root < nranks; ++root) {
        std::vector<int32_t> send(count), recv(count, -1);
        if (rank == root)
          for (size_t i = 0; i < count; ++i) send[i] = tag(root, i);
        RANK_NCCL(ncclBroadcast(send.data(), recv.data(), count, ncclInt32, root, comm, nullptr));
        for (size_t i = 0; i < count; ++i)
          RANK_CHECK(recv[i] == tag(root, i), "broadcast root %d count %zu: [%zu] = %d, want %d",
                     root, count, i, recv[i], tag(root, i));
        // In place, through the legacy ncclBcast.
        std::vector<int32_t> buf(count, -1);
        if (rank == root)
          for (size_t i = 0; i < count; ++i) buf[i] = tag(root + 1, i);
        RANK_NCCL(ncclBcast(buf.data(), count, ncclInt32, root, comm, nullptr));
        for (size_t i = 0; i < count; ++i)
          RANK_CHECK(buf[i] == tag(root + 1, i), "bcast root %d count %zu: [%zu] = %d, want %d",
                     root, count, i, buf[i], tag(root + 1, i));
      }
    return std::string();
  });
}

TEST_P(CollectivesTest, ReduceToEveryRoot) {
  run([](int rank, int nranks, ncclComm_t comm) {
    for (size_t count : kCounts)
      for (int root = 0; root < nranks; ++root) {
        std::vector<int64_t> send(count), recv(count, -1);
        for (size_t i = 0; i < count; ++i) send[i] = (rank + 1) * static_cast<int64_t>(i) - root;
        RANK_NCCL(ncclReduce(send.data(), recv.data(), count, ncclInt64, ncclSum, root, comm,
                             nullptr));
        if (rank == root) {
          for (size_t i = 0; i < count; ++i) {
            int64_t want = static_cast<int64_t>(nranks) * (nranks + 1) / 2 * i - nranks * root;
            RANK_CHECK(recv[i] == want, "reduce root %d count %zu: [%zu] = %lld, want %lld", root,
                       count, i, static_cast<long long>(recv[i]), static_cast<long long>(want));
          }
        }
        // Max in place on the root.
        std::vector<float> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((rank * 31 + i) % 97);
        RANK_NCCL(ncclReduce(buf.data(), buf.data(), count, ncclFloat, ncclMax, root, comm, nullptr));
        if (rank == root)
          for (size_t i = 0; i < count; ++i) {
            float want = 0;
            for (int r = 0; r < nranks; ++r) want = std::max(want, static_cast<float>((r * 31 + i) % 97));
            RANK_CHECK(buf[i] == want, "reduce max root %d: [%zu] = %g, want %g", root, i, buf[i],
                       want);
          }
      }
    return std::string();
  });
}

TEST_P(CollectivesTest, AllGatherInAndOutOfPlace) {
  run([](int rank, int nranks, ncclComm_t comm) {
    for (size_t count : kCounts) {
      std::vector<int32_t> send(count), recv(count * nranks, -1);
      for (size_t i = 0; i < count; ++i) send[i] = tag(rank, i);
      RANK_NCCL(ncclAllGather(send.data(), recv.data(), count, ncclInt32, comm, nullptr));
      for (int r = 0; r < nranks; ++r)
        for (size_t i = 0; i < count; ++i)
          RANK_CHECK(recv[r * count + i] == tag(r, i), "out-of-place count %zu: block %d [%zu] = %d",
                     count, r, i, recv[r * count + i]);
      // In place: sendbuff is this rank's block of recvbuff.
      std::vector<int32_t> buf(count * nranks, -1);
      for (size_t i = 0; i < count; ++i) buf[rank * count + i] = tag(rank + 100, i);
      RANK_NCCL(ncclAllGather(buf.data() + rank * count, buf.data(), count, ncclInt32, comm, nullptr));
      for (int r = 0; r < nranks; ++r)
        for (size_t i = 0; i < count; ++i)
          RANK_CHECK(buf[r * count + i] == tag(r + 100, i), "in-place count %zu: block %d [%zu] = %d",
                     count, r, i, buf[r * count + i]);
    }
    return std::string();
  });
}

TEST_P(CollectivesTest, ReduceScatterInAndOutOfPlace) {
  run([](int rank, int nranks, ncclComm_t comm) {
    for (size_t count : kCounts) {
      // Element j of the full vector from rank r: (r + 1) * (j % 4096).
      auto want = [&](size_t j) {
        return static_cast<int32_t>(nranks * (nranks + 1) / 2 * static_cast<int32_t>(j % 4096));
      };
      std::vector<int32_t> send(count * nranks), recv(count, -1);
      for (size_t j = 0; j < send.size(); ++j) send[j] = (rank + 1) * static_cast<int32_t>(j % 4096);
      RANK_NCCL(ncclReduceScatter(send.data(), recv.data(), count, ncclInt32, ncclSum, comm, nullptr));
      for (size_t i = 0; i < count; ++i)
        RANK_CHECK(recv[i] == want(rank * count + i), "out-of-place count %zu: [%zu] = %d, want %d",
                   count, i, recv[i], want(rank * count + i));
      // In place: recvbuff is this rank's block of sendbuff.
      std::vector<int32_t> buf(count * nranks);
      for (size_t j = 0; j < buf.size(); ++j) buf[j] = (rank + 1) * static_cast<int32_t>(j % 4096);
      int32_t* mine = buf.data() + rank * count;
      RANK_NCCL(ncclReduceScatter(buf.data(), mine, count, ncclInt32, ncclSum, comm, nullptr));
      for (size_t i = 0; i < count; ++i)
        RANK_CHECK(mine[i] == want(rank * count + i), "in-place count %zu: [%zu] = %d, want %d",
                   count, i, mine[i], want(rank * count + i));
    }
    return std::string();
  });
}

// Value rank `from` sends to rank `to` at index i.
int32_t tag3(int from, int to, size_t i) { return tag(from * 64 + to, i); }

TEST_P(CollectivesTest, AlltoAll) {
  run([](int rank, int nranks, ncclComm_t comm) {
    for (size_t count : kCounts) {
      std::vector<int32_t> send(count * nranks), recv(count * nranks, -1);
      for (int p = 0; p < nranks; ++p)
        for (size_t i = 0; i < count; ++i) send[p * count + i] = tag3(rank, p, i);
      RANK_NCCL(ncclAlltoAll(send.data(), recv.data(), count, ncclInt32, comm, nullptr));
      for (int p = 0; p < nranks; ++p)
        for (size_t i = 0; i < count; ++i)
          RANK_CHECK(recv[p * count + i] == tag3(p, rank, i),
                     "count %zu: block from %d [%zu] = %d, want %d", count, p, i,
                     recv[p * count + i], tag3(p, rank, i));
    }
    return std::string();
  });
}

TEST_P(CollectivesTest, GatherAndScatterEveryRoot) {
  run([](int rank, int nranks, ncclComm_t comm) {
    const size_t count = 70001;
    for (int root = 0; root < nranks; ++root) {
      std::vector<int32_t> send(count), recv(rank == root ? count * nranks : 0, -1);
      for (size_t i = 0; i < count; ++i) send[i] = tag3(rank, root, i);
      RANK_NCCL(ncclGather(send.data(), rank == root ? recv.data() : nullptr, count, ncclInt32,
                           root, comm, nullptr));
      if (rank == root)
        for (int p = 0; p < nranks; ++p)
          for (size_t i = 0; i < count; ++i)
            RANK_CHECK(recv[p * count + i] == tag3(p, root, i),
                       "gather root %d: block %d [%zu] = %d", root, p, i, recv[p * count + i]);

      std::vector<int32_t> all(rank == root ? count * nranks : 0), mine(count, -1);
      if (rank == root)
        for (int p = 0; p < nranks; ++p)
          for (size_t i = 0; i < count; ++i) all[p * count + i] = tag3(root, p, i);
      RANK_NCCL(ncclScatter(rank == root ? all.data() : nullptr, mine.data(), count, ncclInt32,
                            root, comm, nullptr));
      for (size_t i = 0; i < count; ++i)
        RANK_CHECK(mine[i] == tag3(root, rank, i), "scatter root %d: [%zu] = %d, want %d", root,
                   i, mine[i], tag3(root, rank, i));
    }
    return std::string();
  });
}

// Every rank sends to next and receives from prev in one group. 3 MiB is more than a
// connection's FIFO holds, so the same calls issued one by one would deadlock.
TEST_P(CollectivesTest, SendRecvRingInGroup) {
  run([](int rank, int nranks, ncclComm_t comm) {
    const size_t count = (3 << 20) / 4 + 11;
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    std::vector<int32_t> send(count), recv(count, -1);
    for (size_t i = 0; i < count; ++i) send[i] = tag3(rank, next, i);
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclSend(send.data(), count, ncclInt32, next, comm, nullptr));
    RANK_NCCL(ncclRecv(recv.data(), count, ncclInt32, prev, comm, nullptr));
    RANK_NCCL(ncclGroupEnd());
    for (size_t i = 0; i < count; ++i)
      RANK_CHECK(recv[i] == tag3(prev, rank, i), "[%zu] = %d, want %d from rank %d", i, recv[i],
                 tag3(prev, rank, i), prev);
    return std::string();
  });
}

// Several messages to the same peer in one group arrive in issue order, each in its own
// buffer, with different sizes and types; both directions of the ring at once.
TEST_P(CollectivesTest, SendRecvSeveralMessagesBothWays) {
  run([](int rank, int nranks, ncclComm_t comm) {
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    const size_t sizes[] = {5, 300001, 0, 17};
    std::vector<std::vector<int32_t>> toNext(4), toPrev(4), fromPrev(4), fromNext(4);
    for (int m = 0; m < 4; ++m) {
      toNext[m].resize(sizes[m]);
      toPrev[m].resize(sizes[m]);
      fromPrev[m].assign(sizes[m], -1);
      fromNext[m].assign(sizes[m], -1);
      for (size_t i = 0; i < sizes[m]; ++i) {
        toNext[m][i] = tag3(rank, next, i) + m;
        toPrev[m][i] = -tag3(rank, prev, i) - m;
      }
    }
    RANK_NCCL(ncclGroupStart());
    for (int m = 0; m < 4; ++m) {
      RANK_NCCL(ncclSend(toNext[m].data(), sizes[m], ncclInt32, next, comm, nullptr));
      RANK_NCCL(ncclRecv(fromNext[m].data(), sizes[m], ncclInt32, next, comm, nullptr));
      RANK_NCCL(ncclSend(toPrev[m].data(), sizes[m], ncclInt32, prev, comm, nullptr));
      RANK_NCCL(ncclRecv(fromPrev[m].data(), sizes[m], ncclInt32, prev, comm, nullptr));
    }
    RANK_NCCL(ncclGroupEnd());
    // With one or two ranks next == prev: messages to that peer (and from it) pair up in
    // issue order, so what arrives first is the peer's "to next" message.
    bool samePeer = next == prev;
    for (int m = 0; m < 4; ++m)
      for (size_t i = 0; i < sizes[m]; ++i) {
        int32_t wantPrev = samePeer ? -tag3(prev, rank, i) - m : tag3(prev, rank, i) + m;
        int32_t wantNext = samePeer ? tag3(next, rank, i) + m : -tag3(next, rank, i) - m;
        RANK_CHECK(fromPrev[m][i] == wantPrev, "message %d from prev: [%zu] = %d, want %d", m, i,
                   fromPrev[m][i], wantPrev);
        RANK_CHECK(fromNext[m][i] == wantNext, "message %d from next: [%zu] = %d, want %d", m, i,
                   fromNext[m][i], wantNext);
      }
    return std::string();
  });
}

TEST_P(CollectivesTest, SendToSelf) {
  run([](int rank, int nranks, ncclComm_t comm) {
    const size_t count = 100003;
    std::vector<int32_t> send(count), recv(count, -1);
    for (size_t i = 0; i < count; ++i) send[i] = tag3(rank, rank, i);
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclSend(send.data(), count, ncclInt32, rank, comm, nullptr));
    RANK_NCCL(ncclRecv(recv.data(), count, ncclInt32, rank, comm, nullptr));
    RANK_NCCL(ncclGroupEnd());
    for (size_t i = 0; i < count; ++i)
      RANK_CHECK(recv[i] == send[i], "[%zu] = %d, want %d", i, recv[i], send[i]);
    return std::string();
  });
}

// A collective and point-to-point traffic in one group.
TEST_P(CollectivesTest, GroupMixingAllReduceAndSendRecv) {
  run([](int rank, int nranks, ncclComm_t comm) {
    const size_t count = 65537;
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    std::vector<float> arIn(count), arOut(count, -1);
    for (size_t i = 0; i < count; ++i) arIn[i] = static_cast<float>((rank + 1) * (i % 100));
    std::vector<int32_t> send(count), recv(count, -1);
    for (size_t i = 0; i < count; ++i) send[i] = tag3(rank, next, i);
    RANK_NCCL(ncclGroupStart());
    RANK_NCCL(ncclAllReduce(arIn.data(), arOut.data(), count, ncclFloat, ncclSum, comm, nullptr));
    RANK_NCCL(ncclSend(send.data(), count, ncclInt32, next, comm, nullptr));
    RANK_NCCL(ncclRecv(recv.data(), count, ncclInt32, prev, comm, nullptr));
    RANK_NCCL(ncclGroupEnd());
    float factor = static_cast<float>(nranks * (nranks + 1) / 2);
    for (size_t i = 0; i < count; ++i) {
      RANK_CHECK(arOut[i] == factor * (i % 100), "all-reduce [%zu] = %g, want %g", i, arOut[i],
                 factor * (i % 100));
      RANK_CHECK(recv[i] == tag3(prev, rank, i), "recv [%zu] = %d, want %d", i, recv[i],
                 tag3(prev, rank, i));
    }
    return std::string();
  });
}

INSTANTIATE_TEST_SUITE_P(Core, CollectivesTest, testing::ValuesIn(fullMatrix()), coreParamName);

}  // namespace
}  // namespace loomtest
