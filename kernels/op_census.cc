// CountOperations: the census hook over ForwardingKernels (op_census.h).
#include "zerort/kernels/op_census.h"

#include <utility>

#include "zerort/kernels/forwarding_kernels.h"

namespace zerort {
namespace {

class CountHook {
 public:
  explicit CountHook(OpCensus* census) : census_(census) {}
  Stream& stream(ModelKernels& inner) { return inner.stream(); }
  template <typename Work>
  Status Op(const internal::OpInfo& info, Work&& work) {
    ++census_->ops[info.name];
    return work();
  }
  template <typename Read>
  auto HostRead(const char* name, Read&& read) -> decltype(read()) {
    ++census_->ops[name];
    ++census_->host_reads;
    return read();
  }
  void Finish() {}

 private:
  OpCensus* census_;
};

}  // namespace

int64_t OpCensus::total_ops() const {
  int64_t n = 0;
  for (const auto& [name, count] : ops) n += count;
  return n;
}

std::unique_ptr<ModelKernels> CountOperations(std::unique_ptr<ModelKernels> kernels,
                                              OpCensus* census) {
  return std::make_unique<internal::ForwardingKernels<CountHook>>(std::move(kernels),
                                                                  CountHook(census));
}

}  // namespace zerort
