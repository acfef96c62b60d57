// The samples-in-SIMD-lanes toolkit shared by ctrkit's native kernels (field_attention.cpp, bilinear_pairs.cpp,
// senet_excite.cpp): L consecutive samples of one row are one vector of GCC's vector extensions, as wide as the
// CPU's registers, so a per-sample formula is one scalar program run on L samples at once. Loads, stores and sums
// read the same for a vector of lanes and for one scalar lane (the batch tail). Header-only, no torch headers;
// ctrkit.nn.kernels hashes this file into every kernel's cache key.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace ctrkit_lanes {

// The vector: the CPU's widest (a 64-byte vector on a CPU without AVX-512 runs through memory: measured 8x slower).
#if defined(__AVX512F__)
#define CTRKIT_VECTOR_BYTES 64
#elif defined(__AVX__)
#define CTRKIT_VECTOR_BYTES 32
#else
#define CTRKIT_VECTOR_BYTES 16
#endif
typedef float VecF __attribute__((vector_size(CTRKIT_VECTOR_BYTES)));
typedef double VecD __attribute__((vector_size(CTRKIT_VECTOR_BYTES)));

template <typename T>
struct Lanes;
template <>
struct Lanes<float> {
  using V = VecF;
  static constexpr int kCount = CTRKIT_VECTOR_BYTES / 4;
};
template <>
struct Lanes<double> {
  using V = VecD;
  static constexpr int kCount = CTRKIT_VECTOR_BYTES / 8;
};

template <typename V, typename T>
inline V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V, typename T>
inline void store(T* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

// The sum of a vector's lanes (a scalar is its own sum).
template <typename T>
inline T lane_sum(T v) {
  return v;
}
inline float lane_sum(VecF v) {
  float s = 0;
  for (int l = 0; l < Lanes<float>::kCount; ++l) s += v[l];
  return s;
}
inline double lane_sum(VecD v) {
  double s = 0;
  for (int l = 0; l < Lanes<double>::kCount; ++l) s += v[l];
  return s;
}

// The columns [c0, c1) of b samples that the calling thread of an OpenMP team takes: whole vectors of `lanes`
// samples, split evenly (one thread outside a parallel region takes them all).
inline void thread_columns(int64_t b, int lanes, int64_t& c0, int64_t& c1) {
  int t = 0, threads = 1;
#if defined(_OPENMP)
  t = omp_get_thread_num();
  threads = omp_get_num_threads();
#endif
  const int64_t vecs = (b + lanes - 1) / lanes, per = (vecs + threads - 1) / threads;
  c0 = std::min(b, t * per * lanes);
  c1 = std::min(b, (t + 1) * per * lanes);
}

}  // namespace ctrkit_lanes
