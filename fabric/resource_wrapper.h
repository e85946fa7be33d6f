// Owning handles for libfabric objects: std::unique_ptr with an fi_close / fi_freeinfo
// deleter (after aws-ofi-nccl's include/ofi/resource_wrapper.h). Declaring these as
// members in creation order makes the compiler close them in reverse order, which is
// the order libfabric wants (fabtests' ft_free_res).
// Thread-safety: like std::unique_ptr (no internal synchronisation).
#pragma once

#include <cstddef>
#include <memory>

#include <rdma/fabric.h>

namespace shardmix::fabric {

// Logs a failed fi_close (defined in fabric.cc, where the logger is).
void log_close_failure(const char* what, int rc) noexcept;

// Closes any fid-carrying object (fid_fabric, fid_domain, fid_cq, fid_av, fid_ep, fid_mr).
// fi_close can fail (e.g. -FI_EBUSY when something still refers to the object). A
// destructor cannot return that and leaking the object is the only safe outcome, so the
// failure is logged (decision 0046: no dropped results) and the object left to the process.
template <typename FidType>
struct FidCloser {
  void operator()(FidType* object) const noexcept {
    if (object == nullptr) return;
    if (const int rc = fi_close(&object->fid); rc != 0) log_close_failure(fid_class_name(object->fid.fclass), rc);
  }
  static const char* fid_class_name(std::size_t fclass) noexcept {
    switch (fclass) {
      case FI_CLASS_FABRIC: return "fabric";
      case FI_CLASS_DOMAIN: return "domain";
      case FI_CLASS_EP: return "endpoint";
      case FI_CLASS_AV: return "address vector";
      case FI_CLASS_CQ: return "completion queue";
      case FI_CLASS_MR: return "memory region";
      case FI_CLASS_EQ: return "event queue";
      case FI_CLASS_CNTR: return "counter";
      case FI_CLASS_WAIT: return "wait set";
      default: return "object";
    }
  }
};

template <typename FidType>
using FidPtr = std::unique_ptr<FidType, FidCloser<FidType>>;

struct FiInfoDeleter {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};

// Owns a whole fi_info list (fi_getinfo's result) or a single fi_dupinfo copy.
using FiInfoPtr = std::unique_ptr<fi_info, FiInfoDeleter>;

}  // namespace shardmix::fabric
