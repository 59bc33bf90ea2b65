#pragma once
// fasttrain's own work on a CUDA GPU where ATen's ops leave speed behind (LibTorch built with CUDA; without
// it the *_takes functions say no and the callers run ATen's ops). Each has a reference test against the
// composed ATen ops on the GPU (tests/kernels) and a switch (model.gpu_kernels, model.aten_kernels).
//
//   torch::Tensor y = fasttrain::kernels::gpu_mlp(x, fc->weight, fc->bias, proj->weight, proj->bias, x0);
//   torch::Tensor qkv = fasttrain::kernels::gpu_linear(x, qkv->weight, qkv->bias);
//
// The residual add + LayerNorm runs on the GPU through kernels::layer_norm, pass_layer_norm and
// add_layer_norm (cpu.h).
#include <torch/types.h>

namespace fasttrain::kernels {

// Whether fasttrain's CUDA kernels run on this GPU: LibTorch with CUDA, compute capability 8.0 or later (bf16
// arithmetic), and code for it in the library (TORCH_CUDA_ARCH_LIST in CMakeLists.txt: 8.0 and 9.0 by
// default, with 9.0's PTX for later GPUs).
bool gpu_kernels_run_on(const torch::Device& device);

// Whether gpu_mlp takes these: x [..., C] on a CUDA GPU computing in bf16 (under bf16 autocast, or bf16
// itself), fc_weight [H, C], fc_bias [H], proj_weight [C, H] and proj_bias [C] on its device in fp32 or
// bf16, C and H multiples of 8 (cuBLASLt's 16-byte alignment), and a residual, where given, of x's sizes in
// fp32 or bf16 on its device.
bool gpu_mlp_takes(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                   const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                   const torch::Tensor& residual = {});

// residual + proj(gelu_tanh(fc(x))), a transformer's MLP, in bf16 with fp32 accumulation: four cuBLASLt
// matmuls whose epilogues do the pointwise work that ATen runs as kernels of their own. Forward: fc with the
// bias and GELU applied in its epilogue, which also writes the pre-activation that backward reads
// (GELU_AUX_BIAS), then proj with its bias (BIAS) and the residual added as the matmul's C, written in the
// residual's dtype (fp32 under autocast, as ATen's add would be; without a residual bf16, as autocast's
// Linear returns). Backward: proj's weight gradient with its bias gradient summed in the same matmul
// (BGRADB), the gradient through proj, then GELU's derivative and fc's bias gradient in one pass of
// fasttrain's (cuBLASLt's DGELU_BGRAD epilogue measured 4x slower), then fc's weight and input gradients.
// The weights' gradients are written in fp32 directly (ATen's bf16 products are cast after).
// Differentiable once in x, the four parameters and the residual.
torch::Tensor gpu_mlp(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                      const torch::Tensor& proj_weight, const torch::Tensor& proj_bias,
                      const torch::Tensor& residual = {});

// Whether gpu_linear takes these: x [..., K] in fp32 or bf16 on a CUDA GPU computing in bf16 (under bf16
// autocast, or bf16 itself), weight [N, K] and bias [N] on its device in fp32 or bf16, K and N multiples
// of 8.
bool gpu_linear_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// x weight^T + bias in bf16 with fp32 accumulation, returned in bf16 (as autocast's Linear): forward is the
// matmul with the bias in its epilogue (as ATen's addmm), backward the weight gradient with the bias
// gradient summed in the same matmul (BGRADB), both written in fp32, where ATen reduces the bias gradient in
// a pass of its own and casts both from bf16. Differentiable once in x, weight and bias.
torch::Tensor gpu_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

}  // namespace fasttrain::kernels
