#pragma once
// Datasets by name (data.dataset): each loads its training and evaluation splits as batch sources,
// from keys of its own in [data]. Built in: fashion-mnist, mnist, idx (IDX image files, with
// normalisation and augmentation), text (byte-level documents for a sequence model), csv (a table's
// numeric columns, for regression or classification) and safetensors (a file of named tensors). A program
// adds its own with one registration, and `[data] dataset = "mine"` then loads it:
//
//   struct MyDataOptions { FT_KEYS(MyDataOptions); FT_KEY(std::string, path, "CSV file") = ""; };
//   fasttrain::dataset_registry().add("mine", "my sensor logs",
//       fasttrain::dataset_recipe<MyDataOptions>([](const MyDataOptions& o, const fasttrain::DataRequest&) {
//         return fasttrain::DataSplits{load_train(o.path()), load_test(o.path())};
//       }));
#include <functional>
#include <memory>
#include <string>

#include "fasttrain/data/batch_source.h"
#include "fasttrain/data/text.h"
#include "fasttrain/util/key.h"
#include "fasttrain/util/registry.h"

namespace fasttrain {

// A dataset's splits. The loader takes the batches from them; the model and the task read train's shape().
struct DataSplits {
  std::shared_ptr<const BatchSource> train;
  std::shared_ptr<const BatchSource> test;  // null: no evaluation
  std::string test_name = "test";           // what reports call the evaluation split ("validation")
};

// What loading needs beyond the dataset's keys: facts of the model it is for.
struct DataRequest {
  // The longest sequence the model takes (a sequence model's recipe says: gpt's model.context); 0: the
  // model takes no sequences.
  int64_t sequence_length = 0;
};

// A registered dataset: its keys with their defaults, and how it loads from them.
struct DatasetRecipe {
  AnyOptions options;
  std::function<DataSplits(const AnyOptions& options, const DataRequest& request)> load;
};

// The registry behind data.dataset, with the built-in datasets.
Registry<DatasetRecipe>& dataset_registry();

// A recipe from a typed loader; the options' rules are checked (as "data.<key>") before it runs.
template <typename Options>
DatasetRecipe dataset_recipe(std::function<DataSplits(const Options&, const DataRequest&)> load) {
  return {AnyOptions::of(Options()), [load](const AnyOptions& options, const DataRequest& request) {
            options.check("data");
            return load(options.as<Options>(), request);
          }};
}

// [data] keys of the image datasets (fashion-mnist, mnist, idx).
struct ImageDataOptions {
  FT_KEYS(ImageDataOptions);
  FT_KEY(std::string, path,
         "Directory with train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
         "t10k-labels-idx1-ubyte (each optionally .gz); \"\" = /usr/share/datasets/<dataset>") = "";
  FT_KEY(bool, normalize,
         "Normalize with the training set's per-channel mean and std (else scale to [0, 1])") = true;
  FT_KEY(int, crop_padding, "Random crop after zero padding by this many pixels (0 = off)", at_least(0)) = 0;
  FT_KEY(double, hflip, "Probability of a horizontal flip (0 = off)", in_unit_interval()) = 0.0;
  FT_KEY(int64_t, train_limit, "Train on the first N samples only (0 = all)", at_least(0)) = 0;
};

// [data] keys of text (byte-level documents; data/text.h).
struct TextDataOptions {
  FT_KEYS(TextDataOptions);
  FT_KEY(std::string, path, "A directory of documents (walked recursively) or one file") = "";
  FT_KEY(std::string, include, "Shell pattern of the file names that are documents, such as \"*.py\"") = "*";
  FT_KEY(double, val_fraction,
         "Fraction of the documents held out for validation (chosen by a hash of their path)",
         in_open_unit_interval()) = 0.05;
  FT_KEY(std::string, batching,
         "windows (data.batch_size random windows of the model's sequence length) or tokens (whole documents "
         "cut at the sequence length, batched by token count with length bucketing and padding)",
         one_of({"windows", "tokens"})) = "windows";
  FT_KEY(int64_t, max_tokens,
         "batching = tokens: tokens per batch, padding included (>= the sequence length); 0 = no bucketing: "
         "data.batch_size documents per batch in random order",
         at_least(0)) = 4096;
};

// The held-out split of the table datasets (csv, safetensors): their keys' help.
inline constexpr const char* kValFractionHelp =
    "Without data.test_path, the fraction of the samples held out for validation, drawn by "
    "data.split_seed (0 = no evaluation)";
inline constexpr const char* kSplitSeedHelp = "The seed of the held-out samples' draw";
// data.delimiter: one character that can separate fields.
KeyRule<std::string> one_delimiter();

// [data] keys of csv: a table with a header row, one sample per row (data/csv.h reads it).
struct CsvDataOptions {
  FT_KEYS(CsvDataOptions);
  FT_KEY(std::string, path, "The CSV file: a header row naming the columns, then one sample per row") = "";
  FT_KEY(std::vector<std::string>, targets, "The column(s) to predict, by name") = {};
  FT_KEY(
      std::vector<std::string>, features,
      "The input columns, by name ([] = every column that is not a target); other columns are not read") = {};
  FT_KEY(std::string, target_kind,
         "auto (targets of numbers are values to regress, a target of text holds class labels), values "
         "(regression on the target columns), or classes (one target column; its distinct values, in sorted "
         "order, are the classes 0, 1, ...)",
         one_of({"auto", "values", "classes"})) = "auto";
  FT_KEY(std::string, test_path,
         "A CSV file with the same columns to evaluate on (\"\" = hold out data.val_fraction of the rows)") =
      "";
  FT_KEY(double, val_fraction, kValFractionHelp, below_one()) = 0.2;
  FT_KEY(int64_t, split_seed, kSplitSeedHelp, at_least(0)) = 0;
  FT_KEY(bool, standardize,
         "Scale each feature to mean 0 and std 1 with the training rows' statistics (the held-out rows "
         "use the same)") = true;
  FT_KEY(std::string, delimiter, "The field delimiter, one character (\"\\t\" for tab-separated files)",
         one_delimiter()) = ",";
};

// [data] keys of safetensors: a program's own tensors, exported to a file ("bring your tensors").
struct TensorFileDataOptions {
  FT_KEYS(TensorFileDataOptions);
  FT_KEY(std::string, path,
         "A .safetensors file of named tensors with the samples along their first dimension: "
         "\"inputs\", usually \"targets\", and any tensor a model or task reads by name") = "";
  FT_KEY(std::string, test_path,
         "A file with the same tensors to evaluate on (\"\" = hold out data.val_fraction of the "
         "samples)") = "";
  FT_KEY(double, val_fraction, kValFractionHelp, below_one()) = 0.2;
  FT_KEY(int64_t, split_seed, kSplitSeedHelp, at_least(0)) = 0;
};

// The splits of data.dataset = "csv": features [F] float; targets [K] float (values) or a class id.
DataSplits csv_splits(const CsvDataOptions& options, const DataRequest& request);
// The splits of data.dataset = "safetensors": the file's tensors as they are (data/tensor_source.h).
DataSplits tensor_file_splits(const TensorFileDataOptions& options, const DataRequest& request);

// The image splits of `options` (normalisation from the training split; augmentation on it only).
DataSplits image_splits(const ImageSplits& images, const ImageDataOptions& options);

}  // namespace fasttrain
