// A model with two inputs, fed by a batch source of your own, trained the way `fasttrain train` trains:
// from a config, with the run directory, checkpoints, "auto" precision and threads, and every switch.
// The task: given two Fashion-MNIST images, do they show the same kind of garment?
//
//   two_inputs [RUN_DIR] [--set section.key=value ...]      (default: runs/two_inputs)
//   two_inputs runs/pairs --set train.max_steps=50 --set ema.enabled=true
#include <fasttrain/fasttrain.h>
#include <torch/torch.h>

#include <iostream>
#include <optional>

// ---- the data: a BatchSource builds whole batches in the loader's worker threads ----
// Sample i is image i and a partner drawn from (seed, epoch, i): of the same class half the time. The
// batch has the two images as `inputs` and the field "partner", and 1 (same) or 0 as `targets`.
class PairSource : public fasttrain::BatchSource {
 public:
  PairSource(fasttrain::ImageDataset images, float mean, float stddev)
      : images_(std::move(images)), mean_(mean), stddev_(stddev) {
    const int64_t* labels = images_.labels.data_ptr<int64_t>();
    by_class_.resize(static_cast<size_t>(images_.num_classes));
    for (int64_t i = 0; i < images_.size(); ++i) by_class_[static_cast<size_t>(labels[i])].push_back(i);
  }

  int64_t size() const override { return images_.size(); }

  // Plain loops over raw pointers: workers use no torch operator, so they stay off the trainer's threads.
  fasttrain::Batch build(const fasttrain::BatchRequest& request) const override {
    const int64_t count = request.count, pixels = 28 * 28;
    const auto options = torch::TensorOptions().pinned_memory(request.pinned);
    fasttrain::Batch batch;
    batch.count = count;
    batch.inputs = torch::empty({count, 1, 28, 28}, options.dtype(torch::kFloat));
    batch.fields["partner"] = torch::empty({count, 1, 28, 28}, options.dtype(torch::kFloat));
    batch.targets = torch::empty({count}, options.dtype(torch::kLong));
    const uint8_t* images = images_.images.data_ptr<uint8_t>();
    const int64_t* labels = images_.labels.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t sample = request.samples[i];
      fasttrain::SampleRng rng(request.seed, static_cast<uint64_t>(request.epoch),
                               static_cast<uint64_t>(sample));
      const bool same = rng.uniform() < 0.5;
      const auto& pool = by_class_[static_cast<size_t>(
          same ? labels[sample] : (labels[sample] + 1 + rng.below(by_class_.size() - 1)) % by_class_.size())];
      const int64_t partner = pool[rng.below(pool.size())];
      normalise(images + sample * pixels, batch.inputs.data_ptr<float>() + i * pixels, pixels);
      normalise(images + partner * pixels, batch.fields["partner"].data_ptr<float>() + i * pixels, pixels);
      batch.targets.data_ptr<int64_t>()[i] = labels[partner] == labels[sample] ? 1 : 0;
    }
    return batch;
  }

  // What the run's task and reports read: two classes (different, same).
  fasttrain::DataShape shape() const override { return fasttrain::DataShape::images(1, 28, 28, 2); }
  std::string describe() const override { return std::to_string(size()) + " image pairs"; }

 private:
  void normalise(const uint8_t* in, float* out, int64_t n) const {
    for (int64_t p = 0; p < n; ++p) out[p] = (static_cast<float>(in[p]) / 255.0f - mean_) / stddev_;
  }
  fasttrain::ImageDataset images_;
  float mean_, stddev_;
  std::vector<std::vector<int64_t>> by_class_;
};

// ---- the model: one encoder for both images, a head on how their codes differ ----
// A stage: conv 3x3, 2x2 max-pool, then BatchNorm and ReLU, with fasttrain's CPU kernels where they take the
// maps (channels_last on the CPU, which train.channels_last gives) and ATen's ops elsewhere (a GPU). The
// first stage's conv (one input channel) and its max-pool run as one kernel, in the dtype the conv would
// run in under autocast.
struct ConvPoolNormReluImpl : torch::nn::Module {
  ConvPoolNormReluImpl(int64_t in_channels, int64_t channels)
      // No conv bias: BatchNorm's shift replaces it.
      : conv(register_module(
            "conv",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, channels, 3).padding(1).bias(false)))),
        norm(register_module("norm", torch::nn::BatchNorm2d(channels))) {}
  torch::Tensor forward(const torch::Tensor& maps) {  // [B, C_in, H, W] -> [B, C, H / 2, W / 2]
    namespace kernels = fasttrain::kernels;
    const torch::ScalarType dtype = kernels::cpu_compute_dtype(maps);
    // In evaluation (fp32, or bf16 on AMX's tiles): the conv, its max-pool and the BatchNorm + ReLU in one
    // pass.
    if (!is_training() && kernels::conv3x3_max_pool2x2_batch_norm_relu_takes(
                              maps, conv->weight, conv->bias, dtype, norm->weight, norm->bias,
                              norm->running_mean, norm->running_var)) {
      if (std::optional<torch::Tensor> normalised = kernels::conv3x3_max_pool2x2_batch_norm_relu(
              maps, conv->weight, conv->bias, dtype, norm->weight, norm->bias, norm->running_mean,
              norm->running_var, norm->options.eps()))
        return *normalised;  // nullopt: a NaN or an infinity in the maps; the two kernels below then run
    }
    torch::Tensor pooled;
    if (kernels::conv3x3_max_pool2x2_takes(maps, conv->weight, conv->bias, dtype)) {
      // On AMX's tiles where the CPU lends them (bf16): the conv the fused evaluation above runs.
      const bool amx = kernels::conv3x3_max_pool2x2_runs_on_amx(maps.size(1), conv->weight.size(0), dtype);
      pooled = kernels::conv3x3_max_pool2x2(
          maps, conv->weight, conv->bias, dtype, kernels::cpu_capability(),
          amx ? kernels::WideConvForward::amx : kernels::WideConvForward::winograd);
    } else {
      const torch::Tensor convolved = conv->forward(maps);
      pooled = kernels::max_pool2x2_takes(convolved) ? kernels::max_pool2x2(convolved)
                                                     : torch::max_pool2d(convolved, 2);
    }
    if (!kernels::batch_norm_relu_takes(pooled, norm->weight, norm->bias, norm->running_mean,
                                        norm->running_var, is_training()))
      return torch::relu(norm->forward(pooled));
    if (is_training()) norm->num_batches_tracked.add_(1);  // as BatchNorm2d counts them
    return kernels::batch_norm_relu(pooled, norm->weight, norm->bias, norm->running_mean, norm->running_var,
                                    is_training(), *norm->options.momentum(), norm->options.eps());
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d norm{nullptr};
};
TORCH_MODULE(ConvPoolNormRelu);

struct SiameseImpl : torch::nn::Module {
  SiameseImpl() {
    encoder = register_module("encoder",
                              torch::nn::Sequential(ConvPoolNormRelu(1, 16),   // 14 x 14
                                                    ConvPoolNormRelu(16, 32),  // 7 x 7
                                                    torch::nn::Flatten(), torch::nn::Linear(32 * 7 * 7, 64)));
    head = register_module("head", torch::nn::Linear(64, 2));
  }
  torch::Tensor forward(const torch::Tensor& a, const torch::Tensor& b) {     // [B, 1, 28, 28] each
    return head->forward((encoder->forward(a) - encoder->forward(b)).abs());  // [B, 2] logits
  }
  torch::nn::Sequential encoder{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Siamese);

// ---- the run: what the config cannot say is ours; the rest (task, optimizer, switches) is the config's ----
struct PairsRun : fasttrain::RunBuilder {
  fasttrain::DataSplits data(const fasttrain::Config&) override {
    auto splits = fasttrain::load_image_dataset("fashion-mnist", "/usr/share/datasets/fashion-mnist");
    auto [mean, stddev] = fasttrain::channel_statistics(splits.train.images);
    return {std::make_shared<PairSource>(splits.train, mean[0], stddev[0]),
            std::make_shared<PairSource>(splits.test, mean[0], stddev[0]), "test"};
  }
  fasttrain::Model model(const fasttrain::Config&, const fasttrain::DataShape&) override {
    return fasttrain::Model(Siamese(), [](SiameseImpl& net, const fasttrain::Batch& batch) {
      return net.forward(batch.inputs, batch.at("partner"));
    });
  }
};

int main(int argc, char** argv) {
  const std::string run_dir = argc > 1 && argv[1][0] != '-' ? argv[1] : "runs/two_inputs";
  try {
    fasttrain::Config config;  // the CLI's defaults, then ours, then the command line's
    config.data.batch_size(128).workers(1);
    config.optim.name("adamw").lr(2e-3);
    config.schedule.name("one-cycle");
    config.train.precision("auto").threads(0);  // bf16 where native; the cores
    config.train.channels_last(true);           // the conv kernels' layout, which fasttrain's kernels take
    config.train.options.epochs(1).eval_every_steps(200).target("accuracy >= 0.85");
    config.checkpoint.every_steps(100);
    for (int i = 1; i + 1 < argc; ++i) {
      if (std::string(argv[i]) == "--set") fasttrain::apply_override(config, argv[++i]);
    }
    PairsRun builder;
    auto console =
        std::make_shared<fasttrain::ConsoleReporter>(fasttrain::Progress::Mode::kLines, "two_inputs");
    const fasttrain::FitSummary summary = fasttrain::train_run(
        builder, config, run_dir, fasttrain::RunOptions().resume("latest").reporter(console));
    std::cout << summary.describe() << "\n";
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 1;
  }
}
