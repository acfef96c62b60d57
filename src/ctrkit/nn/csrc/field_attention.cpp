// AutoInt's interacting layer (self-attention over fields) with the samples in SIMD lanes: the attention part of
// ctrkit.nn.field_attention_lanes, forward and backward, on plain float / double arrays (built by
// ctrkit.nn.kernels and called through ctypes: no torch headers, so it compiles in seconds).
//
// Layout ("lane layout"): L samples make one SIMD vector (L = 16 floats, 8 doubles with AVX-512), and the batch is
// padded to nb = ceil(B / L) blocks of L. Every (rows, N) array has N = nb * F * L columns, column
// (block, field, lane) at (blk * F + f) * L + l: one block's F fields of one row are F contiguous vectors. Every
// per-sample product of the layer (the F x F scores, the softmax, the weighted sum and their gradients) is then
// one scalar program run on a vector of L samples: vertical multiply-adds, no transposes, no horizontal sums.
// The vectors are GCC's vector extensions, as wide as the CPU's registers.
//
//   T   (R, N)       [Q; K; V; Res] = W X^T, each block H * d' rows, head h's rows h * d' .. h * d' + d' - 1
//   att (H*d', N)    O = softmax(Q K^T) V per head and sample (the row maximum subtracted before the exp)
//   y   (H*d', N)    ReLU(O + Res) (ReLU and Res optional)
//   a   (H, nb, F, F, L) the softmax weights A[m, k] (query m, key k) of each head and sample, for the backward
//
// Backward, per head and sample, with g = dL/dy masked by the ReLU (= dL/dRes):
//   c_m = g_m . O_m,  dS_mk = A_mk (g_m . V_k - c_m),  dQ = dS K,  dK = dS^T Q,  dV = A^T g
// (the softmax Jacobian through sum_k dA_mk A_mk = dO_m . O_m). Padded lanes (zero inputs, zero gradients) stay
// finite and give zero gradients.
#include <cmath>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "lanes.h"

namespace {

constexpr int kMaxHeadDim = 64;
constexpr int kMaxFields = 256;

using namespace ctrkit_lanes;
typedef int32_t VecI __attribute__((vector_size(CTRKIT_VECTOR_BYTES)));

// Constants that read the same for a vector of lanes and for one scalar lane.
template <typename V, typename T>
inline V splat(T c) {
  V v = {};
  return v + c;
}
template <typename V>
inline V vmax(V a, V b) {
  return a > b ? a : b;
}

// exp(x) for x <= 0 (scores minus their row maximum), float: Cephes' expf reduction (x = n ln2 + r,
// |r| <= ln2 / 2) and polynomial as plain arithmetic on the lanes; relative error ~1e-7. x is clamped to -87 first,
// so no result is subnormal (an FMA on subnormals takes a microcode assist). With AVX-512, vscalefps applies the
// 2^n in one instruction (measured: the forward 8.5 -> 7.8 us per 16 samples and head, F 26, d' 8).
inline VecF exp_nonpositive(VecF x) {
  x = vmax(x, splat<VecF>(-87.0f));
#if defined(__AVX512F__)
  const __m512 n = _mm512_roundscale_ps(x * 1.44269504088896341f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const VecF nv = n;
#else
  VecF nv = x * 1.44269504088896341f;
  nv = (nv + 12582912.0f) - 12582912.0f;  // round to nearest (|n| < 2^22)
#endif
  const VecF r = (x - nv * 0.693359375f) + nv * 2.12194440e-4f;
  VecF p = splat<VecF>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
#if defined(__AVX512F__)
  return _mm512_scalef_ps(p, n);
#else
  const VecI bits = (__builtin_convertvector(nv, VecI) + 127) << 23;  // 2^n, n in [-126, 0]
  VecF scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
#endif
}

inline VecD exp_nonpositive(VecD x) {  // float64 serves the tests (gradcheck): the library's exp per lane
  for (int l = 0; l < Lanes<double>::kCount; ++l) x[l] = std::exp(x[l]);
  return x;
}

struct Shape {
  int64_t n;       // columns nb * F * L
  int64_t blocks;  // nb
  int64_t f;
  int heads, dh, residual, relu;
};

// K and V of one head and block packed field by field, (F, d') vectors each: kp[kk * dh + j], vp[kk * dh + j]
// (the forward and both backward passes read every key and value row F times).
template <typename T>
inline void pack_keys_values(const T* __restrict k, const T* __restrict v, int64_t n, int64_t f, int dh,
                             typename Lanes<T>::V* __restrict kp, typename Lanes<T>::V* __restrict vp) {
  using V = typename Lanes<T>::V;
  constexpr int kL = Lanes<T>::kCount;
  for (int64_t kk = 0; kk < f; ++kk)
    for (int j = 0; j < dh; ++j) {
      kp[kk * dh + j] = load<V>(k + j * n + kk * kL);
      vp[kk * dh + j] = load<V>(v + j * n + kk * kL);
    }
}

// One work item, head h of block blk: the forward. ``buf``: scratch of 2 * F * d' + F vectors. K and V are packed
// into it first: in place, their d' rows lie N floats apart and share a few L1 sets.
template <typename T, int DH>
void forward_block(const Shape& sh, const T* __restrict t, T* __restrict att, T* __restrict y, T* __restrict a,
                   int h, int64_t blk, typename Lanes<T>::V* __restrict buf) {
  using V = typename Lanes<T>::V;
  constexpr int kL = Lanes<T>::kCount;
  const int dh = DH > 0 ? DH : sh.dh;
  const int64_t n = sh.n, f = sh.f, inner = static_cast<int64_t>(sh.heads) * dh, c0 = blk * f * kL;
  const T* q = t + h * dh * n + c0;  // row j: + j * n; field m: + m * kL
  const T* k = q + inner * n;
  const T* v = k + inner * n;
  const T* res = sh.residual ? v + inner * n : nullptr;
  T* ab = a + (h * sh.blocks + blk) * f * f * kL;  // (F, F, L)
  V* kp = buf;                                       // (F, d'): kp[kk * dh + j]
  V* vp = kp + f * dh;
  V* s = vp + f * dh;
  pack_keys_values<T>(k, v, n, f, dh, kp, vp);
  const int64_t out0 = h * dh * n + c0;
  for (int64_t m = 0; m < f; ++m) {
    V qm[DH > 0 ? DH : kMaxHeadDim];
    for (int j = 0; j < dh; ++j) qm[j] = load<V>(q + j * n + m * kL);
    V mx = splat<V>(-std::numeric_limits<T>::infinity());
    for (int64_t kk = 0; kk < f; ++kk) {
      const V* kr = kp + kk * dh;
      V acc = qm[0] * kr[0];
      for (int j = 1; j < dh; ++j) acc += qm[j] * kr[j];
      s[kk] = acc;
      mx = vmax(mx, acc);
    }
    V z = {};
    for (int64_t kk = 0; kk < f; ++kk) {
      s[kk] = exp_nonpositive(s[kk] - mx);
      z += s[kk];
    }
    const V rz = T(1) / z;
    V o[DH > 0 ? DH : kMaxHeadDim];
    for (int j = 0; j < dh; ++j) o[j] = V{};
    T* am = ab + m * f * kL;
    for (int64_t kk = 0; kk < f; ++kk) {
      const V p = s[kk] * rz;
      store(am + kk * kL, p);
      const V* vr = vp + kk * dh;
      for (int j = 0; j < dh; ++j) o[j] += p * vr[j];
    }
    for (int j = 0; j < dh; ++j) {
      const int64_t i = out0 + j * n + m * kL;
      store(att + i, o[j]);
      V val = res ? o[j] + load<V>(res + j * n + m * kL) : o[j];
      if (sh.relu) val = vmax(val, V{});
      store(y + i, val);
    }
  }
}

// One work item: the backward into dt (R, N), the gradient of T's rows, in two passes so that no gradient is
// accumulated in memory: over queries m (dS row by row, dQ_m in registers; dS, g and Q kept packed), then over keys
// k (dK_k = sum_m dS_mk Q_m and dV_k = sum_m A_mk g_m in registers). Read-modify-writes of dK and dV in the first
// pass instead took ~45% of the backward (measured). ``buf``: scratch of 4 * F * d' + F * F vectors.
template <typename T, int DH>
void backward_block(const Shape& sh, const T* __restrict t, const T* __restrict gy, const T* __restrict y,
                    const T* __restrict att, const T* __restrict a, T* __restrict dt, int h, int64_t blk,
                    typename Lanes<T>::V* __restrict buf) {
  using V = typename Lanes<T>::V;
  constexpr int kL = Lanes<T>::kCount;
  const int dh = DH > 0 ? DH : sh.dh;
  const int64_t n = sh.n, f = sh.f, inner = static_cast<int64_t>(sh.heads) * dh, c0 = blk * f * kL;
  const T* q = t + h * dh * n + c0;
  const T* k = q + inner * n;
  const T* v = k + inner * n;
  const T* ab = a + (h * sh.blocks + blk) * f * f * kL;
  T* dq = dt + h * dh * n + c0;
  T* dk = dq + inner * n;
  T* dv = dk + inner * n;
  T* dres = sh.residual ? dv + inner * n : nullptr;
  V* kp = buf;  // (F, d') each: K, V, Q, g packed; then dS (F, F)
  V* vp = kp + f * dh;
  V* qp = vp + f * dh;
  V* gp = qp + f * dh;
  V* dsp = gp + f * dh;
  pack_keys_values<T>(k, v, n, f, dh, kp, vp);
  const int64_t out0 = h * dh * n + c0;
  for (int64_t m = 0; m < f; ++m) {
    V g[DH > 0 ? DH : kMaxHeadDim], dqm[DH > 0 ? DH : kMaxHeadDim];
    V c = {};
    for (int j = 0; j < dh; ++j) {
      const int64_t i = out0 + j * n + m * kL;
      V gg = load<V>(gy + i);
      if (sh.relu) gg = load<V>(y + i) > T(0) ? gg : V{};
      g[j] = gp[m * dh + j] = gg;
      c += gg * load<V>(att + i);
      if (dres) store(dres + j * n + m * kL, gg);
      qp[m * dh + j] = load<V>(q + j * n + m * kL);
      dqm[j] = V{};
    }
    const T* am = ab + m * f * kL;
    for (int64_t kk = 0; kk < f; ++kk) {
      const V* kr = kp + kk * dh;
      const V* vr = vp + kk * dh;
      V da = g[0] * vr[0];
      for (int j = 1; j < dh; ++j) da += g[j] * vr[j];
      const V ds = load<V>(am + kk * kL) * (da - c);
      dsp[m * f + kk] = ds;
      for (int j = 0; j < dh; ++j) dqm[j] += ds * kr[j];
    }
    for (int j = 0; j < dh; ++j) store(dq + j * n + m * kL, dqm[j]);
  }
  for (int64_t kk = 0; kk < f; ++kk) {
    V dkk[DH > 0 ? DH : kMaxHeadDim], dvk[DH > 0 ? DH : kMaxHeadDim];
    for (int j = 0; j < dh; ++j) dkk[j] = dvk[j] = V{};
    for (int64_t m = 0; m < f; ++m) {
      const V ds = dsp[m * f + kk];
      const V am = load<V>(ab + (m * f + kk) * kL);
      const V* qr = qp + m * dh;
      const V* gr = gp + m * dh;
      for (int j = 0; j < dh; ++j) {
        dkk[j] += ds * qr[j];
        dvk[j] += am * gr[j];
      }
    }
    for (int j = 0; j < dh; ++j) {
      store(dk + j * n + kk * kL, dkk[j]);
      store(dv + j * n + kk * kL, dvk[j]);
    }
  }
}

// Work items: (head, block) pairs, each writing its own columns of the outputs and its own softmax weights.
template <typename T, int DH>
void forward_all(const Shape& sh, const T* t, T* att, T* y, T* a, int threads) {
  const int64_t items = sh.blocks * sh.heads;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    std::vector<typename Lanes<T>::V> buf(static_cast<size_t>(2 * sh.f * sh.dh + sh.f));
#pragma omp for schedule(static)
    for (int64_t w = 0; w < items; ++w)
      forward_block<T, DH>(sh, t, att, y, a, static_cast<int>(w / sh.blocks), w % sh.blocks, buf.data());
  }
}

template <typename T, int DH>
void backward_all(const Shape& sh, const T* t, const T* gy, const T* y, const T* att, const T* a, T* dt,
                  int threads) {
  const int64_t items = sh.blocks * sh.heads;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    std::vector<typename Lanes<T>::V> buf(static_cast<size_t>(4 * sh.f * sh.dh + sh.f * sh.f));
#pragma omp for schedule(static)
    for (int64_t w = 0; w < items; ++w)
      backward_block<T, DH>(sh, t, gy, y, att, a, dt, static_cast<int>(w / sh.blocks), w % sh.blocks, buf.data());
  }
}

inline bool supported(const Shape& sh) {
  return sh.dh >= 1 && sh.dh <= kMaxHeadDim && sh.f >= 1 && sh.f <= kMaxFields && sh.heads >= 1 && sh.blocks >= 0;
}

}  // namespace

// Entry points. Every array is C-contiguous in the lane layout above, ``blocks`` = nb. Returns 0, or 1 when the
// shape is outside the kernel's limits (1 <= d' <= 64, 1 <= F <= 256), with nothing written.
#define CTRKIT_FIELD_ATTENTION(SUFFIX, T)                                                                        \
  extern "C" int ctrkit_field_attention_forward_##SUFFIX(const T* t, T* att, T* y, T* a, int64_t blocks, int f, \
                                                         int heads, int dh, int residual, int relu,            \
                                                         int threads) {                                        \
    const Shape sh{blocks * f * Lanes<T>::kCount, blocks, f, heads, dh, residual, relu};                       \
    if (!supported(sh)) return 1;                                                                              \
    switch (dh) {                                                                                              \
      case 4: forward_all<T, 4>(sh, t, att, y, a, threads); break;                                             \
      case 8: forward_all<T, 8>(sh, t, att, y, a, threads); break;                                             \
      case 16: forward_all<T, 16>(sh, t, att, y, a, threads); break;                                           \
      default: forward_all<T, 0>(sh, t, att, y, a, threads);                                                   \
    }                                                                                                          \
    return 0;                                                                                                  \
  }                                                                                                            \
  extern "C" int ctrkit_field_attention_backward_##SUFFIX(const T* t, const T* gy, const T* y, const T* att,   \
                                                          const T* a, T* dt, int64_t blocks, int f, int heads, \
                                                          int dh, int residual, int relu, int threads) {       \
    const Shape sh{blocks * f * Lanes<T>::kCount, blocks, f, heads, dh, residual, relu};                       \
    if (!supported(sh)) return 1;                                                                              \
    switch (dh) {                                                                                              \
      case 4: backward_all<T, 4>(sh, t, gy, y, att, a, dt, threads); break;                                    \
      case 8: backward_all<T, 8>(sh, t, gy, y, att, a, dt, threads); break;                                    \
      case 16: backward_all<T, 16>(sh, t, gy, y, att, a, dt, threads); break;                                  \
      default: backward_all<T, 0>(sh, t, gy, y, att, a, dt, threads);                                          \
    }                                                                                                          \
    return 0;                                                                                                  \
  }

CTRKIT_FIELD_ATTENTION(f32, float)
CTRKIT_FIELD_ATTENTION(f64, double)

// L, the samples per vector (and per block) of the layout: 16 / 8 floats / doubles with AVX-512, 8 / 4 with AVX.
extern "C" int ctrkit_field_attention_lanes(int double_precision) {
  return double_precision ? Lanes<double>::kCount : Lanes<float>::kCount;
}
