// The NVMe tier's pipelined optimizer step ([Note: the NVMe optimizer step], nvme_step.h).
#include "zerort/sharding/nvme_step.h"

#include <chrono>
#include <cstring>
#include <string>

#include "zerort/runtime/scoped_seconds.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/optimizer_state.h"

namespace zerort {

using optimizer_internal::HostF32;
using optimizer_internal::kPage;

ShardedOptimizer::NvmeStep::NvmeStep(ShardedOptimizer& optimizer, const OptimizerStepArgs& args)
    : opt_(optimizer),
      args_(args),
      store_(*optimizer.resources_.tiers.nvme),
      o_(*optimizer.resources_.options),
      part_(RoundUp(optimizer.chunk_numel_ * 4, kPage)),
      io_wait_(optimizer.resources_.stats ? &optimizer.resources_.stats->optimizer_io_wait_s
                                          : nullptr) {
  for (int u = 0; u < static_cast<int>(opt_.units_.size()); ++u) {
    const int64_t shard = opt_.units_[u]->master.numel();
    for (int64_t b = 0; b < shard; b += opt_.chunk_numel_) {
      chunks_.push_back({u, Range{b, std::min(shard, b + opt_.chunk_numel_)}});
    }
  }
}

std::array<char*, 5> ShardedOptimizer::NvmeStep::Buffers(const Job& j) const {
  char* base = static_cast<char*>(j.lease.data);
  return {base, base + part_, base + 2 * part_, base + 3 * part_, base + 4 * part_};
}

Status ShardedOptimizer::NvmeStep::Issue() {
  Job j{chunks_[next_++], {}, {}, {}};
  {
    ScopedSeconds waited(io_wait_);  // a staging set is free once its last writes have landed
    ZR_ASSIGN_OR_RETURN(j.lease, opt_.staging_->Acquire());
  }
  UnitState& s = *opt_.units_[j.chunk.unit];
  const auto buf = Buffers(j);
  const int64_t off = j.chunk.range.begin * 4, bytes = j.chunk.range.size() * 4;
  j.issued = std::chrono::system_clock::now();
  int i = 0;
  for (PlacedBuffer* b : {&s.master, &s.exp_avg, &s.exp_avg_sq}) {
    if (*b) j.reads.push_back(store_.StartRead(b->region(), off, buf[i], bytes));
    ++i;
  }
  if (s.grad_written) {
    j.reads.push_back(store_.StartRead(s.grad.region(), off, buf[3], bytes));
  } else {
    std::memset(buf[3], 0, bytes);
  }
  in_flight_.push_back(std::move(j));
  return absl::OkStatus();
}

Status ShardedOptimizer::NvmeStep::Complete(Job j) {
  UnitState& s = *opt_.units_[j.chunk.unit];
  Status failed = absl::OkStatus();
  {
    ScopedSeconds waited(io_wait_);
    for (IoHandle& r : j.reads) {
      Status st = r.Finish();
      if (failed.ok() && !st.ok()) failed = st;
    }
  }
  const auto buf = Buffers(j);
  const Range& r = j.chunk.range;
  const int64_t n = r.size();
  const SpanSink* span = opt_.resources_.span;
  const bool traced = span != nullptr && *span && !j.reads.empty();
  const auto read =
      traced ? std::chrono::system_clock::now() : std::chrono::system_clock::time_point();
  const std::string what =
      traced ? StrCat(s.unit->name(), " [", r.begin, ", ", r.end, ")") : std::string();
  if (traced) (*span)(StrCat("nvme read ", what), "io", j.issued, read);
  const int64_t csize = static_cast<int64_t>(DTypeSize(o_.compute_dtype));
  std::vector<Fence> fences;
  if (failed.ok()) {
    const ComputeCopy copy = s.unit->compute_copy();
    TensorView out;
    bool out_staged = false;
    if (copy.buffer != nullptr) {
      if (copy.buffer->in_memory() && copy.buffer->View().device().is_cpu()) {
        out = copy.buffer->View().Flat(copy.offset + r.begin, n);
      } else {
        out = TensorView(buf[4], o_.compute_dtype, {n}, Device::Cpu());
        out_staged = true;
      }
    }
    failed = opt_.Update(j.chunk.unit, r, args_, HostF32(buf[0], n), HostF32(buf[3], n),
                         s.exp_avg ? HostF32(buf[1], n) : TensorView(),
                         s.exp_avg_sq ? HostF32(buf[2], n) : TensorView(), out);
    if (traced) (*span)(StrCat("optimizer ", what), "host", read, std::chrono::system_clock::now());
    int i = 0;
    for (PlacedBuffer* b : {&s.master, &s.exp_avg, &s.exp_avg_sq}) {
      if (failed.ok() && *b) {
        IoHandle w = store_.StartWrite(b->region(), r.begin * 4, buf[i], n * 4);
        fences.push_back([w]() mutable { return w.Finish(); });
      }
      ++i;
    }
    if (failed.ok() && out_staged) {
      if (copy.buffer->in_memory()) {  // device memory (CUDA)
        const TensorView target = copy.buffer->View().Flat(copy.offset + r.begin, n);
        failed = CopyBytes(target.data(), target.device(), buf[4], Device::Cpu(), target.nbytes(),
                           nullptr);
      } else {
        IoHandle w = store_.StartWrite(copy.buffer->region(), (copy.offset + r.begin) * csize,
                                       buf[4], n * csize);
        fences.push_back([w]() mutable { return w.Finish(); });
      }
    }
  }
  opt_.staging_->Return(j.lease, std::move(fences));
  return failed;
}

void ShardedOptimizer::NvmeStep::Abandon() {
  for (Job& j : in_flight_) {  // let the reads finish before the memory is reused
    for (IoHandle& r : j.reads) r.Finish().IgnoreError();
    opt_.staging_->Return(j.lease);
  }
  in_flight_.clear();
}

Status ShardedOptimizer::NvmeStep::Run() {
  const size_t ahead = static_cast<size_t>(opt_.staging_->count() - 1);
  Status failed = absl::OkStatus();
  while (failed.ok() && (next_ < chunks_.size() || !in_flight_.empty())) {
    while (failed.ok() && next_ < chunks_.size() && in_flight_.size() < ahead) failed = Issue();
    if (!failed.ok() || in_flight_.empty()) break;
    Job j = std::move(in_flight_.front());
    in_flight_.pop_front();
    failed = Complete(std::move(j));
  }
  Abandon();  // empty unless a failure stopped the pipeline
  Status drained;
  {
    ScopedSeconds waited(io_wait_);
    drained = opt_.staging_->Drain();  // every write of this step has landed
  }
  if (!failed.ok()) return Annotate(failed, "optimizer step on the nvme tier");
  return Annotate(drained, "optimizer step on the nvme tier");
}

}  // namespace zerort
