// Tables as data: the CSV reader (data/csv.h) and the datasets "csv" and "safetensors" (data/datasets.h):
// what they read, how they split and scale, and the errors that name the file, the line and the column.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "fasttrain/data/csv.h"
#include "fasttrain/data/datasets.h"
#include "fasttrain/data/tensor_source.h"
#include "fasttrain/state/safetensors.h"
#include "support.h"

namespace fasttrain {
namespace {

using testing::contains_all;
using testing::error_message;

// A real table Debian ships (python3-vega-datasets): 1461 days of Seattle weather, 2012-2015.
const std::string kSeattle = "/usr/lib/python3/dist-packages/vega_datasets/_data/seattle-weather.csv";

#define FT_REQUIRE_SEATTLE_WEATHER()                                                               \
  if (!std::filesystem::exists(kSeattle)) {                                                        \
    GTEST_SKIP() << "needs Debian's python3-vega-datasets (scripts/install-deps) at " << kSeattle; \
  }

std::string write(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir.file(name), std::ios::binary) << text;
  return dir.file(name);
}

TEST(Csv, ReadsQuotedFieldsLineEndingsAndOnlyTheSelectedColumns) {
  testing::TempDir dir;
  // A byte order mark, CRLF and LF lines, an empty line, quoted fields with the delimiter, a doubled
  // quote and a line break inside, spaces around numbers, a last line without a line break; the column
  // "note" is text and is not asked for as numbers.
  const std::string good = write(dir, "good.csv",
                                 "\xEF\xBB\xBF"
                                 "a,note,b,label\r\n"
                                 "1,\"x, y\",2.5,cat\r\n"
                                 "\n"
                                 " -3 ,\"say \"\"hi\"\"\",+4e-1,\"dog\"\n"
                                 "5,\"two\nlines\",6,cat");
  const CsvColumns table = read_csv(good, CsvRequest().numbers({"b", "a"}).labels({"label", "note"}));
  EXPECT_EQ(table.header, (std::vector<std::string>{"a", "note", "b", "label"}));
  EXPECT_EQ(table.rows, 3);
  EXPECT_EQ(table.numbers.at("a"), (std::vector<float>{1, -3, 5}));
  EXPECT_EQ(table.numbers.at("b"), (std::vector<float>{2.5f, 0.4f, 6}));
  EXPECT_EQ(table.labels.at("label"), (std::vector<std::string>{"cat", "dog", "cat"}));
  EXPECT_EQ(table.labels.at("note"), (std::vector<std::string>{"x, y", "say \"hi\"", "two\nlines"}));
  EXPECT_EQ(read_csv_header(good), table.header);
  // Another delimiter.
  const std::string tabs = write(dir, "t.tsv", "x\ty\n1\t2\n");
  EXPECT_EQ(read_csv(tabs, CsvRequest().numbers({"y"}).delimiter('\t')).numbers.at("y"),
            (std::vector<float>{2}));
}

TEST(Csv, BadCellsAndRowsAreNamedByFileLineAndColumn) {
  testing::TempDir dir;
  auto message = [&](const std::string& text, const CsvRequest& request) {
    const std::string path = write(dir, "bad.csv", text);
    return error_message([&] { read_csv(path, request); });
  };
  const auto ab = CsvRequest().numbers({"a", "b"});
  EXPECT_TRUE(
      contains_all(message("a,b\n1,2\n3,x7\n", CsvRequest(ab).hints({{"b", "list the numeric columns"}})),
                   {"bad.csv:3", "column 'b'", "'x7'", "not a number", "list the numeric columns"}));
  EXPECT_TRUE(
      contains_all(message("a,b\n1,2\n\n3, \n", ab), {"bad.csv:4", "column 'b' is empty", "fill or drop"}));
  for (const char* value : {"nan", "NaN", "inf", "-Infinity", "1e39"}) {
    EXPECT_TRUE(contains_all(message(std::string("a,b\n1,") + value + "\n", ab),
                             {"bad.csv:2", "column 'b'", value, "not a finite number"}));
  }
  EXPECT_TRUE(contains_all(message("a,b\n1,2\n3,4,5\n", ab), {"bad.csv:3", "3 fields", "the header has 2"}));
  EXPECT_TRUE(
      contains_all(message("a;b\n1;2\n", CsvRequest().numbers({"a"})), {"no column 'a'", "data.delimiter"}));
  EXPECT_TRUE(contains_all(message("a,b\n1;2\n", ab), {"bad.csv:2", "1 fields", "data.delimiter"}));
  EXPECT_TRUE(contains_all(message("a,b\n1,2\n", CsvRequest().numbers({"c"})),
                           {"bad.csv", "no column 'c'", "its columns: a, b"}));
  EXPECT_TRUE(contains_all(message("a,a\n1,2\n", CsvRequest().numbers({"a"})), {"two columns called 'a'"}));
  EXPECT_TRUE(contains_all(message("a,b\n1,\"2\n", ab), {"bad.csv:2", "never closed"}));
  EXPECT_TRUE(
      contains_all(message("a,b\n\"1\"x,2\n", ab), {"bad.csv:2", "after a quoted field's closing quote"}));
  EXPECT_TRUE(contains_all(message("", ab), {"bad.csv", "is empty", "header row"}));
  EXPECT_TRUE(contains_all(message("a,b\n\n", ab), {"bad.csv", "header but no rows"}));
  EXPECT_TRUE(contains_all(error_message([&] { read_csv(dir.file("absent.csv"), ab); }),
                           {"absent.csv", "does not exist"}));
  // What underflows a float is its nearest float, not an error.
  EXPECT_EQ(
      read_csv(write(dir, "tiny.csv", "a\n1e-50\n-2e-45\n"), CsvRequest().numbers({"a"})).numbers.at("a"),
      (std::vector<float>{0.0f, -1.4e-45f}));
  // Columns not asked for are never read as numbers.
  EXPECT_EQ(read_csv(write(dir, "ok.csv", "a,b\n1,x\n"), CsvRequest().numbers({"a"})).numbers.at("a"),
            (std::vector<float>{1}));
}

// The data section of a config for data.dataset = "csv".
CsvDataOptions seattle(std::vector<std::string> targets, std::vector<std::string> features) {
  return CsvDataOptions().path(kSeattle).targets(std::move(targets)).features(std::move(features));
}

TEST(CsvDataset, ARealTableSplitsStandardizesAndTurnsLabelsIntoClasses) {
  FT_REQUIRE_SEATTLE_WEATHER();
  const std::vector<std::string> measured = {"precipitation", "temp_max", "temp_min", "wind"};
  const DataSplits splits = csv_splits(seattle({"weather"}, measured), {});
  ASSERT_TRUE(splits.test);
  EXPECT_EQ(splits.train->size() + splits.test->size(), 1461);
  EXPECT_EQ(splits.test->size(), 292) << "data.val_fraction 0.2 of 1461, rounded";
  EXPECT_EQ(splits.test_name, "validation");
  const DataShape shape = splits.train->shape();
  EXPECT_EQ(shape.input, (std::vector<int64_t>{4}));
  EXPECT_EQ(shape.classes, 5) << "drizzle, fog, rain, snow, sun";
  EXPECT_EQ(shape.task, "classification");
  const auto& train = dynamic_cast<const TensorSource&>(*splits.train);
  const auto& test = dynamic_cast<const TensorSource&>(*splits.test);
  // Standardized with the training rows' statistics: mean 0 and std 1 there, not exactly in the held-out
  // rows.
  const torch::Tensor x = train.tensor("inputs");
  EXPECT_LT(x.mean(0).abs().max().item<double>(), 1e-5);
  EXPECT_LT((x.std(0, /*unbiased=*/false, /*keepdim=*/false) - 1).abs().max().item<double>(), 1e-4);
  EXPECT_GT(test.tensor("inputs").mean(0).abs().max().item<double>(), 1e-3);
  // Classes in sorted order: "sun" is 4, the most frequent label (714 days).
  const torch::Tensor all = torch::cat({train.tensor("targets"), test.tensor("targets")});
  EXPECT_EQ(all.bincount().argmax().item<int64_t>(), 4);
  EXPECT_TRUE(torch::equal(all.bincount(), torch::tensor({54, 411, 259, 23, 714}, torch::kLong)));

  // The split is the seed's: the same again, another with another seed; without standardisation the
  // values are the file's (precipitation of 2012/01/02 is 10.9).
  const DataSplits again = csv_splits(seattle({"weather"}, measured), {});
  EXPECT_TRUE(
      torch::equal(dynamic_cast<const TensorSource&>(*again.test).tensor("inputs"), test.tensor("inputs")));
  const DataSplits other = csv_splits(seattle({"weather"}, measured).split_seed(1), {});
  EXPECT_FALSE(
      torch::equal(dynamic_cast<const TensorSource&>(*other.test).tensor("inputs"), test.tensor("inputs")));
  const DataSplits raw = csv_splits(seattle({"weather"}, measured).standardize(false).val_fraction(0), {});
  EXPECT_FALSE(raw.test);
  EXPECT_FLOAT_EQ(dynamic_cast<const TensorSource&>(*raw.train).tensor("inputs")[1][0].item<float>(), 10.9f);

  // Regression: a target of numbers; two targets make [2] values.
  const DataSplits temps = csv_splits(seattle({"temp_max", "temp_min"}, {"precipitation", "wind"}), {});
  EXPECT_EQ(temps.train->shape().target, (std::vector<int64_t>{2}));
  EXPECT_EQ(temps.train->shape().task, "regression");
}

TEST(CsvDataset, WhatDoesNotFitIsNamedBeforeAnyTraining) {
  FT_REQUIRE_SEATTLE_WEATHER();
  auto message = [](const CsvDataOptions& options) {
    return error_message([&] { csv_splits(options, {}); });
  };
  EXPECT_TRUE(contains_all(message(CsvDataOptions().path(kSeattle)),
                           {"data.targets must name", "date, precipitation, temp_max"}));
  EXPECT_TRUE(contains_all(message(seattle({"rain"}, {})), {"data.targets names 'rain'", "no such column"}));
  EXPECT_TRUE(contains_all(message(seattle({"weather"}, {"wind", "humidity"})),
                           {"data.features names 'humidity'", "seattle-weather.csv"}));
  EXPECT_TRUE(contains_all(message(seattle({"weather"}, {"wind", "weather"})),
                           {"'weather'", "data.features and in data.targets"}));
  // Every column that is not a target includes the dates: named, with what to do.
  EXPECT_TRUE(contains_all(message(seattle({"weather"}, {})), {"seattle-weather.csv:2", "column 'date'",
                                                               "'2012/01/01'", "list the numeric ones"}));
  EXPECT_TRUE(contains_all(
      message(seattle({"weather"}, {"wind"}).target_kind("values")),
      {"seattle-weather.csv:2", "column 'weather'", "'drizzle'", "data.target_kind = \"classes\""}));
  EXPECT_TRUE(contains_all(message(seattle({"weather", "wind"}, {"temp_max"}).target_kind("classes")),
                           {"takes one target column", "weather, wind"}));
  EXPECT_TRUE(
      contains_all(message(seattle({"weather"}, {"wind"}).path("")), {"data.path must name the file"}));
  EXPECT_TRUE(contains_all(message(seattle({"weather"}, {"wind"}).test_path("/nowhere.csv")),
                           {"data.test_path '/nowhere.csv' does not exist"}));
  // A regression target with a few bad cells is a regression with errors, not classes.
  testing::TempDir dir;
  std::string table = "x,y\n";
  for (int i = 0; i < 20; ++i) table += std::to_string(i) + "," + std::to_string(2 * i) + "\n";
  table += "20,NA\n";
  const std::string path = write(dir, "y.csv", table);
  EXPECT_TRUE(
      contains_all(message(CsvDataOptions().path(path).targets({"y"})), {"y.csv:22", "column 'y'", "'NA'"}));
  EXPECT_TRUE(contains_all(
      message(CsvDataOptions().path(write(dir, "one.csv", "x,y\n1,a\n2,a\n3,a\n")).targets({"y"})),
      {"one class only", "'a'"}));
}

TEST(TensorFileDataset, AFileOfNamedTensorsSplitsAndItsErrorsNameTheFile) {
  testing::TempDir dir;
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({50, 3}), mask = torch::rand({50, 3}) > 0.5,
                      y = torch::randint(0, 3, {50}, torch::kLong);
  save_safetensors(dir.file("d.safetensors"), {{"inputs", x}, {"mask", mask}, {"targets", y}});
  const DataSplits splits =
      tensor_file_splits(TensorFileDataOptions().path(dir.file("d.safetensors")).val_fraction(0.1), {});
  EXPECT_EQ(splits.train->size(), 45);
  EXPECT_EQ(splits.test->size(), 5);
  EXPECT_EQ(splits.train->shape().classes, 3);
  const auto& test = dynamic_cast<const TensorSource&>(*splits.test);
  EXPECT_EQ(test.tensor("mask").scalar_type(), torch::kBool);
  // The held-out rows are rows of the file, values untouched.
  bool found = false;
  for (int64_t i = 0; i < 50; ++i) found = found || torch::equal(x[i], test.tensor("inputs")[0]);
  EXPECT_TRUE(found);

  save_safetensors(dir.file("short.safetensors"), {{"inputs", x}, {"targets", y.slice(0, 0, 40)}});
  EXPECT_TRUE(contains_all(error_message([&] {
                             tensor_file_splits(TensorFileDataOptions().path(dir.file("short.safetensors")),
                                                {});
                           }),
                           {"short.safetensors", "'targets'", "50 samples"}));
  save_safetensors(dir.file("other.safetensors"), {{"inputs", x}, {"targets", y}});
  EXPECT_TRUE(contains_all(
      error_message([&] {
        tensor_file_splits(
            TensorFileDataOptions().path(dir.file("d.safetensors")).test_path(dir.file("other.safetensors")),
            {});
      }),
      {"other.safetensors", "inputs, targets", "inputs, mask, targets"}));
  EXPECT_TRUE(contains_all(error_message([&] {
                             tensor_file_splits(TensorFileDataOptions().path(dir.file("none.safetensors")),
                                                {});
                           }),
                           {"data.path", "none.safetensors", "does not exist"}));
}

}  // namespace
}  // namespace fasttrain
