// The table datasets: data.dataset = "csv" (a CSV file's numeric columns) and "safetensors" (a file of
// named tensors). Both end as TensorSources, split into training and held-out rows the same way.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include "fasttrain/data/csv.h"
#include "fasttrain/data/datasets.h"
#include "fasttrain/data/tensor_source.h"
#include "fasttrain/state/safetensors.h"
#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

using Tensors = std::map<std::string, torch::Tensor>;

// Samples [N, ...] of every tensor split in two: `fraction` of them (at least one) held out, drawn by a
// Fisher-Yates shuffle of std::mt19937_64(seed), which the standard fixes: the same rows on every
// machine and LibTorch. Each side keeps the file's row order.
std::pair<Tensors, Tensors> hold_out(const Tensors& tensors, int64_t rows, double fraction, int64_t seed,
                                     const std::string& what) {
  const auto held =
      std::max<int64_t>(1, static_cast<int64_t>(std::llround(fraction * static_cast<double>(rows))));
  FT_CONFIG_CHECK(
      held < rows,
      "data.val_fraction = {} holds out {} of the {} samples of {}, which leaves none to train on", fraction,
      held, rows, what);
  std::vector<int64_t> order(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) order[static_cast<size_t>(i)] = i;
  std::mt19937_64 draw(static_cast<uint64_t>(seed));
  for (int64_t i = rows - 1; i > 0; --i)
    std::swap(order[static_cast<size_t>(i)], order[draw() % static_cast<uint64_t>(i + 1)]);
  std::sort(order.begin(), order.begin() + held);
  std::sort(order.begin() + held, order.end());
  const torch::Tensor index = torch::tensor(order, torch::kLong);
  Tensors train, test;
  for (const auto& [name, tensor] : tensors) {
    test[name] = tensor.index_select(0, index.slice(0, 0, held));
    train[name] = tensor.index_select(0, index.slice(0, held));
  }
  return {train, test};
}

// --- csv ---------------------------------------------------------------------------------------------

void require_columns(const std::vector<std::string>& header, const std::vector<std::string>& names,
                     const char* key, const std::string& path) {
  for (const auto& name : names) {
    FT_CONFIG_CHECK(std::find(header.begin(), header.end(), name) != header.end(),
                    "{} names '{}', but '{}' has no such column; its columns: {}", key, name, path,
                    fmt::join(header, ", "));
  }
}

// The columns the run reads: data.features (or every column that is not a target) and data.targets.
std::vector<std::string> feature_columns(const CsvDataOptions& options,
                                         const std::vector<std::string>& header) {
  FT_CONFIG_CHECK(!options.targets().empty(),
                  "data.targets must name the column(s) to predict when data.dataset = \"csv\"; '{}' has: {}",
                  options.path(), fmt::join(header, ", "));
  require_columns(header, options.targets(), "data.targets", options.path());
  require_columns(header, options.features(), "data.features", options.path());
  const auto& targets = options.targets();
  auto is_target = [&](const std::string& name) {
    return std::find(targets.begin(), targets.end(), name) != targets.end();
  };
  std::vector<std::string> features;
  for (const auto& name : options.features().empty() ? header : options.features()) {
    FT_CONFIG_CHECK(options.features().empty() || !is_target(name),
                    "column '{}' is in data.features and in data.targets: a model would be given its answer",
                    name);
    if (!is_target(name)) features.push_back(name);
  }
  FT_CONFIG_CHECK(!features.empty(), "'{}' has no column left for features once data.targets are taken",
                  options.path());
  return features;
}

// What a table's rows hold once read: the features and the targets as text (kinds are decided after).
struct CsvRows {
  torch::Tensor features;                         // [N, F] float
  std::vector<std::vector<std::string>> targets;  // by target column, a cell per row
  std::string path;
};

CsvRows read_rows(const std::string& path, const std::vector<std::string>& features,
                  const CsvDataOptions& options) {
  CsvHints hints;
  for (const auto& name : features) {
    hints[name] =
        options.features().empty()
            ? "data.features is every column that is not a target: list the numeric ones to leave it out"
            : "data.features must name columns of numbers";
  }
  const CsvColumns table = read_csv(path, CsvRequest()
                                              .numbers(features)
                                              .labels(options.targets())
                                              .delimiter(options.delimiter()[0])
                                              .hints(std::move(hints)));
  CsvRows rows;
  rows.path = path;
  rows.features = torch::empty({table.rows, static_cast<int64_t>(features.size())}, torch::kFloat);
  for (size_t f = 0; f < features.size(); ++f)
    rows.features.select(1, static_cast<int64_t>(f))
        .copy_(torch::from_blob(const_cast<float*>(table.numbers.at(features[f]).data()), {table.rows},
                                torch::kFloat));
  for (const auto& name : options.targets()) rows.targets.push_back(table.labels.at(name));
  return rows;
}

// A target column of numbers: [N] floats, or the first cell that is not one, named with its file and line.
torch::Tensor target_values(const CsvRows& rows, size_t column, const CsvDataOptions& options) {
  const auto& cells = rows.targets[column];
  torch::Tensor values = torch::empty({static_cast<int64_t>(cells.size())}, torch::kFloat);
  float* out = values.data_ptr<float>();
  for (size_t i = 0; i < cells.size(); ++i) {
    if (parse_csv_number(cells[i], out[i])) continue;
    // Read again as numbers for the cell's line and what is wrong with it.
    read_csv(rows.path,
             CsvRequest()
                 .numbers({options.targets()[column]})
                 .delimiter(options.delimiter()[0])
                 .hints({{options.targets()[column],
                          "a target of regression must hold numbers (data.target_kind = \"classes\" "
                          "takes labels)"}}));
    FT_FAIL("'{}': target column '{}' holds '{}', which is not a number", rows.path,
            options.targets()[column], cells[i]);
  }
  return values;
}

bool all_numbers(const std::vector<std::string>& cells) {
  float ignored = 0;
  return std::all_of(cells.begin(), cells.end(),
                     [&](const std::string& cell) { return parse_csv_number(cell, ignored); });
}

// The classes of a label column over every split: its distinct values, numerically sorted where they are
// all numbers ("2" before "10"), else in byte order.
std::vector<std::string> class_labels(const std::vector<const CsvRows*>& splits) {
  std::set<std::string> distinct;
  for (const CsvRows* rows : splits) distinct.insert(rows->targets[0].begin(), rows->targets[0].end());
  std::vector<std::string> labels(distinct.begin(), distinct.end());
  if (all_numbers(labels)) {
    std::stable_sort(labels.begin(), labels.end(), [](const std::string& a, const std::string& b) {
      float x = 0, y = 0;
      parse_csv_number(a, x);
      parse_csv_number(b, y);
      return x < y;
    });
  }
  return labels;
}

torch::Tensor class_ids(const CsvRows& rows, const std::vector<std::string>& labels) {
  std::map<std::string, int64_t> id;
  for (size_t i = 0; i < labels.size(); ++i) id[labels[i]] = static_cast<int64_t>(i);
  torch::Tensor ids = torch::empty({static_cast<int64_t>(rows.targets[0].size())}, torch::kLong);
  int64_t* out = ids.data_ptr<int64_t>();
  for (size_t i = 0; i < rows.targets[0].size(); ++i) out[i] = id.at(rows.targets[0][i]);
  return ids;
}

// "classes" or "values" for target_kind = "auto": a single target column of text holds labels.
std::string target_kind(const CsvDataOptions& options, const std::vector<const CsvRows*>& splits) {
  if (options.target_kind() != "auto") return options.target_kind();
  bool numbers = true;
  for (const CsvRows* rows : splits)
    for (const auto& column : rows->targets) numbers = numbers && all_numbers(column);
  if (numbers || options.targets().size() > 1) return "values";  // several columns: each cell is checked
  // A column of numbers with a few bad cells is a regression target with errors, not thousands of classes.
  const auto& cells = splits[0]->targets[0];
  float ignored = 0;
  const auto numeric = std::count_if(cells.begin(), cells.end(),
                                     [&](const std::string& c) { return parse_csv_number(c, ignored); });
  return 2 * numeric > static_cast<int64_t>(cells.size()) ? "values" : "classes";
}

Tensors csv_tensors(const CsvRows& rows, const std::string& kind, const std::vector<std::string>& labels,
                    const CsvDataOptions& options) {
  Tensors tensors{{"inputs", rows.features}};
  if (kind == "classes") {
    tensors["targets"] = class_ids(rows, labels);
    return tensors;
  }
  std::vector<torch::Tensor> columns;
  for (size_t c = 0; c < rows.targets.size(); ++c) columns.push_back(target_values(rows, c, options));
  tensors["targets"] = torch::stack(columns, 1);  // [N, K]
  return tensors;
}

// Each feature to mean 0 and std 1 with the training rows' statistics; a constant feature is only centred.
void standardize(Tensors& train, Tensors* test) {
  const torch::Tensor mean = train["inputs"].mean(0, true);
  torch::Tensor std = train["inputs"].std(0, /*unbiased=*/false, /*keepdim=*/true);
  std = torch::where(std > 0, std, torch::ones_like(std));
  train["inputs"] = (train["inputs"] - mean) / std;
  if (test) (*test)["inputs"] = ((*test)["inputs"] - mean) / std;
}

void check_file(const std::string& path, const char* key, const char* dataset) {
  FT_CONFIG_CHECK(!path.empty(), "{} must name the file when data.dataset = \"{}\"", key, dataset);
  FT_CONFIG_CHECK(std::filesystem::is_regular_file(path), "{} '{}' does not exist (or is not a file)", key,
                  path);
}

}  // namespace

KeyRule<std::string> one_delimiter() {
  return KeyRule<std::string>([](const std::string& name, const std::string& value) {
    FT_CONFIG_CHECK(value.size() == 1 && value != "\"" && value != "\n" && value != "\r",
                    "{} must be one character other than a quote or a line break, got '{}'", name, value);
  });
}

DataSplits csv_splits(const CsvDataOptions& options, const DataRequest&) {
  check_file(options.path(), "data.path", "csv");
  if (!options.test_path().empty()) check_file(options.test_path(), "data.test_path", "csv");
  const std::vector<std::string> features =
      feature_columns(options, read_csv_header(options.path(), options.delimiter()[0]));
  const CsvRows train_rows = read_rows(options.path(), features, options);
  std::optional<CsvRows> test_rows;
  if (!options.test_path().empty()) test_rows = read_rows(options.test_path(), features, options);
  std::vector<const CsvRows*> all{&train_rows};
  if (test_rows) all.push_back(&*test_rows);

  const std::string kind = target_kind(options, all);
  FT_CONFIG_CHECK(kind != "classes" || options.targets().size() == 1,
                  "data.target_kind = \"classes\" takes one target column, data.targets names {}: {}",
                  options.targets().size(), fmt::join(options.targets(), ", "));
  const std::vector<std::string> labels = kind == "classes" ? class_labels(all) : std::vector<std::string>{};
  FT_CONFIG_CHECK(kind != "classes" || labels.size() >= 2,
                  "target column '{}' of '{}' holds one class only ('{}'): there is nothing to classify",
                  options.targets()[0], options.path(), labels.empty() ? "" : labels[0]);

  Tensors train = csv_tensors(train_rows, kind, labels, options), test;
  DataSplits splits;
  if (test_rows) {
    test = csv_tensors(*test_rows, kind, labels, options);
  } else if (options.val_fraction() > 0) {
    std::tie(train, test) = hold_out(train, train_rows.features.size(0), options.val_fraction(),
                                     options.split_seed(), options.path());
    splits.test_name = "validation";
  }
  if (options.standardize()) standardize(train, test.empty() ? nullptr : &test);
  const auto classes = static_cast<int64_t>(labels.size());
  splits.train = std::make_shared<TensorSource>(
      train, fmt::format("the training rows of '{}'", options.path()), classes);
  if (!test.empty()) {
    splits.test =
        std::make_shared<TensorSource>(test,
                                       fmt::format("the {} rows of '{}'", splits.test_name,
                                                   test_rows ? options.test_path() : options.path()),
                                       classes);
  }
  return splits;
}

// --- safetensors -------------------------------------------------------------------------------------

DataSplits tensor_file_splits(const TensorFileDataOptions& options, const DataRequest&) {
  check_file(options.path(), "data.path", "safetensors");
  if (!options.test_path().empty()) check_file(options.test_path(), "data.test_path", "safetensors");
  auto tensors_of = [](const std::string& path) {
    Tensors tensors;
    const SafetensorsFile file = load_safetensors(path);
    for (const auto& [name, tensor] : file.tensors()) tensors[name] = tensor;
    return tensors;
  };
  const std::string what = fmt::format("data.path '{}'", options.path());
  Tensors train = tensors_of(options.path()), test;
  const TensorSource whole(train, what);  // the tensors' rules (inputs, one length) before any split
  int64_t classes = whole.shape().classes;
  DataSplits splits;
  if (!options.test_path().empty()) {
    test = tensors_of(options.test_path());
    auto names = [](const Tensors& tensors) {
      std::vector<std::string> list;
      for (const auto& item : tensors) list.push_back(item.first);
      return list;
    };
    FT_CONFIG_CHECK(names(test) == names(train),
                    "data.test_path '{}' holds the tensors {}, data.path '{}' holds {}: "
                    "the evaluation needs the same ones",
                    options.test_path(), fmt::join(names(test), ", "), options.path(),
                    fmt::join(names(train), ", "));
    classes =
        std::max(classes, TensorSource(test, "data.test_path '" + options.test_path() + "'").shape().classes);
  } else if (options.val_fraction() > 0) {
    std::tie(train, test) = hold_out(train, whole.size(), options.val_fraction(), options.split_seed(), what);
    splits.test_name = "validation";
  }
  splits.train = std::make_shared<TensorSource>(train, what, classes);
  if (!test.empty()) {
    splits.test = std::make_shared<TensorSource>(
        test, options.test_path().empty() ? what : "data.test_path '" + options.test_path() + "'", classes);
  }
  return splits;
}

}  // namespace fasttrain
