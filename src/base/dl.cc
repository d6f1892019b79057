#include "base/dl.h"

#include <dlfcn.h>
#include <link.h>

namespace loom {

DynLib::~DynLib() {
  if (handle_) dlclose(handle_);
}

DynLib& DynLib::operator=(DynLib&& o) noexcept {
  if (this != &o) {
    if (handle_) dlclose(handle_);
    handle_ = o.handle_;
    path_ = std::move(o.path_);
    o.handle_ = nullptr;
  }
  return *this;
}

DynLib DynLib::open(const std::vector<std::string>& names, std::string* error, int extraFlags) {
  std::string tried;
  for (const std::string& name : names) {
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | extraFlags);
    if (!h) {
      const char* why = dlerror();
      if (!tried.empty()) tried += "; ";
      tried += name + " (" + (why ? why : "unknown dlopen error") + ")";
      continue;
    }
    DynLib lib;
    lib.handle_ = h;
    // Report the file the loader actually picked, which is what a user debugging a
    // version mismatch needs; fall back to the name asked for.
    link_map* map = nullptr;
    if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name)
      lib.path_ = map->l_name;
    else
      lib.path_ = name;
    return lib;
  }
  if (error)
    *error = names.empty() ? std::string("no library names to try") : "tried " + tried;
  return DynLib();
}

void* DynLib::symbol(const char* name) const {
  if (!handle_) return nullptr;
  return dlsym(handle_, name);
}

}  // namespace loom
