#pragma once
// TensorSource: samples a program already holds as tensors, batched by copying rows. Bring any data:
// named tensors, each with the samples along its first dimension. "inputs" and "targets" are what the
// built-in models and tasks read; every other name becomes a field of the batch (Batch::fields: a
// second input, a mask, per-sample weights), pinned, copied and prefetched with the rest.
//
//   auto source = std::make_shared<fasttrain::TensorSource>(std::map<std::string, torch::Tensor>{
//       {"inputs", features},          // [N, 13] float
//       {"targets", prices},           // [N, 1] float
//       {"weights", sample_weights}}); // [N] float: batch.at("weights") is [B]
//   fasttrain::DataLoader loader(source, fasttrain::LoaderOptions(64));
//
// The rows are copied by the loader's workers with plain memcpy (no torch operator: workers stay off
// the intra-op pool the trainer computes on). 4-d tensors follow BatchRequest::channels_last. With
// data.device_resident the tensors live on the device and each batch is gathered there (the same values).
#include <torch/types.h>

#include <map>
#include <string>

#include "fasttrain/data/batch_source.h"

namespace fasttrain {

class TensorSource : public BatchSource {
 public:
  // Every tensor on the CPU (it is made contiguous here), with the same number of samples N >= 1 along
  // dimension 0; "inputs" must be there. `what` names the data in messages ("the training split of
  // data.path 'x.safetensors'"). Integer 1-d targets are class ids in [0, classes); `classes` 0: their
  // largest + 1 (a split that may lack the last class passes the whole data's count).
  TensorSource(std::map<std::string, torch::Tensor> tensors, std::string what = "tensors",
               int64_t classes = 0);

  int64_t size() const override { return size_; }
  Batch build(const BatchRequest& request) const override;
  // data.device_resident: every tensor copied to the device, a batch one index_select of each there.
  int64_t resident_bytes() const override;
  bool resident_batches_are_gathers() const override { return true; }
  std::unique_ptr<ResidentBatches> make_resident(torch::Device device) const override;
  DataShape shape() const override;
  std::string describe() const override;
  const torch::Tensor& tensor(const std::string& name) const;

 private:
  std::map<std::string, torch::Tensor> tensors_;
  std::string what_;
  int64_t size_ = 0;
  int64_t classes_ = 0;
};

}  // namespace fasttrain
