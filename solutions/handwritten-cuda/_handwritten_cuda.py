"""Kernels and helpers shared by the handwritten-cuda solutions (not a solution: its name starts with _).

The solutions import it as a sibling module (the worker puts a solution's folder on sys.path while
importing it). Nothing here touches CuPy or the GPU until a solution is first called, so listing
or parsing the set needs neither.

Every kernel follows one pattern. Each rank first copies its input into its own symmetric buffer
(stream-ordered before the kernel), then the kernel's blocks meet their counterparts on every rank
in pkb_block_barrier (so every peer's copy is done), move data with 16-byte peer loads where the
layout allows, and meet again at the end (so no rank overwrites its buffer in the next call while
a peer still reads it). Where a kernel has phases, block b of each rank only reads what block b of
the peers wrote: every loop maps index i to block (i / blockDim) % gridDim the same way on every
rank. Sums run over ranks in rank order 0..n-1 on every rank, in fp32, so every rank gets the same
bits (as NCCL does): data-parallel replicas must not drift apart.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from pkb_tui import symheap

THREADS = 512
VECTOR_BYTES = 16

KERNELS = r"""
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

// ---- element types: arithmetic in fp32, storage as the task's dtype (no headers: PTX converts)
struct F32 {
    typedef float T;
    static __device__ __forceinline__ float load(T v) { return v; }
    static __device__ __forceinline__ T store(float v) { return v; }
};
struct F16 {
    typedef u16 T;
    static __device__ __forceinline__ float load(T v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }
    static __device__ __forceinline__ T store(float f) { T h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
};
struct BF16 {
    typedef u16 T;
    static __device__ __forceinline__ float load(T v) { return __uint_as_float(((u32)v) << 16); }
    static __device__ __forceinline__ T store(float f) { T h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
};

// ---- loads that skip L1 (peer memory is written by other processes; L1 is not coherent)
__device__ __forceinline__ uint4 ld_cg(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ld_cg(const uint2* p) {
    uint2 v;
    asm volatile("ld.global.cg.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ u32 ld_cg(const u32* p) {
    u32 v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ u16 ld_cg(const u16* p) {
    u16 v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ unsigned char ld_cg(const unsigned char* p) {
    u32 v;
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=r"(v) : "l"(p));
    return (unsigned char)v;
}

template <class D> struct Vec {
    static constexpr int N = 16 / sizeof(typename D::T);
    union { uint4 raw; typename D::T e[N]; };
};

#define RANK_BATCH 8

// acc[k] = sum over ranks r in order 0..world-1 of bufs[r][elem + k], k < N; elem is N-aligned.
// All loads of a batch are issued before the first add: up to 8 peers' data in flight per thread.
template <class D>
__device__ __forceinline__ void sum_vector(const u64* bufs, int world, long long elem, float* acc) {
    typedef typename D::T T;
    constexpr int N = Vec<D>::N;
    #pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = 0.f;
    for (int r0 = 0; r0 < world; r0 += RANK_BATCH) {
        Vec<D> v[RANK_BATCH];
        #pragma unroll
        for (int j = 0; j < RANK_BATCH; ++j)
            if (r0 + j < world)
                v[j].raw = ld_cg(reinterpret_cast<const uint4*>(reinterpret_cast<const T*>(bufs[r0 + j]) + elem));
        #pragma unroll
        for (int j = 0; j < RANK_BATCH; ++j)
            if (r0 + j < world) {
                #pragma unroll
                for (int k = 0; k < N; ++k) acc[k] += D::load(v[j].e[k]);
            }
    }
}

template <class D>
__device__ __forceinline__ float sum_scalar(const u64* bufs, int world, long long elem) {
    typedef typename D::T T;
    float acc = 0.f;
    for (int r = 0; r < world; ++r) acc += D::load(ld_cg(reinterpret_cast<const T*>(bufs[r]) + elem));
    return acc;
}

// out[i] = sum over ranks r (in order) of bufs[r][src_off + i], i < count; optionally also to out2.
// Vector i goes to block (i / blockDim) % gridDim; tail element t to block t / blockDim.
template <class D>
__device__ __forceinline__ void reduce_range(
    const u64* bufs, int world, long long src_off, typename D::T* out, typename D::T* out2, long long count) {
    typedef typename D::T T;
    constexpr int N = Vec<D>::N;
    const long long nvec = count / N;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
        float acc[N];
        sum_vector<D>(bufs, world, src_off + i * N, acc);
        Vec<D> o;
        #pragma unroll
        for (int k = 0; k < N; ++k) o.e[k] = D::store(acc[k]);
        reinterpret_cast<uint4*>(out)[i] = o.raw;
        if (out2) reinterpret_cast<uint4*>(out2)[i] = o.raw;
    }
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long e = nvec * N + t;
    if (e < count) {
        float acc = sum_scalar<D>(bufs, world, src_off + e);
        out[e] = D::store(acc);
        if (out2) out2[e] = D::store(acc);
    }
}

// out[i] = src[i], i < count, with reduce_range's block mapping (so phases line up across ranks).
template <class D>
__device__ __forceinline__ void copy_range(const typename D::T* src, typename D::T* out, long long count) {
    constexpr int N = Vec<D>::N;
    const long long nvec = count / N;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride)
        reinterpret_cast<uint4*>(out)[i] = ld_cg(reinterpret_cast<const uint4*>(src) + i);
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long e = nvec * N + t;
    if (e < count) out[e] = ld_cg(src + e);
}

// One-shot all-reduce / reduce-scatter: every rank reads every rank's [src_off, src_off+count).
template <class D>
__device__ void reduce_kernel(const u64* bufs, const u64* pads, int rank, int world, u32 epoch,
                              typename D::T* out, long long src_off, long long count) {
    pkb_block_barrier(pads, rank, world, epoch);
    reduce_range<D>(bufs, world, src_off, out, nullptr, count);
    pkb_block_barrier(pads, rank, world, epoch + 1);
}

// Two-shot all-reduce: reduce-scatter my chunk (into my buffer and my output), then gather the
// other ranks' reduced chunks from their buffers. Moves 2(n-1)/n of the data over the links
// instead of one-shot's (n-1).
template <class D>
__device__ void twoshot_kernel(const u64* bufs, const u64* pads, int rank, int world, u32 epoch,
                               typename D::T* out, long long n, long long chunk) {
    typedef typename D::T T;
    pkb_block_barrier(pads, rank, world, epoch);
    long long begin = (long long)rank * chunk;
    long long count = n - begin < chunk ? n - begin : chunk;
    if (count > 0)
        reduce_range<D>(bufs, world, begin, out + begin, reinterpret_cast<T*>(bufs[rank]) + begin, count);
    pkb_block_barrier(pads, rank, world, epoch + 1);
    for (int j = 1; j < world; ++j) {
        int s = (rank + j) % world;
        long long b = (long long)s * chunk;
        long long c = n - b < chunk ? n - b : chunk;
        if (c > 0) copy_range<D>(reinterpret_cast<const T*>(bufs[s]) + b, out + b, c);
    }
    pkb_block_barrier(pads, rank, world, epoch + 2);
}

#define TYPED_KERNELS(D, SUFFIX)                                                                          \
extern "C" __global__ void __launch_bounds__(512) reduce_##SUFFIX(                                        \
    const u64* bufs, const u64* pads, int rank, int world, u32 epoch, D::T* out, long long src_off,      \
    long long count) { reduce_kernel<D>(bufs, pads, rank, world, epoch, out, src_off, count); }           \
extern "C" __global__ void __launch_bounds__(512) twoshot_##SUFFIX(                                       \
    const u64* bufs, const u64* pads, int rank, int world, u32 epoch, D::T* out, long long n,            \
    long long chunk) { twoshot_kernel<D>(bufs, pads, rank, world, epoch, out, n, chunk); }

// ---- ZeRO-1 AdamW step, fused: reduce-scatter the gradients, AdamW on my shard, all-gather params.
// One kernel, three barriers, no intermediate in device memory except my new parameter shard in my
// symmetric buffer (which the peers read). Shard s covers elements [s*shard, (s+1)*shard) of the
// zero-padded flat buffer; shard starts need not be 16-byte aligned, so each shard is walked as a
// scalar head up to the first aligned element, 16-byte vectors, and a scalar tail -- the same walk
// on every rank, so phase 2's block b reads exactly what the owner's block b wrote in phase 1.
struct Adam {
    float beta1, beta2, eps, decay, step_size, sqrt_bias2, world;
    __device__ __forceinline__ float step(float g_sum, float p, float m0, float v0, float* m, float* v) const {
        float g = g_sum / world;
        float mm = m0 * beta1 + g * (1.f - beta1);
        float vv = v0 * beta2 + g * g * (1.f - beta2);
        float denom = sqrtf(vv) / sqrt_bias2 + eps;
        *m = mm;
        *v = vv;
        return p * decay - step_size * mm / denom;
    }
};

template <class D>
__device__ __forceinline__ long long head_elems(long long base, long long count) {
    constexpr int N = Vec<D>::N;  // N elements = 16 bytes: base is aligned iff base % N == 0
    long long h = (N - base % N) % N;
    return h < count ? h : count;
}

template <class D>
__device__ void zero1_adam_kernel(
    const u64* gbufs, const u64* pbufs, const u64* pads, int rank, int world, u32 epoch,
    const typename D::T* params, const float* m_in, const float* v_in, float* m_out, float* v_out,
    typename D::T* out, long long numel, long long shard, Adam adam) {
    typedef typename D::T T;
    constexpr int N = Vec<D>::N;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    pkb_block_barrier(pads, rank, world, epoch);

    // Phase 1: my shard.
    {
        const long long base = (long long)rank * shard;
        T* mine = reinterpret_cast<T*>(pbufs[rank]);
        const long long h = head_elems<D>(base, shard);
        const long long nvec = (shard - h) / N;
        const long long tail_start = h + nvec * N;
        for (long long i = t; i < nvec; i += stride) {
            const long long e = h + i * N, g0 = base + e;
            float gs[N], p[N];
            sum_vector<D>(gbufs, world, g0, gs);
            if (g0 + N <= numel) {
                Vec<D> pv;
                pv.raw = *reinterpret_cast<const uint4*>(params + g0);
                #pragma unroll
                for (int k = 0; k < N; ++k) p[k] = D::load(pv.e[k]);
            } else {
                #pragma unroll
                for (int k = 0; k < N; ++k) p[k] = (g0 + k < numel) ? D::load(params[g0 + k]) : 0.f;
            }
            Vec<D> o;
            #pragma unroll
            for (int k = 0; k < N; ++k) {
                float m, v;
                o.e[k] = D::store(adam.step(gs[k], p[k], m_in[e + k], v_in[e + k], &m, &v));
                m_out[e + k] = m;
                v_out[e + k] = v;
            }
            *reinterpret_cast<uint4*>(mine + g0) = o.raw;
            if (g0 + N <= numel) {
                *reinterpret_cast<uint4*>(out + g0) = o.raw;
            } else {
                #pragma unroll
                for (int k = 0; k < N; ++k) if (g0 + k < numel) out[g0 + k] = o.e[k];
            }
        }
        for (int part = 0; part < 2; ++part) {  // the scalar head, then the scalar tail (block 0)
            const long long e = part == 0 ? t : tail_start + t;
            if (part == 0 ? t >= h : e >= shard) continue;
            const long long g = base + e;
            float m, v;
            const float p = g < numel ? D::load(params[g]) : 0.f;
            const T value = D::store(adam.step(sum_scalar<D>(gbufs, world, g), p, m_in[e], v_in[e], &m, &v));
            m_out[e] = m;
            v_out[e] = v;
            mine[g] = value;
            if (g < numel) out[g] = value;
        }
    }
    pkb_block_barrier(pads, rank, world, epoch + 1);

    // Phase 2: the other shards, from their owners' buffers, walked exactly as their owners did.
    for (int j = 1; j < world; ++j) {
        const int s = (rank + j) % world;
        const long long base = (long long)s * shard;
        const long long valid = numel - base < shard ? (numel - base > 0 ? numel - base : 0) : shard;
        const T* theirs = reinterpret_cast<const T*>(pbufs[s]);
        const long long h = head_elems<D>(base, shard);
        const long long nvec = (shard - h) / N;
        const long long tail_start = h + nvec * N;
        for (long long i = t; i < nvec; i += stride) {
            const long long e = h + i * N, g0 = base + e;
            if (e + N <= valid) {
                *reinterpret_cast<uint4*>(out + g0) = ld_cg(reinterpret_cast<const uint4*>(theirs + g0));
            } else {
                for (int k = 0; k < N; ++k) if (e + k < valid) out[g0 + k] = ld_cg(theirs + g0 + k);
            }
        }
        for (int part = 0; part < 2; ++part) {
            const long long e = part == 0 ? t : tail_start + t;
            if (part == 0 ? t >= h : e >= shard) continue;
            if (e < valid) out[base + e] = ld_cg(theirs + base + e);
        }
    }
    pkb_block_barrier(pads, rank, world, epoch + 2);
}

#define TYPED_KERNELS2(D, SUFFIX)                                                                         \
extern "C" __global__ void __launch_bounds__(512) zero1_adam_##SUFFIX(                                    \
    const u64* gbufs, const u64* pbufs, const u64* pads, int rank, int world, u32 epoch,                 \
    const D::T* params, const float* m_in, const float* v_in, float* m_out, float* v_out, D::T* out,     \
    long long numel, long long shard, float beta1, float beta2, float eps, float decay, float step_size, \
    float sqrt_bias2) {                                                                                   \
    Adam adam{beta1, beta2, eps, decay, step_size, sqrt_bias2, (float)world};                            \
    zero1_adam_kernel<D>(gbufs, pbufs, pads, rank, world, epoch, params, m_in, v_in, m_out, v_out, out,  \
                         numel, shard, adam); }

TYPED_KERNELS(F32, f32)
TYPED_KERNELS(F16, f16)
TYPED_KERNELS(BF16, bf16)
TYPED_KERNELS2(F32, f32)
TYPED_KERNELS2(F16, f16)
TYPED_KERNELS2(BF16, bf16)

// Gather-style pull: out[s*chunk_bytes + ...] = bufs[s][src_off_bytes + ...] for every rank s.
// all-gather: src_off 0; all-to-all: src_off = my rank's slot in the peers' padded layout.
// W: the widest word (16, 8, 4, 2, 1 bytes) that divides chunk_bytes, so every access is aligned.
template <typename Word>
__device__ void pull_kernel(const u64* bufs, const u64* pads, int rank, int world, u32 epoch,
                            unsigned char* out, long long chunk_bytes, long long src_off_bytes) {
    pkb_block_barrier(pads, rank, world, epoch);
    const long long words = chunk_bytes / (long long)sizeof(Word);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        for (int j0 = 0; j0 < world; j0 += RANK_BATCH) {
            Word v[RANK_BATCH];
            #pragma unroll
            for (int j = 0; j < RANK_BATCH; ++j) {
                if (j0 + j < world) {
                    int s = (rank + j0 + j) % world;  // start at a different peer on every rank
                    v[j] = ld_cg(reinterpret_cast<const Word*>(reinterpret_cast<const unsigned char*>(bufs[s]) + src_off_bytes) + i);
                }
            }
            #pragma unroll
            for (int j = 0; j < RANK_BATCH; ++j) {
                if (j0 + j < world) {
                    int s = (rank + j0 + j) % world;
                    reinterpret_cast<Word*>(out + (long long)s * chunk_bytes)[i] = v[j];
                }
            }
        }
    }
    pkb_block_barrier(pads, rank, world, epoch + 1);
}

#define PULL_KERNEL(WORD, SUFFIX)                                                                         \
extern "C" __global__ void __launch_bounds__(512) pull_##SUFFIX(                                          \
    const u64* bufs, const u64* pads, int rank, int world, u32 epoch, unsigned char* out,                \
    long long chunk_bytes, long long src_off_bytes) {                                                     \
    pull_kernel<WORD>(bufs, pads, rank, world, epoch, out, chunk_bytes, src_off_bytes); }

PULL_KERNEL(uint4, w16)
PULL_KERNEL(uint2, w8)
PULL_KERNEL(u32, w4)
PULL_KERNEL(u16, w2)
PULL_KERNEL(unsigned char, w1)
"""

SOURCE = symheap.DEVICE_CODE + KERNELS
DTYPE_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}

_module: Any = None
_functions: dict[str, Any] = {}
_lock = threading.Lock()


def require_cuda(*tensors: torch.Tensor, task: str) -> None:
    symheap.require_cuda(*tensors, who=f"handwritten-cuda {task}")


def heap() -> symheap.SymmetricHeap:
    return symheap.get_heap()


def kernel(name: str) -> Any:
    """A kernel of the module, compiled once per process with NVRTC (well under a second)."""
    global _module
    with _lock:
        found = _functions.get(name)
        if found is None:
            if _module is None:
                import cupy

                _module = cupy.RawModule(code=SOURCE, options=("--std=c++17",))
            found = _module.get_function(name)
            _functions[name] = found
        return found


def typed(name: str, dtype: torch.dtype, task: str) -> Any:
    if dtype not in DTYPE_SUFFIX:
        raise symheap.PkbError(f"handwritten-cuda {task} supports float32, float16 and bfloat16, not {dtype}.")
    return kernel(f"{name}_{DTYPE_SUFFIX[dtype]}")


def word_bytes(nbytes: int) -> int:
    """The widest of 16/8/4/2/1 bytes dividing nbytes: the access width that keeps every chunk aligned."""
    for width in (16, 8, 4, 2):
        if nbytes % width == 0:
            return width
    return 1


def grid(h: symheap.SymmetricHeap, items: int) -> int:
    """Blocks for `items` work items per block-thread: enough to cover them, never more than fit."""
    return h.max_blocks(work_blocks=-(-max(items, 1) // THREADS))


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
