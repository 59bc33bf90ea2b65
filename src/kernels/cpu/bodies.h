#pragma once
// Every kernel body's entry point, once per capability: attention_kernel.cpp, batch_norm_relu_kernel.cpp,
// bias_gelu_kernel.cpp, conv_max_pool_kernel.cpp, cross_entropy_kernel.cpp, layer_norm_kernel.cpp,
// linear_relu_kernel.cpp, matmul_kernel.cpp, max_pool_kernel.cpp, narrow_linear_kernel.cpp,
// newton_schulz_kernel.cpp and transpose_kernel.cpp define them in the namespace of the capability they are
// compiled for (CMakeLists.txt).
#include "attention_kernel.h"
#include "batch_norm_relu_kernel.h"
#include "bias_gelu_kernel.h"
#include "conv_max_pool_kernel.h"
#include "cross_entropy_kernel.h"
#include "layer_norm_kernel.h"
#include "linear_relu_kernel.h"
#include "matmul_kernel.h"
#include "max_pool_kernel.h"
#include "narrow_linear_kernel.h"
#include "newton_schulz_kernel.h"
#include "transpose_kernel.h"

#define FASTTRAIN_KERNEL_BODIES(capability)               \
  namespace fasttrain::kernels::capability {              \
  detail::AttentionKernels attention_kernels();           \
  detail::BatchNormReluKernels batch_norm_relu_kernels(); \
  detail::BiasGeluKernels bias_gelu_kernels();            \
  detail::ConvMaxPoolKernels conv_max_pool_kernels();     \
  detail::CrossEntropyKernels cross_entropy_kernels();    \
  detail::LayerNormKernels layer_norm_kernels();          \
  detail::LinearReluKernels linear_relu_kernels();        \
  detail::MatmulKernels matmul_kernels();                 \
  detail::MaxPoolKernels max_pool_kernels();              \
  detail::NarrowLinearKernels narrow_linear_kernels();    \
  detail::NewtonSchulzKernels newton_schulz_kernels();    \
  detail::TransposeKernels transpose_kernels();           \
  }
FASTTRAIN_KERNEL_BODIES(DEFAULT)
FASTTRAIN_KERNEL_BODIES(AVX2)
FASTTRAIN_KERNEL_BODIES(AVX512)
#undef FASTTRAIN_KERNEL_BODIES

// The bodies that `entry` (attention_kernels, ...) returns in the build for `capability`, a
// CpuCapability the dispatcher has checked is runnable. Off x86 only the scalar build is compiled.
#ifdef FASTTRAIN_X86_KERNELS
#define FASTTRAIN_BODIES_FOR(entry, capability)                                                        \
  ((capability) == ::fasttrain::kernels::CpuCapability::avx512 ? ::fasttrain::kernels::AVX512::entry() \
   : (capability) == ::fasttrain::kernels::CpuCapability::avx2 ? ::fasttrain::kernels::AVX2::entry()   \
                                                               : ::fasttrain::kernels::DEFAULT::entry())
#else
#define FASTTRAIN_BODIES_FOR(entry, capability) ::fasttrain::kernels::DEFAULT::entry()
#endif
