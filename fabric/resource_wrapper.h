// Owning handles for libfabric objects: std::unique_ptr with an fi_close / fi_freeinfo
// deleter (after aws-ofi-nccl's include/ofi/resource_wrapper.h). Declaring these as
// members in creation order makes the compiler close them in reverse order, which is
// the order libfabric wants (fabtests' ft_free_res).
// Thread-safety: like std::unique_ptr (no internal synchronisation).
#pragma once

#include <memory>

#include <rdma/fabric.h>

namespace shardmix::fabric {

// Closes any fid-carrying object (fid_fabric, fid_domain, fid_cq, fid_av, fid_ep, fid_mr).
// fi_close can fail (e.g. -FI_EBUSY when something still refers to the object); a
// destructor cannot report that, and leaking is the only safe alternative, so it is ignored.
template <typename FidType>
struct FidCloser {
  void operator()(FidType* object) const noexcept {
    if (object != nullptr) (void)fi_close(&object->fid);
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
