// The fused-row ids of one pooling group of ctrkit.nn.embedding_joint's lookup in one pass: built by
// ctrkit.nn.kernels and called through ctypes (no torch headers).
#include <cstdint>

// The fused-row ids of one pooling group: ids[i] = values[i] + offsets[k] for the values of key k (counts[k] of them,
// the keys' values one after another), each value checked against [0, sizes[k]) when ``check``. Returns -1, or the
// position of the first value out of range (ids partly written then). Replaces a repeat_interleave of the offsets,
// one of the sizes, two comparisons, an any() and an add, one pass each.
extern "C" int64_t ctrkit_shift_ids(const int64_t* values, const int64_t* counts, const int64_t* offsets,
                                    const int64_t* sizes, int64_t keys, int check, int64_t* ids) {
  int64_t pos = 0;
  for (int64_t k = 0; k < keys; ++k) {
    const int64_t off = offsets[k], size = sizes[k], end = pos + counts[k];
    if (check) {
      bool bad = false;
      for (int64_t i = pos; i < end; ++i) bad |= static_cast<uint64_t>(values[i]) >= static_cast<uint64_t>(size);
      if (bad)
        for (int64_t i = pos; i < end; ++i)
          if (values[i] < 0 || values[i] >= size) return i;
    }
    for (int64_t i = pos; i < end; ++i) ids[i] = values[i] + off;
    pos = end;
  }
  return -1;
}
