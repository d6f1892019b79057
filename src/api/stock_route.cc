#include "api/stock_route.h"

#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace loom::api {
namespace {

struct Handles {
  std::mutex mu;
  std::unordered_map<ncclWindow_t, ncclComm_t> windows;  // stock's window -> its Loom comm
  std::unordered_set<const void*> allocations;           // ncclMemAlloc's, through stock
  std::unordered_map<int, int> loomServed;               // device -> communicators
};
Handles& handles() {
  static Handles* h = new Handles();  // outlives static destruction: apps free late
  return *h;
}

}  // namespace

void checkStock(ncclComm_t comm, ncclResult_t rc, const char* fn) {
  rc = comm->shadow->settle(rc);
  if (rc == ncclSuccess) return;
  throwError(static_cast<Code>(rc), "%s (rank %d, served by stock NCCL): %s", fn, comm->rank,
             comm->shadow->lib().errorText(rc, comm->shadow->stockComm()).c_str());
}

void checkStockCommless(const dispatch::StockNccl& lib, ncclResult_t rc, const char* fn) {
  if (rc != ncclSuccess)
    throwError(static_cast<Code>(rc), "%s (served by stock NCCL): %s", fn,
               lib.errorText(rc, nullptr).c_str());
}

void checkStockQueued(ncclComm_t comm, ncclResult_t rc, const char* fn) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  throwError(static_cast<Code>(rc), "%s (rank %d, served by stock NCCL): %s", fn, comm->rank,
             comm->shadow->lib().errorText(rc, comm->shadow->stockComm()).c_str());
}

void noteStockWindow(ncclWindow_t win, ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(handles().mu);
  handles().windows[win] = comm;
}

bool takeStockWindow(ncclWindow_t win, ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(handles().mu);
  auto it = handles().windows.find(win);
  if (it == handles().windows.end() || it->second != comm) return false;
  handles().windows.erase(it);
  return true;
}

ncclComm_t stockWindowComm(ncclWindow_t win) {
  std::lock_guard<std::mutex> lock(handles().mu);
  auto it = handles().windows.find(win);
  return it == handles().windows.end() ? nullptr : it->second;
}

void forgetStockWindowsOf(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(handles().mu);
  for (auto it = handles().windows.begin(); it != handles().windows.end();)
    it = it->second == comm ? handles().windows.erase(it) : std::next(it);
}

void noteStockAllocation(const void* ptr) {
  std::lock_guard<std::mutex> lock(handles().mu);
  handles().allocations.insert(ptr);
}

bool takeStockAllocation(const void* ptr) {
  std::lock_guard<std::mutex> lock(handles().mu);
  return handles().allocations.erase(ptr) != 0;
}

void countLoomServedDevice(int dev, int delta) {
  std::lock_guard<std::mutex> lock(handles().mu);
  if ((handles().loomServed[dev] += delta) <= 0) handles().loomServed.erase(dev);
}

bool loomServesDevice(int dev) {
  std::lock_guard<std::mutex> lock(handles().mu);
  return handles().loomServed.count(dev) != 0;
}

}  // namespace loom::api
