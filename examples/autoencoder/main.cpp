// Your own model and your own loss, with the playbook's switches: a convolutional autoencoder that
// compresses Fashion-MNIST images to 16 numbers, trained with bf16 autocast where the hardware runs it
// natively, an EMA of the weights, a one-cycle schedule, clipping and checkpoints that resume; one of
// its layers runs a fused kernel of fasttrain's.
//
//   autoencoder [RUN_DIR] [MAX_STEPS]      (defaults: runs/autoencoder, 2 epochs)
//
// Run it twice: the second run continues from the first one's last checkpoint.
#include <fasttrain/fasttrain.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

// ---- the model: any torch::nn::Module ----
// A Linear and a tanh GELU, the bias and the GELU in fasttrain's fused CPU kernel (one pass each way,
// fasttrain/kernels/cpu.h) where it takes the tensors, and in fp32 the Linear through fasttrain's linear;
// ATen's ops elsewhere (a GPU, bf16 autocast).
struct LinearGeluImpl : torch::nn::Module {
  LinearGeluImpl(int64_t in, int64_t out) : linear(register_module("linear", torch::nn::Linear(in, out))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    namespace kernels = fasttrain::kernels;
    torch::Tensor pre =
        kernels::linear_takes(x, linear->weight, {})  // without the bias, which the kernel adds
            ? kernels::linear(x, linear->weight, {})  // fp32: oneDNN's matmuls each way
            : torch::linear(x, linear->weight);
    if (kernels::bias_gelu_takes(pre, linear->bias)) return kernels::bias_gelu(pre, linear->bias);
    return torch::gelu(pre + linear->bias, "tanh");
  }
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(LinearGelu);

struct AutoencoderImpl : torch::nn::Module {
  AutoencoderImpl() {
    encoder = register_module(
        "encoder",
        torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).stride(2).padding(1)),
                              torch::nn::ReLU(),  // [B, 16, 14, 14]
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).stride(2).padding(1)),
                              torch::nn::ReLU(),  // [B, 32, 7, 7]
                              torch::nn::Flatten(), torch::nn::Linear(32 * 7 * 7, 16)));
    decoder = register_module(
        "decoder",
        torch::nn::Sequential(
            LinearGelu(16, 32 * 7 * 7), torch::nn::Unflatten(torch::nn::UnflattenOptions(1, {32, 7, 7})),
            torch::nn::ConvTranspose2d(
                torch::nn::ConvTranspose2dOptions(32, 16, 4).stride(2).padding(1)),  // 14 x 14
            torch::nn::ReLU(),
            torch::nn::ConvTranspose2d(
                torch::nn::ConvTranspose2dOptions(16, 1, 4).stride(2).padding(1))));  // 28 x 28
  }
  // Two outputs by name: the reconstruction, and the code the loss keeps small.
  std::map<std::string, torch::Tensor> forward(const torch::Tensor& images) {  // [B, 1, 28, 28]
    torch::Tensor code = encoder->forward(images);                             // [B, 16]
    return {{"reconstruction", decoder->forward(code)}, {"code", code}};
  }
  torch::nn::Sequential encoder{nullptr}, decoder{nullptr};
};
TORCH_MODULE(Autoencoder);

// ---- the loss: any function of the model's output and the batch ----
// Mean squared reconstruction error plus a small L1 penalty on the code. Evaluation reports both terms;
// the sums stay on the device until the evaluation ends.
class SparseReconstruction : public fasttrain::Task {
 public:
  std::string name() const override { return "sparse_reconstruction"; }
  torch::Tensor loss(const fasttrain::ModelOutput& output, const fasttrain::Batch& batch) override {
    return mse(output, batch) + kSparsity * output.at("code").abs().mean();
  }
  std::vector<std::string> sum_names() const override { return {"mse_sum", "code_l1_sum", "count"}; }
  torch::Tensor evaluation_sums(const fasttrain::ModelOutput& output,
                                const fasttrain::Batch& batch) override {
    const double count = static_cast<double>(batch.count);
    return torch::stack(
        {mse(output, batch).to(torch::kDouble) * count,
         output.at("code").abs().mean().to(torch::kDouble) * count,
         torch::full({}, count, torch::TensorOptions().dtype(torch::kDouble).device(batch.inputs.device()))});
  }
  fasttrain::Metrics metrics(const std::vector<double>& totals) const override {
    fasttrain::Metrics metrics;
    metrics.set("mse", totals[0] / totals[2]);
    metrics.set("code_l1", totals[1] / totals[2]);
    metrics.set("loss", metrics.at("mse") + kSparsity * metrics.at("code_l1"));
    return metrics;
  }

 private:
  static torch::Tensor mse(const fasttrain::ModelOutput& output, const fasttrain::Batch& batch) {
    return torch::nn::functional::mse_loss(output.at("reconstruction").to(torch::kFloat), batch.inputs);
  }
  static constexpr double kSparsity = 1e-3;
};

int main(int argc, char** argv) {
  const std::string run_dir = argc > 1 ? argv[1] : "runs/autoencoder";
  const int64_t max_steps = argc > 2 ? std::atoll(argv[2]) : 0;
  try {
    // ---- data: Fashion-MNIST (Debian's dataset-fashion-mnist), normalised by the training set ----
    auto splits = fasttrain::load_image_dataset("fashion-mnist", "/usr/share/datasets/fashion-mnist");
    auto [mean, stddev] = fasttrain::channel_statistics(splits.train.images);
    fasttrain::DataLoader train(splits.train, fasttrain::TransformPipeline(mean, stddev),
                                fasttrain::LoaderOptions(128).seed(0));
    fasttrain::DataLoader test(splits.test, fasttrain::TransformPipeline(mean, stddev),
                               fasttrain::LoaderOptions(1000).shuffle(false).drop_last(false));

    // ---- what runs where: bf16 autocast only where this machine runs bfloat16 natively ----
    const fasttrain::Hardware hardware = fasttrain::detect_hardware(torch::kCPU);
    const torch::ScalarType precision =
        fasttrain::parse_precision(fasttrain::auto_precision(hardware).value, torch::kCPU);
    std::cout << hardware.describe() << ": training in " << fasttrain::precision_name(precision) << "\n";

    // ---- the trainer: the model, the task, the optimizer and the schedule ----
    torch::manual_seed(0);
    fasttrain::Model model(Autoencoder{});
    auto options = fasttrain::TrainOptions()
                       .epochs(2)
                       .max_steps(max_steps)
                       .clip_norm(1.0)
                       .precision(precision)
                       .eval_every_steps(max_steps > 0 ? max_steps : 0)
                       .target("mse <= 0.25");
    auto optimizer = fasttrain::make_optimizer(
        model.module().named_parameters(), fasttrain::OptimizerOptions("adamw").lr(3e-3).weight_decay(1e-4));
    auto schedule = fasttrain::make_schedule(fasttrain::ScheduleOptions("one-cycle"), 3e-3, 0.9,
                                             fasttrain::planned_steps(options, train.batches_per_epoch()));
    fasttrain::Trainer trainer(model, std::make_shared<SparseReconstruction>(), std::move(optimizer),
                               std::move(schedule), options);
    trainer.enable_ema(fasttrain::EmaOptions(0.99));
    trainer.enable_checkpoints(fasttrain::RunCheckpointOptions(run_dir + "/checkpoints").every_steps(200));

    // ---- continue an earlier run, or start a new one ----
    if (auto latest = fasttrain::latest_checkpoint(run_dir + "/checkpoints")) {
      trainer.load_checkpoint(latest->dir, train.batches_per_epoch());
      fasttrain::truncate_metrics(run_dir + "/metrics.jsonl",
                                  trainer.step());  // the records after it are redone
      std::cout << "resuming from " << latest->dir << "\n";
    } else {
      fasttrain::clear_run_dir(run_dir);  // a new run: no metrics or events of an earlier one
    }
    auto console =
        std::make_shared<fasttrain::ConsoleReporter>(fasttrain::Progress::Mode::kLines, "autoencoder");
    trainer.add_callback(
        std::make_shared<fasttrain::RunLogger>(run_dir, console));  // metrics.jsonl, TensorBoard

    const fasttrain::FitSummary summary = trainer.fit(train, &test);
    std::filesystem::create_directories(run_dir + "/final");
    fasttrain::save_module_safetensors(model.module(), run_dir + "/final/model.safetensors");
    std::cout << summary.describe() << "\n";
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 1;
  }
}
