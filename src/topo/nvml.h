// GPUs and NVLinks from NVML, reached through dlopen so that Loom loads where no driver is
// installed. Absence is a normal outcome (returns false with the reason), never an error.
#pragma once

#include <string>
#include <vector>

namespace loom::topo {

struct NvmlLink {
  std::string remoteBusId;  // normalized where possible, else as NVML spelled it
  int count = 0;            // active links to that remote device
};

struct NvmlGpu {
  int index = -1;       // NVML index (PCI bus order, the order CUDA_DEVICE_ORDER=PCI_BUS_ID uses)
  std::string busId;    // "0000:18:00.0"
  int sm = 0;           // compute capability major*10+minor
  std::vector<NvmlLink> links;
};

// Fills `gpus` from libnvidia-ml.so.1; false with `why` set when NVML is absent or fails.
bool queryNvml(std::vector<NvmlGpu>* gpus, std::string* why);

}  // namespace loom::topo
