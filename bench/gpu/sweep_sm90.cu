// SPDX-License-Identifier: MIT
// Tile sweep for the Hopper forward (keys per step x consumer warpgroups x K/V stages; a block
// per query tile, K/V by row copies), on FlashAttention's benchmark shapes (batch * seq = 16k,
// hidden 2048, bf16, BSHD), beside the mma.sync forward. Each variant's output is compared
// with the mma.sync kernel's.
// Build and run on an sm_90 machine:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iinclude \
//        bench/gpu/sweep_sm90.cu -o sweep_sm90 && ./sweep_sm90
#include "../../src/cuda/forward.cu"
#include "../../src/cuda/forward_sm90.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

using bf16 = __nv_bfloat16;
typedef cudaError_t (*launcher)(const fa_cuda_params &, cudaStream_t);

struct variant {
    const char *name;
    int d;
    launcher fn;
};

static float median_ms(launcher fn, const fa_cuda_params &p, int reps)
{
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++)
        CHECK(fn(p, 0));
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        CHECK(cudaEventRecord(a));
        CHECK(fn(p, 0));
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return t[t.size() / 2];
}

static void fill(bf16 *d, size_t n, unsigned seed)
{
    std::vector<bf16> h(n);
    srand(seed);
    for (size_t i = 0; i < n; i++)
        h[i] = __float2bfloat16((float)rand() / RAND_MAX * 2.0f - 1.0f);
    CHECK(cudaMemcpy(d, h.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
}

static float max_diff(const bf16 *x, const bf16 *y, size_t n)
{
    std::vector<bf16> a(n), b(n);
    CHECK(cudaMemcpy(a.data(), x, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(b.data(), y, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(__bfloat162float(a[i]) - __bfloat162float(b[i]));
        if (!(d <= m))
            m = d; // NaN propagates
    }
    return m;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    unsigned seed = 12345;
    printf("seed %u, reps %d (median)\n", seed, reps);
    const variant vs[] = {
        { "mma.sync 128x64 8w", 64, fa::launch<bf16, 64, 128, 64, 8> },
        { "ws bn128 wg2 s2", 64, fa::launch_sm90_ws<bf16, 64, 128, 2, 2, 1> },
        { "ws bn128 wg2 s3", 64, fa::launch_sm90_ws<bf16, 64, 128, 2, 3, 1> },
        { "ws bn128 wg2 s4", 64, fa::launch_sm90_ws<bf16, 64, 128, 2, 4, 1> },
        { "ws bn64 wg3 s3", 64, fa::launch_sm90_ws<bf16, 64, 64, 3, 3, 1> },
        { "mma.sync 128x64 8w", 128, fa::launch<bf16, 128, 128, 64, 8> },
        { "ws bn128 wg2 s2", 128, fa::launch_sm90_ws<bf16, 128, 128, 2, 2, 1> },
        { "ws bn128 wg2 s3", 128, fa::launch_sm90_ws<bf16, 128, 128, 2, 3, 1> },
        { "ws bn64 wg2 s3", 128, fa::launch_sm90_ws<bf16, 128, 64, 2, 3, 1> },
    };
    const int seqs[] = { 1024, 4096, 16384 };
    const size_t total = 16384 * 2048; // batch * seq * hidden
    bf16 *q, *k, *v, *o, *ref;
    CHECK(cudaMalloc(&q, total * 2));
    CHECK(cudaMalloc(&k, total * 2));
    CHECK(cudaMalloc(&v, total * 2));
    CHECK(cudaMalloc(&o, total * 2));
    CHECK(cudaMalloc(&ref, total * 2));
    fill(q, total, seed);
    fill(k, total, seed + 1);
    fill(v, total, seed + 2);
    printf("%-4s %-6s %-6s %-22s %9s %9s %10s\n", "d", "causal", "seq", "kernel", "ms", "TFLOP/s",
           "maxdiff");
    for (int d : { 64, 128 })
        for (int causal = 0; causal < 2; causal++)
            for (int s : seqs) {
                const int h = 2048 / d, b = 16384 / s;
                fa_cuda_params p;
                memset(&p, 0, sizeof(p));
                fa_cuda_view x = { q, (int64_t)s * h * d, (int64_t)h * d, d, 0 };
                p.q = x;
                x.p = k, p.k = x;
                x.p = v, p.v = x;
                p.batch = b, p.heads_q = p.heads_kv = h, p.group = 1, p.dim = d;
                p.seqlen_q = p.seqlen_k = p.max_q = p.max_k = s;
                p.scale = 1.0f / sqrtf((float)d);
                p.scale_log2 = p.scale * 1.4426950408889634f;
                p.win_left = (int64_t)1 << 40;
                p.win_right = causal ? 0 : (int64_t)1 << 40;
                p.aligned = 1, p.o_vec = 1;
                p.dropout_scale = 1.0f;
                p.rescale_slack = 8.0f; // the forward as by default (backend.c)
                const double flops = 4.0 * b * h * (double)s * s * d / (causal ? 2 : 1);
                for (const variant &vt : vs) {
                    if (vt.d != d)
                        continue;
                    const bool base = vt.fn == (launcher)fa::launch<bf16, 64, 128, 64, 8> ||
                                      vt.fn == (launcher)fa::launch<bf16, 128, 128, 64, 8>;
                    x.p = base ? ref : o, p.o = x;
                    CHECK(cudaMemset(base ? ref : o, 0xff, total * 2)); // NaN poison: every element written
                    const float ms = median_ms(vt.fn, p, reps);
                    const float diff = base ? 0.0f : max_diff(o, ref, total);
                    printf("%-4d %-6d %-6d %-22s %9.3f %9.1f %10.2e\n", d, causal, s, vt.name, ms,
                           flops / ms / 1e9, diff);
                }
            }
    return 0;
}
