// The element-wise part of a cross layer x_{l+1} = x_0 * z_l + x_l (ctrkit.nn.crossnet_native), forward and backward
// each one pass over the (B, N) tensors instead of autograd's separate multiplies and adds with a temporary each.
// Built with -ffp-contract=off: each product and sum rounds as torch's separate ops do, so the results are
// bit-identical to the torch graph (tests/nn/test_crossnet_native.py). Plain C++, no torch headers.
#include <cstdint>

namespace {

template <typename T>
void cross_forward(T* __restrict out, const T* __restrict x0, const T* __restrict z, const T* __restrict x,
                   int64_t n, int threads) {
#pragma omp parallel for simd schedule(static) num_threads(threads) if (threads > 1 && n >= (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = x0[i] * z[i] + x[i];
}

// dz = g * x0; acc, x_0's gradient so far, by mode (the order autograd's engine adds the parts in):
// 0: acc = g * z (the last layer, first in the backward); 1: acc = acc + g * z; 2: acc = (acc + g) + g * z (layer 0
// of several: the identity path x_0 arrives before the product's); 3: acc = g + g * z (a single layer).
template <typename T>
void cross_backward(T* __restrict dz, T* __restrict acc, const T* __restrict g, const T* __restrict x0,
                    const T* __restrict z, int64_t n, int mode, int threads) {
#pragma omp parallel for simd schedule(static) num_threads(threads) if (threads > 1 && n >= (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i];
    dz[i] = gi * x0[i];
    const T p = gi * z[i];
    if (mode == 0) {
      acc[i] = p;
    } else if (mode == 1) {
      acc[i] = acc[i] + p;
    } else if (mode == 2) {
      acc[i] = (acc[i] + gi) + p;
    } else {
      acc[i] = gi + p;
    }
  }
}

}  // namespace

#define CTRKIT_CROSS_LAYER(T, SUFFIX)                                                                          \
  extern "C" void ctrkit_cross_forward_##SUFFIX(T* out, const T* x0, const T* z, const T* x, int64_t n,        \
                                                int threads) {                                              \
    cross_forward<T>(out, x0, z, x, n, threads);                                                             \
  }                                                                                                          \
  extern "C" void ctrkit_cross_backward_##SUFFIX(T* dz, T* acc, const T* g, const T* x0, const T* z, int64_t n, \
                                                 int mode, int threads) {                                     \
    cross_backward<T>(dz, acc, g, x0, z, n, mode, threads);                                                  \
  }
CTRKIT_CROSS_LAYER(float, f32)
CTRKIT_CROSS_LAYER(double, f64)
