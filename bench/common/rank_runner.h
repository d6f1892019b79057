// One rank's part of the benchmark: nccl-tests' TimeTest / BenchTime loop on host buffers,
// or on device buffers and a stream of the rank's own (BenchProcess::cuda()).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "bench/common/collective.h"
#include "bench/common/runner.h"

namespace loom::bench {

// Page-aligned host memory; RankRunner writes all of it before it times anything.
class HostBuffer {
 public:
  explicit HostBuffer(size_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

class RankRunner {
 public:
  // `comm` runs the test; `ctl` (the whole job's, the same without NCCL_TESTS_SPLIT) the
  // control traffic between timed calls.
  RankRunner(BenchProcess& proc, int thread, ncclComm_t comm, ncclComm_t ctl);
  ~RankRunner();
  void run();  // the whole sweep

  int errors() const { return errors_; }  // checks with wrong elements on this rank
  double bwSum() const { return bwSum_; }
  int bwCount() const { return bwCount_; }

  // Control traffic between the timed calls, over the whole job's communicator.
  void barrier();
  double reduceScalar(double v, int mode);  // nccl-tests' -a: 0 rank 0, 1 avg, 2 min, 3 max
  int64_t sumAll(int64_t v);
  void maxAll(std::vector<double>& v);

 private:
  void timeTest(const TypeInfo& type, const OpInfo& op, int root);
  void prepareBuffers(const TypeInfo& type);
  void setupSize(size_t bytes);
  size_t nextSize(size_t size) const;
  void benchTime(bool inPlace);
  void timeGraph(bool inPlace);
  void report(bool inPlace, double deltaSec, double cpuSec, std::vector<double> iterTimes);
  void startColl(bool inPlace, int iter);
  void injectWrong(const DataContext& c) const;
  DataContext dataContext(bool inPlace, uint64_t seed) const;
  void registerBuffers();
  void deregisterBuffers();
  // Device buffers: the address a call takes for a pointer into a host buffer (its mirror),
  // copies between mirror and device around checked calls, and waiting for the stream.
  void* onDevice(void* p) const;
  void upload() const;
  void download() const;
  void syncStream() const;

  BenchProcess& proc_;
  const Options& o_;
  const Collective& coll_;
  const int thread_;
  const int worldRank_;  // in the whole job
  const int worldRanks_;
  ncclComm_t comm_;      // the communicator under test (the job's, or a split group's)
  ncclComm_t ctl_;       // the job's
  int rank_ = 0;         // in comm_
  int nranks_ = 1;
  std::unique_ptr<HostBuffer> sendBuf_, recvBuf_;  // host buffers
  std::unique_ptr<DeviceBuffer> sendDev_, recvDev_;  // or device buffers with host mirrors
  char* sendBase_ = nullptr;  // the host buffer or the mirror
  char* recvBase_ = nullptr;
  size_t bufBytes_ = 0;
  void* stream_ = nullptr;
  char* send_ = nullptr;  // after -u misalignment
  char* recv_ = nullptr;
  void* sendHandle_ = nullptr;
  void* recvHandle_ = nullptr;
  ncclWindow_t sendWin_ = nullptr;  // -R 2
  ncclWindow_t recvWin_ = nullptr;

  // The test in progress.
  const TypeInfo* type_ = nullptr;
  const OpInfo* op_ = nullptr;
  ncclRedOp_t ncclOp_ = ncclSum;
  bool opCreated_ = false;
  int root_ = -1;
  Counts counts_;
  size_t sendBytes_ = 0, recvBytes_ = 0;
  uint64_t rep_ = 0;

  int errors_ = 0;
  double bwSum_ = 0;
  int bwCount_ = 0;
};

}  // namespace loom::bench
