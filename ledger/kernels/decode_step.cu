// ledger's decode-step kernels: everything of a Llama decode step (one token, M = 1) that is not
// a matvec, fused so that a decoder layer is 9 launches (rms, qkv, rope+cache, attention, o,
// add+rms, gate|up, silu*mul, down) instead of ~50 small torch kernels. At 135M parameters the
// step is launch-bound: 30 layers x ~50 kernels of ~2 us each inside a CUDA graph cost more
// than reading the weights (ledger.image.cuda_decode, benchmarks/RESULTS.md session 7).
//
// Every kernel reads the token and the position from device buffers (i64), so a CUDA graph of
// the step replays with no host work. Numerics follow ledger.image.cuda_decode's torch path
// operation for operation (bf16 rounding after each bf16 op, fp32 statistics), so the two agree
// to the last bf16 ulp except for reduction order (tested against each other on a GPU).
//
// Compiled with NVRTC (cupy) for sm_80+; no CUDA headers, bf16 as raw 16-bit patterns (as
// decode_linear.cu).

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

__device__ __forceinline__ float bf(u16 b) { return __uint_as_float(((u32)b) << 16); }

// round to nearest even, as torch's float -> bfloat16 (NaN stays a quiet NaN)
__device__ __forceinline__ u16 tobf(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float rbf(float f) { return bf(tobf(f)); }

// sum over the block (blockDim.x a multiple of 32); every thread gets the total
__device__ float block_sum(float v, float* sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < nw ? sh[l] : 0.f;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (l == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}

__device__ float block_max(float v, float* sh) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < nw ? sh[l] : -__int_as_float(0x7f800000);
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (l == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}

#define RMS_PER_THREAD 8

// RMSNorm of the residual stream x [D] (bf16, updated in place), one block:
//   mode 0: x as it is;  mode 1: x = bf16(x + y) first (the residual add);  mode 2: x = embed[tok]
//   h = bf16(w * (x * rsqrt(mean(x^2) + eps)))   (transformers' LlamaRMSNorm, fp32 statistics)
// D <= RMS_PER_THREAD * blockDim.x. h's elements past D are never written (zero padding for the
// q4b32 matvecs, whose K must be a multiple of 128).
extern "C" __global__ void ledger_rms(u16* x, const u16* y, const u16* embed, const i64* tok, const u16* w,
                                      u16* h, int D, float eps, int mode) {
  __shared__ float sh[32];
  const u16* src = mode == 2 ? embed + tok[0] * (i64)D : x;
  float v[RMS_PER_THREAD];
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < RMS_PER_THREAD; j++) {
    const int i = threadIdx.x + j * blockDim.x;
    float a = 0.f;
    if (i < D) {
      a = bf(src[i]);
      if (mode == 1) a = rbf(a + bf(y[i]));
      if (mode != 0) x[i] = tobf(a);
    }
    v[j] = a;
    acc += a * a;
  }
  const float r = rsqrtf(block_sum(acc, sh) / (float)D + eps);
#pragma unroll
  for (int j = 0; j < RMS_PER_THREAD; j++) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < D) h[i] = tobf(bf(w[i]) * (v[j] * r));
  }
}

// Rotary embedding of q and k of one token and the KV-cache write at position pos:
//   qkv [heads*hd | kvh*hd | kvh*hd] -> q_out [heads*hd] (rotated), kc/vc [kvh, ctx, hd] at pos
//   rot(x)[d] = bf16(bf16(x[d] cos[d]) + bf16(x'[d] sin[d])),  x' = (-x[hd/2:], x[:hd/2])
extern "C" __global__ void ledger_rope_cache(const u16* qkv, const u16* cos, const u16* sin, const i64* pos,
                                             u16* q_out, u16* kc, u16* vc, int heads, int kvh, int hd, int ctx) {
  const i64 p = pos[0];
  const u16* c = cos + p * hd;
  const u16* s = sin + p * hd;
  const int nq = heads * hd, nkv = kvh * hd, half = hd / 2;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nq + 2 * nkv; i += gridDim.x * blockDim.x) {
    if (i < nq + nkv) {
      const int d = i % hd, base = i - d;
      const float xv = bf(qkv[i]);
      const float other = d < half ? -bf(qkv[base + d + half]) : bf(qkv[base + d - half]);
      const u16 r = tobf(rbf(xv * bf(c[d])) + rbf(other * bf(s[d])));
      if (i < nq) {
        q_out[i] = r;
      } else {
        const int hh = (i - nq) / hd;
        kc[((i64)hh * ctx + p) * hd + d] = r;
      }
    } else {
      const int j = i - nq - nkv, hh = j / hd, d = j % hd;
      vc[((i64)hh * ctx + p) * hd + d] = qkv[i];
    }
  }
}

#define ATT_HD_PER_LANE 8  // head_dim <= 256

// Attention of one token over the cache (keys 0..pos), one block per query head, grouped-query
// heads read their kv head (h / (heads / kvh)). fp32 scores and softmax, bf16 output.
// Dynamic shared memory: (ctx + blockDim.x) floats; blockDim.x >= hd, a multiple of hd.
extern "C" __global__ void ledger_attn(const u16* q, const u16* kc, const u16* vc, const i64* pos, u16* out,
                                       int heads, int kvh, int hd, int ctx, float scale) {
  extern __shared__ float S[];
  __shared__ float sh[32];
  float* P = S + ctx;
  const int h = blockIdx.x, g = h / (heads / kvh);
  const int n = (int)pos[0] + 1;
  const u16* K = kc + (i64)g * ctx * hd;
  const u16* V = vc + (i64)g * ctx * hd;
  const u16* qh = q + h * hd;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float qr[ATT_HD_PER_LANE];
#pragma unroll
  for (int j = 0; j < ATT_HD_PER_LANE; j++) {
    const int d = lane + 32 * j;
    qr[j] = d < hd ? bf(qh[d]) : 0.f;
  }
  float mx = -__int_as_float(0x7f800000);
  for (int t = warp; t < n; t += nw) {
    const u16* kt = K + (i64)t * hd;
    float a = 0.f;
#pragma unroll
    for (int j = 0; j < ATT_HD_PER_LANE; j++) {
      const int d = lane + 32 * j;
      if (d < hd) a += qr[j] * bf(kt[d]);
    }
    for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    a *= scale;
    if (lane == 0) S[t] = a;
    mx = fmaxf(mx, a);
  }
  mx = block_max(mx, sh);  // also orders the S writes before the reads below
  float sum = 0.f;
  for (int t = threadIdx.x; t < n; t += blockDim.x) {
    const float e = expf(S[t] - mx);
    S[t] = e;
    sum += e;
  }
  sum = block_sum(sum, sh);
  const int nph = blockDim.x / hd, d = threadIdx.x % hd, ph = threadIdx.x / hd;
  float acc = 0.f;
  if (ph < nph)
    for (int t = ph; t < n; t += nph) acc += S[t] * bf(V[(i64)t * hd + d]);
  P[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < hd) {
    float o = 0.f;
    for (int k = 0; k < nph; k++) o += P[k * hd + threadIdx.x];
    out[h * hd + threadIdx.x] = tobf(o / sum);
  }
}

// The MLP's activation: out[i] = bf16(bf16(silu(g[i])) * u[i]), gu = [g (I) | u (I)].
extern "C" __global__ void ledger_silu_mul(const u16* gu, u16* out, int I) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < I; i += gridDim.x * blockDim.x) {
    const float g = bf(gu[i]);
    out[i] = tobf(rbf(g / (1.f + expf(-g))) * bf(gu[I + i]));
  }
}

// Greedy choice and the step's bookkeeping, one block: t = argmax(logits) (the first index of
// the maximum, NaN counted as the maximum, as torch.argmax), then out[pos + 1] = t, tok = t,
// pos = pos + 1.
extern "C" __global__ void ledger_argmax_step(const u16* logits, int V, i64* out, i64* tok, i64* pos) {
  __shared__ float sv[32];
  __shared__ int si[32];
  float best = -__int_as_float(0x7f800000);
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float v = bf(logits[i]);
    if (v != v) v = __int_as_float(0x7f800000);
    if (v > best || bi == 0x7fffffff) {
      best = v;
      bi = i;
    }
  }
  for (int o = 16; o; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > best || (ov == best && oi < bi)) {
      best = ov;
      bi = oi;
    }
  }
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (l == 0) {
    sv[w] = best;
    si[w] = bi;
  }
  __syncthreads();
  if (w == 0) {
    best = l < nw ? sv[l] : -__int_as_float(0x7f800000);
    bi = l < nw ? si[l] : 0x7fffffff;
    for (int o = 16; o; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) {
        best = ov;
        bi = oi;
      }
    }
    if (l == 0) {
      const i64 p = pos[0];
      out[p + 1] = bi;
      tok[0] = bi;
      pos[0] = p + 1;
    }
  }
}
