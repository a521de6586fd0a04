// cuDNN's fused flash attention through cudnn-frontend ([Note: the cuDNN attention] in
// kernels/cudnn_attention.h). Compiled only when CMake is given the frontend's folder.
#include "zerort/kernels/cudnn_attention.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cudnn_frontend.h>

#include <array>
#include <cmath>
#include <exception>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "zerort/kernels/bounded_cache.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/kernels/model_math.h"
#include "zerort/runtime/strings.h"

// The frontend's dynamic loading (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING) calls cuDNN through the
// library this handle holds; CudnnAttention::Create opens it.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace zerort::internal {
namespace fe = cudnn_frontend;

Status CudnnAttentionBuilt() { return absl::OkStatus(); }

namespace {

// The tensors' ids in a graph's variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

Status FrontendError(const fe::error_object& e, std::string_view what) {
  return absl::InternalError(StrCat("cuDNN attention: ", what, ": ", e.err_msg));
}
#define ZR_FE_RETURN_IF_ERROR(expr, what)                        \
  do {                                                           \
    const fe::error_object zr_fe_e = (expr);                     \
    if (!zr_fe_e.is_good()) return FrontendError(zr_fe_e, what); \
  } while (false)

// Opens libcudnn once per process for the frontend; the error says why it did not load.
Status LoadCudnn() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (fe::cudnn_dlhandle != nullptr) return absl::OkStatus();
  dlerror();
  void* handle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return absl::UnimplementedError(
        StrCat("model.attention_backend = \"cudnn\": libcudnn.so.9 does not load here (",
               error != nullptr ? error : "unknown", "); install cuDNN 9 or choose \"flash\""));
  }
  fe::cudnn_dlhandle = handle;
  return absl::OkStatus();
}

fe::DataType_t FeType(DType dtype) {
  return dtype == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

math::QkvLayout LayoutOf(const FlashAttentionShape& s) {
  return {s.heads, s.kv_heads, s.head_size};
}

// Q, K and V as views of qkv ([Note: the qkv layout]: K and V at their offsets into a row, each
// with qkv's strides); out, dout [batch, seq, heads hs]; the statistics [batch, heads, seq]
// (fp32): dims [b, h, s, d] and their strides.
struct Views {
  std::vector<int64_t> q_dim, kv_dim, qkv_stride, o_stride, stat_dim, stat_stride;
};
Views ViewsOf(const FlashAttentionShape& s) {
  const math::QkvLayout l = LayoutOf(s);
  const int64_t b = s.batch, t = s.seq, h = s.heads, d = s.head_size;
  return {.q_dim = {b, h, t, d},
          .kv_dim = {b, s.kv_heads, t, d},
          .qkv_stride = {t * l.row(), d, l.row(), 1},
          .o_stride = {t * l.q_cols(), d, l.q_cols(), 1},
          .stat_dim = {b, h, t, 1},
          .stat_stride = {h * t, t, 1, 1}};
}

std::shared_ptr<fe::graph::Tensor_attributes> Input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    const std::vector<int64_t>& dim,
                                                    const std::vector<int64_t>& stride) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

class CudnnAttentionImpl final : public CudnnAttention {
 public:
  CudnnAttentionImpl(cudnnHandle_t handle, cudaStream_t stream)
      : handle_(handle), stream_(stream) {}
  ~CudnnAttentionImpl() override {
    graphs_.Clear();
    try {  // the frontend's loader throws where a symbol is missing; a destructor must not
      fe::detail::destroy_handle(handle_);
    } catch (const std::exception&) {
    }
  }

  Status Forward(DType dtype, const FlashAttentionShape& s, void* out, float* lse, const void* qkv,
                 void* workspace, int64_t workspace_bytes) override {
    Pack pack = {{kO, out}, {kStats, lse}};
    AddQkv(pack, {kQ, kK, kV}, qkv, dtype, s);
    return Run(false, dtype, s, pack, workspace, workspace_bytes);
  }

  Status Backward(DType dtype, const FlashAttentionShape& s, void* dqkv, const void* dout,
                  const void* qkv, const void* out, const float* lse, void* workspace,
                  int64_t workspace_bytes) override {
    Pack pack = {{kO, const_cast<void*>(out)},
                 {kDO, const_cast<void*>(dout)},
                 {kStats, const_cast<float*>(lse)}};
    AddQkv(pack, {kQ, kK, kV}, qkv, dtype, s);
    AddQkv(pack, {kDQ, kDK, kDV}, dqkv, dtype, s);
    return Run(true, dtype, s, pack, workspace, workspace_bytes);
  }

 private:
  using Key = std::tuple<bool, DType, int, int, int, int, int>;

  using Pack = std::unordered_map<int64_t, void*>;

  // The three views of a tensor in qkv's layout (qkv or dqkv) under `uids` (Q's, K's, V's): the
  // first query head's, the first key head's and the first value head's columns.
  static void AddQkv(Pack& pack, std::array<Uid, 3> uids, const void* base, DType dtype,
                     const FlashAttentionShape& s) {
    const math::QkvLayout l = LayoutOf(s);
    auto* p = static_cast<std::byte*>(const_cast<void*>(base));
    const int64_t e = static_cast<int64_t>(DTypeSize(dtype));
    pack[uids[0]] = p + l.q(0) * e;
    pack[uids[1]] = p + l.k(0) * e;
    pack[uids[2]] = p + l.v(0) * e;
  }

  // Checks the shape, builds (or finds) the direction's graph, checks its workspace against the
  // budget, and runs it on the handle's stream.
  Status Run(bool backward, DType dtype, const FlashAttentionShape& s, Pack& pack, void* workspace,
             int64_t workspace_bytes) {
    ZR_RETURN_IF_ERROR(CheckCudnnAttention(dtype, s));
    if (s.batch == 0 || s.seq == 0) return absl::OkStatus();
    const char* way = backward ? "backward" : "forward";
    ZR_ASSIGN_OR_RETURN(const Built* built, GraphFor(backward, dtype, s));
    if (built->workspace > workspace_bytes) {
      return absl::ResourceExhaustedError(
          StrCat("cuDNN attention ", way, " asks for ", built->workspace,
                 " bytes of workspace, more than the ", workspace_bytes,
                 " the memory plan gives it (kernels/memory_facts.h's AttentionScratchBytes); "
                 "model.attention_backend \"flash\" runs zerort's kernels instead"));
    }
    return Execute(*built->graph, pack, workspace, way);
  }

  Status Execute(const fe::graph::Graph& g, Pack& pack, void* workspace, const char* way) {
    try {
      ZR_FE_RETURN_IF_ERROR(g.execute(handle_, pack, workspace), way);
    } catch (const std::exception& ex) {
      return absl::InternalError(StrCat("cuDNN attention ", way, ": ", ex.what()));
    }
    return absl::OkStatus();
  }

  // A built graph and the workspace it asks for (taken once, when it is built).
  struct Built {
    std::unique_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;
  };

  // The graph for this direction, element type and shape: built on first use, then kept among
  // the kMaxGraphs most recently used.
  StatusOr<const Built*> GraphFor(bool backward, DType dtype, const FlashAttentionShape& s) {
    const Key key{backward, dtype, s.batch, s.seq, s.heads, s.kv_heads, s.head_size};
    if (const Built* kept = graphs_.Find(key)) return kept;
    if (graphs_.full()) {  // the graph to be dropped may still have work queued on the stream
      const cudaError_t waited = cudaStreamSynchronize(stream_);
      if (waited != cudaSuccess) {
        return absl::InternalError(
            StrCat("cuDNN attention: waiting for the stream before dropping a graph: ",
                   cudaGetErrorString(waited)));
      }
    }
    Built built{.graph = std::make_unique<fe::graph::Graph>()};
    try {
      ZR_RETURN_IF_ERROR(Build(*built.graph, backward, dtype, s));
      ZR_FE_RETURN_IF_ERROR(built.graph->get_workspace_size(built.workspace), "workspace size");
    } catch (const std::exception& ex) {
      return absl::InternalError(StrCat("cuDNN attention: building its ",
                                        backward ? "backward" : "forward", " graph: ", ex.what()));
    }
    return graphs_.Insert(key, std::move(built));
  }

  Status Build(fe::graph::Graph& g, bool backward, DType dtype, const FlashAttentionShape& s) {
    const Views v = ViewsOf(s);
    g.set_io_data_type(FeType(dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = Input(g, "Q", kQ, v.q_dim, v.qkv_stride);
    auto k = Input(g, "K", kK, v.kv_dim, v.qkv_stride);
    auto val = Input(g, "V", kV, v.kv_dim, v.qkv_stride);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_size));
    if (!backward) {
      auto options = fe::graph::SDPA_attributes()
                         .set_name("zerort_attention")
                         .set_generate_stats(true)
                         .set_attn_scale(scale)
                         .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                         .set_diagonal_band_right_bound(0);
      auto [o, stats] = g.sdpa(q, k, val, options);
      o->set_output(true).set_uid(kO).set_dim(v.q_dim).set_stride(v.o_stride);
      stats->set_output(true)
          .set_uid(kStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim(v.stat_dim)
          .set_stride(v.stat_stride);
    } else {
      auto o = Input(g, "O", kO, v.q_dim, v.o_stride);
      auto d_o = Input(g, "dO", kDO, v.q_dim, v.o_stride);
      auto stats = g.tensor(fe::graph::Tensor_attributes()
                                .set_name("Stats")
                                .set_uid(kStats)
                                .set_dim(v.stat_dim)
                                .set_stride(v.stat_stride)
                                .set_data_type(fe::DataType_t::FLOAT));
      auto options = fe::graph::SDPA_backward_attributes()
                         .set_name("zerort_attention_backward")
                         .set_attn_scale(scale)
                         .set_deterministic_algorithm(false)
                         .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                         .set_diagonal_band_right_bound(0);
      auto [dq, dk, dv] = g.sdpa_backward(q, k, val, o, d_o, stats, options);
      dq->set_output(true).set_uid(kDQ).set_dim(v.q_dim).set_stride(v.qkv_stride);
      dk->set_output(true).set_uid(kDK).set_dim(v.kv_dim).set_stride(v.qkv_stride);
      dv->set_output(true).set_uid(kDV).set_dim(v.kv_dim).set_stride(v.qkv_stride);
    }
    ZR_FE_RETURN_IF_ERROR(g.validate(), "validate");
    ZR_FE_RETURN_IF_ERROR(g.build_operation_graph(handle_), "operation graph");
    ZR_FE_RETURN_IF_ERROR(g.create_execution_plans({fe::HeurMode_t::A}), "execution plans");
    ZR_FE_RETURN_IF_ERROR(g.check_support(handle_), "support (this GPU, cuDNN version or shape)");
    ZR_FE_RETURN_IF_ERROR(g.build_plans(handle_), "plans");
    return absl::OkStatus();
  }

  // Training needs two to four graphs (each direction, a shorter last batch, evaluation's);
  // generation one a sequence length, so the oldest are dropped (kernels/bounded_cache.h).
  static constexpr size_t kMaxGraphs = 8;

  cudnnHandle_t handle_;
  cudaStream_t stream_;
  BoundedCache<Key, Built> graphs_{kMaxGraphs};
};

}  // namespace

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(Stream& stream) {
  ZR_RETURN_IF_ERROR(LoadCudnn());
  cudnnHandle_t handle = nullptr;
  try {
    const cudnnStatus_t made = fe::detail::create_handle(&handle);
    if (made != CUDNN_STATUS_SUCCESS) {
      return absl::UnimplementedError(
          StrCat("model.attention_backend = \"cudnn\": cudnnCreate failed: ",
                 fe::detail::get_error_string(made)));
    }
    const cudnnStatus_t bound =
        fe::detail::set_stream(handle, static_cast<cudaStream_t>(stream.native_handle()));
    if (bound != CUDNN_STATUS_SUCCESS) {
      fe::detail::destroy_handle(handle);
      return absl::InternalError(
          StrCat("cuDNN attention: cudnnSetStream: ", fe::detail::get_error_string(bound)));
    }
  } catch (const std::exception& ex) {
    return absl::UnimplementedError(
        StrCat("model.attention_backend = \"cudnn\": cuDNN did not start here: ", ex.what()));
  }
  return std::unique_ptr<CudnnAttention>(std::make_unique<CudnnAttentionImpl>(
      handle, static_cast<cudaStream_t>(stream.native_handle())));
}

}  // namespace zerort::internal
