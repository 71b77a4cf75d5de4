"""The C++ guard checker: a cache entry's guards (those program.py can express) run as one
C++ call.

Generated Python spends about 0.1 us on each attribute read, `type(...) is`, `==` and
`len`, and about 0.4 us on a tensor guard (six properties, each read through a call that
builds a Python object). A ResNet-50 forward guards some 1,300 module attributes and 268
tensors on every call, before its first kernel starts. Here a straight-line program reads
each object on the way once into a register and runs each test through the C API; the
expected tensor properties are unpacked once into C++ structs and read off each
TensorImpl: tens of nanoseconds a guard.

The extension is built once per machine, Python and torch (the system C++ compiler against
torch's headers, about 10-25 s) on a background thread, into `engine.config.native_dir`.
Until it is ready (or where it cannot be built) the guards stay Python, with the same
meaning; guards compiled before it was ready switch to it when it is.

It also computes the placement of a graph's inputs (`placement`): the storage offsets of
~600 optimizer-step inputs that share no storage, checked on every call of a graph that
writes its inputs (0.2-0.35 ms of Python a step on the H200 machines)."""

from __future__ import annotations

from typing import Optional

import torch

from ..native_build import BackgroundBuild
from .program import OPS

_SOURCE = r"""
#include <torch/csrc/autograd/python_variable.h>
#include <pybind11/pybind11.h>
#include <algorithm>
#include <vector>

namespace py = pybind11;

struct Spec {
  PyTypeObject* type;
  c10::ScalarType dtype;
  c10::DeviceType device_type;
  int device_index;               // -1: any index
  bool requires_grad;
  std::vector<int64_t> sizes;     // -1: not checked (a symbolic size, related by other guards)
  std::vector<int64_t> strides;
};

static std::vector<int64_t> dims(py::list xs) {
  std::vector<int64_t> out;
  for (auto x : xs) out.push_back(x.is_none() ? -1 : x.cast<int64_t>());
  return out;
}

class TensorSpecs {
 public:
  // specs: (type, a tensor of the dtype, device type string, device index, requires_grad, sizes, strides)
  explicit TensorSpecs(py::list specs) {
    for (auto item : specs) {
      py::tuple s = item.cast<py::tuple>();
      Spec spec;
      spec.type = reinterpret_cast<PyTypeObject*>(s[0].ptr());
      types_.push_back(py::reinterpret_borrow<py::object>(s[0]));
      spec.dtype = THPVariable_Unpack(s[1].ptr()).scalar_type();
      spec.device_type = c10::Device(s[2].cast<std::string>()).type();
      spec.device_index = s[3].cast<int>();
      spec.requires_grad = s[4].cast<bool>();
      spec.sizes = dims(s[5].cast<py::list>());
      spec.strides = dims(s[6].cast<py::list>());
      specs_.push_back(std::move(spec));
    }
  }

  size_t size() const { return specs_.size(); }

  static bool matches(PyObject* o, const Spec& s) {
    if (Py_TYPE(o) != s.type) return false;     // the exact type, as `type(t) is T`
    const at::Tensor& t = THPVariable_Unpack(o);
    if (t.scalar_type() != s.dtype || t.requires_grad() != s.requires_grad) return false;
    const c10::Device d = t.device();
    if (d.type() != s.device_type || (s.device_index >= 0 && d.index() != s.device_index)) return false;
    if (t.layout() != c10::kStrided) return false;
    const auto sizes = t.sizes();
    if (sizes.size() != s.sizes.size()) return false;
    const auto strides = t.strides();
    for (size_t k = 0; k < s.sizes.size(); k++) {
      if ((s.sizes[k] >= 0 && sizes[k] != s.sizes[k]) || (s.strides[k] >= 0 && strides[k] != s.strides[k]))
        return false;
    }
    return true;
  }

  bool check_all(PyObject* const* tensors, size_t n) const {
    if (n != specs_.size()) return false;
    for (size_t i = 0; i < n; i++)
      if (!matches(tensors[i], specs_[i])) return false;
    return true;
  }

 private:
  std::vector<Spec> specs_;
  std::vector<py::object> types_;   // keeps the type objects alive
};

// A cache entry's guards as a straight-line program (engine/guards/program.py builds it):
// each read puts an object in a register, each test returns false when it fails, in the
// order of the generated Python. Any error (a missing key, an attribute that raises) is a
// failed guard, as the Python function's `except Exception: return False`.
enum Op { @OPS@ };            // program.OPS, in its order

struct Instr {
  int op, dst, src, src2;
  Py_ssize_t n;
  PyObject* a;                // borrowed: kept alive by GuardProgram::refs_
  PyObject* b;
  std::vector<int> regs;
  unsigned int tag = 0;       // MODULE_HASATTR: the module class's version tag when compiled (0: none)
  bool immutable = false;     // EQ: the expected value's type is a builtin immutable one
  int special = 0;            // ATTR: CLASS_OF (`.__class__`), DICT_OF (`.__dict__`)
  Py_ssize_t index = -1;      // ITEM: the key when it is an int (a tuple's item)
};
enum { CLASS_OF = 1, DICT_OF = 2 };

// What a read (ATTR, ITEM) gave, or that a KEYS test held, in the last run of the program
// that passed. A dict's version tag changes with every change to it, and no two dicts
// share one (CPython draws them from one counter): a dict at the same address with the same
// tag is the same dict, unchanged, so its value for a key is the same object, alive (the
// dict holds it). Reads through unchanged dicts then skip the lookup, and a test on a value
// that is the same immutable object it passed on is not repeated: on the next call a
// model's forward touches its modules' dicts, not their hash tables (guards run right
// before the first kernel, with the model's objects out of the CPU's caches).
struct Memo {
  PyObject* dict = nullptr;       // ITEM, KEYS: the dict; ATTR: the object's __dict__ (borrowed)
  uint64_t tag = 0;               // its version tag then
  PyTypeObject* type = nullptr;   // ATTR: the object's type, whose dict the lookup skipped ...
  unsigned int type_tag = 0;      // ... unchanged while its version tag is
  PyObject* value = nullptr;      // borrowed: held by `dict` (or by `type`) while the tags are unchanged
  PyObject* key = nullptr;        // ITEM_REG: the key object (compared by identity, never dereferenced)
};

#if PY_VERSION_HEX < 0x030E0000
#define ENGINE_DICT_TAGS 1
static inline uint64_t dict_tag(PyObject* d) { return reinterpret_cast<PyDictObject*>(d)->ma_version_tag; }
// 3.13 keeps an object's attributes in the object itself, and a dict made for it reads them
// there: attribute stores then change no tag. Only dicts with their own table are trusted.
static inline bool tag_tracks(PyObject* d) {
#if PY_VERSION_HEX >= 0x030D0000
  return reinterpret_cast<PyDictObject*>(d)->ma_values == nullptr;
#else
  return true;
#endif
}
#else
#define ENGINE_DICT_TAGS 0    // 3.14 has no version tags: every read looks up
static inline uint64_t dict_tag(PyObject*) { return 0; }
static inline bool tag_tracks(PyObject*) { return false; }
#endif

// Whether d is a dict whose tag says what changed in it (then a memo over it may be filled).
static inline bool trackable(PyObject* d) { return ENGINE_DICT_TAGS && PyDict_CheckExact(d) && tag_tracks(d); }

// Whether o is the dict m was filled from, unchanged since (compared before dereferenced).
static inline bool unchanged(PyObject* o, const Memo& m) {
  return o == m.dict && Py_TYPE(o) == &PyDict_Type && dict_tag(o) == m.tag && tag_tracks(o);
}

static PyObject* hash_name = nullptr;     // "__hash__"
static PyObject* tensor_hash = nullptr;   // torch.Tensor.__hash__ as the checker was loaded (a strong reference)

class GuardProgram {
 public:
  // code: [(op, dst, src, src2, n, a, b, regs)], registers: how many, specs: TensorSpecs's
  GuardProgram(py::list code, int registers, py::list specs) : registers_(registers), specs_(specs) {
    for (auto item : code) {
      py::tuple t = item.cast<py::tuple>();
      Instr in;
      in.op = t[0].cast<int>();
      in.dst = t[1].cast<int>();
      in.src = t[2].cast<int>();
      in.src2 = t[3].cast<int>();
      in.n = t[4].cast<Py_ssize_t>();
      PyObject* a = Py_NewRef(t[5].ptr());
      if (PyUnicode_CheckExact(a)) PyUnicode_InternInPlace(&a);   // names and keys: the caches' fast path
      refs_.push_back(py::reinterpret_steal<py::object>(a));
      refs_.push_back(py::reinterpret_borrow<py::object>(t[6]));
      in.a = a;
      in.b = t[6].ptr();
      for (auto r : t[7].cast<py::list>()) in.regs.push_back(r.cast<int>());
      if (in.op == TENSOR) tensors_++;
      if (in.op == MODULE_HASATTR) in.tag = reinterpret_cast<PyTypeObject*>(in.b)->tp_version_tag;
      if (in.op == ATTR && PyUnicode_Check(in.a))
        in.special = PyUnicode_CompareWithASCIIString(in.a, "__class__") == 0 ? CLASS_OF
                   : PyUnicode_CompareWithASCIIString(in.a, "__dict__") == 0 ? DICT_OF : 0;
      if (in.op == ITEM && PyLong_CheckExact(in.a)) {
        in.index = PyLong_AsSsize_t(in.a);
        if (in.index < 0) {
          PyErr_Clear();
          in.index = -1;
        }
      }
      if (in.op == EQ) {
        PyTypeObject* t = Py_TYPE(in.a);
        in.immutable = t == &PyLong_Type || t == &PyFloat_Type || t == &PyUnicode_Type || t == &PyBool_Type ||
                       t == &PyBytes_Type || t == &PyComplex_Type;
      }
      code_.push_back(std::move(in));
    }
    if (tensors_ != specs_.size()) throw std::invalid_argument("one spec per TENSOR instruction");
    memo_.resize(code_.size());
  }

  bool check(py::object L, py::object G) {
    std::vector<PyObject*> regs(registers_, nullptr);
    std::vector<char> same(registers_, 0);
    std::vector<std::pair<size_t, Memo>> fills;
    std::vector<PyObject*> tensors;
    tensors.reserve(tensors_);
    bool ok = run(L.ptr(), G.ptr(), regs.data(), same.data(), fills, tensors) &&
              specs_.check_all(tensors.data(), tensors.size());
    if (ok)           // a run that passed: its reads and tests are what later runs may skip
      for (auto& f : fills) memo_[f.first] = f.second;
    for (PyObject* r : regs) Py_XDECREF(r);
    if (!ok && PyErr_Occurred()) PyErr_Clear();
    return ok;
  }

  // How many reads the last runs skipped, and how many they made (tests: the memo at work).
  std::pair<size_t, size_t> counts() const { return {skipped_, looked_up_}; }

 private:
  static PyObject* item(PyObject* o, PyObject* key) {      // a new reference, or null
    if (PyDict_CheckExact(o)) {
      PyObject* v = PyDict_GetItemWithError(o, key);
      if (v == nullptr) return nullptr;
      Py_INCREF(v);
      return v;
    }
    return PyObject_GetItem(o, key);
  }

  static int hasattr(PyObject* o, PyObject* name) {         // 1, 0, or -1 on another error
    PyObject* v = PyObject_GetAttr(o, name);
    if (v != nullptr) {
      Py_DECREF(v);
      return 1;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    return 0;
  }

  // hasattr(m, name) for a module whose class reads attributes as nn.Module does (object's
  // __getattribute__, then Module.__getattr__ over _parameters, _buffers and _modules),
  // without Module.__getattr__'s Python call and its formatted AttributeError: about 2 us
  // a guard, and transformers' attention layers each guard `hasattr(self, ...) is False`.
  // A name the class itself has (a method, a property) is asked the usual way.
  static int module_hasattr(PyObject* o, PyObject* name) {
    if (_PyType_Lookup(Py_TYPE(o), name) != nullptr) return hasattr(o, name);
    PyObject* d = PyObject_GenericGetDict(o, nullptr);
    if (d == nullptr) return -1;
    int found = PyDict_Contains(d, name);
    for (const char* slot : {"_parameters", "_buffers", "_modules"}) {
      if (found != 0) break;
      PyObject* held = PyDict_GetItemString(d, slot);
      if (held != nullptr) found = PySequence_Contains(held, name);
    }
    Py_DECREF(d);
    return found;
  }

  static bool same_keys(PyObject* o, PyObject* expected) {  // list(o.keys()) == expected
    if (PyDict_CheckExact(o)) {
      if (PyDict_GET_SIZE(o) != PyList_GET_SIZE(expected)) return false;
      Py_ssize_t pos = 0, i = 0;
      PyObject *key, *value;
      while (PyDict_Next(o, &pos, &key, &value)) {
        int r = PyObject_RichCompareBool(key, PyList_GET_ITEM(expected, i++), Py_EQ);
        if (r != 1) return false;
      }
      return true;
    }
    PyObject* keys = PyObject_CallMethod(o, "keys", nullptr);
    if (keys == nullptr) return false;
    PyObject* list = PySequence_List(keys);
    Py_DECREF(keys);
    if (list == nullptr) return false;
    int r = PyObject_RichCompareBool(list, expected, Py_EQ);
    Py_DECREF(list);
    return r == 1;
  }

  // Whether t reads attributes as object does (or as nn.Module does: a class __getattr__
  // only runs for names found nowhere else).
  static bool reads_as_object(PyTypeObject* t) {
    static PyObject* getattribute = PyUnicode_InternFromString("__getattribute__");
    static PyObject* object_getattribute = _PyType_Lookup(&PyBaseObject_Type, getattribute);
    return t->tp_getattro == PyObject_GenericGetAttr ||
           ((t->tp_flags & Py_TPFLAGS_HEAPTYPE) && _PyType_Lookup(t, getattribute) == object_getattribute);
  }

  static PyObject* object_class() {              // object's __class__ descriptor
    static PyObject* descr = _PyType_Lookup(&PyBaseObject_Type, PyUnicode_InternFromString("__class__"));
    return descr;
  }

  // A tensor hashed by torch.Tensor's own __hash__ (its identity), not by one patched in since.
  static bool identity_hashed(PyObject* k) {
    return THPVariable_Check(k) && tensor_hash != nullptr && _PyType_Lookup(Py_TYPE(k), hash_name) == tensor_hash;
  }

  // A key whose hash cannot change while it lives: a str, an int, or an identity-hashed
  // tensor. The memo skips the hash.
  static bool stable_hash(PyObject* k) {
    return PyUnicode_CheckExact(k) || PyLong_CheckExact(k) || identity_hashed(k);
  }

  // ATTR's read of `name` on `o` as the memo may replay it: t reads attributes as object
  // does, no data descriptor of that name on t (it would come first), and the value is the
  // object's own __dict__ entry or, where that has none, t's attribute that is no
  // descriptor (a class-level default). Both stay while t's and the __dict__'s tags do.
  void note_attr(size_t i, PyObject* o, PyObject* name, PyObject* v, std::vector<std::pair<size_t, Memo>>& fills) {
    PyTypeObject* t = Py_TYPE(o);
    if (!reads_as_object(t)) return;
    PyObject* attr = _PyType_Lookup(t, name);
    if (attr != nullptr && Py_TYPE(attr)->tp_descr_set != nullptr) return;
    unsigned int type_tag = t->tp_version_tag;
    PyObject** dp = _PyObject_GetDictPtr(o);
    if (dp == nullptr || *dp == nullptr || type_tag == 0 || !trackable(*dp)) {
      PyErr_Clear();
      return;
    }
    uint64_t tag = dict_tag(*dp);
    PyObject* held = PyDict_GetItemWithError(*dp, name);
    if (held == nullptr && (PyErr_Occurred() || attr == nullptr || Py_TYPE(attr)->tp_descr_get != nullptr)) {
      PyErr_Clear();
      return;
    }
    if ((held != nullptr ? held : attr) != v || dict_tag(*dp) != tag || t->tp_version_tag != type_tag) return;
    fills.push_back({i, Memo{*dp, tag, t, type_tag, v, nullptr}});
  }

  bool run(PyObject* L, PyObject* G, PyObject** regs, char* same, std::vector<std::pair<size_t, Memo>>& fills,
           std::vector<PyObject*>& tensors) {
    for (size_t i = 0; i < code_.size(); i++) {
      const Instr& in = code_[i];
      switch (in.op) {
        case LOCAL:
        case GLOBAL:
        case SYSMOD: {
          PyObject* d = in.op == LOCAL ? L : in.op == GLOBAL ? G : PyImport_GetModuleDict();
          PyObject* v = item(d, in.a);
          if (v == nullptr) return false;
          regs[in.dst] = v;
          break;
        }
        case ATTR: {
          PyObject* o = regs[in.src];
          if (in.special == CLASS_OF && reads_as_object(Py_TYPE(o)) &&
              _PyType_Lookup(Py_TYPE(o), in.a) == object_class()) {      // o.__class__: its type
            regs[in.dst] = Py_NewRef(reinterpret_cast<PyObject*>(Py_TYPE(o)));
            break;
          }
          if (in.special == DICT_OF && Py_TYPE(o) == &PyModule_Type) {    // a module's __dict__
            regs[in.dst] = Py_NewRef(PyModule_GetDict(o));
            same[in.dst] = same[in.src];
            break;
          }
          const Memo& m = memo_[i];
          if (m.value != nullptr && Py_TYPE(o) == m.type && m.type->tp_version_tag == m.type_tag) {
            PyObject** dp = _PyObject_GetDictPtr(o);
            if (dp != nullptr && *dp == m.dict && dict_tag(m.dict) == m.tag && tag_tracks(m.dict)) {
              regs[in.dst] = Py_NewRef(m.value);
              same[in.dst] = 1;
              skipped_++;
              break;
            }
            if (dp == nullptr) PyErr_Clear();
          }
          looked_up_++;
          PyObject* v = PyObject_GetAttr(o, in.a);
          if (v == nullptr) return false;
          regs[in.dst] = v;
          note_attr(i, o, in.a, v, fills);
          break;
        }
        case ITEM: {
          PyObject* o = regs[in.src];
          if (in.index >= 0 && PyTuple_CheckExact(o)) {     // a tuple's item: the same while the tuple is
            if (in.index >= PyTuple_GET_SIZE(o)) return false;
            regs[in.dst] = Py_NewRef(PyTuple_GET_ITEM(o, in.index));
            same[in.dst] = same[in.src];
            break;
          }
          const Memo& m = memo_[i];
          if (unchanged(o, m)) {
            regs[in.dst] = Py_NewRef(m.value);
            same[in.dst] = 1;
            skipped_++;
            break;
          }
          looked_up_++;
          bool tracked = trackable(o);
          uint64_t tag = tracked ? dict_tag(o) : 0;
          PyObject* v = item(o, in.a);
          if (v == nullptr) return false;
          regs[in.dst] = v;
          if (tracked && dict_tag(o) == tag) fills.push_back({i, Memo{o, tag, nullptr, 0, v, nullptr}});
          break;
        }
        case ITEM_REG: {                   // d[k], k itself read from the frame (an optimizer's state[p])
          PyObject* o = regs[in.src];
          PyObject* k = regs[in.src2];
          const Memo& m = memo_[i];
          // k is the key the memo found only if it is the same object: known where k's own read
          // was replayed, or where k is a tensor, hashed by identity: an unchanged dict that
          // holds a tensor key at k's address holds that object, alive
          if (k == m.key && (same[in.src2] || identity_hashed(k)) && o == m.dict && Py_TYPE(o) == m.type &&
              m.type->tp_version_tag == m.type_tag && dict_tag(o) == m.tag && tag_tracks(o)) {
            regs[in.dst] = Py_NewRef(m.value);
            same[in.dst] = 1;
            skipped_++;
            break;
          }
          looked_up_++;
          PyTypeObject* t = Py_TYPE(o);
          bool tracked = ENGINE_DICT_TAGS && PyDict_Check(o) && t->tp_as_mapping != nullptr &&
                         t->tp_as_mapping->mp_subscript == PyDict_Type.tp_as_mapping->mp_subscript &&
                         t->tp_version_tag != 0 && tag_tracks(o) && stable_hash(k);
          uint64_t tag = tracked ? dict_tag(o) : 0;
          unsigned int type_tag = t->tp_version_tag;
          PyObject* v = item(o, k);
          if (v == nullptr) return false;
          regs[in.dst] = v;
          if (tracked && dict_tag(o) == tag && t->tp_version_tag == type_tag)
            fills.push_back({i, Memo{o, tag, t, type_tag, v, k}});
          break;
        }
        case TYPE_IS:
          if (reinterpret_cast<PyObject*>(Py_TYPE(regs[in.src])) != in.a) return false;
          break;
        case ID_IS:
          if (regs[in.src] != in.a) return false;
          break;
        case EQ: {                       // type(v) is T and v == expected
          if (same[in.src] && in.immutable) break;   // the immutable object it passed on last time
          PyObject* v = regs[in.src];
          if (reinterpret_cast<PyObject*>(Py_TYPE(v)) != in.b) return false;
          if (PyObject_RichCompareBool(v, in.a, Py_EQ) != 1) return false;
          break;
        }
        case LEN:
          if (PyObject_Length(regs[in.src]) != in.n) return false;
          break;
        case KEYS: {
          PyObject* o = regs[in.src];
          const Memo& m = memo_[i];
          if (unchanged(o, m)) break;
          bool tracked = trackable(o);
          uint64_t tag = tracked ? dict_tag(o) : 0;
          if (!same_keys(o, in.a)) return false;
          if (tracked && dict_tag(o) == tag) fills.push_back({i, Memo{o, tag, nullptr, 0, nullptr, nullptr}});
          break;
        }
        case HASATTR:                    // hasattr(v, name) is bool(n): only AttributeError means absent
          if (hasattr(regs[in.src], in.a) != in.n) return false;
          break;
        case MODULE_HASATTR: {           // the same, read as nn.Module reads it while its class is unchanged
          PyObject* o = regs[in.src];
          PyTypeObject* t = Py_TYPE(o);
          bool plain = reinterpret_cast<PyObject*>(t) == in.b && in.tag != 0 && t->tp_version_tag == in.tag;
          if ((plain ? module_hasattr(o, in.a) : hasattr(o, in.a)) != in.n) return false;
          break;
        }
        case TENSOR:
          tensors.push_back(regs[in.src]);
          break;
        case SAME:
          if (regs[in.src] != regs[in.src2]) return false;
          break;
        case DISTINCT: {
          std::vector<PyObject*> objs;
          for (int r : in.regs) objs.push_back(regs[r]);
          std::sort(objs.begin(), objs.end());
          if (std::adjacent_find(objs.begin(), objs.end()) != objs.end()) return false;
          break;
        }
        default:
          return false;
      }
    }
    return true;
  }

  int registers_;
  size_t tensors_ = 0;
  TensorSpecs specs_;
  std::vector<Instr> code_;
  std::vector<py::object> refs_;
  std::vector<Memo> memo_;                // per instruction: see Memo
  size_t skipped_ = 0, looked_up_ = 0;
};

// placement(tensors) -> the storage offsets, where every tensor is a plain Tensor or Parameter on a
// storage of its own (not empty), else None. The common case of aot/inputs.py's placement_key: an
// optimizer step's ~600 inputs, on every call of a graph that writes its inputs.
static py::object placement(py::list args) {
  Py_ssize_t n = PyList_GET_SIZE(args.ptr());
  std::vector<std::pair<c10::Device, const void*>> storages;
  storages.reserve(n);
  py::tuple offsets(n);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* o = PyList_GET_ITEM(args.ptr(), i);
    if (!THPVariable_CheckExact(o)) return py::none();
    const at::Tensor& t = THPVariable_Unpack(o);
    if (!t.has_storage()) return py::none();
    const void* base = t.storage().data();
    if (base == nullptr) return py::none();
    storages.emplace_back(t.device(), base);
    PyObject* off = PyLong_FromLongLong(t.storage_offset());
    if (off == nullptr) throw py::error_already_set();
    PyTuple_SET_ITEM(offsets.ptr(), i, off);
  }
  auto before = [](const std::pair<c10::Device, const void*>& x, const std::pair<c10::Device, const void*>& y) {
    if (x.first.type() != y.first.type()) return x.first.type() < y.first.type();
    if (x.first.index() != y.first.index()) return x.first.index() < y.first.index();
    return x.second < y.second;
  };
  std::sort(storages.begin(), storages.end(), before);
  for (size_t i = 1; i < storages.size(); i++)
    if (storages[i] == storages[i - 1]) return py::none();
  return offsets;
}

PYBIND11_MODULE(engine_native_guards, m) {
  m.def("placement", &placement);
  hash_name = PyUnicode_InternFromString("__hash__");
  tensor_hash = Py_XNewRef(_PyType_Lookup(reinterpret_cast<PyTypeObject*>(THPVariableClass), hash_name));
  py::class_<GuardProgram>(m, "GuardProgram")
      .def(py::init<py::list, int, py::list>())
      .def("__call__", &GuardProgram::check)
      .def("counts", &GuardProgram::counts);
}
""".replace("@OPS@", ", ".join(OPS))

_BUILD = BackgroundBuild("engine_native_guards", _SOURCE, knob="native_guards",
                        switch=lambda compiled: compiled.use_native(), log_name="dynamo",
                        fallback="tensor guards stay Python")


def checker(program):
    """The C++ function of (L, G) that runs a program.Program, or None while the extension
    is not built (or is turned off)."""
    from .program import OP, module_class_is_plain
    mod = _BUILD.module
    if mod is None or not _BUILD.enabled():
        return None
    # the C++ side takes each MODULE_HASATTR class's version tag now: asked again here, in case
    # the class changed since the guards were compiled
    code = [(OP["HASATTR"], *ins[1:6], None, ins[7]) if ins[0] == OP["MODULE_HASATTR"]
            and not module_class_is_plain(ins[6]) else ins for ins in program.code]
    return mod.GuardProgram(code, program.registers, [spec_of(t) for t in program.tensors])


def wanted() -> bool:
    """Whether guards should be made into programs: the checker is on and has not failed to build."""
    return _BUILD.enabled() and _BUILD.failed is None


def when_ready(compiled) -> None:
    """Switch `compiled` (a CompiledGuards) to the C++ checker now if it is built, else
    when it is (starting the build)."""
    _BUILD.when_ready(compiled)


def wait(timeout: Optional[float] = None) -> bool:
    """Block until the build has finished (or failed); True when the checker is available."""
    return _BUILD.wait(timeout)


def build_error() -> Optional[str]:
    """Why the checker did not build (its first line), or None."""
    return _BUILD.failed


def placement(args: list):
    """The inputs' storage offsets where each is a plain tensor on a storage of its own, else
    None (and None while the extension is not built): aot/inputs.py's placement_key in C++."""
    mod = _BUILD.module
    return mod.placement(args) if mod is not None and type(args) is list and _BUILD.enabled() else None


def spec_of(m) -> tuple:
    """A TensorMeta as the C++ constructor takes it."""
    dev = torch.device(m.device)
    return (m.type, torch.empty(0, dtype=m.dtype, device="meta"), dev.type, -1 if dev.index is None else dev.index,
            bool(m.requires_grad), list(m.sizes), list(m.strides))
