#pragma once
// Every kernel body's entry point, once per capability: attention_kernel.cpp, bias_gelu_kernel.cpp and
// layer_norm_kernel.cpp define them in the namespace of the capability they are compiled for
// (CMakeLists.txt).
#include "attention_kernel.h"
#include "bias_gelu_kernel.h"
#include "layer_norm_kernel.h"

#define FASTTRAIN_KERNEL_BODIES(capability)      \
  namespace fasttrain::kernels::capability {     \
  detail::AttentionKernels attention_kernels();  \
  detail::BiasGeluKernels bias_gelu_kernels();   \
  detail::LayerNormKernels layer_norm_kernels(); \
  }
FASTTRAIN_KERNEL_BODIES(DEFAULT)
FASTTRAIN_KERNEL_BODIES(AVX2)
FASTTRAIN_KERNEL_BODIES(AVX512)
#undef FASTTRAIN_KERNEL_BODIES
