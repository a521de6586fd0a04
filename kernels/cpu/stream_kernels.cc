// CPU kernels issued on a stream: every call of the wrapped kernels runs in the stream's order
// (at once on an immediate CPU stream, on its thread for a queued one), as the CUDA kernels'
// launches do on theirs. Arguments are captured by value, so the buffers they point to must stay
// alive until the stream reaches the call (the caching allocator's stream-ordered rules). The
// host reads (ActToHost, StatToHost, TakeLossLedger) synchronise the stream first, as cudaMemcpy
// to the host does; the loss ledger is added to on the stream's thread, with no wait per
// micro-batch.
#include "zerort/kernels/cpu/stream_kernels.h"

#include <memory>
#include <utility>

#include "zerort/kernels/forwarding_kernels.h"

namespace zerort::internal {
namespace {

class IssueHook {
 public:
  explicit IssueHook(Stream& stream) : stream_(&stream) {}
  Stream& stream(ModelKernels& /*inner: its own stream is never used*/) { return *stream_; }
  // On an immediate stream the call runs here, without wrapping it in a std::function (one heap
  // allocation per kernel call otherwise).
  template <typename Work>
  Status Op(const OpInfo& /*info*/, Work&& work) {
    if (!stream_->asynchronous()) return work();
    return stream_->Launch(std::forward<Work>(work));
  }
  template <typename Read>
  auto HostRead(const char* /*name*/, Read&& read) -> decltype(read()) {
    ZR_RETURN_IF_ERROR(stream_->Synchronize());
    return read();
  }
  // Work still queued (a step that failed part-way) calls the inner kernels: it runs first.
  void Finish() { (void)stream_->Synchronize(); }

 private:
  Stream* stream_;
};

}  // namespace

std::unique_ptr<ModelKernels> IssueOnStream(std::unique_ptr<ModelKernels> kernels, Stream& stream) {
  return std::make_unique<ForwardingKernels<IssueHook>>(std::move(kernels), IssueHook(stream));
}

}  // namespace zerort::internal
