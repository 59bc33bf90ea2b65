#include "fasttrain/data/datasets.h"

#include <torch/torch.h>

#include <filesystem>

#include "fasttrain/data/dataset.h"
#include "fasttrain/data/transforms.h"
#include "fasttrain/util/check.h"

namespace fasttrain {

namespace {

// Normalisation statistics come from the training set (identity when data.normalize is off); both
// splits share them.
std::pair<std::vector<float>, std::vector<float>> normalisation(const ImageDataOptions& options,
                                                                const ImageDataset& train) {
  if (options.normalize()) return channel_statistics(train.images);
  return {std::vector<float>(train.channels(), 0.0f), std::vector<float>(train.channels(), 1.0f)};
}

TransformPipeline make_pipeline(const ImageDataOptions& options,
                                const std::pair<std::vector<float>, std::vector<float>>& stats,
                                bool augment) {
  TransformPipeline pipeline(stats.first, stats.second);
  if (augment && options.crop_padding() > 0)
    pipeline.add(std::make_shared<RandomCrop>(options.crop_padding()));
  if (augment && options.hflip() > 0) pipeline.add(std::make_shared<HorizontalFlip>(options.hflip()));
  return pipeline;
}

// An IDX image dataset called `name`: its files under data.path, or /usr/share/datasets/<name>.
DatasetRecipe image_dataset(const std::string& name) {
  return dataset_recipe<ImageDataOptions>([name](const ImageDataOptions& options, const DataRequest&) {
    FT_CONFIG_CHECK(name != "idx" || !options.path().empty(),
                    "data.path must name the IDX directory when data.dataset = \"idx\"");
    const std::string path = options.path().empty() ? "/usr/share/datasets/" + name : options.path();
    FT_CONFIG_CHECK(
        std::filesystem::is_directory(path), "data.path '{}' is not a directory{}", path,
        options.path().empty() ? " (install Debian's dataset-" + name + " package or set data.path)" : "");
    return image_splits(load_image_dataset(name, path), options);
  });
}

DataSplits text_splits(const TextDataOptions& options, const DataRequest& request) {
  FT_CONFIG_CHECK(!options.path().empty(),
                  "data.path must name a directory of documents (or one file) when data.dataset = \"text\"");
  FT_CONFIG_CHECK(std::filesystem::exists(options.path()), "data.path '{}' does not exist", options.path());
  FT_CONFIG_CHECK(request.sequence_length > 0,
                  "data.dataset = \"text\" cuts sequences of the model's length, but this model takes no "
                  "sequences: use a sequence model (model.name = \"gpt\")");
  const TextSplits text = load_text_corpus(
      TextCorpusOptions(options.path()).include(options.include()).val_fraction(options.val_fraction()));
  const int64_t context = request.sequence_length;
  DataSplits splits;
  splits.test_name = "validation";
  if (options.batching() == "windows") {
    splits.train = std::make_shared<TextWindowSource>(text.train, context);
    splits.test = std::make_shared<TextWindowSource>(text.validation, context);
  } else {
    check_token_budget(options.max_tokens(), context);
    const auto documents = TextDocumentOptions(context).max_tokens(options.max_tokens());
    splits.train = std::make_shared<TextDocumentSource>(text.train, documents);
    splits.test = std::make_shared<TextDocumentSource>(text.validation, documents);
  }
  return splits;
}

}  // namespace

DataSplits image_splits(const ImageSplits& images, const ImageDataOptions& options) {
  ImageDataset train = images.train;
  if (options.train_limit() > 0) {
    FT_CONFIG_CHECK(options.train_limit() <= train.size(),
                    "data.train_limit {} exceeds the {} training samples", options.train_limit(),
                    train.size());
    train = train.head(options.train_limit());
  }
  const auto stats = normalisation(options, train);
  DataSplits splits;
  splits.train = std::make_shared<ImageBatchSource>(train, make_pipeline(options, stats, /*augment=*/true));
  splits.test =
      std::make_shared<ImageBatchSource>(images.test, make_pipeline(options, stats, /*augment=*/false));
  return splits;
}

Registry<DatasetRecipe>& dataset_registry() {
  static Registry<DatasetRecipe> registry = [] {
    Registry<DatasetRecipe> datasets("data.dataset");
    datasets.add("fashion-mnist", "Fashion-MNIST (Debian's dataset-fashion-mnist): 28x28 clothes, 10 classes",
                 image_dataset("fashion-mnist"));
    datasets.add("mnist", "MNIST digits in IDX files", image_dataset("mnist"));
    datasets.add("idx", "any MNIST-format IDX image files under data.path", image_dataset("idx"));
    datasets.add("text", "byte-level documents for a sequence model (model.name = \"gpt\")",
                 dataset_recipe<TextDataOptions>(text_splits));
    datasets.add(
        "csv",
        "a CSV table's numeric columns: data.targets to predict (values or class labels) from data.features",
        dataset_recipe<CsvDataOptions>(csv_splits));
    datasets.add("safetensors",
                 "a .safetensors file of named tensors: \"inputs\", \"targets\" and any other a model reads",
                 dataset_recipe<TensorFileDataOptions>(tensor_file_splits));
    return datasets;
  }();
  return registry;
}

}  // namespace fasttrain
