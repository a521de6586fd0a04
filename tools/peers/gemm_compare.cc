// make bench-gemm: the GPT model's own GEMM shapes (forward, and the backward's input and weight
// gradients, of every linear layer and the tied head) through OpenBLAS (zerort's GEMM path),
// BLIS, oneDNN and libxsmm, all from Debian, in the same run on the same buffers, rounds
// interleaved, medians. Row-major C = A op(B) as kernels/cpu/model_ops.cc calls cblas_sgemm.
//
// usage: gemm_compare [--threads 2] [--rounds 5] [--shapes tiny,small,gpt2]
// libxsmm's sgemm is single-threaded (it forwards shapes beyond its small-matrix threshold to the
// BLAS it is linked with, here OpenBLAS); the others use --threads.
#include <cblas.h>
#include <libxsmm.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

void BlisSetThreads(int threads);
void BlisSgemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc);

namespace {

struct Gemm {
  std::string what;
  bool ta, tb;
  int m, n, k;
};

// The shapes one micro-batch of the model runs: rows = B x T; per linear [in -> out]: forward
// out[rows, out] = x[rows, in] w[out, in]^T; dinp[rows, in] = dout[rows, out] w[out, in];
// dweight[out, in] = dout^T[out, rows] x[rows, in].
std::vector<Gemm> ModelGemms(int rows, int d, int vocab) {
  std::vector<Gemm> g;
  const std::pair<const char*, std::pair<int, int>> linears[] = {{"qkv", {d, 3 * d}},
                                                                 {"proj", {d, d}},
                                                                 {"fc", {d, 4 * d}},
                                                                 {"fc_proj", {4 * d, d}},
                                                                 {"head", {d, vocab}}};
  for (const auto& [name, io] : linears) {
    const auto [in, out] = io;
    g.push_back({std::string(name) + " fwd", false, true, rows, out, in});
    g.push_back({std::string(name) + " dinp", false, false, rows, in, out});
    g.push_back({std::string(name) + " dw", true, false, out, in, rows});
  }
  return g;
}

void Openblas(const Gemm& s, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
              s.m, s.n, s.k, 1.0f, a, s.ta ? s.m : s.k, b, s.tb ? s.k : s.n, 0.0f, c, s.n);
}
void Blis(const Gemm& s, const float* a, const float* b, float* c) {
  BlisSgemm(s.ta, s.tb, s.m, s.n, s.k, a, s.ta ? s.m : s.k, b, s.tb ? s.k : s.n, 0.0f, c, s.n);
}
void Onednn(const Gemm& s, const float* a, const float* b, float* c) {
  dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a, s.ta ? s.m : s.k, b,
             s.tb ? s.k : s.n, 0.0f, c, s.n);
}
// Column-major libxsmm: row-major C = A op(B) is column-major C^T = op(B)^T A^T.
void Xsmm(const Gemm& s, const float* a, const float* b, float* c) {
  const char ta = s.tb ? 'T' : 'N', tb = s.ta ? 'T' : 'N';
  const libxsmm_blasint m = s.n, n = s.m, k = s.k, lda = s.tb ? s.k : s.n, ldb = s.ta ? s.m : s.k,
                        ldc = s.n;
  const float alpha = 1.0f, beta = 0.0f;
  libxsmm_sgemm(&ta, &tb, &m, &n, &k, &alpha, b, &lda, a, &ldb, &beta, c, &ldc);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// A whole-word integer in [lo, hi], or -1.
int ParseCount(const char* text, int lo, int hi) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && v >= lo && v <= hi ? static_cast<int>(v) : -1;
}

int main(int argc, char** argv) {
  int threads = 2, rounds = 5;
  std::string shapes = "tiny,small,gpt2";
  const auto usage = [&](const char* why) {
    std::fprintf(stderr,
                 "%s: %s\nusage: %s [--threads 2] [--rounds 5] [--shapes tiny,small,gpt2]\n",
                 argv[0], why, argv[0]);
    return 2;
  };
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return usage((std::string(argv[i]) + " needs a value").c_str());
    if (!std::strcmp(argv[i], "--threads")) {
      if ((threads = ParseCount(argv[i + 1], 1, 1024)) < 0) return usage("--threads: 1 to 1024");
    } else if (!std::strcmp(argv[i], "--rounds")) {
      if ((rounds = ParseCount(argv[i + 1], 1, 1000)) < 0) return usage("--rounds: 1 to 1000");
    } else if (!std::strcmp(argv[i], "--shapes")) {
      shapes = argv[i + 1];
    } else {
      return usage((std::string("unknown argument ") + argv[i]).c_str());
    }
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  BlisSetThreads(threads);
  libxsmm_init();
  const std::map<std::string, std::vector<Gemm>> all = {{"tiny", ModelGemms(8 * 128, 128, 256)},
                                                        {"small", ModelGemms(4 * 256, 384, 50257)},
                                                        {"gpt2", ModelGemms(2 * 256, 768, 50257)}};
  using Fn = std::function<void(const Gemm&, const float*, const float*, float*)>;
  const std::vector<std::pair<const char*, Fn>> libs = {
      {"OpenBLAS", Openblas}, {"BLIS", Blis}, {"oneDNN", Onednn}, {"libxsmm", Xsmm}};
  std::printf("OpenBLAS kernels: %s (OPENBLAS_CORETYPE %s)\n", openblas_get_corename(),
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "unset");
  std::printf("threads %d, %d interleaved rounds, medians; GFLOP/s (2 m n k / time)\n\n", threads,
              rounds);
  std::printf("| shape | GEMM | m x n x k |");
  for (const auto& l : libs) std::printf(" %s |", l.first);
  std::printf(" fastest |\n|---|---|---|");
  for (size_t i = 0; i <= libs.size(); ++i) std::printf("---|");
  std::printf("\n");
  size_t start = 0;
  while (start <= shapes.size()) {
    const size_t comma = std::min(shapes.find(',', start), shapes.size());
    const std::string name = shapes.substr(start, comma - start);
    start = comma + 1;
    const auto found = all.find(name);
    if (found == all.end()) {
      std::fprintf(stderr, "unknown shape set '%s' (tiny, small, gpt2)\n", name.c_str());
      return 2;
    }
    std::vector<double> totals(libs.size(), 0.0);
    for (const Gemm& g : found->second) {
      std::vector<float> a(static_cast<size_t>(g.m) * g.k), b(static_cast<size_t>(g.n) * g.k),
          c(static_cast<size_t>(g.m) * g.n), ref;
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7919) % 97) / 97.0f;
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 104729) % 89) / 89.0f;
      const double flops = 2.0 * g.m * g.n * g.k;
      const int reps = std::max(1, static_cast<int>(2e9 / flops));
      std::vector<std::vector<double>> times(libs.size());
      for (size_t l = 0; l < libs.size(); ++l) {  // warm up, and check every library's answer
        libs[l].second(g, a.data(), b.data(), c.data());
        if (l == 0) {
          ref = c;
        } else {
          double worst = 0;
          for (size_t i = 0; i < c.size(); ++i) {
            worst = std::max(worst, std::abs(double{c[i]} - ref[i]) / (std::abs(ref[i]) + 1));
          }
          if (worst > 1e-4) {
            std::fprintf(stderr, "%s %s: differs from OpenBLAS by %g\n", libs[l].first,
                         g.what.c_str(), worst);
            return 1;
          }
        }
      }
      for (int r = 0; r < rounds; ++r) {
        for (size_t l = 0; l < libs.size(); ++l) {
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < reps; ++i) libs[l].second(g, a.data(), b.data(), c.data());
          times[l].push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
        }
      }
      std::printf("| %s | %s | %d x %d x %d |", name.c_str(), g.what.c_str(), g.m, g.n, g.k);
      size_t best = 0;
      for (size_t l = 0; l < libs.size(); ++l) {
        const double t = Median(times[l]);
        totals[l] += t;
        if (t < Median(times[best])) best = l;
        std::printf(" %.0f |", flops / t / 1e9);
      }
      std::printf(" %s |\n", libs[best].first);
    }
    std::printf("| %s | all of them (ms, one micro-batch) | |", name.c_str());
    for (double t : totals) std::printf(" %.2f |", t * 1e3);
    std::printf(" |\n");
  }
  return 0;
}
