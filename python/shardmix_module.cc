// shardmix._shardmix: the Python binding of libshardmix (client/client.h), pybind11.
//
// Only the public Client / Epoch / EpochIterator / Batch / Sample API is used, so the
// binding follows the C++ client's semantics exactly (docs/decisions/0020):
//
//   * One Python Client owns one shardmix::Client (one connection, one trainer rank).
//   * iter(client.epoch(e)) starts the epoch; next() releases the batch in hand and
//     returns the next one, as EpochIterator::operator++ does.
//   * A Sample exports its bytes through the buffer protocol: read-only, no copy, the
//     pointer is the one Sample::bytes() returns (a view into the daemon's memfd-backed
//     cache arena or this trainer's staging area).
//   * Lifetime: "invalidate on release". A batch is released when the iterator moves past
//     it, when another epoch starts or when the client is closed. From then on its
//     samples refuse new exports (shardmix.ReleasedError, a BufferError). Exports taken
//     before the release stay *mapped* (every export keeps the client's mappings alive,
//     so there is never a dangling pointer), but their bytes are unspecified: a staging
//     slot is reused for later batches. Client(strict=True) turns such a leftover export
//     into a BufferError at the release instead (as bytearray refuses to resize while
//     exported).
//   * Errors: shardmix::Error becomes shardmix.Error (a RuntimeError) with the same
//     message (the daemon's, for errors the daemon reported) and .code (the StatusCode
//     name, e.g. "invalid_argument").
//   * Blocking calls (connect, waiting for a batch) release the GIL. A Ctrl-C during a
//     wait raises KeyboardInterrupt out of it (ClientOptions::interrupted, decision 0036)
//     and closes that Client, since a frame may have been half read.
//
// Thread-safety: like the C++ client, one Client per thread; concurrent calls on one
// Client from two Python threads raise RuntimeError instead of corrupting the stream.
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "client/client.h"

namespace py = pybind11;

namespace shardmix::python {
namespace {

// Everything one Python Client owns. Shared by the Client, its Epoch/Batch/Sample objects
// and every exported buffer, so the mappings live as long as anything points into them.
struct State {
  std::optional<shardmix::Client> client;
  std::optional<shardmix::Epoch> epoch;
  std::optional<shardmix::EpochIterator> it;
  std::uint64_t epoch_number = 0;
  std::uint64_t stream = 0;       // bumped per started epoch: tells a stale iterator apart
  std::uint64_t generation = 0;   // bumped whenever the batch in hand is released
  bool holding = false;           // it points at a batch the user has been given
  bool busy = false;              // a call is in progress with the GIL released
  bool strict = false;
  bool closed = false;
  // A checkpoint blob given to load_state_dict(): the next epoch() of its epoch resumes from it.
  std::vector<std::uint8_t> pending_resume;
  std::uint64_t live_exports = 0;   // exports of the batch in hand not yet released
  std::uint64_t stale_exports = 0;  // exports still alive of batches already released

  shardmix::Client& get() {
    if (closed || !client) throw py::value_error("this shardmix.Client is closed");
    return *client;
  }
  // Called before the batch in hand goes back to the daemon.
  void releasing() {
    if (!holding) return;
    if (strict && live_exports > 0) {
      throw py::buffer_error(
          "batch " + std::to_string(it ? (**it).index() : 0) + " of epoch " + std::to_string(epoch_number) +
          " still has " + std::to_string(live_exports) +
          " exported buffer(s) (memoryview, numpy or torch views of its samples); release or copy them before "
          "moving on (Client(strict=False) allows it, with the bytes unspecified afterwards)");
    }
    stale_exports += live_exports;
    live_exports = 0;
    ++generation;
    holding = false;
  }
};

struct Busy {  // marks a call that releases the GIL; a second thread gets an error
  explicit Busy(State& s) : s_(s) {
    if (s_.busy) throw std::runtime_error("shardmix.Client used from two threads at once (one Client per thread)");
    s_.busy = true;
  }
  ~Busy() { s_.busy = false; }
  State& s_;
};

// A call into the C++ client that may wait on the daemon: the GIL is released meanwhile, so
// other Python threads run, and the state is marked busy, so a second thread gets an error.
template <typename Call>
decltype(auto) without_gil(State& s, Call&& call) {
  Busy busy(s);
  py::gil_scoped_release nogil;
  return call(s.get());
}

// The bytes of a buffer the caller passed (bytes, bytearray, memoryview, numpy...), which
// must be C-contiguous; `what` names the call in the error. Valid while `info` lives.
std::span<const std::uint8_t> contiguous_bytes(const py::buffer_info& info, const char* what) {
  if (!PyBuffer_IsContiguous(info.view(), 'C')) {
    throw py::value_error(std::string(what) + ": the data must be a contiguous buffer");
  }
  return {static_cast<const std::uint8_t*>(info.ptr), static_cast<std::size_t>(info.size * info.itemsize)};
}

PyObject* g_released_error = nullptr;  // shardmix.ReleasedError (BufferError + shardmix.Error)

// Ctrl-C while a wait is in C++ (GIL released): ClientOptions::interrupted runs on the
// waiting thread when a signal interrupts poll. It runs Python's signal handlers; if one
// raised (KeyboardInterrupt), the wait gives up and the raised exception is kept here,
// per thread, until the C++ error (kCancelled) reaches the exception translator, which
// raises it instead of a shardmix.Error.
struct PendingSignalError {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
};
thread_local PendingSignalError t_signal_error;

bool python_signal_raised() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return false;
  PendingSignalError& e = t_signal_error;
  Py_XDECREF(e.type);
  Py_XDECREF(e.value);
  Py_XDECREF(e.traceback);
  PyErr_Fetch(&e.type, &e.value, &e.traceback);
  return true;
}

[[noreturn]] void throw_released(const std::string& message) {
  PyErr_SetString(g_released_error, message.c_str());
  throw py::error_already_set();
}

struct PySample {
  std::shared_ptr<State> state;
  std::uint64_t generation = 0;
  shardmix::Sample sample;  // a copy of the descriptor and pointer: valid while generation holds
  std::uint64_t exports = 0;
  bool valid() const { return state->holding && state->generation == generation; }
};

struct PyBatch {
  std::shared_ptr<State> state;
  std::uint64_t generation = 0;
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;
  std::vector<shardmix::Sample> samples;
  std::vector<shardmix::SampleId> skipped;  // planned but unreadable (Batch::skipped)
  bool valid() const { return state->holding && state->generation == generation; }
  void check(const char* what) const;
};

struct PyEpoch {
  std::shared_ptr<State> state;
  std::uint64_t epoch = 0;
  std::vector<std::uint8_t> resume;  // checkpoint blob to resume this epoch from, or empty
  std::uint64_t stream = 0;  // 0 = not started
  bool finished = false;
};

void PyBatch::check(const char* what) const {
  if (!valid()) {
    throw_released("batch " + std::to_string(index) + " of epoch " + std::to_string(epoch) +
                   " was released (the iterator moved past it); " + what + " needs the batch in hand");
  }
}

// ---- buffer protocol of Sample (own slots: pybind11's cannot refuse an export) ----

int sample_getbuffer(PyObject* obj, Py_buffer* view, int flags) {
  PySample* s = nullptr;
  try {
    s = py::handle(obj).cast<PySample*>();
  } catch (...) {
    PyErr_SetString(PyExc_BufferError, "not a shardmix.Sample");
    return -1;
  }
  if (!s->valid()) {
    PyErr_Format(g_released_error,
                 "sample %llu: its batch was released (the iterator moved past it); its bytes can no longer be "
                 "exported. Copy what you keep (bytes(memoryview(s)), numpy .copy()) before advancing",
                 static_cast<unsigned long long>(s->sample.id()));
    return -1;
  }
  const auto bytes = s->sample.bytes();
  // readonly = 1: a request for a writable buffer fails with BufferError. The memory is
  // mapped PROT_READ anyway, so a write through a forged pointer would fault.
  if (PyBuffer_FillInfo(view, obj, const_cast<std::byte*>(bytes.data()), static_cast<Py_ssize_t>(bytes.size()), 1,
                        flags) != 0) {
    return -1;
  }
  ++s->exports;
  ++s->state->live_exports;
  return 0;
}

void sample_releasebuffer(PyObject* obj, Py_buffer*) {
  try {
    PySample* s = py::handle(obj).cast<PySample*>();
    if (s->exports > 0) --s->exports;
    if (s->valid()) {
      if (s->state->live_exports > 0) --s->state->live_exports;
    } else if (s->state->stale_exports > 0) {
      --s->state->stale_exports;
    }
  } catch (...) {
    PyErr_Clear();
  }
}

PyBufferProcs g_sample_buffer_procs = {sample_getbuffer, sample_releasebuffer};

// ---- helpers ----

py::dict stats_dict(const proto::EpochStats& s) {
  py::dict d;
  d["epoch"] = s.epoch;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["bytes"] = s.bytes;
  d["local_samples"] = s.local_samples;
  d["peer_samples"] = s.peer_samples;
  d["storage_samples"] = s.storage_samples;
  d["peer_bytes"] = s.peer_bytes;
  d["fetch_wait_us"] = s.fetch_wait_us;
  d["substituted_samples"] = s.substituted_samples;
  d["unreadable_samples"] = s.unreadable_samples;
  d["exchange_fraction"] = s.exchange_fraction;
  d["window"] = s.window;
  d["batches_scored"] = s.batches_scored;
  d["label_entropy_mean"] = s.label_entropy_mean;  // NaN when nothing was scored
  d["label_entropy_p5"] = s.label_entropy_p5;
  d["affinity"] = s.affinity;
  return d;
}

py::object stats_or_none(const std::optional<proto::EpochStats>& s) {
  if (!s) return py::none();
  return stats_dict(*s);
}

// Moves the state's iterator to the next batch (GIL released while waiting) and wraps it.
std::optional<PyBatch> next_batch(const std::shared_ptr<State>& state, PyEpoch& e) {
  State& s = *state;
  s.releasing();
  {
    Busy busy(s);
    py::gil_scoped_release nogil;
    try {
      if (!s.it) {
        s.it.emplace(s.epoch->begin());  // StartEpoch + the first batch
      } else {
        ++*s.it;                          // Release of the batch in hand + the next one
      }
    } catch (...) {
      s.it.reset();
      s.epoch.reset();
      e.finished = true;
      throw;
    }
  }
  if (*s.it == std::default_sentinel) {
    e.finished = true;
    s.it.reset();
    return std::nullopt;
  }
  s.holding = true;
  const shardmix::Batch& b = **s.it;
  PyBatch out;
  out.state = state;
  out.generation = s.generation;
  out.epoch = b.epoch();
  out.index = b.index();
  out.samples.assign(b.begin(), b.end());
  out.skipped = b.skipped();
  return out;
}

// `out` is any writable, C-contiguous buffer (bytearray, numpy array, tensor.numpy()).
py::int_ copy_into(PyBatch& b, py::buffer out, py::object stride_obj) {
  b.check("copy_into()");
  std::size_t stride = 0;
  if (stride_obj.is_none()) {
    if (!b.samples.empty()) stride = b.samples[0].bytes().size();
    for (const auto& s : b.samples) {
      if (s.bytes().size() != stride) {
        throw py::value_error("copy_into(): samples of batch " + std::to_string(b.index) +
                              " differ in length (sample " + std::to_string(s.id()) + " has " +
                              std::to_string(s.bytes().size()) + " bytes, the first " + std::to_string(stride) +
                              "); pass stride= the largest length to pad");
      }
    }
  } else {
    stride = stride_obj.cast<std::size_t>();
  }
  Py_buffer view;
  if (PyObject_GetBuffer(out.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
  struct Releaser {
    Py_buffer* v;
    ~Releaser() { PyBuffer_Release(v); }
  } releaser{&view};
  const std::size_t need = stride * b.samples.size();
  if (static_cast<std::size_t>(view.len) < need) {
    throw py::value_error("copy_into(): the buffer has " + std::to_string(view.len) + " bytes; " +
                          std::to_string(b.samples.size()) + " samples x stride " + std::to_string(stride) +
                          " need " + std::to_string(need));
  }
  for (const auto& s : b.samples) {
    if (s.bytes().size() > stride) {
      throw py::value_error("copy_into(): sample " + std::to_string(s.id()) + " has " +
                            std::to_string(s.bytes().size()) + " bytes, more than stride " + std::to_string(stride));
    }
  }
  auto* dst = static_cast<std::byte*>(view.buf);
  {
    py::gil_scoped_release nogil;
    for (const auto& s : b.samples) {
      const auto src = s.bytes();
      std::memcpy(dst, src.data(), src.size());
      if (src.size() < stride) std::memset(dst + src.size(), 0, stride - src.size());
      dst += stride;
    }
  }
  return py::int_(need);
}

}  // namespace
}  // namespace shardmix::python

PYBIND11_MODULE(_shardmix, m) {
  using namespace shardmix::python;
  namespace sm = shardmix;
  m.doc() = "ShardMix client (libshardmix) for Python: epochs of prefetched, zero-copy batches.";

  static py::exception<sm::Error> error(m, "Error", PyExc_RuntimeError);
  // ReleasedError: a BufferError (what Python raises for a buffer that cannot be
  // exported) and a shardmix.Error.
  py::tuple bases = py::make_tuple(py::handle(PyExc_BufferError), error);
  py::object released = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "shardmix.ReleasedError", "The sample's batch was released: its bytes can no longer be exported.",
      bases.ptr(), nullptr));
  if (!released) throw py::error_already_set();
  m.attr("ReleasedError") = released;
  g_released_error = released.ptr();
  Py_INCREF(g_released_error);  // lives as long as the interpreter
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const sm::Error& e) {
      PendingSignalError& pending = t_signal_error;
      if (e.code() == sm::StatusCode::kCancelled && pending.type != nullptr) {
        PyErr_Restore(std::exchange(pending.type, nullptr), std::exchange(pending.value, nullptr),
                      std::exchange(pending.traceback, nullptr));  // the KeyboardInterrupt itself
        return;
      }
      py::object exc = py::reinterpret_borrow<py::object>(error.ptr())(e.what());
      exc.attr("code") = std::string(sm::status_code_name(e.code()));
      PyErr_SetObject(error.ptr(), exc.ptr());
    }
  });

  py::class_<PySample> sample(m, "Sample", R"doc(
One sample of a batch. Its bytes are exported read-only and without a copy through the
buffer protocol: memoryview(s), numpy.frombuffer(s, numpy.uint8), torch.frombuffer(s, ...).
Valid while its batch is in hand; afterwards exports raise ReleasedError.)doc");
  // Our own buffer slots (see sample_getbuffer): set on the heap type pybind11 made.
  reinterpret_cast<PyTypeObject*>(sample.ptr())->tp_as_buffer = &g_sample_buffer_procs;
  sample
      .def_property_readonly("id", [](const PySample& s) { return s.sample.id(); }, "Dataset-wide sample id (catalog order).")
      .def_property_readonly("label", [](const PySample& s) { return s.sample.label(); })
      .def_property_readonly("nbytes", [](const PySample& s) { return s.sample.bytes().size(); })
      .def_property_readonly("tier", [](const PySample& s) { return std::string(sm::proto::tier_name(s.sample.tier())); },
                             "'local' (this node's cache arena), 'peer' (read from another node) or 'storage'.")
      .def_property_readonly("owner", [](const PySample& s) { return s.sample.owner(); }, "Node whose cache served it.")
      .def_property_readonly("valid", &PySample::valid, "False once the batch was released.")
      .def_property_readonly("exports", [](const PySample& s) { return s.exports; },
                             "Buffer exports of this sample still alive.")
      .def_property_readonly("address", [](const PySample& s) {
        return reinterpret_cast<std::uintptr_t>(s.sample.bytes().data());
      }, "Address of the first byte in this process (for checks: it lies in the daemon's shared mapping).")
      .def("tobytes", [](const PySample& s) {
        if (!s.valid()) throw_released("sample " + std::to_string(s.sample.id()) + ": its batch was released");
        const auto b = s.sample.bytes();
        return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
      }, "A copy of the bytes (bytes object).")
      .def("__len__", [](const PySample& s) { return s.sample.bytes().size(); })
      .def("__repr__", [](const PySample& s) {
        return "<shardmix.Sample id=" + std::to_string(s.sample.id()) + " label=" + std::to_string(s.sample.label()) +
               " nbytes=" + std::to_string(s.sample.bytes().size()) + " tier=" + std::string(sm::proto::tier_name(s.sample.tier())) +
               (s.valid() ? "" : " released") + ">";
      });

  py::class_<PyBatch>(m, "Batch", "A trainer micro-batch: a sequence of Samples, valid until the iterator moves past it.")
      .def_property_readonly("epoch", [](const PyBatch& b) { return b.epoch; })
      .def_property_readonly("index", [](const PyBatch& b) { return b.index; })
      .def_property_readonly("valid", &PyBatch::valid)
      .def_property_readonly("ids", [](const PyBatch& b) {
        py::list l;
        for (const auto& s : b.samples) l.append(s.id());
        return l;
      })
      .def_property_readonly("skipped", [](const PyBatch& b) {
        py::list l;
        for (const auto id : b.skipped) l.append(id);
        return l;
      }, "Ids of samples planned for this batch whose bytes could not be read (dataset.strict = false); "
         "not in the batch. Usually empty.")
      .def_property_readonly("labels", [](const PyBatch& b) {
        py::list l;
        for (const auto& s : b.samples) l.append(s.label());
        return l;
      })
      .def_property_readonly("nbytes", [](const PyBatch& b) {
        std::size_t n = 0;
        for (const auto& s : b.samples) n += s.bytes().size();
        return n;
      })
      .def("__len__", [](const PyBatch& b) { return b.samples.size(); })
      .def("__getitem__", [](const PyBatch& b, py::ssize_t i) {
        const auto n = static_cast<py::ssize_t>(b.samples.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) throw py::index_error("batch index out of range");
        return PySample{b.state, b.generation, b.samples[static_cast<std::size_t>(i)], 0};
      })
      .def("copy_into", &copy_into, py::arg("out"), py::arg("stride") = py::none(), R"doc(
Copies the samples' bytes, one after another, into the writable C-contiguous buffer `out`
(bytearray, numpy array, torch_tensor.numpy(), pinned memory included), sample i at
offset i * stride, zero-padded to stride. stride=None: all samples must have the same
length, which is the stride. Returns the bytes written. One memcpy per sample with the
GIL released: this is the copy shardmix.torch makes.)doc")
      .def("__repr__", [](const PyBatch& b) {
        return "<shardmix.Batch epoch=" + std::to_string(b.epoch) + " index=" + std::to_string(b.index) +
               " samples=" + std::to_string(b.samples.size()) + (b.valid() ? "" : " released") + ">";
      });

  py::class_<PyEpoch>(m, "Epoch", "One epoch's batches for this trainer: iterate it once.")
      .def_property_readonly("epoch", [](const PyEpoch& e) { return e.epoch; })
      .def("__iter__", [](py::object self) {
        PyEpoch& e = self.cast<PyEpoch&>();
        State& s = *e.state;
        if (e.stream != 0) return self;  // an iterator's __iter__ is itself (for b in it: after next(it))
        s.releasing();  // another epoch's batch in hand goes back first (the C++ client releases it too)
        s.it.reset();
        s.epoch.emplace(e.resume.empty() ? s.get().epoch(e.epoch) : s.get().epoch(e.epoch, e.resume));
        s.epoch_number = e.epoch;
        e.stream = ++s.stream;
        return self;
      })
      .def("__next__", [](PyEpoch& e) {
        State& s = *e.state;
        if (e.stream == 0) throw py::value_error("call iter() on the epoch first (for batch in client.epoch(e): ...)");
        if (e.finished) throw py::stop_iteration();
        s.get();  // a closed client: ValueError, never a stale iterator
        if (e.stream != s.stream) throw py::value_error("epoch " + std::to_string(e.epoch) + ": another epoch was started on this client since; only one epoch is iterated at a time");
        auto b = next_batch(e.state, e);
        if (!b) throw py::stop_iteration();
        return std::move(*b);
      })
      .def_property_readonly("stats", [](const PyEpoch& e) -> py::object {
        if (!e.finished || !e.state->client) return py::none();
        const auto& stats = e.state->client->last_epoch_stats();
        if (!stats || stats->epoch != e.epoch) return py::none();
        return stats_dict(*stats);
      }, "The daemon's statistics of this epoch (dict) once iteration reached its end, else None.");

  struct PyClient {
    std::shared_ptr<State> state;
  };
  // A lease of the daemon's checkpoint pool (Client::lease_checkpoint, decision 0069). Its
  // memory is reached through write() only, never exported as a buffer: the mapping goes
  // when the lease is saved, abandoned or replaced, and a memoryview kept past that would
  // point at nothing. write() checks the lease is still the client's current one.
  struct PyLease {
    std::shared_ptr<State> state;
    sm::CheckpointLease lease;
  };
  py::class_<PyLease>(m, "CheckpointLease",
                      "Memory of the node's checkpoint pool leased for one save (Client.lease_checkpoint): fill it "
                      "with write(), then Client.save_lease(lease, length).")
      .def_property_readonly("name", [](const PyLease& l) { return l.lease.name; })
      .def_property_readonly("size", [](const PyLease& l) { return l.lease.bytes.size(); })
      .def("write", [](PyLease& l, std::uint64_t offset, py::buffer data) {
        // The buffer first: request() can run Python code (an exporter's __buffer__, a
        // finalizer), and so let another thread save or abandon the lease; the checks after
        // it see the lease as the copy will.
        const py::buffer_info info = data.request();
        const std::span<const std::uint8_t> bytes = contiguous_bytes(info, "CheckpointLease.write()");
        // Busy: another thread is in a call of this client (perhaps saving this very lease).
        if (l.state->busy) throw std::runtime_error("shardmix.Client used from two threads at once (one Client per thread)");
        if (!l.state->get().holds_lease(l.lease)) {
          throw py::value_error("checkpoint " + l.lease.name + ": this lease was saved, abandoned or replaced, or its connection to the daemon was closed");
        }
        const auto n = static_cast<std::uint64_t>(bytes.size());
        if (offset > l.lease.bytes.size() || n > l.lease.bytes.size() - offset) {
          throw py::value_error("checkpoint " + l.lease.name + ": writing " + std::to_string(n) + " bytes at offset " +
                                std::to_string(offset) + " goes past its lease of " +
                                std::to_string(l.lease.bytes.size()) + " bytes");
        }
        // With the GIL held, so that no other thread can save or abandon the lease meanwhile.
        if (n > 0) std::memcpy(l.lease.bytes.data() + offset, bytes.data(), n);
        return n;
      }, py::arg("offset"), py::arg("data"),
      "Copies the bytes of `data` into the lease at `offset`; returns how many. ValueError past its size, or "
      "once the lease is saved, abandoned or replaced.");

  py::class_<PyClient>(m, "Client", R"doc(
Connects to this trainer's ShardMix daemon (shardmix::Client::connect). The rank and world
size come from the launcher's environment (Open MPI, Slurm, PMI, torchrun, SHARDMIX_RANK)
unless given. Raises shardmix.Error.)doc")
      .def(py::init([](std::string run_dir, int daemon, int rank, int world_size, double ready_timeout,
                       double receive_timeout, double progress_timeout, bool strict) {
             sm::ClientOptions o;
             o.run_dir = std::move(run_dir);
             o.daemon = daemon;
             o.rank = rank;
             o.world_size = world_size;
             o.ready_timeout_s = ready_timeout;
             o.receive_timeout_s = receive_timeout;
             o.progress_timeout_s = progress_timeout;
             o.interrupted = python_signal_raised;
             auto state = std::make_shared<State>();
             state->strict = strict;
             {
               py::gil_scoped_release nogil;
               state->client.emplace(sm::Client::connect(o));
             }
             return PyClient{state};
           }),
           py::kw_only(), py::arg("run_dir") = "", py::arg("daemon") = -1, py::arg("rank") = -1,
           py::arg("world_size") = -1, py::arg("ready_timeout") = -1.0, py::arg("receive_timeout") = -1.0, py::arg("progress_timeout") = -1.0,
           py::arg("strict") = false)
      .def("epoch", [](PyClient& c, std::uint64_t e, std::optional<py::bytes> resume) {
        State& s = *c.state;
        s.get();
        std::vector<std::uint8_t> blob;
        if (resume) {
          const std::string bytes = *resume;
          blob.assign(bytes.begin(), bytes.end());
        } else if (!s.pending_resume.empty() && sm::Client::inspect_checkpoint(s.pending_resume).epoch == e) {
          blob = std::move(s.pending_resume);  // load_state_dict() of this epoch: used once
          s.pending_resume.clear();
        }
        return PyEpoch{c.state, e, std::move(blob), 0, false};
      }, py::arg("epoch"), py::arg("resume") = py::none(),
      "The batches of `epoch` for this trainer (iterate once). Starting it releases any batch in hand. "
      "resume: a checkpoint() blob of this epoch: only the batches not yet delivered when it was taken "
      "(also applied automatically after load_state_dict()).")
      .def_property_readonly("rank", [](PyClient& c) { return c.state->get().rank(); })
      .def_property_readonly("world_size", [](PyClient& c) { return c.state->get().world_size(); })
      .def_property_readonly("node", [](PyClient& c) { return c.state->get().node(); })
      .def_property_readonly("batches_per_epoch", [](PyClient& c) { return c.state->get().batches_per_epoch(); })
      .def_property_readonly("samples_per_epoch", [](PyClient& c) { return c.state->get().samples_per_epoch(); })
      .def_property_readonly("dataset_samples", [](PyClient& c) { return c.state->get().dataset_samples(); })
      .def_property("strict", [](PyClient& c) { return c.state->strict; },
                    [](PyClient& c, bool v) { c.state->strict = v; },
                    "True: moving past a batch while exports of its samples are alive raises BufferError.")
      .def_property_readonly("live_exports", [](PyClient& c) { return c.state->live_exports; },
                             "Exports of the batch in hand still alive.")
      .def_property_readonly("stale_exports", [](PyClient& c) { return c.state->stale_exports; },
                             "Exports still alive of batches already released (their bytes are unspecified).")
      .def("sample_path", [](PyClient& c, std::uint64_t id) {
        // The C++ client refuses while an epoch is being iterated.
        const sm::Catalog* cat = &without_gil(*c.state, [](sm::Client& client) -> const sm::Catalog& {
          return client.catalog();
        });
        if (id >= cat->size()) throw py::index_error("sample id " + std::to_string(id) + " >= " + std::to_string(cat->size()));
        return std::string(cat->path(static_cast<sm::SampleId>(id)));
      }, py::arg("id"), "Path of a sample relative to dataset.path (fetches the catalog on first use, between epochs).")
      .def_property_readonly("last_epoch_stats", [](PyClient& c) { return stats_or_none(c.state->get().last_epoch_stats()); },
                             "The last completed epoch's statistics as the daemon reported them (dict), or None.")
      // ---- checkpoint / resume (C++: Client::checkpoint, Client::epoch(e, blob); decision 0022) ----
      .def("checkpoint", [](PyClient& c) {
        const std::vector<std::uint8_t> blob = c.state->get().checkpoint();
        return py::bytes(reinterpret_cast<const char*>(blob.data()), blob.size());
      }, "This trainer's position as an opaque blob (bytes): the batches yielded so far count as delivered. "
         "Resume with epoch(e, resume=blob) or load_state_dict(blob) in a new process of the same rank.")
      .def("state_dict", [](PyClient& c) {
        const std::vector<std::uint8_t> blob = c.state->get().checkpoint();
        return py::bytes(reinterpret_cast<const char*>(blob.data()), blob.size());
      }, "The same as checkpoint() (PyTorch's naming).")
      .def("load_state_dict", [](PyClient& c, py::bytes state) {
        const std::string bytes = state;
        std::vector<std::uint8_t> blob(bytes.begin(), bytes.end());
        (void)sm::Client::inspect_checkpoint(blob);  // a damaged blob: shardmix.Error now, not at epoch()
        c.state->get();
        c.state->pending_resume = std::move(blob);
      }, py::arg("state"), "Remembers a checkpoint() blob: the next epoch() of its epoch resumes from it.")
      .def_property_readonly("resumed_epoch", [](PyClient& c) -> py::object {
        const auto e = c.state->get().resumed_epoch();
        return e ? py::object(py::int_(*e)) : py::none();
      }, "The epoch the daemons re-dealt from resume.checkpoint_dir (a restart with another world size), or None.")
      .def_static("inspect_checkpoint", [](py::bytes blob) {
        const std::string bytes = blob;
        const std::vector<std::uint8_t> v(bytes.begin(), bytes.end());
        const sm::CheckpointInfo info = sm::Client::inspect_checkpoint(v);
        py::dict d;
        d["epoch"] = info.epoch;
        d["batches_consumed"] = info.batches_consumed;
        d["samples_consumed"] = info.samples_consumed;
        d["rank"] = info.rank;
        d["world_size"] = info.world_size;
        d["redealt"] = info.redealt;
        return d;
      }, py::arg("blob"), "What a checkpoint blob says (epoch, batches_consumed, samples_consumed, rank, world_size, redealt), without a daemon.")
      // ---- model checkpoints (C++: Client::save, wait_durable, load, list; decision 0056) ----
      .def("save", [](PyClient& c, const std::string& name, py::buffer data) {
        State& s = *c.state;
        const py::buffer_info info = data.request();
        const std::span<const std::uint8_t> bytes = contiguous_bytes(info, "save()");
        return without_gil(s, [&](sm::Client& client) { return client.save(name, bytes); });
      }, py::arg("name"), py::arg("data"),
      "Saves the bytes of `data` (bytes, bytearray, memoryview, a numpy array...) as the next version of "
      "checkpoint `name` and returns its version number once the node's daemon holds them (checkpoint.dir set). "
      "They are copied once, into a lease of the daemon's checkpoint pool (lease_checkpoint), memory that "
      "outlives this process and is reused from save to save.")
      .def("lease_checkpoint", [](PyClient& c, const std::string& name, std::uint64_t size) {
        sm::CheckpointLease lease =
            without_gil(*c.state, [&](sm::Client& client) { return client.lease_checkpoint(name, size); });
        return PyLease{c.state, std::move(lease)};
      }, py::arg("name"), py::arg("size"),
      "`size` bytes of the daemon's checkpoint pool for the next version of checkpoint `name`: fill them with "
      "CheckpointLease.write, then save_lease(lease, length) saves them without a copy. One lease at a time: "
      "one held from before is abandoned.")
      .def("save_lease", [](PyClient& c, const PyLease& l, std::uint64_t length) {
        return without_gil(*c.state, [&](sm::Client& client) { return client.save_lease(l.lease, length); });
      }, py::arg("lease"), py::arg("length"),
      "Saves the first `length` bytes written into `lease` as the next version of its checkpoint; returns its "
      "version number once the node's daemon (and a peer's) holds them. The lease is used up.")
      .def("abandon_lease", [](PyClient& c, const PyLease& l) {
        without_gil(*c.state, [&](sm::Client& client) { client.abandon_lease(l.lease); });
      }, py::arg("lease"), "Gives `lease` back unsaved.")
      .def("holds_lease", [](PyClient& c, const PyLease& l) { return c.state->get().holds_lease(l.lease); },
           py::arg("lease"), "Whether `lease` is this client's current one (not saved, abandoned or replaced).")
      .def("checkpoint_buffer_fd", [](PyClient& c) {
        return without_gil(*c.state, [&](sm::Client& client) { return client.checkpoint_buffer_fd(); });
      }, "The descriptor of this client's save buffer, a memfd it keeps: write a checkpoint into it from offset 0 "
      "(e.g. torch.save to open(fd, 'wb', closefd=False) after os.lseek(fd, 0, 0)), then call "
      "save_buffer(name, size). Owned by the client: do not close it.")
      .def("save_buffer", [](PyClient& c, const std::string& name, std::uint64_t size) {
        return without_gil(*c.state, [&](sm::Client& client) { return client.save_buffer(name, size); });
      }, py::arg("name"), py::arg("size"),
      "Saves the first `size` bytes written into the save buffer (checkpoint_buffer_fd) as the next version of "
      "checkpoint `name`; returns its version number once the node's daemon (and a peer's) holds them.")
      .def("save_memfd", [](PyClient& c, const std::string& name, int fd) {
        return without_gil(*c.state, [&](sm::Client& client) { return client.save_memfd(name, fd); });
      }, py::arg("name"), py::arg("fd"),
      "Saves the whole content of memfd `fd` (os.memfd_create with os.MFD_ALLOW_SEALING, filled by the caller, "
      "e.g. torch.save to open(fd, 'wb', closefd=False)) as the next version of checkpoint `name`, without a copy: "
      "it is sealed against writes and resizing and the daemon keeps its pages. Returns the version number; the "
      "caller still closes fd.")
      .def("wait_durable", [](PyClient& c, const std::string& name) {
        without_gil(*c.state, [&](sm::Client& client) { client.wait_durable(name); });
      }, py::arg("name"),
      "Returns once the newest version of `name` is in checkpoint.dir; raises shardmix.Error with the drain's "
      "error (naming the checkpoint and the directory) if writing it failed (the daemon keeps it in RAM and retries).")
      .def("load", [](PyClient& c, const std::string& name) {
        const sm::LoadedCheckpoint loaded = without_gil(*c.state, [&](sm::Client& client) { return client.load(name); });
        return py::bytes(reinterpret_cast<const char*>(loaded.bytes().data()), loaded.bytes().size());
      }, py::arg("name"), "The newest version of `name` as bytes: from the daemon's RAM, else from its file.")
      .def("list", [](PyClient& c) {
        const std::vector<sm::CheckpointVersion> versions =
            without_gil(*c.state, [](sm::Client& client) { return client.list(); });
        py::list out;
        for (const sm::CheckpointVersion& v : versions) out.append(py::make_tuple(v.name, v.version));
        return out;
      }, "The checkpoint versions the daemon knows, as (name, version) tuples, newest first per name.")
      .def("close", [](PyClient& c) {
        State& s = *c.state;
        if (s.busy) throw std::runtime_error("close() while another thread waits on this client");
        if (s.closed) return;
        // The shared regions are mapped by the connection: closing it under a live export
        // would leave that export pointing at unmapped memory.
        if (s.live_exports + s.stale_exports > 0) {
          throw py::buffer_error("close(): " + std::to_string(s.live_exports + s.stale_exports) +
                                 " exported buffer(s) of samples are still alive (memoryview, numpy or torch "
                                 "views); release them first (the client closes when the last one goes otherwise)");
        }
        s.releasing();
        s.it.reset();
        s.epoch.reset();
        s.closed = true;
        s.client.reset();
      }, "Releases the batch in hand and disconnects. Raises BufferError while sample exports are alive.")
      .def_property_readonly("closed", [](PyClient& c) { return c.state->closed; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, py::object, py::object, py::object) {
        // Without live exports: close now. With them, the connection (and the mappings they
        // point into) goes when the last export and the last Sample do.
        State& s = *c.state;
        if (s.busy) return;
        s.strict = false;
        s.releasing();
        s.it.reset();
        s.epoch.reset();
        s.closed = true;
        if (s.live_exports + s.stale_exports == 0) s.client.reset();
      });

  m.attr("HAS_CHECKPOINT") = true;
  m.def("detect_launcher_rank", [] {
    const sm::LauncherRank r = sm::detect_launcher_rank();
    py::dict d;
    d["rank"] = r.rank;
    d["world_size"] = r.world_size;
    d["local_rank"] = r.local_rank;
    d["local_size"] = r.local_size;
    d["nodes"] = r.nodes;
    d["source"] = r.source;
    d["description"] = r.describe();
    return d;
  }, "The trainer's place in the job as the launcher's environment says (what Client() uses).");
}
