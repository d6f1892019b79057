// RDMA devices as the verbs backend will see them (issue 12 item 3): libibverbs reached
// through dlopen (libibverbs.so.1; nothing is linked), every port of every device with
// its state and link layer, and NCCL_IB_HCA's selection rules:
//   "mlx5"          devices whose name starts with mlx5 (any port)
//   "=mlx5_0:1"     exactly mlx5_0, port 1
//   "^mlx5_1"       every device except those starting with mlx5_1; "^=" excludes exact names
// Entries are comma-separated; a ":port" suffix narrows an entry to one port.
#pragma once

#include <string>
#include <vector>

namespace loom {

struct IbPort {
  std::string device;   // "mlx5_0", "rxe0"
  int port = 0;         // 1-based, as verbs numbers them
  bool active = false;  // IBV_PORT_ACTIVE
  std::string linkLayer;  // "InfiniBand" or "Ethernet" (RoCE)
  int gidTable = 0;     // the GID table's length
};

struct IbHcaFilter {
  struct Entry {
    std::string name;
    int port = -1;  // -1: any
  };
  bool exclude = false;  // '^'
  bool exact = false;    // '='
  std::vector<Entry> entries;  // empty: everything

  // Throws kInvalidArgument naming NCCL_IB_HCA and the bad entry.
  static IbHcaFilter parse(const std::string& spec);
  bool matches(const std::string& device, int port) const;
};

// Every port of every RDMA device; empty with `*why` set when there are none or
// libibverbs is not there.
std::vector<IbPort> listIbPorts(std::string* why);

// The active ports NCCL_IB_HCA (`spec`) selects from `ports`. Throws kInvalidArgument
// when the filter leaves none although active ports exist, naming them.
std::vector<IbPort> selectIbPorts(const std::vector<IbPort>& ports, const std::string& spec);

std::string describe(const IbPort& p);  // "rxe0:1 ACTIVE Ethernet (RoCE)"

// NCCL_IB_HCA as set (LOOM_IB_HCA), "" when unset.
std::string ibHcaSpec();

}  // namespace loom
