// The extension module: makes a LoomBackend for torch.distributed (registered as "loom"
// by loom_torch/__init__.py) and reports which libloom it uses.
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <chrono>

#include "backend.h"

namespace {

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                const std::chrono::duration<float>& timeout) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  py::gil_scoped_release nogil;  // the rendezvous waits on the store and on the other ranks
  return c10::make_intrusive<loom_torch::LoomBackend>(store, rank, size, ms);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Loom as a torch.distributed backend";
  m.def("create_backend", &createBackend, "a Loom process group backend", py::arg("store"),
        py::arg("rank"), py::arg("size"), py::arg("timeout"));
  m.def("library", [] { return loom_torch::loomApi().path; }, "the libloom.so in use");
  m.def("nccl_version", [] {
    int v = 0;
    loom_torch::loomApi().getVersion(&v);
    return v;
  });
}
