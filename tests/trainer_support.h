#pragma once
// Fixtures for tests that train: small models over synthetic_images' shape, and a trainer around one.
#include <torch/torch.h>

#include <memory>
#include <string>

#include "fasttrain/data/transforms.h"
#include "fasttrain/models/registry.h"
#include "fasttrain/optim/optimizer.h"
#include "fasttrain/optim/schedule.h"
#include "fasttrain/task/tasks.h"
#include "fasttrain/train/trainer.h"

namespace fasttrain::testing {

// Normalisation only: the pipeline of tests whose images need no augmentation.
inline TransformPipeline plain_pipeline() {
  return TransformPipeline({0.5f}, {0.25f});
}

// synthetic_images' default samples: [1, 8, 8] images in 4 classes.
inline DataShape small_images() {
  return DataShape::images(1, 8, 8, 4);
}

// An mlp over small_images() with one hidden layer of 16, initialised from `seed`.
inline Model small_mlp(uint64_t seed, double dropout = 0.0) {
  torch::manual_seed(seed);
  return make_mlp(MlpOptions().hidden({16}).dropout(dropout), small_images());
}

// A trainer of `model` for classification with SGD (momentum 0.9) or another optimizer, at a constant LR.
inline std::unique_ptr<Trainer> make_trainer(
    const Model& model, TrainOptions options, double lr = 0.1, const std::string& optimizer = "sgd",
    std::shared_ptr<Task> task = std::make_shared<ClassificationTask>()) {
  auto opt =
      make_optimizer(model.module().named_parameters(), OptimizerOptions(optimizer).lr(lr).momentum(0.9));
  auto schedule = make_schedule(ScheduleOptions("constant"), lr, 0.9, 1000);
  return std::make_unique<Trainer>(model, std::move(task), std::move(opt), std::move(schedule), options);
}

}  // namespace fasttrain::testing
