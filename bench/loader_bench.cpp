// Loader throughput on the Fashion-MNIST train set: batch 256, RandomCrop(padding 2) + HorizontalFlip +
// normalise, one JSON line per worker count. The peer is bench/loader_peer.py (torch DataLoader);
// bench/loader_compare.sh runs both.
//
//   loader_bench [--data DIR] [--workers 0,2] [--epochs 1] [--batch-size 256] [--seed 0]
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "fasttrain/data/dataset.h"
#include "fasttrain/data/loader.h"
#include "fasttrain/data/transforms.h"
#include "fasttrain/util/check.h"

namespace {

struct Args {
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::vector<int> workers = {0, 2};
  int epochs = 1;
  int64_t batch_size = 256;
  uint64_t seed = 0;
};

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) values.push_back(std::stoi(item));
  FT_CHECK(!values.empty(), "--workers needs a comma-separated list of counts, got '{}'", text);
  return values;
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    FT_CHECK(i + 1 < argc, "{} needs a value", key);
    const std::string value = argv[++i];
    if (key == "--data") {
      args.data = value;
    } else if (key == "--workers") {
      args.workers = parse_list(value);
    } else if (key == "--epochs") {
      args.epochs = std::stoi(value);
    } else if (key == "--batch-size") {
      args.batch_size = std::stoll(value);
    } else if (key == "--seed") {
      args.seed = std::stoull(value);
    } else {
      FT_FAIL("unknown option '{}'; valid: --data, --workers, --epochs, --batch-size, --seed", key);
    }
  }
  FT_CHECK(args.epochs >= 1, "--epochs must be >= 1, got {}", args.epochs);
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    const fasttrain::ImageSplits splits = fasttrain::load_image_dataset("fashion-mnist", args.data);
    const auto pipeline = fasttrain::TransformPipeline({0.2860f}, {0.3530f})
                              .add(std::make_shared<fasttrain::RandomCrop>(2))
                              .add(std::make_shared<fasttrain::HorizontalFlip>(0.5));
    for (int workers : args.workers) {
      // drop_last(false): every sample of the epoch is produced, as torch's DataLoader default does.
      fasttrain::DataLoader loader(splits.train, pipeline,
                                   fasttrain::LoaderOptions(args.batch_size)
                                       .workers(workers)
                                       .shuffle(true)
                                       .drop_last(false)
                                       .seed(args.seed));
      int64_t samples = 0;
      double checksum = 0;  // keeps the consumer honest: every batch is read
      const auto begin = std::chrono::steady_clock::now();
      for (int epoch = 0; epoch < args.epochs; ++epoch) {
        loader.start_epoch(epoch);
        while (auto batch = loader.next()) {
          samples += batch->targets.size(0);
          checksum += batch->inputs.data_ptr<float>()[0];
        }
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      std::cout
          << fmt::format(
                 "{{\"bench\": \"loader\", \"impl\": \"fasttrain\", \"workers\": {}, \"batch_size\": {}, "
                 "\"epochs\": {}, \"samples\": {}, \"seconds\": {:.4f}, \"samples_per_s\": {:.1f}, "
                 "\"wait_s\": {:.4f}, \"checksum\": {:.4f}}}",
                 loader.workers(), args.batch_size, args.epochs, samples, seconds, samples / seconds,
                 loader.wait_seconds(), checksum)
          << std::endl;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
