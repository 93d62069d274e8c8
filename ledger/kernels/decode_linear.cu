// ledger decode-time linear kernels:  y[m, n] = sum_k W[n, k] x[m, k]  (+ s * sum_r B[n, r] t[m, r],
// t = A x), for M <= 8 rows of x ("matvec" at M = 1, small batches up to 8).
//
// Compiled with NVRTC (cupy) for sm_80+; no CUDA headers are included so that the source
// compiles the same way under any NVRTC, with bf16 handled as raw 16-bit patterns.
//
// Why the design looks the way it does
// ------------------------------------
// * Decode is memory bound: every weight byte is read once and used M <= 8 times. The only
//   goal is to keep enough 16-byte loads in flight to saturate HBM, and to spend almost no
//   ALU per weight byte (the 4-bit path would otherwise become issue-bound).
// * The dot products run on the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate):
//   a warp owns 16 output rows x 8 batch columns; the M <= 8 batch fits the n = 8 side of the
//   instruction exactly, so a batch of 8 costs no more instructions than a batch of 1, and
//   the FMA work leaves the ALUs, which then only dequantize.
// * A dot product is invariant under a permutation of k applied to both operands. Each lane
//   therefore loads 16 CONTIGUOUS bytes of a weight row (one 128-bit load) and we simply
//   declare that its elements are the k-slots the mma fragment layout assigns to that lane;
//   the x fragment is loaded with the same permutation. No shuffles, no shared-memory staging.
// * A block of NW warps shares one 16*RT-row tile and splits K across its warps (interleaved
//   64-byte chunks, so that the block streams one contiguous stretch of each row at a time);
//   partial sums are reduced once through shared memory.
// * LoRA: t = A x (r x M) is computed ONCE per launch by the first ceil(r/16) * SLICES blocks
//   of the same grid (A is just another 16-row bf16 tile, split along K into SLICES pieces so
//   that t is ready long before any consumer needs it) and published with per-launch epoch
//   flags; every other block sums the slices in its epilogue. No second launch, no memset, no
//   atomics. Blocks are dispatched in index order in practice, so the producers run first; for
//   guaranteed forward progress a consumer that waits longer than LEDGER_WAIT_NS computes t
//   itself (bit-identical: same code, same slices, same order), so the kernel cannot hang.
// * B (N x r) rows for the block are prefetched with cp.async at kernel start, so the LoRA
//   epilogue costs a few FMAs from shared memory.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define WF_BF16 0
#define WF_INT8 1
#define WF_Q4 2
#define WF_Q4P 3  // q4b32p: q4b32 bytes, each 128-chunk of a row pre-permuted (x16 kernels only)

#ifndef LEDGER_MAXR
#define LEDGER_MAXR 64  // largest LoRA rank supported (must be a multiple of 16)
#endif
#ifndef LEDGER_SLICES
#define LEDGER_SLICES 8  // producer blocks per 16-rank tile of t = A x (split K)
#endif
#ifndef LEDGER_WAIT_NS
#define LEDGER_WAIT_NS 200000ull  // forward-progress guard, never reached in normal runs
#endif

template <int WF> struct Fmt;
// E = weight elements carried by one 16-byte load of one row.
template <> struct Fmt<WF_BF16> { enum { E = 8 }; };
template <> struct Fmt<WF_INT8> { enum { E = 16 }; };
template <> struct Fmt<WF_Q4> { enum { E = 32 }; };
template <> struct Fmt<WF_Q4P> { enum { E = 32 }; };

// Weights are read exactly once: bypass L1 (no_allocate), and ask L2 to fetch the whole
// 256-byte neighbourhood, which turns the block's 64-byte row pieces into full DRAM bursts
// (measured 1-4% faster on an H200; -DLEDGER_NO_L2_256B turns the hint off).
#ifndef LEDGER_NO_L2_256B
#define LEDGER_L2_256B
#endif
__device__ __forceinline__ uint4 ld_weights(const void* p) {
  uint4 v;
#ifdef LEDGER_L2_256B
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
  return v;
}

// x is tiny and re-read by every block: keep it cached.
__device__ __forceinline__ uint4 ld_x(const void* p) { return __ldg((const uint4*)p); }

__device__ __forceinline__ void mma_bf16(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 fma_bf16x2(u32 a, u32 b, u32 c) {
  u32 d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ u16 f32_to_bf16(float f) {
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

__device__ __forceinline__ u32 words(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Turn one 16-byte weight vector (E elements of one row) into E/2 bf16x2 pairs; pair p holds
// the elements that meet x pair p (x elements k0+2p, k0+2p+1).
template <int WF> struct Dequant;

template <> struct Dequant<WF_BF16> {
  __device__ __forceinline__ static void run(const uint4& v, u32, u32 (&p)[4]) {
    p[0] = v.x; p[1] = v.y; p[2] = v.z; p[3] = v.w;
  }
};

// int8, per-row scale applied in the epilogue. Exact: every int8 is a bf16.
// s + 128 is placed in the low mantissa bits of 2^23 (one byte_perm), one FADD removes the bias,
// and a byte_perm keeps the two upper halves (truncation is exact for 8-bit integers).
template <> struct Dequant<WF_INT8> {
  __device__ __forceinline__ static void run(const uint4& v, u32, u32 (&p)[8]) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const u32 u = words(v, w) ^ 0x80808080u;
      float f[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        f[i] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540 + i)) - 8388736.0f;
      p[2 * w] = __byte_perm(__float_as_uint(f[0]), __float_as_uint(f[1]), 0x7632);
      p[2 * w + 1] = __byte_perm(__float_as_uint(f[2]), __float_as_uint(f[3]), 0x7632);
    }
  }
};

// 4-bit "q4b32": blocks of 32 consecutive k of one row share one bf16 scale; value = (q - 8) * s.
// Storage is interleaved so that ONE lop3 yields a bf16x2 pair: in 32-bit word w of a block,
// element 8w+2j sits in bits [4j, 4j+4) and element 8w+2j+1 in bits [16+4j, 16+4j+4).
// 0x4300 | q is the bf16 of 128 + q (exact), an fma subtracts 136 (exact), a second fma applies
// the scale (one rounding, identical to torch's (q - 8) * s rounded to bf16).
template <> struct Dequant<WF_Q4> {
  __device__ __forceinline__ static void run(const uint4& v, u32 s, u32 (&p)[16]) {
    const u32 s2 = (s & 0xFFFFu) | (s << 16);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const u32 q = words(v, w);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const u32 h = ((q >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
        const u32 d = fma_bf16x2(h, 0x3F803F80u, 0xC308C308u);  // (128 + q) * 1 - 136
        p[4 * w + j] = fma_bf16x2(d, s2, 0x80008000u);            // * s (+ -0)
      }
    }
  }
};

// Partial products of one warp for RT tiles of 16 rows, over the K chunks in [c_begin, c_end)
// this warp owns. Lane (g = lane/4, t = lane%4) loads rows g and g+8 of each tile; chunk ch
// covers k in [ch*4E, ch*4E + 4E), this lane's 16 bytes start at k0 = ch*4E + t*E.
// The E/4 mma of one 16-byte vector go to NACC independent accumulators: one chain of
// dependent mma (each ~30+ cycles) per vector would make the 4-bit path latency-bound.
template <int WF, int NW, int U, int RT>
__device__ __forceinline__ void tile_mma(const unsigned char* __restrict__ P, long long row_bytes,
                                         const u16* __restrict__ qscale, int row0, int nrows,
                                         const u16* __restrict__ x, int M, int K, int c_begin,
                                         int c_end, float (&c)[RT][4]) {
  constexpr int E = Fmt<WF>::E;
  constexpr int NACC = E / 4 < 4 ? E / 4 : 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nchunks = c_end;
  const int nblk = K / 32;  // q4 scale blocks per row
  float acc[RT][NACC][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int q = 0; q < NACC; ++q) acc[rt][q][0] = acc[rt][q][1] = acc[rt][q][2] = acc[rt][q][3] = 0.f;

  const unsigned char* prow[RT][2];
  const u16* srow[RT][2];
  bool rok[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + rt * 16 + g + 8 * h;
      rok[rt][h] = row < nrows;
      const int rr = rok[rt][h] ? row : 0;
      prow[rt][h] = P + (long long)rr * row_bytes + t * 16;
      srow[rt][h] = qscale + (long long)rr * nblk + t;
    }
  const bool xok = g < M;  // columns >= M of the mma are padding: zero operands, no loads
  const u16* xrow = x + (long long)(xok ? g : 0) * K + t * E;

  // Software pipeline: the loads of step i+1 are issued before the mma of step i. Without it
  // ptxas interleaves each load group with the mma that consumes it and a warp keeps only one
  // group in flight (seen in the SASS); with it every warp keeps 2*U*RT weight vectors moving.
  uint4 wv[U][RT][2];
  uint4 xv[U][E / 8];
  u32 sc[U][RT][2];
  auto load_step = [&](int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool ok = base + u * NW < nchunks;
      // Addresses are clamped in range as well as predicated: the compiler may speculate a
      // load it considers side-effect free.
      const int ch = ok ? base + u * NW : 0;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wv[u][rt][h] = (ok && rok[rt][h]) ? ld_weights(prow[rt][h] + (long long)ch * 64)
                                            : make_uint4(0u, 0u, 0u, 0u);
          if (WF == WF_Q4) sc[u][rt][h] = (ok && rok[rt][h]) ? (u32)__ldg(srow[rt][h] + ch * 4) : 0u;
          else sc[u][rt][h] = 0u;
        }
#pragma unroll
      for (int j = 0; j < E / 8; ++j)
        xv[u][j] = (ok && xok) ? ld_x(xrow + (long long)ch * 4 * E + j * 8) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  load_step(c_begin + warp);
  for (int base = c_begin + warp; base < nchunks; base += NW * U) {
    uint4 cw[U][RT][2];
    uint4 cx[U][E / 8];
    u32 cs[U][RT][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) { cw[u][rt][0] = wv[u][rt][0]; cw[u][rt][1] = wv[u][rt][1]; cs[u][rt][0] = sc[u][rt][0]; cs[u][rt][1] = sc[u][rt][1]; }
#pragma unroll
      for (int j = 0; j < E / 8; ++j) cx[u][j] = xv[u][j];
    }
    if (base + NW * U < nchunks) load_step(base + NW * U);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      u32 xp[E / 2];
#pragma unroll
      for (int j = 0; j < E / 8; ++j) {
        xp[4 * j] = cx[u][j].x; xp[4 * j + 1] = cx[u][j].y;
        xp[4 * j + 2] = cx[u][j].z; xp[4 * j + 3] = cx[u][j].w;
      }
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        u32 a0[E / 2], a1[E / 2];
        Dequant<WF>::run(cw[u][rt][0], cs[u][rt][0], a0);
        Dequant<WF>::run(cw[u][rt][1], cs[u][rt][1], a1);
#pragma unroll
        for (int j = 0; j < E / 4; ++j)
          mma_bf16(acc[rt][j % NACC], a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1], xp[2 * j],
                   xp[2 * j + 1]);
      }
    }
  }
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = acc[rt][0][i];
#pragma unroll
      for (int q = 1; q < NACC; ++q) v += acc[rt][q][i];
      c[rt][i] = v;
    }
}

// Sum the NW warps' fragments. red: NW*RT*128 floats; out: RT*128 floats laid out [col][row]
// (col = batch column, row within the block's 16*RT rows) so that output stores coalesce.
template <int NW, int RT>
__device__ __forceinline__ void block_reduce(const float (&c)[RT][4], float* red, float* out) {
  constexpr int ROWS = 16 * RT;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  float* r = red + warp * (ROWS * 8);
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const int row = rt * 16 + g;
    r[(2 * t) * ROWS + row] = c[rt][0];
    r[(2 * t + 1) * ROWS + row] = c[rt][1];
    r[(2 * t) * ROWS + row + 8] = c[rt][2];
    r[(2 * t + 1) * ROWS + row + 8] = c[rt][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < ROWS * 8; i += NW * 32) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) s += red[w * (ROWS * 8) + i];
    out[i] = s;
  }
  __syncthreads();
}

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(u32* p, u32 v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u64 global_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ void cp_async16_w(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
#ifdef LEDGER_L2_256B
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
#endif
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Shared-memory ring for tile_mma_async: per warp, per stage, per (tile, row half, unroll) one
// 16-byte weight vector per lane (+ one 32-bit word holding the lane's q4 scale).
template <int WF, int NW, int U, int RT, int S> struct Ring {
  uint4 w[S > 0 ? NW * S * RT * 2 * U * 32 : 1];
  u32 sc[(S > 0 && WF == WF_Q4) ? NW * S * RT * 2 * U * 32 : 1];
};

// Same contract as tile_mma, but the weights (and q4 scales) travel through an S-stage
// cp.async ring in shared memory instead of registers: S-1 steps of every warp are in flight
// while it computes one, at no register cost. Each lane reads back only the bytes it copied
// itself, so cp.async.wait_group is the only synchronisation needed (no barriers).
// x fragments stay on the register double-buffer (x is L2-resident and small).
template <int WF, int NW, int U, int RT, int S>
__device__ __forceinline__ void tile_mma_async(Ring<WF, NW, U, RT, S>& ring, const unsigned char* __restrict__ P,
                                               long long row_bytes, const u16* __restrict__ qscale, int row0,
                                               int nrows, const u16* __restrict__ x, int M, int K,
                                               float (&c)[RT][4]) {
  constexpr int E = Fmt<WF>::E;
  constexpr int NACC = E / 4 < 4 ? E / 4 : 4;
  constexpr int SLOT = RT * 2 * U * 32;  // uint4 per warp per stage
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nchunks = K / (4 * E);
  const int nblk = K / 32;
  const int nsteps = warp < nchunks ? (nchunks - warp + NW * U - 1) / (NW * U) : 0;
  float acc[RT][NACC][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int q = 0; q < NACC; ++q) acc[rt][q][0] = acc[rt][q][1] = acc[rt][q][2] = acc[rt][q][3] = 0.f;

  const unsigned char* prow[RT][2];
  const u16* srow[RT][2];
  bool rok[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + rt * 16 + g + 8 * h;
      rok[rt][h] = row < nrows;
      const int rr = rok[rt][h] ? row : 0;
      prow[rt][h] = P + (long long)rr * row_bytes + t * 16;
      srow[rt][h] = qscale + (long long)rr * nblk + (t & ~1);  // 4-byte aligned pair holding ours
    }
  const bool xok = g < M;
  const u16* xrow = x + (long long)(xok ? g : 0) * K + t * E;
  uint4* wbase = ring.w + warp * S * SLOT + lane;
  u32* sbase = ring.sc + ((WF == WF_Q4) ? warp * S * SLOT + lane : 0);

  auto issue = [&](int step) {  // cp.async one step into its slot (zero-filled past the end)
    const int slot = step % S;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch0 = warp + (step * U + u) * NW;
      const bool ok = step < nsteps && ch0 < nchunks;
      const int ch = ok ? ch0 : 0;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int idx = slot * SLOT + ((rt * 2 + h) * U + u) * 32;
          const bool on = ok && rok[rt][h];
          cp_async16_w(wbase + idx, prow[rt][h] + (long long)ch * 64, on ? 16 : 0);
          if (WF == WF_Q4) cp_async4(sbase + idx, srow[rt][h] + ch * 4, on ? 4 : 0);
        }
    }
  };
  uint4 xv[U][E / 8];
  auto load_x = [&](int step) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int ch0 = warp + (step * U + u) * NW;
      const bool ok = step < nsteps && ch0 < nchunks && xok;
      const int ch = ok ? ch0 : 0;
#pragma unroll
      for (int j = 0; j < E / 8; ++j)
        xv[u][j] = ok ? ld_x(xrow + (long long)ch * 4 * E + j * 8) : make_uint4(0u, 0u, 0u, 0u);
    }
  };

#pragma unroll
  for (int st = 0; st < S - 1; ++st) {
    issue(st);
    cp_async_commit();
  }
  load_x(0);
  for (int step = 0; step < nsteps; ++step) {
    issue(step + S - 1);  // the slot consumed in the previous iteration
    cp_async_commit();
    uint4 cx[U][E / 8];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < E / 8; ++j) cx[u][j] = xv[u][j];
    load_x(step + 1);
    cp_async_wait<S - 1>();  // this step's group has landed (groups complete in order)
    const int slot = step % S;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      u32 xp[E / 2];
#pragma unroll
      for (int j = 0; j < E / 8; ++j) {
        xp[4 * j] = cx[u][j].x; xp[4 * j + 1] = cx[u][j].y;
        xp[4 * j + 2] = cx[u][j].z; xp[4 * j + 3] = cx[u][j].w;
      }
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const int i0 = slot * SLOT + ((rt * 2 + 0) * U + u) * 32;
        const int i1 = slot * SLOT + ((rt * 2 + 1) * U + u) * 32;
        const uint4 w0 = wbase[i0], w1 = wbase[i1];
        u32 s0 = 0, s1 = 0;
        if (WF == WF_Q4) {  // our bf16 scale is the low or high half of the aligned pair
          s0 = (t & 1) ? (sbase[i0] >> 16) : (sbase[i0] & 0xFFFFu);
          s1 = (t & 1) ? (sbase[i1] >> 16) : (sbase[i1] & 0xFFFFu);
        }
        u32 a0[E / 2], a1[E / 2];
        Dequant<WF>::run(w0, s0, a0);
        Dequant<WF>::run(w1, s1, a1);
#pragma unroll
        for (int j = 0; j < E / 4; ++j)
          mma_bf16(acc[rt][j % NACC], a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1], xp[2 * j],
                   xp[2 * j + 1]);
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = acc[rt][0][i];
#pragma unroll
      for (int q = 1; q < NACC; ++q) v += acc[rt][q][i];
      c[rt][i] = v;
    }
}

// Slice p (of LEDGER_SLICES, split along K) of t tile `a` (ranks 16a .. 16a+15) of t = A x:
// fp32 partial sums, [col][rank] (stride MAXR). mode 0: store to global dst; 1: dst (shared) =
// partial; 2: dst (shared) += partial. Summing the slices in order p = 0, 1, ... gives the same
// bits on the producer path and the forward-progress path.
template <int NW>
__device__ __forceinline__ void lora_t_slice(const u16* __restrict__ A, int r, int a, int p,
                                             const u16* __restrict__ x, int M, int K, float* red,
                                             float* sums, float* dst, int mode) {
  const int nch = K / 32;  // bf16 chunks of A rows
  float c[1][4];
  tile_mma<WF_BF16, NW, 1, 1>((const unsigned char*)A, 2ll * K, nullptr, 16 * a, r, x, M, K,
                              (int)((long long)nch * p / LEDGER_SLICES),
                              (int)((long long)nch * (p + 1) / LEDGER_SLICES), c);
  block_reduce<NW, 1>(c, red, sums);
  for (int i = threadIdx.x; i < 128; i += NW * 32) {
    const int col = i >> 4, rank = 16 * a + (i & 15);
    if (col < M && rank < r) {
      float* d = dst + col * LEDGER_MAXR + rank;
      if (mode == 0) __stcg(d, sums[i]);
      else if (mode == 1) *d = sums[i];
      else *d += sums[i];
    }
  }
  __syncthreads();
}

// One kernel for every weight format, with or without the fused LoRA term.
//   W       : N rows; bf16 [N][K] / int8 [N][K] / q4b32 packed [N][K/2] bytes
//   wscale  : int8: fp32 [N]; q4b32: bf16 [N][K/32]; bf16: unused
//   x, y    : bf16 [M][K], [M][N]
//   A, Bm   : LoRA bf16 [r][K], [N][r]; lora_scale = alpha / r; r % 8 == 0, r <= MAXR
//   tbuf    : fp32 [SLICES][8][MAXR] scratch; flags: u32 [MAXR/16 * SLICES];
//   epoch   : a new value every launch (flags start at 0)
//   lora_mode: 0 normal, 1 consumers ignore the producers (tests the fallback path)
// S = 0: weights travel through a register double-buffer (tile_mma); S >= 2: through an
// S-stage cp.async ring in shared memory (tile_mma_async).
// Launch bounds ask for at least 512 threads per SM: registers are capped at 128 so that
// >= 16 warps stream per SM.
template <int WF, int NW, int U, int RT, bool LORA, int S>
__global__ void __launch_bounds__(NW * 32, 512 / (NW * 32))
    decode_linear(const unsigned char* __restrict__ W, const void* __restrict__ wscale,
                  const u16* __restrict__ x, u16* __restrict__ y, int M, int N, int K,
                  const u16* __restrict__ A, const u16* __restrict__ Bm, float lora_scale, int r,
                  float* __restrict__ tbuf, u32* __restrict__ flags, u32 epoch, int lora_mode) {
  constexpr int ROWS = 16 * RT;
  __shared__ float red[NW * ROWS * 8];
  __shared__ float sums[ROWS * 8];
  __shared__ float tsm[LORA ? 8 * LEDGER_MAXR : 1];
  __shared__ float tsums[LORA ? 128 : 1];
  __shared__ __align__(16) u16 bsm[LORA ? ROWS * LEDGER_MAXR : 8];
  __shared__ int t_ready;
  __shared__ Ring<WF, NW, U, RT, S> ring;

  const long long row_bytes = WF == WF_Q4 ? (long long)K / 2 : WF == WF_INT8 ? (long long)K : 2ll * K;
  int tile = blockIdx.x;
  const int nA = LORA ? (r + 15) / 16 : 0;
  const int nprod = nA * LEDGER_SLICES;

  if (LORA && tile < nprod) {  // producer: one K slice of one 16-rank tile of t = A x
    const int a = tile / LEDGER_SLICES, p = tile % LEDGER_SLICES;
    lora_t_slice<NW>(A, r, a, p, x, M, K, red, tsums, tbuf + p * 8 * LEDGER_MAXR, 0);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) st_release(flags + tile, epoch);
    return;
  }
  tile -= nprod;
  const int row0 = tile * ROWS;

  if (LORA) {  // prefetch this block's B rows (zero-filled past N) while the weights stream
    const int cpr = r / 8;  // 16-byte pieces per B row
    for (int i = threadIdx.x; i < ROWS * cpr; i += NW * 32) {
      const int row = i / cpr, piece = i % cpr, n = row0 + row;
      cp_async16(bsm + row * LEDGER_MAXR + piece * 8, Bm + (long long)(n < N ? n : 0) * r + piece * 8,
                 n < N ? 16 : 0);
    }
  }

  float c[RT][4];
  if constexpr (S > 0)
    tile_mma_async<WF, NW, U, RT, S>(ring, W, row_bytes, (const u16*)wscale, row0, N, x, M, K, c);
  else
    tile_mma<WF, NW, U, RT>(W, row_bytes, (const u16*)wscale, row0, N, x, M, K, 0, K / (4 * Fmt<WF>::E), c);
  block_reduce<NW, RT>(c, red, sums);

  // t is fetched here, after the weight stream. Fetching it mid-stream in warp 0 instead (to
  // take its two L2 round trips out of the tail) was measured slower on an H200 (session 6:
  // 39.23 vs 38.80 us at 8192^2, 37.25 vs 35.68 us at 14336x4096): warp 0's stall delays its
  // share of the stream by more than the tail gains.
  if (LORA) {
    if (threadIdx.x < 32) {  // lane i polls producer i (nprod <= 32), in parallel
      int ok = lora_mode == 0;
      if (ok && threadIdx.x < nprod) {
        const u64 t0 = global_ns();
        while (ld_acquire(flags + threadIdx.x) != epoch) {
          if (global_ns() - t0 > LEDGER_WAIT_NS) { ok = 0; break; }
          __nanosleep(64);
        }
      }
      ok = __all_sync(0xffffffffu, ok);
      if (threadIdx.x == 0) t_ready = ok;
    }
    __syncthreads();
    if (t_ready) {  // t = sum of the slices, in slice order
      for (int i = threadIdx.x; i < 8 * LEDGER_MAXR; i += NW * 32) {
        const int col = i / LEDGER_MAXR, rank = i % LEDGER_MAXR;
        if (col < M && rank < r) {
          float v = __ldcg(tbuf + i);
          for (int p = 1; p < LEDGER_SLICES; ++p) v += __ldcg(tbuf + p * 8 * LEDGER_MAXR + i);
          tsm[i] = v;
        }
      }
    } else {  // forward-progress path: compute t here (same code, same order, same bits)
      for (int a = 0; a < nA; ++a)
        for (int p = 0; p < LEDGER_SLICES; ++p)
          lora_t_slice<NW>(A, r, a, p, x, M, K, red, tsums, tsm, p == 0 ? 1 : 2);
    }
    cp_async_wait_all();
    __syncthreads();
  }

  for (int i = threadIdx.x; i < ROWS * 8; i += NW * 32) {
    const int col = i / ROWS, row = i % ROWS, n = row0 + row;
    if (col >= M || n >= N) continue;
    float v = sums[i];
    if (WF == WF_INT8) v *= ((const float*)wscale)[n];
    if (LORA) {
      float l = 0.f;
      const u16* b = bsm + row * LEDGER_MAXR;
      const float* tt = tsm + col * LEDGER_MAXR;
      for (int k = 0; k < r; ++k) l = fmaf(bf16_to_f32(b[k]), tt[k], l);
      v = fmaf(lora_scale, l, v);
    }
    y[(long long)col * N + n] = f32_to_bf16(v);
  }
}

// ---------------------------------------------------------------------------------------------
// int8 weights through fp16 tensor cores ("x16"): y = s[n] * sum_k q[n, k] x[m, k].
//
// Why: the bf16 int8 path spends ~11 ALU instructions per 4 weights (4 byte_perm into the
// mantissa of 2^23, 4 FADD, 2 byte_perm, 1 XOR) because bf16's 8-bit significand cannot hold
// q + 128 in one OR; in the SASS of the bf16 kernel that is ~45 of the ~79 instructions per
// 16-byte weight vector, and the kernel streams at 65 % of copy. fp16 holds 1024 + u (u = q + 128,
// 0..255) exactly, and one byte_perm builds two such halves: per 4 weights one XOR, two PRMT and
// two HADD2 (subtract 1152), all exact. The price is x in fp16: each block stages x once in
// shared memory, scaled by a power of two 2^-p chosen from max|x| so that the largest element
// lands in [2^14, 2^15) (no overflow; bf16's 8 significant bits are exact in fp16's 11 down to
// 2^-14, i.e. 2^-28 of max|x|, below which an element loses bits it cannot affect at fp32
// accumulation). y is scaled back by 2^p (exact). Products are exact, accumulation is fp32.
// The weight loads of the first step are issued before x is staged, so that DRAM latency and
// the staging overlap. The register pipeline is written ping-pong (two named buffers, loop
// unrolled by two) so that no register copies are needed between steps.
// Requirement: M * (K + XPAD) <= LEDGER_XS_MAX fp16 elements (M = 1 up to K = 16384).
#ifndef LEDGER_XS_MAX
#define LEDGER_XS_MAX 16448
#endif
#define LEDGER_XPAD 8  // fp16 elements of padding per staged x row (bank spread for M > 1)

__device__ __forceinline__ void mma_f16(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 add_f16x2(u32 a, u32 b) {
  u32 d;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ u32 f32x2_to_f16x2(float lo, float hi) {
  u32 d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));  // hi -> upper half
  return d;
}

// As ld_weights, but volatile: the first step's loads must be issued before x is staged.
__device__ __forceinline__ uint4 ld_weights_first(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// 16 int8 -> 8 fp16x2 pairs, pair p = elements (2p, 2p+1) of the vector; exact.
__device__ __forceinline__ void dequant_i8_f16(const uint4& v, u32 (&p)[8]) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const u32 u = words(v, w) ^ 0x80808080u;                                   // q + 128
    p[2 * w] = add_f16x2(__byte_perm(u, 0x64646464u, 0x4140), 0xE480E480u);     // (1024 + u) - 1152
    p[2 * w + 1] = add_f16x2(__byte_perm(u, 0x64646464u, 0x4342), 0xE480E480u);
  }
}

// 32 q4b32 weights (one scale block of one row) -> 16 fp16x2 pairs, pair p = elements (2p, 2p+1).
// The interleave of formats.py puts pair i of word w at nibble i of each 16-bit half: i = 0 and
// 2 (after >> 8) sit in bits [0, 4) -> 1024 + q, i = 1 and 3 in bits [4, 8) -> 1024 + 16 q; one
// HADD2 (- 1032) or HFMA2 (* 1/16 - 72) gives q - 8 exactly, one HMUL2 applies the scale (one
// rounding, to fp16's 11 bits). Per word: 1 shift, 4 lop3, 4 exact fp16 ops, 4 HMUL2 -- the bf16
// path needs 3 shifts, 4 lop3 and 8 bf16 FMAs, and ptxas spends ~136 instructions per 16-byte
// vector on it in all.
__device__ __forceinline__ u32 lop3_or_and(u32 a, u32 mask, u32 orv) {  // (a & mask) | orv
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(orv));
  return d;
}
__device__ __forceinline__ u32 mul_f16x2(u32 a, u32 b) {
  u32 d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ u32 fma_f16x2(u32 a, u32 b, u32 c) {
  u32 d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
// SCALE = false: q - 8 only (q4b32p applies its scales in fp32 after the mma).
template <bool SCALE = true>
__device__ __forceinline__ void dequant_q4_f16(const uint4& v, u32 s2, u32 (&p)[16]) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const u32 q = words(v, w), q8 = q >> 8;
    p[4 * w + 0] = add_f16x2(lop3_or_and(q, 0x000F000Fu, 0x64006400u), 0xE408E408u);
    p[4 * w + 1] = fma_f16x2(lop3_or_and(q, 0x00F000F0u, 0x64006400u), 0x2C002C00u, 0xD480D480u);
    p[4 * w + 2] = add_f16x2(lop3_or_and(q8, 0x000F000Fu, 0x64006400u), 0xE408E408u);
    p[4 * w + 3] = fma_f16x2(lop3_or_and(q8, 0x00F000F0u, 0x64006400u), 0x2C002C00u, 0xD480D480u);
    if (SCALE) {
#pragma unroll
      for (int i = 0; i < 4; ++i) p[4 * w + i] = mul_f16x2(p[4 * w + i], s2);
    }
  }
}

// bf16 scale bits -> fp16x2 (both halves), exact for scales in [2^-14, 65504]
__device__ __forceinline__ u32 scale_f16x2(u32 sbits) {
  const float f = __uint_as_float(sbits << 16);
  return f32x2_to_f16x2(f, f);
}

// FULL: every row of the block's tile is < N and every warp has the same, even number of steps
// (nchunks % (2 NW U) == 0), so no load needs a predicate (the blocks of a decode-shaped layer
// all take this path; the last tile of an odd N and odd K splits take the general one).
template <int WF, int NW, int U, int RT, bool FULL>
__device__ __forceinline__ void x16_body(const unsigned char* __restrict__ W, const void* __restrict__ wscale,
                                         const u16* __restrict__ x, u16* __restrict__ y, int M, int N, int K,
                                         float* red, float* sums, u16* xs, u32* wmax) {
  constexpr int E = Fmt<WF>::E;   // weights per 16-byte vector
  constexpr int ROWS = 16 * RT;
  constexpr int NACC = 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * ROWS;
  const int nchunks = K / (4 * E);
  const int XR = K + LEDGER_XPAD;  // staged row stride (fp16 elements)
  constexpr bool Q4 = WF == WF_Q4 || WF == WF_Q4P;
  const long long row_bytes = Q4 ? (long long)K / 2 : (long long)K;
  const int nblk = K / 32;  // q4 scale blocks per row

  const unsigned char* prow[RT][2];
  const u16* srow[RT][2];
  bool rok[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + rt * 16 + g + 8 * h;
      rok[rt][h] = FULL || row < N;
      const int rr = rok[rt][h] ? row : 0;
      prow[rt][h] = W + (long long)rr * row_bytes + t * 16;
      // q4b32: this lane's block of the chunk; q4b32p: all four blocks of the chunk (8 bytes)
      srow[rt][h] = (const u16*)wscale + (long long)rr * nblk + (WF == WF_Q4P ? 0 : t);
    }
  const bool xok = g < M;
  const int xoff = (xok ? g : 0) * XR + t * E;

  uint4 wa[U][RT][2], wb[U][RT][2];
  uint2 sa[U][RT][2], sb[U][RT][2];
  auto load = [&](uint4 (&wv)[U][RT][2], uint2 (&sc)[U][RT][2], int base, bool first) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool ok = FULL || base + u * NW < nchunks;
      const int ch = ok ? base + u * NW : 0;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const void* p = prow[rt][h] + (long long)ch * 64;
          const bool on = ok && rok[rt][h];
          wv[u][rt][h] = on ? (first ? ld_weights_first(p) : ld_weights(p)) : make_uint4(0u, 0u, 0u, 0u);
          if (WF == WF_Q4P) sc[u][rt][h] = on ? __ldg((const uint2*)(srow[rt][h] + ch * 4)) : make_uint2(0u, 0u);
          else if (WF == WF_Q4) sc[u][rt][h] = make_uint2(on ? (u32)__ldg(srow[rt][h] + ch * 4) : 0u, 0u);
          else sc[u][rt][h] = make_uint2(0u, 0u);
        }
    }
  };
  // One step in flight while x is staged. Issuing the second buffer's loads before the staging
  // too was measured 1-5 % slower at every shape on an H200 (session 6, second run).
  constexpr int STEP = NW * U;
  load(wa, sa, warp, true);

  // Stage x: max|x| (as bf16 magnitude bits), then x * 2^-p as fp16 into xs[m * XR + k].
  const int nvec = M * K / 8;
  u32 mx = 0;
  for (int i = threadIdx.x; i < nvec; i += NW * 32) {
    const uint4 v = __ldg((const uint4*)x + i);
    mx = __vmaxu2(mx, __vmaxu2(__vmaxu2(v.x & 0x7FFF7FFFu, v.y & 0x7FFF7FFFu),
                               __vmaxu2(v.z & 0x7FFF7FFFu, v.w & 0x7FFF7FFFu)));
  }
  mx = __vmaxu2(mx, mx >> 16) & 0xFFFFu;
  mx = __reduce_max_sync(0xffffffffu, mx);
  if (lane == 0) wmax[warp] = mx;
  __syncthreads();
  mx = 0;
#pragma unroll
  for (int w = 0; w < NW; ++w) mx = max(mx, wmax[w]);
  int p = (int)(mx >> 7) - 141;  // bf16 exponent field e: max|x| < 2^(e-126); scaled into [2^14, 2^15)
  p = p < -126 ? -126 : (p > 114 ? 114 : p);  // 2^-p and 2^p stay normal fp32
  const float inscale = __int_as_float((127 - p) << 23);
  const float outscale = __int_as_float((127 + p) << 23);
  const int kv = K / 8;
  for (int i = threadIdx.x; i < nvec; i += NW * 32) {
    const uint4 v = __ldg((const uint4*)x + i);
    const int m = i / kv, k8 = (i - m * kv) * 8;
    uint4 o;
    o.x = f32x2_to_f16x2(__uint_as_float(v.x << 16) * inscale, __uint_as_float(v.x & 0xFFFF0000u) * inscale);
    o.y = f32x2_to_f16x2(__uint_as_float(v.y << 16) * inscale, __uint_as_float(v.y & 0xFFFF0000u) * inscale);
    o.z = f32x2_to_f16x2(__uint_as_float(v.z << 16) * inscale, __uint_as_float(v.z & 0xFFFF0000u) * inscale);
    o.w = f32x2_to_f16x2(__uint_as_float(v.w << 16) * inscale, __uint_as_float(v.w & 0xFFFF0000u) * inscale);
    *(uint4*)(xs + m * XR + k8) = o;
  }
  __syncthreads();

  float acc[RT][NACC][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int q = 0; q < NACC; ++q) acc[rt][q][0] = acc[rt][q][1] = acc[rt][q][2] = acc[rt][q][3] = 0.f;

  auto compute = [&](const uint4 (&wv)[U][RT][2], const uint2 (&sc)[U][RT][2], int base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool ok = FULL || base + u * NW < nchunks;
      const int ch = ok ? base + u * NW : 0;
      u32 xp[E / 2];
      const bool xon = ok && xok;
#pragma unroll
      for (int j = 0; j < E / 8; ++j) {
        if constexpr (WF == WF_Q4P) {  // mma 2j: k = 32j + 4t + 0..3; mma 2j+1: k = 32j + 16 + 4t + 0..3
          const u16* xq = xs + (xoff - t * E) + ch * 4 * E + 32 * j + 4 * t;
          const uint2 lo = xon ? *(const uint2*)xq : make_uint2(0u, 0u);
          const uint2 hi = xon ? *(const uint2*)(xq + 16) : make_uint2(0u, 0u);
          xp[4 * j] = lo.x; xp[4 * j + 1] = lo.y; xp[4 * j + 2] = hi.x; xp[4 * j + 3] = hi.y;
        } else {
          const uint4 xv = xon ? *(const uint4*)(xs + xoff + ch * 4 * E + 8 * j) : make_uint4(0u, 0u, 0u, 0u);
          xp[4 * j] = xv.x; xp[4 * j + 1] = xv.y; xp[4 * j + 2] = xv.z; xp[4 * j + 3] = xv.w;
        }
      }
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        u32 a0[E / 2], a1[E / 2];
        if constexpr (WF == WF_Q4P) {
          // q - 8 exactly (the fp16 "scale" 1.0); each pair of mma covers one scale block of the
          // chunk for rows g (c0, c1) and g + 8 (c2, c3): scaled once, in fp32, after the mma
          dequant_q4_f16<false>(wv[u][rt][0], 0u, a0);
          dequant_q4_f16<false>(wv[u][rt][1], 0u, a1);
          const uint2 s0 = sc[u][rt][0], s1 = sc[u][rt][1];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const u32 w0 = q < 2 ? s0.x : s0.y, w1 = q < 2 ? s1.x : s1.y;
            const float f0 = __uint_as_float((q & 1) ? (w0 & 0xFFFF0000u) : (w0 << 16));
            const float f1 = __uint_as_float((q & 1) ? (w1 & 0xFFFF0000u) : (w1 << 16));
            float tmp[4] = {0.f, 0.f, 0.f, 0.f};
            mma_f16(tmp, a0[4 * q], a1[4 * q], a0[4 * q + 1], a1[4 * q + 1], xp[4 * q], xp[4 * q + 1]);
            mma_f16(tmp, a0[4 * q + 2], a1[4 * q + 2], a0[4 * q + 3], a1[4 * q + 3], xp[4 * q + 2], xp[4 * q + 3]);
            float (&ac)[4] = acc[rt][q];
            ac[0] = fmaf(f0, tmp[0], ac[0]);
            ac[1] = fmaf(f0, tmp[1], ac[1]);
            ac[2] = fmaf(f1, tmp[2], ac[2]);
            ac[3] = fmaf(f1, tmp[3], ac[3]);
          }
          continue;
        } else if constexpr (WF == WF_Q4) {
          dequant_q4_f16(wv[u][rt][0], scale_f16x2(sc[u][rt][0].x), a0);
          dequant_q4_f16(wv[u][rt][1], scale_f16x2(sc[u][rt][1].x), a1);
        } else {
          dequant_i8_f16(wv[u][rt][0], a0);
          dequant_i8_f16(wv[u][rt][1], a1);
        }
#pragma unroll
        for (int j = 0; j < E / 4; ++j)
          mma_f16(acc[rt][j % NACC], a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1], xp[2 * j], xp[2 * j + 1]);
      }
    }
  };
  // ping-pong: compute one buffer while the other one's loads are in flight
  for (int base = warp; base < nchunks; base += 2 * STEP) {
    if (base + STEP < nchunks) load(wb, sb, base + STEP, false);
    compute(wa, sa, base);
    if (base + STEP >= nchunks) break;
    if (base + 2 * STEP < nchunks) load(wa, sa, base + 2 * STEP, false);
    compute(wb, sb, base + STEP);
  }

  float c[RT][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int i = 0; i < 4; ++i) c[rt][i] = (acc[rt][0][i] + acc[rt][1][i]) + (acc[rt][2][i] + acc[rt][3][i]);
  block_reduce<NW, RT>(c, red, sums);
  for (int i = threadIdx.x; i < ROWS * 8; i += NW * 32) {
    const int col = i / ROWS, row = i % ROWS, n = row0 + row;
    if (col >= M || n >= N) continue;
    float v = sums[i] * outscale;
    if (WF == WF_INT8) v *= ((const float*)wscale)[n];
    y[(long long)col * N + n] = f32_to_bf16(v);
  }
}

template <int WF, int NW, int U, int RT, bool LORA, int S>
__global__ void __launch_bounds__(NW * 32, 512 / (NW * 32))
    decode_linear_x16(const unsigned char* __restrict__ W, const void* __restrict__ wscale,
                      const u16* __restrict__ x, u16* __restrict__ y, int M, int N, int K,
                      const u16* __restrict__ A, const u16* __restrict__ Bm, float lora_scale, int r,
                      float* __restrict__ tbuf, u32* __restrict__ flags, u32 epoch, int lora_mode) {
  static_assert((WF == WF_INT8 || WF == WF_Q4 || WF == WF_Q4P) && !LORA && S == 0,
                "x16 path: int8, q4b32 or q4b32p weights, no LoRA, register pipeline");
  constexpr int ROWS = 16 * RT;
  __shared__ float red[NW * ROWS * 8];
  __shared__ float sums[ROWS * 8];
  __shared__ __align__(16) u16 xs[LEDGER_XS_MAX];
  __shared__ u32 wmax[NW];
  const bool full = (blockIdx.x + 1) * ROWS <= N && (K / (4 * Fmt<WF>::E)) % (2 * NW * U) == 0;
  if (full) x16_body<WF, NW, U, RT, true>(W, wscale, x, y, M, N, K, red, sums, xs, wmax);
  else x16_body<WF, NW, U, RT, false>(W, wscale, x, y, M, N, K, red, sums, xs, wmax);
}

// Keeps the GPU busy for `ns` nanoseconds so that the host can queue timed launches
// back-to-back: the timings then measure the kernels, not Python's launch latency.
extern "C" __global__ void ledger_spin(u64 ns) {
  const u64 t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}
