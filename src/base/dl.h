// dlopen wrapper: optional runtimes (CUDA, NVML, verbs, UCX, NCCL) are only ever reached
// through this, so libloom loads on machines that have none of them.
#pragma once

#include <string>
#include <vector>

namespace loom {

class DynLib {
 public:
  DynLib() = default;
  ~DynLib();
  DynLib(DynLib&& o) noexcept : handle_(o.handle_), path_(std::move(o.path_)) { o.handle_ = nullptr; }
  DynLib& operator=(DynLib&& o) noexcept;
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;

  // Tries each name in order (RTLD_NOW | RTLD_LOCAL | extraFlags); returns an unloaded
  // DynLib and sets `error` (if given) when none loads.
  static DynLib open(const std::vector<std::string>& names, std::string* error = nullptr,
                     int extraFlags = 0);
  bool loaded() const { return handle_ != nullptr; }
  const std::string& path() const { return path_; }
  void* symbol(const char* name) const;  // nullptr if absent

  template <typename Fn>
  bool bind(Fn*& fn, const char* name) const {
    fn = reinterpret_cast<Fn*>(symbol(name));
    return fn != nullptr;
  }

 private:
  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace loom
