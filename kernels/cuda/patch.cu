// patch.cu: the patch-embedding input on CUDA (kernels/patch.h): uint8 pixels normalized (or
// normalized floats as given) and gathered into patch rows in one pass, in the compute type; and
// the plain patch merge (Swin V2's, forward and backward). Patch merging with its LayerNorm
// (Swin V1's) lives in kernels/cuda/layernorm_register.cu and layernorm_multipass.cu (entry
// points in kernels/cuda/layernorm.cu).
//
// The fast path works on strips. Strip (b, y) is image b's p rows y*p .. y*p + p - 1: p*W*Cin
// contiguous input elements, whose Wp patches are Wp*Cin*p*p contiguous output elements. A block
// copies a strip into shared memory with 16-byte asynchronous copies (cp.async), then each thread
// gathers the elements of one 16-byte output chunk from shared memory and stores it whole, so
// both sides of the permutation are contiguous 16-byte accesses. Blocks loop over strips (one
// wave of blocks, two strip buffers each: the copy of the next strip runs during the gather of
// this one).
//
// uint8 pixels take at most 256 values per channel, so each block first tabulates the normalized
// value of every (channel, pixel) pair in the compute type, with the expression of the
// per-element path (((float)v / 255 - mean) / std, IEEE division, then one rounding): a lookup
// returns exactly the bits the per-element arithmetic would, without two divisions and a
// channel-indexed parameter read per element.
//
// Strips whose rows are not whole 16-byte vectors, output strips that are not, or strips too
// large for shared memory take the per-element kernel: a row of threads per patch striding over
// its Cin*p*p columns (coalesced writes; the reads walk p pixels of Cin channels per patch row).
#include <cuda_pipeline.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/patch.h"
#include "src/base/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;
// Shared memory a block may use without opting in.
constexpr int kDefaultSharedBytes = 48 * 1024;

struct Norm {
  float mean[4], std[4];
};

// Pixel value v of a channel with that mean and std normalized as images_normalize_cpu does: the
// one expression every uint8 path here evaluates (per element, or once per table entry).
__device__ __forceinline__ float normalize_pixel(uint8_t v, float mean, float std) {
  return ((float)v / 255.0f - mean) / std;
}

// Row u = (b, y, x) of patches (B, Hp, Wp, Cin*p*p); column c*p*p + i*p + j is pixel
// (y*p + i, x*p + j), channel c, normalized as images_normalize_cpu does for uint8 input.
template <typename In, typename T>
__global__ void patch_embed_input_kernel(T *__restrict__ patches, const In *__restrict__ input,
                                         Norm norm, int npatch, int H, int W, int Cin, int p) {
  int64_t u64 = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  if (u64 >= npatch) return;
  int u = (int)u64;
  int Hp = H / p, Wp = W / p, pp = p * p, row = Cin * pp;
  int b = u / (Hp * Wp), yx = u - b * (Hp * Wp);
  int y = yx / Wp, x = yx - y * Wp;
  T *dst = patches + (int64_t)u * row;
  const In *src = input + (((int64_t)b * H + (int64_t)y * p) * W + (int64_t)x * p) * Cin;
  for (int col = threadIdx.x; col < row; col += blockDim.x) {
    int c = col / pp, ij = col - c * pp;
    int i = ij / p, j = ij - i * p;
    In v = src[((int64_t)i * W + j) * Cin + c];
    float f;
    if constexpr (sizeof(In) == 1)
      f = normalize_pixel(v, norm.mean[c], norm.std[c]);
    else
      f = (float)v;
    dst[col] = from_float<T>(f);
  }
}

// ---- the strip kernel -------------------------------------------------------------------------
// Output element o of a strip (o = x * Cin*p*p + c*p*p + i*p + j) is its input element
// i*W*Cin + (x*p + j)*Cin + c. Thread t stores the 16-byte chunks g = t, t + threads, ... of V
// elements. The chunk pattern repeats every `period` chunks (lcm(Cin*p*p, V) / V), shifted by
// `shift` input elements (the p*Cin of each patch it spans), and threads is a multiple of period:
// so a thread's V input offsets are fixed, computed once, plus (g / period) * shift.
struct StripPlan {
  int threads;      // 0: the fast path does not serve these shapes
  int strip_elems;  // input elements of a strip: p*W*Cin, a whole number of 16-byte vectors
  int chunks;       // 16-byte output chunks of a strip: Wp*Cin*p*p / V
  int period, shift;
  int table_offset;  // bytes: where the pixel table starts in shared memory
  int shared_bytes;
};

// Input element (within the strip) of output element o of the strip.
__device__ __forceinline__ int strip_source(int o, int W, int Cin, int p) {
  const int pp = p * p, row = Cin * pp;
  const int x = o / row, col = o - x * row;
  const int c = col / pp, ij = col - c * pp;
  const int i = ij / p, j = ij - i * p;
  return i * W * Cin + (x * p + j) * Cin + c;
}

// Strip s's input, copied into shared memory at dst without passing through registers
// (cp.async, one commit group per call), so the copy of the next strip overlaps the gather of
// this one.
template <typename In>
__device__ __forceinline__ void fetch_strip(int4 *dst, const In *input, const StripPlan &sp, int s,
                                            int Hp, int H, int W, int Cin, int p) {
  const int b = s / Hp, y = s - b * Hp;
  const int4 *src =
      reinterpret_cast<const int4 *>(input + ((int64_t)b * H + (int64_t)y * p) * W * Cin);
  const int vectors = sp.strip_elems * (int)sizeof(In) / 16;
  for (int q = threadIdx.x; q < vectors; q += sp.threads)
    __pipeline_memcpy_async(dst + q, src + q, 16);
  __pipeline_commit();
}

template <typename In, typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    patch_embed_strip_kernel(T *__restrict__ patches, const In *__restrict__ input, Norm norm,
                             StripPlan sp, int strips, int Hp, int H, int W, int Cin, int p) {
  constexpr int V = kVec16<T>;
  constexpr bool kPixels = sizeof(In) == 1;
  extern __shared__ int4 shared_i4[];
  const int vectors = sp.strip_elems * (int)sizeof(In) / 16;  // of a strip buffer (two of them)
  T *table = reinterpret_cast<T *>(reinterpret_cast<char *>(shared_i4) + sp.table_offset);
  const int tid = threadIdx.x;
  if (blockIdx.x < strips) fetch_strip(shared_i4, input, sp, blockIdx.x, Hp, H, W, Cin, p);
  if constexpr (kPixels) {
#pragma unroll
    for (int c = 0; c < 4; c++)  // entry c*256 + v; c unrolled, so norm is not indexed at run time
      if (c < Cin)
        for (int v = tid; v < 256; v += sp.threads)
          table[c * 256 + v] =
              from_float<T>(normalize_pixel((uint8_t)v, norm.mean[c], norm.std[c]));
  }
  int offset[V], channel[V];  // channel: the pixel table's row offset, c*256
  const int pp = p * p;
#pragma unroll
  for (int k = 0; k < V; k++) {
    const int o = tid % sp.period * V + k;
    offset[k] = strip_source(o, W, Cin, p);
    channel[k] = (o % (Cin * pp) / pp) << 8;
  }
  const int step = sp.threads / sp.period * sp.shift;
  for (int s = blockIdx.x, it = 0; s < strips; s += gridDim.x, it++) {
    if ((int64_t)s + gridDim.x < strips)
      fetch_strip(shared_i4 + ((it + 1) & 1) * vectors, input, sp, s + gridDim.x, Hp, H, W, Cin, p);
    else
      __pipeline_commit();     // an empty group: strip s is still the one before the newest
    __pipeline_wait_prior(1);  // this thread's copies of strip s have landed
    __syncthreads();           // and everyone's; the table is built
    const In *strip = reinterpret_cast<const In *>(shared_i4 + (it & 1) * vectors);
    int4 *dst = reinterpret_cast<int4 *>(patches + (int64_t)s * sp.chunks * V);
    int base = tid / sp.period * sp.shift;
    for (int g = tid; g < sp.chunks; g += sp.threads, base += step) {
      int4 raw;
      T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
      for (int k = 0; k < V; k++) {
        const In v = strip[base + offset[k]];
        if constexpr (kPixels)
          e[k] = table[channel[k] + v];
        else
          e[k] = from_float<T>((float)v);
      }
      dst[g] = raw;
    }
    __syncthreads();  // strip s is consumed before its buffer takes strip s + 2 * gridDim.x
  }
}

int gcd(int a, int b) {
  while (b) {
    int t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// The strip plan for these shapes and pointers; threads == 0 when the fast path does not serve
// them (rows of strips not whole 16-byte vectors, misaligned bases, a strip too large for the
// default shared memory, a chunk pattern longer than a block).
template <typename In, typename T>
StripPlan strip_plan(const void *patches, const void *input, int H, int W, int Cin, int p) {
  StripPlan sp = {};
  constexpr int V = kVec16<T>;
  const int64_t row_bytes = (int64_t)W * Cin * (int64_t)sizeof(In);  // one image row
  const int64_t strip_bytes = p * row_bytes;
  const int64_t out_elems = (int64_t)(W / p) * Cin * p * p;  // one strip's patches
  const int64_t table_bytes = sizeof(In) == 1 ? 256 * Cin * (int64_t)sizeof(T) : 0;
  const int row = Cin * p * p, period = row / gcd(row, V);
  if (!aligned16(patches) || !aligned16(input) || strip_bytes % 16 || (H * row_bytes) % 16 ||
      out_elems % V || 2 * strip_bytes + table_bytes > kDefaultSharedBytes ||
      period > kThreadsPerBlock)
    return sp;
  sp.threads = kThreadsPerBlock / period * period;
  sp.strip_elems = (int)(strip_bytes / (int64_t)sizeof(In));
  sp.chunks = (int)(out_elems / V);
  sp.period = period;
  sp.shift = period * V / row * p * Cin;
  sp.table_offset = (int)(2 * strip_bytes);  // after the two strip buffers
  sp.shared_bytes = (int)(2 * strip_bytes + table_bytes);
  return sp;
}

// One wave of strip blocks: as many as fit on the device at once, at most one per strip.
template <typename Kernel>
unsigned strip_blocks(Kernel kernel, const StripPlan &sp, int strips) {
  int device = 0, sms = 0, per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, sp.threads,
                                                           (size_t)sp.shared_bytes));
  const int64_t wave = (int64_t)sms * (per_sm > 0 ? per_sm : 1);
  return (unsigned)(strips < wave ? strips : wave);
}

template <typename In, typename T>
void launch_patch_embed(T *patches, const In *input, const Norm &norm, int B, int H, int W, int Cin,
                        int p, cudaStream_t stream) {
  const int Hp = H / p;
  const StripPlan sp = strip_plan<In, T>(patches, input, H, W, Cin, p);
  if (sp.threads) {
    auto kernel = patch_embed_strip_kernel<In, T>;
    const int strips = B * Hp;
    kernel<<<strip_blocks(kernel, sp, strips), sp.threads, sp.shared_bytes, stream>>>(
        patches, input, norm, sp, strips, Hp, H, W, Cin, p);
    return;
  }
  const int64_t npatch = (int64_t)B * Hp * (W / p);
  RowLaunch l = row_launch(npatch, Cin * p * p, kThreadsPerBlock);
  patch_embed_input_kernel<In, T>
      <<<l.grid, l.block, 0, stream>>>(patches, input, norm, (int)npatch, H, W, Cin, p);
}

__global__ void images_normalize_kernel(float *__restrict__ images,
                                        const uint8_t *__restrict__ pixels, Norm norm, int64_t n,
                                        int Cin) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int c = (int)(i % Cin);
  images[i] = normalize_pixel(pixels[i], norm.mean[c], norm.std[c]);
}

// ---- the plain patch merge ----------------------------------------------------------------------
// One thread per VEC consecutive channels (16 bytes of T where C and the bases allow, else one
// element): the forward per vector of a merged row, the backward per vector of a token, so each
// writes every element of its output once. Merged row (b, y, x), segment k = (dy, dx) with
// (dy, dx) = (k & 1, k >> 1) (kernels/patch.h's order) is token (b, 2y + dy, 2x + dx).
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreadsPerBlock)
    patch_merge_forward_kernel(T *__restrict__ merged, const T *__restrict__ tokens, int64_t vecs,
                               int H, int W, int C) {
  const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vecs) return;
  const int H2 = H / 2, W2 = W / 2, C4 = 4 * C;
  const int64_t e = v * VEC, u = e / C4;
  const int col = (int)(e - u * C4), k = col / C, c = col - k * C;
  const int64_t b = u / ((int64_t)H2 * W2);
  const int yx = (int)(u - b * H2 * W2), y = yx / W2, x = yx - y * W2;
  const T *src = tokens + ((b * H + 2 * y + (k & 1)) * W + 2 * x + (k >> 1)) * C + c;
  if constexpr (VEC * sizeof(T) == 16) {
    *reinterpret_cast<int4 *>(merged + e) = *reinterpret_cast<const int4 *>(src);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i++) merged[e + i] = src[i];
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreadsPerBlock)
    patch_merge_backward_kernel(float *__restrict__ dtokens, const T *__restrict__ dmerged,
                                int64_t vecs, int H, int W, int C) {
  const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vecs) return;
  const int H2 = H / 2, W2 = W / 2;
  const int64_t e = v * VEC, t = e / C;
  const int c = (int)(e - t * C);
  const int64_t b = t / ((int64_t)H * W);
  const int yx = (int)(t - b * H * W), y = yx / W, x = yx - y * W;
  float g[VEC];
  if (y < 2 * H2 && x < 2 * W2) {
    const int k = (y & 1) + 2 * (x & 1);
    load_vec<T, VEC>(g, dmerged + ((b * H2 + y / 2) * W2 + x / 2) * 4 * C + k * C + c);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i++) g[i] = 0.0f;  // no merged row reads this token
  }
  store_vec<float, VEC>(dtokens + e, g);
}

template <typename T>
void launch_patch_merge_forward(T *merged, const T *tokens, int B, int H, int W, int C,
                                cudaStream_t stream) {
  const int64_t n = (int64_t)B * (H / 2) * (W / 2) * 4 * C;
  constexpr int V = kVec16<T>;
  if (C % V == 0 && aligned16(merged) && aligned16(tokens))
    patch_merge_forward_kernel<T, V>
        <<<blocks_for(n / V, kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(merged, tokens,
                                                                               n / V, H, W, C);
  else
    patch_merge_forward_kernel<T, 1>
        <<<blocks_for(n, kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(merged, tokens, n, H, W,
                                                                           C);
}

template <typename T>
void launch_patch_merge_backward(float *dtokens, const T *dmerged, int B, int H, int W, int C,
                                 cudaStream_t stream) {
  const int64_t n = (int64_t)B * H * W * C;
  constexpr int V = kVec16<T>;
  if (C % V == 0 && aligned16(dtokens) && aligned16(dmerged))
    patch_merge_backward_kernel<T, V>
        <<<blocks_for(n / V, kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(dtokens, dmerged,
                                                                               n / V, H, W, C);
  else
    patch_merge_backward_kernel<T, 1>
        <<<blocks_for(n, kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(dtokens, dmerged, n, H,
                                                                           W, C);
}

}  // namespace

void patch_merge_forward_cuda(DType dt, void *merged, const void *tokens, int B, int H, int W,
                              int C, cudaStream_t stream) {
  if ((int64_t)B * (H / 2) * (W / 2) * C <= 0) return;
  SWIN_DISPATCH(dt, T,
                launch_patch_merge_forward<T>(static_cast<T *>(merged),
                                              static_cast<const T *>(tokens), B, H, W, C, stream));
  CUDA_CHECK_LAUNCH();
}

void patch_merge_backward_cuda(DType dt, float *dtokens, const void *dmerged, int B, int H, int W,
                               int C, cudaStream_t stream) {
  if ((int64_t)B * H * W * C <= 0) return;
  SWIN_DISPATCH(
      dt, T,
      launch_patch_merge_backward<T>(dtokens, static_cast<const T *>(dmerged), B, H, W, C, stream));
  CUDA_CHECK_LAUNCH();
}

void images_normalize_cuda(float *images, const uint8_t *pixels, int64_t B, int H, int W, int Cin,
                           const float *mean, const float *std, cudaStream_t stream) {
  int64_t n = B * H * W * Cin;
  if (n <= 0) return;
  Norm norm = {};
  for (int c = 0; c < Cin && c < 4; c++) norm.mean[c] = mean[c], norm.std[c] = std[c];
  images_normalize_kernel<<<blocks_for(n, kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(
      images, pixels, norm, n, Cin);
  CUDA_CHECK_LAUNCH();
}

void patch_embed_input_cuda(DType dt, void *patches, const void *input, DType input_dtype,
                            const float *mean, const float *std, int B, int H, int W, int Cin,
                            int p, cudaStream_t stream) {
  int64_t npatch = (int64_t)B * (H / p) * (W / p);
  if (npatch <= 0) return;
  if (npatch > INT_MAX || Cin < 1 || Cin > 4 ||
      (input_dtype != DTYPE_U8 && input_dtype != DTYPE_F32)) {
    fprintf(stderr, "patch_embed_input_cuda: unsupported input (%lld patches, Cin %d, %s)\n",
            (long long)npatch, Cin, dtype_name(input_dtype));
    abort();
  }
  Norm norm = {};
  for (int c = 0; c < Cin; c++) {
    norm.mean[c] = mean ? mean[c] : 0.0f;
    norm.std[c] = std ? std[c] : 1.0f;
  }
  SWIN_DISPATCH(dt, T, {
    T *out = static_cast<T *>(patches);
    if (input_dtype == DTYPE_U8)
      launch_patch_embed<uint8_t, T>(out, static_cast<const uint8_t *>(input), norm, B, H, W, Cin,
                                     p, stream);
    else
      launch_patch_embed<float, T>(out, static_cast<const float *>(input), norm, B, H, W, Cin, p,
                                   stream);
  });
  CUDA_CHECK_LAUNCH();
}
