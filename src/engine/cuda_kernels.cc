#include "engine/cuda_kernels.h"

#include <dlfcn.h>

#include <atomic>
#include <memory>
#include <vector>

#include "base/config.h"
#include "base/cuda_driver.h"
#include "base/dl.h"
#include "base/log.h"

namespace loom::cuda {
namespace {

StringKnob kKernelsLibrary("LOOM_CUDA_KERNELS_LIBRARY", "", "",
                           "Path of Loom's CUDA kernels module (libloom-cuda-kernels.so); "
                           "empty: the one next to libloom, else the loader's search");

void anchor() {}

const Kernels* load() {
  std::vector<std::string> names;
  const std::string set = kKernelsLibrary.get();
  // The module's CUDA runtime always opens the system's libcuda.so.1: with another driver
  // library selected (LOOM_CUDA_DRIVER_LIBRARY, a stand-in), only a module named here fits.
  if (set.empty() && driverLibraryChosen()) {
    LOOM_INFO(kLogInit, "LOOM_CUDA_DRIVER_LIBRARY set and no LOOM_CUDA_KERNELS_LIBRARY: no CUDA "
              "kernels module (device collectives of ranks sharing a GPU reduce on the host)");
    return nullptr;
  }
  if (!set.empty()) {
    names.push_back(set);
  } else {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&anchor), &info) != 0 && info.dli_fname) {
      std::string self = info.dli_fname;
      size_t slash = self.rfind('/');
      if (slash != std::string::npos)
        names.push_back(self.substr(0, slash + 1) + LOOM_CUDA_KERNELS_LIBRARY);
    }
    names.push_back(LOOM_CUDA_KERNELS_LIBRARY);
  }
  std::string error;
  // Kept for the process's life once bound (kernels may run at exit), reachable from the
  // Kernels it returns.
  auto lib = std::make_unique<DynLib>(DynLib::open(names, &error));
  loomCudaKernelsAbiVersion_t version = nullptr;
  auto k = std::make_unique<Kernels>();
  if (!lib->loaded()) {
    LOOM_INFO(kLogInit, "no CUDA kernels module (%s): device collectives of ranks sharing a "
              "GPU reduce on the host", error.c_str());
    return nullptr;
  }
  if (!lib->bind(version, "loomCudaKernelsAbiVersion") || version() != LOOM_CUDA_KERNELS_ABI_VERSION ||
      !lib->bind(k->reduce, "loomCudaReduce") || !lib->bind(k->reduceMulti, "loomCudaReduceMulti") ||
      !lib->bind(k->interpLaunch, "loomCudaInterpLaunch")) {
    LOOM_INFO(kLogInit, "%s: not Loom's CUDA kernels module of ABI %d; not used",
              lib->path().c_str(), LOOM_CUDA_KERNELS_ABI_VERSION);
    return nullptr;
  }
  k->path = lib->path();
  k->lib = lib.release();
  LOOM_INFO(kLogInit, "CUDA kernels module %s", k->path.c_str());
  return k.release();
}

std::atomic<bool> gDisabled{false};

}  // namespace

const Kernels* kernels() {
  static const Kernels* k = load();
  return gDisabled.load(std::memory_order_acquire) ? nullptr : k;
}

void disableKernels(const std::string& why) {
  const Kernels* k = kernels();
  if (gDisabled.exchange(true)) return;
  LOOM_WARN("CUDA kernels module %s: %s; device collectives of ranks sharing a GPU reduce on "
            "the host from now on",
            k ? k->path.c_str() : "", why.c_str());
}

}  // namespace loom::cuda
