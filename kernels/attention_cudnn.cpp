/*
kernels/attention_cudnn.cpp: causal attention through cuDNN's fused flash attention (cudnn-frontend SDPA graphs),
the USE_CUDNN alternative to kernels/attention.cuh. Its own translation unit because cudnn-frontend is slow to
compile; the prototypes are in kernels/attention.cuh (under USE_CUDNN). BF16 only.

Build (the cudnn-frontend headers are an external dependency, never committed):
  nvcc -O3 -arch=sm_90 -std=c++17 -c kernels/attention_cudnn.cpp -I/path/to/cudnn-frontend/include
  ... link with -lcudnn -lnvrtc (recent cudnn-frontend versions compile some engines at run time with NVRTC)

Layouts are those of kernels/attention.cuh: qkv [B, T, 3C] is read in place as the strided views
Q, K, V [B, NH, T, hs] with strides (T*3C, hs, 3C, 1) at column offsets 0, C, 2C (no permute); out and dout
[B, T, C] are [B, NH, T, hs] with strides (T*C, hs, C, 1); lse is cuDNN's softmax statistics tensor
[B, NH, T] fp32 (the natural-log log-sum-exp of each row of scaled scores, as in attention.cuh); dqkv is written
through the same views as qkv. Causal = top-left diagonal alignment with right bound 0, scale 1/sqrt(hs).
The backward asks for cuDNN's deterministic algorithm (no atomics), so runs are bitwise reproducible.

Graphs are built once per (B, NH, T, hs, direction) and cached; the cuDNN workspace grows on demand.
*/
#if defined(ENABLE_FP32)
#error "cuDNN attention is bf16 only: build with USE_CUDNN only in the BF16 build"
#endif

#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cudnn_frontend.h>
#include "../utils.h"

namespace fe = cudnn_frontend;
typedef __nv_bfloat16 floatX;

// tensor uids of the graphs
enum { ATT_UID_Q = 1, ATT_UID_K, ATT_UID_V, ATT_UID_O, ATT_UID_STATS, ATT_UID_DO, ATT_UID_DQ, ATT_UID_DK, ATT_UID_DV };

static cudnnHandle_t att_cudnn_handle = NULL;
static void* att_cudnn_workspace = NULL;
static size_t att_cudnn_workspace_bytes = 0;
typedef std::tuple<int, int, int, int, bool> AttGraphKey;  // B, NH, T, hs, backward
static std::map<AttGraphKey, std::shared_ptr<fe::graph::Graph>> att_cudnn_graphs;

static void att_cudnn_check(fe::error_t e, const char* what) {
    if (e.is_bad()) { die("cuDNN attention: %s failed: %s", what, e.get_message().c_str()); }
}

static void att_cuda_check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) { die("cuDNN attention: %s: %s", what, cudaGetErrorString(err)); }
}

static cudnnHandle_t att_cudnn_get_handle(cudaStream_t stream) {
    if (att_cudnn_handle == NULL) {
        if (cudnnCreate(&att_cudnn_handle) != CUDNN_STATUS_SUCCESS) { die("cuDNN attention: cudnnCreate failed"); }
    }
    if (cudnnSetStream(att_cudnn_handle, stream) != CUDNN_STATUS_SUCCESS) { die("cuDNN attention: cudnnSetStream failed"); }
    return att_cudnn_handle;
}

// a [B, NH, T, hs] bf16 tensor whose rows (b, t) are ld elements apart (3C for the qkv views, C for out)
static std::shared_ptr<fe::graph::Tensor_attributes> att_view(fe::graph::Graph& g, const char* name, int uid,
                                                              int64_t B, int64_t NH, int64_t T, int64_t hs,
                                                              int64_t ld) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({B, NH, T, hs})
                        .set_stride({T * ld, hs, ld, 1}));
}

static void att_set_view(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int uid, int64_t B, int64_t NH,
                         int64_t T, int64_t hs, int64_t ld) {
    t->set_output(true).set_uid(uid).set_dim({B, NH, T, hs}).set_stride({T * ld, hs, ld, 1});
}

// builds (or finds) the graph and makes sure the workspace is large enough for it
static fe::graph::Graph& att_cudnn_graph(cudnnHandle_t handle, int B, int T, int C, int NH, bool backward) {
    const AttGraphKey key(B, NH, T, C / NH, backward);
    auto it = att_cudnn_graphs.find(key);
    if (it != att_cudnn_graphs.end()) { return *it->second; }

    const int64_t hs = C / NH, ld = 3 * (int64_t)C;
    const float scale = 1.0f / sqrtf((float)hs);
    auto graph = std::make_shared<fe::graph::Graph>();
    graph->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto Q = att_view(*graph, "Q", ATT_UID_Q, B, NH, T, hs, ld);
    auto K = att_view(*graph, "K", ATT_UID_K, B, NH, T, hs, ld);
    auto V = att_view(*graph, "V", ATT_UID_V, B, NH, T, hs, ld);
    if (!backward) {
        auto options = fe::graph::SDPA_attributes()
                           .set_name("attention_forward")
                           .set_generate_stats(true)
                           .set_attn_scale(scale)
                           .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                           .set_diagonal_band_right_bound(0);
        auto [O, stats] = graph->sdpa(Q, K, V, options);
        att_set_view(O, ATT_UID_O, B, NH, T, hs, C);
        stats->set_output(true).set_uid(ATT_UID_STATS).set_data_type(fe::DataType_t::FLOAT);
    } else {
        auto O = att_view(*graph, "O", ATT_UID_O, B, NH, T, hs, C);
        auto dO = att_view(*graph, "dO", ATT_UID_DO, B, NH, T, hs, C);
        auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                       .set_name("stats")
                                       .set_uid(ATT_UID_STATS)
                                       .set_dim({B, NH, T, 1})
                                       .set_stride({(int64_t)NH * T, T, 1, 1})
                                       .set_data_type(fe::DataType_t::FLOAT));
        auto options = fe::graph::SDPA_backward_attributes()
                           .set_name("attention_backward")
                           .set_attn_scale(scale)
                           .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                           .set_diagonal_band_right_bound(0)
                           .set_deterministic_algorithm(true);
        auto [dQ, dK, dV] = graph->sdpa_backward(Q, K, V, O, dO, stats, options);
        att_set_view(dQ, ATT_UID_DQ, B, NH, T, hs, ld);
        att_set_view(dK, ATT_UID_DK, B, NH, T, hs, ld);
        att_set_view(dV, ATT_UID_DV, B, NH, T, hs, ld);
    }
    att_cudnn_check(graph->validate(), "graph validate");
    att_cudnn_check(graph->build_operation_graph(handle), "build_operation_graph");
    att_cudnn_check(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    att_cudnn_check(graph->check_support(handle), "check_support");
    att_cudnn_check(graph->build_plans(handle), "build_plans");

    int64_t ws = 0;
    att_cudnn_check(graph->get_workspace_size(ws), "get_workspace_size");
    if ((size_t)ws > att_cudnn_workspace_bytes) {
        if (att_cudnn_workspace != NULL) { att_cuda_check(cudaFree(att_cudnn_workspace), "cudaFree workspace"); }
        att_cuda_check(cudaMalloc(&att_cudnn_workspace, (size_t)ws), "cudaMalloc workspace");
        att_cudnn_workspace_bytes = (size_t)ws;
    }
    att_cudnn_graphs[key] = graph;
    return *graph;
}

// out [B, T, C], lse [B, NH, T] from qkv [B, T, 3C]
void attention_forward_cudnn(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                             cudaStream_t stream) {
    cudnnHandle_t handle = att_cudnn_get_handle(stream);
    fe::graph::Graph& graph = att_cudnn_graph(handle, B, T, C, NH, false);
    floatX* q = (floatX*)qkv;  // cuDNN takes non-const pointers; the inputs are only read
    std::unordered_map<int64_t, void*> pack = {
        {ATT_UID_Q, q}, {ATT_UID_K, q + C}, {ATT_UID_V, q + 2 * C}, {ATT_UID_O, out}, {ATT_UID_STATS, lse}};
    att_cudnn_check(graph.execute(handle, pack, att_cudnn_workspace), "forward execute");
}

// dqkv [B, T, 3C] overwritten with the gradients of q, k, v (no scratch: cuDNN's workspace is managed here)
void attention_backward_cudnn(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                              const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
    cudnnHandle_t handle = att_cudnn_get_handle(stream);
    fe::graph::Graph& graph = att_cudnn_graph(handle, B, T, C, NH, true);
    floatX* q = (floatX*)qkv;
    std::unordered_map<int64_t, void*> pack = {
        {ATT_UID_Q, q},         {ATT_UID_K, q + C},         {ATT_UID_V, q + 2 * C},
        {ATT_UID_O, (void*)out}, {ATT_UID_DO, (void*)dout}, {ATT_UID_STATS, (void*)lse},
        {ATT_UID_DQ, dqkv},     {ATT_UID_DK, dqkv + C},     {ATT_UID_DV, dqkv + 2 * C}};
    att_cudnn_check(graph.execute(handle, pack, att_cudnn_workspace), "backward execute");
}

// frees the graphs, the workspace and the handle
void attention_cudnn_destroy(void) {
    att_cudnn_graphs.clear();
    if (att_cudnn_workspace != NULL) { att_cuda_check(cudaFree(att_cudnn_workspace), "cudaFree workspace"); }
    att_cudnn_workspace = NULL;
    att_cudnn_workspace_bytes = 0;
    if (att_cudnn_handle != NULL) { cudnnDestroy(att_cudnn_handle); }
    att_cudnn_handle = NULL;
}
