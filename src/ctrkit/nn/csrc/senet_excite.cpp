// FiBiNET's SENET field weights (ctrkit.nn.senet.SENET with mean pooling: two bias-free Linear layers, each with a
// ReLU), forward and backward, on the feature-major fields of the shared bilinear node (ctrkit.nn.
// bilinear_pairs_native), the samples in SIMD lanes: per sample, with H = max(1, F // r) hidden units,
//
//   z_f = (1 / D) sum_d v_f,d        h = ReLU(W1 z)  (W1: H x F)        a = ReLU(W2 h)  (W2: F x H)
//
// Backward from da (F, B): ga = da [a > 0], dW2 += ga h^T, gh = (W2^T ga) [h > 0], dW1 += gh z^T,
// dv_f,d += (W1^T gh)_f / D for every d (the sums over samples in per-lane partial sums, reduced once per thread).
// Layout: e (F, D, B), a, da (F, B), h (H, B), rows B apart. Plain arrays, built by ctrkit.nn.kernels and called
// through ctypes (no torch headers).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lanes.h"

namespace {

constexpr int kMaxFields = 64, kMaxHidden = 64, kMaxDim = 64;

using namespace ctrkit_lanes;

template <typename V>
inline V relu(V x) {
  return x > V{} ? x : V{};
}
inline float relu(float x) { return x > 0 ? x : 0; }
inline double relu(double x) { return x > 0 ? x : 0; }
template <typename V>
inline V positive(V x, V y) {  // y where x > 0, else 0
  return x > V{} ? y : V{};
}
inline float positive(float x, float y) { return x > 0 ? y : 0; }
inline double positive(double x, double y) { return x > 0 ? y : 0; }

struct Shape {
  int64_t b;
  int f, d, hidden;
};

// z of the samples at column col (W: a vector of lanes, or one scalar for the batch tail).
template <typename W, typename T>
inline void squeeze(const Shape& sh, const T* __restrict e, int64_t col, W* __restrict z) {
  const T inv = T(1) / T(sh.d);
  for (int f = 0; f < sh.f; ++f) {
    const T* row = e + static_cast<int64_t>(f) * sh.d * sh.b + col;
    W s = load<W>(row);
    for (int c = 1; c < sh.d; ++c) s += load<W>(row + c * sh.b);
    z[f] = s * inv;
  }
}

template <typename W, typename T>
inline void forward_cols(const Shape& sh, const T* __restrict e, const T* __restrict w1, const T* __restrict w2,
                         T* __restrict h, T* __restrict a, int64_t col) {
  W z[kMaxFields], hv[kMaxHidden];
  squeeze<W, T>(sh, e, col, z);
  for (int k = 0; k < sh.hidden; ++k) {
    W s = z[0] * w1[k * sh.f];
    for (int f = 1; f < sh.f; ++f) s += z[f] * w1[k * sh.f + f];
    hv[k] = relu(s);
    store(h + k * sh.b + col, hv[k]);
  }
  for (int f = 0; f < sh.f; ++f) {
    W s = hv[0] * w2[f * sh.hidden];
    for (int k = 1; k < sh.hidden; ++k) s += hv[k] * w2[f * sh.hidden + k];
    store(a + f * sh.b + col, relu(s));
  }
}

// acc1 (H x F) and acc2 (F x H): this thread's per-lane partial sums of dW1 and dW2.
template <typename W, typename T>
inline void backward_cols(const Shape& sh, const T* __restrict e, const T* __restrict w1, const T* __restrict w2,
                          const T* __restrict h, const T* __restrict a, const T* __restrict da, T* __restrict de,
                          W* __restrict acc1, W* __restrict acc2, int64_t col) {
  W z[kMaxFields], ga[kMaxFields], hv[kMaxHidden], gh[kMaxHidden];
  squeeze<W, T>(sh, e, col, z);
  for (int k = 0; k < sh.hidden; ++k) {
    hv[k] = load<W>(h + k * sh.b + col);
    gh[k] = W{};
  }
  for (int f = 0; f < sh.f; ++f) {
    ga[f] = positive(load<W>(a + f * sh.b + col), load<W>(da + f * sh.b + col));
    for (int k = 0; k < sh.hidden; ++k) {
      acc2[f * sh.hidden + k] += ga[f] * hv[k];
      gh[k] += ga[f] * w2[f * sh.hidden + k];
    }
  }
  for (int k = 0; k < sh.hidden; ++k) gh[k] = positive(hv[k], gh[k]);
  const T inv = T(1) / T(sh.d);
  for (int f = 0; f < sh.f; ++f) {
    W dz = W{};
    for (int k = 0; k < sh.hidden; ++k) {
      acc1[k * sh.f + f] += gh[k] * z[f];
      dz += gh[k] * w1[k * sh.f + f];
    }
    const W g = dz * inv;
    T* row = de + static_cast<int64_t>(f) * sh.d * sh.b + col;
    for (int c = 0; c < sh.d; ++c) store(row + c * sh.b, load<W>(row + c * sh.b) + g);
  }
}

inline bool supported(const Shape& sh) {
  return sh.b >= 0 && sh.f >= 1 && sh.f <= kMaxFields && sh.hidden >= 1 && sh.hidden <= kMaxHidden && sh.d >= 1 &&
         sh.d <= kMaxDim;
}

template <typename T>
void forward_all(const Shape& sh, const T* e, const T* w1, const T* w2, T* h, T* a, int threads) {
  using V = typename Lanes<T>::V;
  constexpr int kL = Lanes<T>::kCount;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    int64_t c0, c1;
    thread_columns(sh.b, kL, c0, c1);
    int64_t col = c0;
    for (; col + kL <= c1; col += kL) forward_cols<V, T>(sh, e, w1, w2, h, a, col);
    for (; col < c1; ++col) forward_cols<T, T>(sh, e, w1, w2, h, a, col);
  }
}

template <typename T>
void backward_all(const Shape& sh, const T* e, const T* w1, const T* w2, const T* h, const T* a, const T* da,
                  T* de, T* dw1, T* dw2, int threads) {
  using V = typename Lanes<T>::V;
  constexpr int kL = Lanes<T>::kCount;
  const int64_t n = static_cast<int64_t>(sh.f) * sh.hidden;
  std::memset(dw1, 0, sizeof(T) * n);
  std::memset(dw2, 0, sizeof(T) * n);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    int64_t c0, c1;
    thread_columns(sh.b, kL, c0, c1);
    std::vector<V> acc1(static_cast<size_t>(n)), acc2(static_cast<size_t>(n));
    std::vector<T> tail1(static_cast<size_t>(n)), tail2(static_cast<size_t>(n));
    int64_t col = c0;
    for (; col + kL <= c1; col += kL) backward_cols<V, T>(sh, e, w1, w2, h, a, da, de, acc1.data(), acc2.data(), col);
    for (; col < c1; ++col) backward_cols<T, T>(sh, e, w1, w2, h, a, da, de, tail1.data(), tail2.data(), col);
#pragma omp critical
    for (int64_t r = 0; r < n; ++r) {
      dw1[r] += lane_sum(acc1[r]) + tail1[r];
      dw2[r] += lane_sum(acc2[r]) + tail2[r];
    }
  }
}

}  // namespace

// Entry points. Returns 0, or 1 with nothing written when the shape is outside the kernel's limits (1 <= F <= 64,
// 1 <= H <= 64, 1 <= D <= 64). The backward ADDS the fields' gradient into ``de`` (the bilinear node's, already there).
#define CTRKIT_SENET(SUFFIX, T)                                                                                  \
  extern "C" int ctrkit_senet_forward_##SUFFIX(const T* e, const T* w1, const T* w2, T* h, T* a, int64_t b,     \
                                               int f, int d, int hidden, int threads) {                        \
    const Shape sh{b, f, d, hidden};                                                                           \
    if (!supported(sh)) return 1;                                                                              \
    forward_all<T>(sh, e, w1, w2, h, a, threads);                                                              \
    return 0;                                                                                                  \
  }                                                                                                            \
  extern "C" int ctrkit_senet_backward_##SUFFIX(const T* e, const T* w1, const T* w2, const T* h, const T* a,   \
                                                const T* da, T* de, T* dw1, T* dw2, int64_t b, int f, int d,    \
                                                int hidden, int threads) {                                     \
    const Shape sh{b, f, d, hidden};                                                                           \
    if (!supported(sh)) return 1;                                                                              \
    backward_all<T>(sh, e, w1, w2, h, a, da, de, dw1, dw2, threads);                                           \
    return 0;                                                                                                  \
  }

CTRKIT_SENET(f32, float)
CTRKIT_SENET(f64, double)
