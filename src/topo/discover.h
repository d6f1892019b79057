// Live discovery of the local host as NCCL topology XML: NUMA domains and CPU identity
// from /sys/devices/system/node and /proc/cpuinfo, the PCI tree above each GPU and NIC from
// /sys/bus/pci/devices, RDMA ports from /sys/class/infiniband, Ethernet from
// /sys/class/net, GPUs' compute capability and NVLinks from NVML when it loads.
// A machine without GPUs, NVML or RDMA yields its CPUs and plain NICs; nothing here fails
// because a device class is absent.
#pragma once

#include <string>

#include "topo/xml.h"

namespace loom::topo {

struct DetectOptions {
  // Prefix for /sys and /proc: tests point it at a synthetic tree; "" is the live system.
  std::string root;
  bool useNvml = true;
};

XmlNode detectXml(const DetectOptions& options = {});

}  // namespace loom::topo
