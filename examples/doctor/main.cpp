// `fasttrain doctor` on your own model: measure a short run of it, and read which techniques of the
// playbook it needs, ranked, each with the measurement behind it. The model here is a conv net written
// the way many are (a bias on each convolution before its BatchNorm, the layers in a Stage so that
// activation checkpointing and fully sharded training can cut it into blocks); the data is the registered
// fashion-mnist, so only the model is ours.
//
//   doctor [OUT_DIR] [STEPS] [MIN_SECONDS]      (defaults: runs/doctor, 20, 2)
#include <fasttrain/fasttrain.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>

struct MyConvNetImpl : torch::nn::Module {
  explicit MyConvNetImpl(int64_t classes) {
    // Conv2dOptions' default bias = true: a bias before each BatchNorm.
    layers = register_module(
        "layers",
        fasttrain::Stage(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 24, 3).padding(1)),
                         torch::nn::BatchNorm2d(24), torch::nn::ReLU(), torch::nn::MaxPool2d(2),  // 14 x 14
                         torch::nn::Conv2d(torch::nn::Conv2dOptions(24, 48, 3).padding(1)),
                         torch::nn::BatchNorm2d(48), torch::nn::ReLU(), torch::nn::MaxPool2d(2),  // 7 x 7
                         torch::nn::Flatten(), torch::nn::Linear(48 * 7 * 7, 100), torch::nn::ReLU(),
                         torch::nn::Linear(100, classes)));
  }
  torch::Tensor forward(const torch::Tensor& images) { return layers->forward(images); }
  fasttrain::Stage layers{nullptr};
};
TORCH_MODULE(MyConvNet);

// The doctor builds several runs of the config, each with one switch flipped; the builder makes the model.
struct MyRun : fasttrain::RunBuilder {
  fasttrain::Model model(const fasttrain::Config&, const fasttrain::DataShape& shape) override {
    return fasttrain::Model(MyConvNet(shape.classes));
  }
};

int main(int argc, char** argv) {
  const std::string out_dir = argc > 1 ? argv[1] : "runs/doctor";
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 20;
  const double min_seconds = argc > 3 ? std::atof(argv[3]) : 2.0;
  try {
    fasttrain::Config config;  // fashion-mnist, the task it implies (classification), adam at a constant LR
    config.data.batch_size(32);
    config.train.threads(0).precision("auto");
    auto console = std::make_shared<fasttrain::ConsoleReporter>(fasttrain::Progress::Mode::kLines, "doctor");
    MyRun builder;
    const fasttrain::DoctorReport report =
        fasttrain::diagnose(builder, config, out_dir,
                            fasttrain::DoctorOptions().measure(fasttrain::MeasureOptions()
                                                                   .steps(steps)
                                                                   .warmup_steps(3)
                                                                   .min_seconds(min_seconds)
                                                                   .reporter(console)));
    std::cout << report.text();
    fasttrain::write_json_file(out_dir + "/doctor.json", report.to_json());
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 1;
  }
}
