// Collective semantics checks shared by the loopback and MPI tests.
#include "tests/runtime/comm_test_util.h"

#include <chrono>
#include <thread>

#include "zerort/runtime/device.h"

namespace zerort::testing {
namespace {

std::string Compare(const std::vector<std::byte>& got, DType dtype, size_t count,
                    const std::function<double(size_t)>& expected, int size,
                    std::string_view what) {
  for (size_t i = 0; i < count; ++i) {
    const double want = expected(i);
    const double have = ValueAt(got, dtype, i);
    if (!(std::abs(have - want) <= Tolerance(dtype, want, size))) {
      return StrCat(what, " ", DTypeName(dtype), " count ", count, ": element ", i, " is ", have,
                    ", expected ", want);
    }
  }
  return "";
}

std::string StatusText(const Status& s, std::string_view what) {
  return s.ok() ? std::string() : StrCat(what, ": ", s.ToString());
}

}  // namespace

std::string CheckAllGather(Communicator& comm, DType dtype, size_t count, uint64_t seed,
                           bool in_place) {
  const size_t elem = DTypeSize(dtype);
  const int n = comm.size();
  std::vector<std::byte> send = RandomData(dtype, count, seed, comm.rank());
  std::vector<std::byte> recv(count * n * elem + 1, std::byte{0x5a});  // poisoned
  const void* src = send.data();
  if (in_place) {
    if (count > 0) std::memcpy(recv.data() + comm.rank() * count * elem, send.data(), count * elem);
    src = recv.data() + comm.rank() * count * elem;
  }
  if (auto s = comm.AllGather(src, recv.data(), count, dtype); !s.ok())
    return StatusText(s, "all_gather");
  const auto all = AllRanksData(dtype, count, seed, n);
  return Compare(
      recv, dtype, count * n, [&](size_t i) { return ValueAt(all[i / count], dtype, i % count); },
      1, in_place ? "all_gather(in place)" : "all_gather");
}

std::string CheckReduceScatter(Communicator& comm, DType dtype, size_t count, ReduceOp op,
                               uint64_t seed, bool in_place) {
  const size_t elem = DTypeSize(dtype);
  const int n = comm.size();
  const size_t total = count * n;
  std::vector<std::byte> send = RandomData(dtype, total, seed, comm.rank());
  std::vector<std::byte> recv(count * elem + 1, std::byte{0x5a});
  void* dst = in_place ? static_cast<void*>(send.data() + comm.rank() * count * elem) : recv.data();
  if (auto s = comm.ReduceScatter(send.data(), dst, count, dtype, op); !s.ok()) {
    return StatusText(s, "reduce_scatter");
  }
  if (in_place && count > 0) std::memcpy(recv.data(), dst, count * elem);
  const auto all = AllRanksData(dtype, total, seed, n);
  return Compare(
      recv, dtype, count,
      [&](size_t i) { return ReferenceReduce(all, dtype, comm.rank() * count + i, op); }, n,
      StrCat("reduce_scatter(", ReduceOpName(op), in_place ? ", in place)" : ")"));
}

std::string CheckAllReduce(Communicator& comm, DType dtype, size_t count, ReduceOp op,
                           uint64_t seed, bool in_place) {
  const size_t elem = DTypeSize(dtype);
  const int n = comm.size();
  std::vector<std::byte> send = RandomData(dtype, count, seed, comm.rank());
  std::vector<std::byte> recv(count * elem + 1, std::byte{0x5a});
  if (in_place) recv = send;
  if (auto s = comm.AllReduce(in_place ? recv.data() : send.data(), recv.data(), count, dtype, op);
      !s.ok()) {
    return StatusText(s, "all_reduce");
  }
  const auto all = AllRanksData(dtype, count, seed, n);
  return Compare(
      recv, dtype, count, [&](size_t i) { return ReferenceReduce(all, dtype, i, op); }, n,
      StrCat("all_reduce(", ReduceOpName(op), in_place ? ", in place)" : ")"));
}

std::string CheckBroadcast(Communicator& comm, DType dtype, size_t count, int root, uint64_t seed) {
  std::vector<std::byte> buffer = RandomData(dtype, count, seed, comm.rank());
  if (auto s = comm.Broadcast(buffer.data(), count, dtype, root); !s.ok()) {
    return StatusText(s, "broadcast");
  }
  const std::vector<std::byte> want = RandomData(dtype, count, seed, root);
  return Compare(
      buffer, dtype, count, [&](size_t i) { return ValueAt(want, dtype, i); }, 1,
      StrCat("broadcast(root ", root, ")"));
}

std::string CheckSendRecvRing(Communicator& comm, DType dtype, size_t count, uint64_t seed) {
  const int n = comm.size();
  const int right = (comm.rank() + 1) % n;
  const int left = (comm.rank() + n - 1) % n;
  std::vector<std::byte> send = RandomData(dtype, count, seed, comm.rank());
  std::vector<std::byte> recv(count * DTypeSize(dtype) + 1, std::byte{0x5a});
  if (auto s = comm.p2p().SendRecv(send.data(), count, right, recv.data(), count, left, dtype);
      !s.ok()) {
    return StatusText(s, "send_recv");
  }
  const std::vector<std::byte> want = RandomData(dtype, count, seed, left);
  std::string err = Compare(
      recv, dtype, count, [&](size_t i) { return ValueAt(want, dtype, i); }, 1, "send_recv ring");
  if (!err.empty() || n == 1) return err;
  // Plain Send/Recv around the ring, ordered so that no rank waits on an unposted receive.
  std::vector<std::byte> got(count * DTypeSize(dtype) + 1, std::byte{0x5a});
  Status s;
  if (comm.rank() % 2 == 0) {
    s = comm.p2p().Send(send.data(), count, dtype, right);
    if (s.ok()) s = comm.p2p().Recv(got.data(), count, dtype, left);
  } else {
    s = comm.p2p().Recv(got.data(), count, dtype, left);
    if (s.ok()) s = comm.p2p().Send(send.data(), count, dtype, right);
  }
  if (!s.ok()) return StatusText(s, "send/recv ring");
  return Compare(
      got, dtype, count, [&](size_t i) { return ValueAt(want, dtype, i); }, 1, "send/recv ring");
}

std::string CheckExchange(Communicator& comm, DType dtype, size_t count, uint64_t seed) {
  const int n = comm.size();
  if (n == 1) return "";
  const int right = (comm.rank() + 1) % n;
  const int left = (comm.rank() + n - 1) % n;
  // Three messages of different sizes: two to the right (matched in order), one to the left;
  // every rank posts its sends before its receives, which blocking sends of large messages
  // could not survive.
  const size_t sizes[3] = {count, count / 2 + 1, count + 5};
  const int to[3] = {right, left, right};
  const int from[3] = {left, right, left};
  std::vector<std::vector<std::byte>> send(3), recv(3);
  std::vector<P2POp> ops;
  for (int i = 0; i < 3; ++i) {
    send[i] = RandomData(dtype, sizes[i], seed + i, comm.rank());
    ops.push_back({P2POp::kSend, send[i].data(), sizes[i], to[i]});
  }
  for (int i = 0; i < 3; ++i) {
    recv[i].assign(sizes[i] * DTypeSize(dtype) + 1, std::byte{0x5a});
    ops.push_back({P2POp::kRecv, recv[i].data(), sizes[i], from[i]});
  }
  if (auto s = comm.p2p().Exchange(ops, dtype); !s.ok()) return StatusText(s, "exchange");
  for (int i = 0; i < 3; ++i) {
    const std::vector<std::byte> want = RandomData(dtype, sizes[i], seed + i, from[i]);
    std::string err = Compare(
        recv[i], dtype, sizes[i], [&](size_t k) { return ValueAt(want, dtype, k); }, 1,
        StrCat("exchange message ", i));
    if (!err.empty()) return err;
  }
  return "";
}

std::string CheckPostedSends(Communicator& comm, DType dtype, size_t count, uint64_t seed) {
  const int n = comm.size();
  if (n == 1) return "";
  const int right = (comm.rank() + 1) % n;
  const int left = (comm.rank() + n - 1) % n;
  // Every rank posts all its sends first (two to the right, one to the left), then receives
  // them in a batch, then waits for its sends: posted sends never wait for their receive.
  const size_t sizes[3] = {count, count + 3, count / 2 + 1};
  const int to[3] = {right, right, left};
  const int from[3] = {left, left, right};
  std::vector<std::vector<std::byte>> send(3), recv(3);
  for (int i = 0; i < 3; ++i) {
    send[i] = RandomData(dtype, sizes[i], seed + i, comm.rank());
    if (auto s = comm.p2p().PostSend(send[i].data(), sizes[i], dtype, to[i]); !s.ok()) {
      return StatusText(s, "post send");
    }
  }
  std::vector<P2POp> ops;
  for (int i = 0; i < 3; ++i) {
    recv[i].assign(sizes[i] * DTypeSize(dtype) + 1, std::byte{0x5a});
    ops.push_back({P2POp::kRecv, recv[i].data(), sizes[i], from[i]});
  }
  if (auto s = comm.p2p().Exchange(ops, dtype); !s.ok())
    return StatusText(s, "exchange of receives");
  if (auto s = comm.p2p().WaitSends(); !s.ok()) return StatusText(s, "wait sends");
  if (comm.p2p().posted_sends() != 0) return "posted sends left after WaitSends";
  for (int i = 0; i < 3; ++i) {
    const std::vector<std::byte> want = RandomData(dtype, sizes[i], seed + i, from[i]);
    std::string err = Compare(
        recv[i], dtype, sizes[i], [&](size_t k) { return ValueAt(want, dtype, k); }, 1,
        StrCat("posted send ", i));
    if (!err.empty()) return err;
  }
  return "";
}

std::string CheckEverything(Communicator& comm, uint64_t seed) {
  const size_t large = (size_t{1} << 20) + 3;  // 1 Mi + 3 elements: uneven and multi-tile
  for (DType dtype : AllDTypes()) {
    std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMax};
    if (IsFloatingPoint(dtype)) ops.push_back(ReduceOp::kAvg);
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
      for (bool in_place : {false, true}) {
        if (auto e = CheckAllGather(comm, dtype, count, seed + count, in_place); !e.empty())
          return e;
        for (ReduceOp op : ops) {
          if (auto e = CheckReduceScatter(comm, dtype, count, op, seed + count + 1, in_place);
              !e.empty())
            return e;
          if (auto e = CheckAllReduce(comm, dtype, count, op, seed + count + 2, in_place);
              !e.empty())
            return e;
        }
      }
      for (int root = 0; root < comm.size(); root += std::max(1, comm.size() - 1)) {
        if (auto e = CheckBroadcast(comm, dtype, count, root, seed + count + 3); !e.empty())
          return e;
      }
      if (auto e = CheckSendRecvRing(comm, dtype, count, seed + count + 4); !e.empty()) return e;
      if (auto e = CheckExchange(comm, dtype, count, seed + count + 8); !e.empty()) return e;
      if (auto e = CheckPostedSends(comm, dtype, count, seed + count + 11); !e.empty()) return e;
    }
  }
  // Large messages in the two dtypes that matter most for training.
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    if (auto e = CheckAllReduce(comm, dtype, large, ReduceOp::kSum, seed + 5, false); !e.empty())
      return e;
    if (auto e = CheckReduceScatter(comm, dtype, large / comm.size() + 1, ReduceOp::kAvg, seed + 6,
                                    true);
        !e.empty())
      return e;
    if (auto e = CheckAllGather(comm, dtype, large / comm.size() + 1, seed + 7, false); !e.empty())
      return e;
  }
  if (auto e = CheckExchange(comm, DType::kF32, large, seed + 9); !e.empty()) return e;
  if (auto e = CheckPostedSends(comm, DType::kF32, large, seed + 12); !e.empty()) return e;
  if (auto s = comm.Barrier(); !s.ok()) return StatusText(s, "barrier");
  return "";
}

namespace {
// A queued CPU stream with up to 50 us of jitter per item.
std::unique_ptr<Stream> JitteredStream(const char* name, uint64_t seed) {
  return std::move(*CreateStream(
      Device::Cpu(), name,
      StreamOptions{.cpu = CpuExecution::kQueued, .jitter_seed = seed, .jitter_max_us = 50}));
}
}  // namespace

std::string CheckQueuedCollectives(Communicator& comm, uint64_t seed) {
  const int r = comm.rank(), size = comm.size();
  const size_t n = 4096 - 4096 % static_cast<size_t>(size);
  std::unique_ptr<Stream> compute = JitteredStream("compute", seed * 100 + r);
  std::unique_ptr<Stream> stream = JitteredStream("comm", seed * 100 + 50 + r);
  std::unique_ptr<Event> produced = std::move(*CreateEvent(Device::Cpu()));
  std::vector<float> in(n, -1.0f), sum(n), shard(n / size), gathered(n);
  auto check = [](const Status& s) { return s.ok() ? std::string() : s.ToString(); };
  std::string error = check(compute->Launch([&in, r] {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((r + 1) * (i % 7));
    return absl::OkStatus();
  }));
  if (error.empty()) error = check(produced->Record(*compute));
  if (error.empty()) error = check(stream->WaitEvent(*produced));
  if (error.empty()) {
    error =
        check(comm.AllReduce(in.data(), sum.data(), n, DType::kF32, ReduceOp::kSum, stream.get()));
  }
  if (error.empty()) {
    error = check(comm.ReduceScatter(in.data(), shard.data(), n / size, DType::kF32, ReduceOp::kSum,
                                     stream.get()));
  }
  if (error.empty()) {
    error =
        check(comm.AllGather(shard.data(), gathered.data(), n / size, DType::kF32, stream.get()));
  }
  const Status refused =
      size > 1 ? comm.p2p().PostSend(in.data(), 1, DType::kF32, (r + 1) % size, stream.get())
               : absl::UnimplementedError("one rank");
  const Status synced = stream->Synchronize();  // always: the queue reads these locals
  (void)compute->Synchronize();
  if (!error.empty()) return error;
  if (!synced.ok()) return synced.ToString();
  const float ranks = static_cast<float>(size * (size + 1) / 2);
  for (size_t i = 0; i < n; ++i) {
    const float want = ranks * static_cast<float>(i % 7);
    if (sum[i] != want || gathered[i] != want) {
      return StrCat("rank ", r, " element ", i, ": all-reduce ", sum[i], ", gathered ", gathered[i],
                    ", want ", want);
    }
  }
  if (refused.code() != absl::StatusCode::kUnimplemented) {
    return StrCat("a posted send on a queued stream: ", refused);
  }
  return "";
}

std::string CheckIssueOrderAcrossStreams(Communicator& comm, uint64_t seed) {
  const int r = comm.rank(), size = comm.size();
  constexpr size_t n = 1024;
  std::unique_ptr<Stream> first = JitteredStream("compute", seed * 100 + r);
  std::unique_ptr<Stream> second = JitteredStream("comm", seed * 100 + 50 + r);
  // Three all-reduces with inputs unlike each other: a pairing of two different ones shows.
  std::vector<std::vector<float>> in(3, std::vector<float>(n)), out(3, std::vector<float>(n));
  for (size_t k = 0; k < 3; ++k) {
    for (size_t i = 0; i < n; ++i) {
      in[k][i] = static_cast<float>((r + 1) * (1 + static_cast<int>(k) * 1000) + i % 7);
    }
  }
  auto check = [](const Status& s) { return s.ok() ? std::string() : s.ToString(); };
  std::string error = check(first->Launch([r] {
    if (r % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return absl::OkStatus();
  }));
  auto all_reduce = [&](size_t k, Stream* stream) {
    return check(
        comm.AllReduce(in[k].data(), out[k].data(), n, DType::kF32, ReduceOp::kSum, stream));
  };
  if (error.empty()) error = all_reduce(0, first.get());
  if (error.empty()) error = all_reduce(1, second.get());
  if (error.empty()) error = all_reduce(2, nullptr);
  const Status synced_first = first->Synchronize();  // always: the queues read these locals
  const Status synced_second = second->Synchronize();
  if (!error.empty()) return error;
  if (!synced_first.ok()) return synced_first.ToString();
  if (!synced_second.ok()) return synced_second.ToString();
  const float ranks = static_cast<float>(size * (size + 1) / 2);
  for (size_t k = 0; k < 3; ++k) {
    for (size_t i = 0; i < n; ++i) {
      const float want = ranks * static_cast<float>(1 + static_cast<int>(k) * 1000) +
                         static_cast<float>(size) * static_cast<float>(i % 7);
      if (out[k][i] != want) {
        return StrCat("rank ", r, ": all-reduce ", k, " element ", i, " is ", out[k][i], ", want ",
                      want, " (issued in one order, run in another)");
      }
    }
  }
  return "";
}

}  // namespace zerort::testing
