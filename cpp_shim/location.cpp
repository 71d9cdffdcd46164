// Where a recorded op comes from: the innermost Python frame outside torch
// and rtpu, so deferred errors and recompile explanations can name the
// user's line. The shim does not link Python (libtorch programs use it
// too), so the CPython API is looked up at run time; without it (or on a
// thread not holding the GIL, such as autograd's backward threads) ops have
// the unknown location.

#include "rtpu_torch.h"

#include <dlfcn.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rtpu_torch {
namespace {

// The few CPython functions used, all part of the stable C API since 3.9.
struct PythonApi {
  int (*is_initialized)();
  void* (*this_thread_state)();  // borrowed; NULL on a thread without Python
  int (*gil_ensure)();
  void (*gil_release)(int);
  void* (*get_frame)();  // borrowed
  void* (*frame_back)(void*);  // new reference
  void* (*frame_code)(void*);  // new reference
  int (*frame_line)(void*);
  // Python 3.11+; NULL before: the line is then computed on every op.
  int (*frame_lasti)(void*);
  void (*incref)(void*);
  void (*decref)(void*);
  void* (*get_attr)(void*, const char*);  // new reference
  const char* (*utf8)(void*);  // borrowed
  void (*clear_error)();

  static const PythonApi* get() {
    static const PythonApi* api = load();
    return api;
  }

 private:
  template <typename F>
  static bool find(F& slot, const char* name) {
    slot = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
    return slot != nullptr;
  }

  static const PythonApi* load() {
    static PythonApi api;
    const bool all = find(api.is_initialized, "Py_IsInitialized") &&
        find(api.this_thread_state, "PyGILState_GetThisThreadState") &&
        find(api.gil_ensure, "PyGILState_Ensure") &&
        find(api.gil_release, "PyGILState_Release") &&
        find(api.get_frame, "PyEval_GetFrame") &&
        find(api.frame_back, "PyFrame_GetBack") &&
        find(api.frame_code, "PyFrame_GetCode") &&
        find(api.frame_line, "PyFrame_GetLineNumber") &&
        find(api.incref, "Py_IncRef") && find(api.decref, "Py_DecRef") &&
        find(api.get_attr, "PyObject_GetAttrString") &&
        find(api.utf8, "PyUnicode_AsUTF8") &&
        find(api.clear_error, "PyErr_Clear");
    find(api.frame_lasti, "PyFrame_GetLasti");
    return all ? &api : nullptr;
  }
};

struct CodeInfo {
  std::string where;  // "file" and " in function"
  bool internal = false;
};

// Everything below is touched only while holding the GIL.
std::vector<std::string>& internal_prefixes() {
  static auto* prefixes = new std::vector<std::string>();
  return *prefixes;
}

std::string string_attr(const PythonApi& api, void* object, const char* name) {
  void* value = api.get_attr(object, name);
  if (value == nullptr) {
    api.clear_error();
    return "?";
  }
  const char* text = api.utf8(value);
  std::string out = text != nullptr ? text : "?";
  if (text == nullptr) {
    api.clear_error();
  }
  api.decref(value);
  return out;
}

const CodeInfo& code_info(const PythonApi& api, void* code) {
  static auto* cache = new std::unordered_map<void*, CodeInfo>();
  auto found = cache->find(code);
  if (found != cache->end()) {
    return found->second;
  }
  // The cache keeps each code object alive, so its address is never reused
  // by another one.
  api.incref(code);
  CodeInfo info;
  const std::string file = string_attr(api, code, "co_filename");
  for (const auto& prefix : internal_prefixes()) {
    info.internal = info.internal || file.rfind(prefix, 0) == 0;
  }
  info.where = file;
  return cache->emplace(code, std::move(info)).first->second;
}

// The frame's location id, cached by code object and instruction offset:
// a frame's line number is computed by walking its code's line table, which
// costs more than the rest of an op's location.
uint32_t location_id(const PythonApi& api, void* frame, void* code, const CodeInfo& info) {
  struct Hash {
    size_t operator()(const std::pair<void*, int>& key) const {
      return std::hash<void*>()(key.first) ^ (static_cast<size_t>(key.second) << 1);
    }
  };
  // Keyed by offset where the API gives it, else by line (never both in
  // one process, so the two kinds of key cannot collide).
  static auto* ids = new std::unordered_map<std::pair<void*, int>, uint32_t, Hash>();
  const int offset = api.frame_lasti != nullptr ? api.frame_lasti(frame) : api.frame_line(frame);
  const auto key = std::make_pair(code, offset);
  auto found = ids->find(key);
  if (found != ids->end()) {
    return found->second;
  }
  const int line = api.frame_lasti != nullptr ? api.frame_line(frame) : offset;
  const std::string text = info.where + ":" + std::to_string(line) + " in " +
      string_attr(api, code, "co_name");
  const uint32_t id = rtpu_location_intern(text.c_str());
  ids->emplace(key, id);
  return id;
}

}  // namespace

void set_internal_paths(const std::vector<std::string>& prefixes) {
  internal_prefixes() = prefixes;
}

uint32_t python_location() {
  const PythonApi* api = PythonApi::get();
  if (api == nullptr || !api->is_initialized() ||
      api->this_thread_state() == nullptr) {
    return 0;
  }
  const int gil = api->gil_ensure();
  void* frame = api->get_frame();
  uint32_t id = 0;
  if (frame != nullptr) {
    api->incref(frame);
  }
  // Bounded: a deep stack of torch frames ends in the unknown location.
  for (int depth = 0; frame != nullptr && depth < 64; ++depth) {
    void* code = api->frame_code(frame);
    const CodeInfo& info = code_info(*api, code);
    if (!info.internal) {
      id = location_id(*api, frame, code, info);
      api->decref(code);
      break;
    }
    api->decref(code);
    void* back = api->frame_back(frame);
    api->decref(frame);
    frame = back;
  }
  if (frame != nullptr) {
    api->decref(frame);
  }
  api->gil_release(gil);
  return id;
}

}  // namespace rtpu_torch
