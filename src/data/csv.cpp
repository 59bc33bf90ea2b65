#include "fasttrain/data/csv.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>

#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

std::string read_whole_file(const std::string& path) {
  FT_CHECK(std::filesystem::is_regular_file(path), "the CSV file '{}' does not exist (or is not a file)",
           path);
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "cannot open the CSV file '{}'", path);
  std::string text(static_cast<size_t>(std::filesystem::file_size(path)), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  FT_CHECK(in.gcount() == static_cast<std::streamsize>(text.size()), "cannot read the CSV file '{}'", path);
  return text;
}

// Yields a CSV text's records one at a time, as views of their fields.
class CsvScanner {
 public:
  CsvScanner(std::string_view text, char delimiter, const std::string& path)
      : text_(text), delimiter_(delimiter), path_(path) {
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;  // a UTF-8 byte order mark (spreadsheets write one)
  }

  // The next non-empty record's fields (valid until the next call); false at the end of the text.
  bool next_record(std::vector<std::string_view>& fields) {
    skip_empty_lines();
    if (pos_ >= text_.size()) return false;
    record_line_ = line_;
    fields.clear();
    unquoted_.clear();
    while (true) {
      fields.push_back(text_[pos_] == '"' ? quoted_field() : plain_field());
      if (pos_ >= text_.size()) return true;
      if (text_[pos_] == delimiter_) {
        ++pos_;
        if (pos_ >= text_.size()) {  // "a,b," at the end of the text: an empty last field
          fields.emplace_back();
          return true;
        }
        continue;
      }
      end_line();
      return true;
    }
  }
  int64_t record_line() const { return record_line_; }

 private:
  bool at_line_end() const {
    return text_[pos_] == '\n' || (text_[pos_] == '\r' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n');
  }
  void end_line() {
    pos_ += text_[pos_] == '\r' ? 2 : 1;
    ++line_;
  }
  void skip_empty_lines() {
    while (pos_ < text_.size() && at_line_end()) end_line();
  }
  std::string_view plain_field() {
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != delimiter_ && !at_line_end()) ++pos_;
    return text_.substr(start, pos_ - start);
  }
  // "..." with "" for a quote; line breaks inside count as lines.
  std::string_view quoted_field() {
    const int64_t opened = line_;
    std::string& value = unquoted_.emplace_back();
    for (++pos_;; ++pos_) {
      FT_CHECK(pos_ < text_.size(), "{}:{}: a quoted field opened on this line is never closed", path_,
               opened);
      const char c = text_[pos_];
      if (c == '"') {
        if (pos_ + 1 < text_.size() && text_[pos_ + 1] == '"') {
          value += '"';
          ++pos_;
          continue;
        }
        ++pos_;
        break;
      }
      if (c == '\n') ++line_;
      value += c;
    }
    FT_CHECK(
        pos_ >= text_.size() || text_[pos_] == delimiter_ || at_line_end(),
        "{}:{}: text after a quoted field's closing quote (a quote inside a quoted field is written \"\")",
        path_, line_);
    return value;
  }

  std::string_view text_;
  char delimiter_;
  const std::string& path_;
  size_t pos_ = 0;
  int64_t line_ = 1;
  int64_t record_line_ = 1;
  std::deque<std::string> unquoted_;  // the current record's quoted fields, unescaped
};

std::string_view trimmed(std::string_view cell) {
  while (!cell.empty() && (cell.front() == ' ' || cell.front() == '\t')) cell.remove_prefix(1);
  while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\t')) cell.remove_suffix(1);
  return cell;
}

enum class Cell { kNumber, kEmpty, kNotANumber, kNotFinite };

Cell parse_number(std::string_view cell, float& out) {
  cell = trimmed(cell);
  if (cell.empty()) return Cell::kEmpty;
  if (cell.front() == '+') cell.remove_prefix(1);  // from_chars takes no plus sign
  float value = 0;  // rounded once, to the nearest float (a double first would round twice)
  const auto [end, error] = std::from_chars(cell.data(), cell.data() + cell.size(), value);
  if (error == std::errc::result_out_of_range) {  // past float's range, or so small it underflows
    double wide = 0;
    std::from_chars(cell.data(), cell.data() + cell.size(), wide);
    if (!(std::abs(wide) <= std::numeric_limits<float>::max())) return Cell::kNotFinite;
    value = static_cast<float>(wide);
  } else if (error != std::errc() || end != cell.data() + cell.size()) {
    return Cell::kNotANumber;
  }
  if (!std::isfinite(value)) return Cell::kNotFinite;
  out = value;
  return Cell::kNumber;
}

std::vector<std::string> header_of(CsvScanner& scanner, const std::string& path) {
  std::vector<std::string_view> fields;
  FT_CHECK(scanner.next_record(fields),
           "the CSV file '{}' is empty: it needs a header row naming the columns", path);
  std::vector<std::string> header;
  for (std::string_view field : fields) header.emplace_back(trimmed(field));
  return header;
}

// A line read as one field may be split by another character.
std::string delimiter_hint(size_t fields, char delimiter) {
  return fields == 1 ? fmt::format(" (is '{}' the delimiter? data.delimiter sets it)", delimiter) : "";
}

// Where each of the file's columns goes: nowhere, a number column or a label column.
struct ColumnPlan {
  std::vector<std::vector<float>*> numbers;       // by file column; null: not a number column
  std::vector<std::vector<std::string>*> labels;  // by file column; null: not a label column
};

ColumnPlan plan_columns(const std::string& path, const std::vector<std::string>& header,
                        const CsvRequest& request, CsvColumns& out) {
  ColumnPlan plan{std::vector<std::vector<float>*>(header.size()),
                  std::vector<std::vector<std::string>*>(header.size())};
  auto column_of = [&](const std::string& name) {
    const auto found = std::find(header.begin(), header.end(), name);
    FT_CHECK(found != header.end(), "the CSV file '{}' has no column '{}'; its columns: {}{}", path, name,
             fmt::join(header, ", "), delimiter_hint(header.size(), request.delimiter()));
    FT_CHECK(std::find(found + 1, header.end(), name) == header.end(),
             "the CSV file '{}' has two columns called '{}'", path, name);
    return static_cast<size_t>(found - header.begin());
  };
  for (const auto& name : request.numbers()) plan.numbers[column_of(name)] = &out.numbers[name];
  for (const auto& name : request.labels()) {
    const size_t column = column_of(name);
    FT_CHECK(plan.numbers[column] == nullptr, "column '{}' of '{}' was asked for as numbers and as labels",
             name, path);
    plan.labels[column] = &out.labels[name];
  }
  return plan;
}

[[noreturn]] void fail_cell(const std::string& path, int64_t line, const std::string& column,
                            std::string_view cell, Cell problem, const CsvRequest& request) {
  const auto hint = request.hints().find(column);
  switch (problem) {
    case Cell::kEmpty:
      FT_FAIL("{}:{}: column '{}' is empty; a model cannot train on a missing value: fill or drop such rows",
              path, line, column);
    case Cell::kNotFinite:
      FT_FAIL(
          "{}:{}: column '{}' holds '{}', not a finite number (a float32 is at most 3.4e38); a model cannot "
          "train on it: fill or drop such rows",
          path, line, column, cell);
    default:
      FT_FAIL("{}:{}: column '{}' holds '{}', which is not a number{}", path, line, column, cell,
              hint == request.hints().end() ? "" : "; " + hint->second);
  }
}

}  // namespace

bool parse_csv_number(std::string_view cell, float& out) {
  return parse_number(cell, out) == Cell::kNumber;
}

std::vector<std::string> read_csv_header(const std::string& path, char delimiter) {
  const std::string text = read_whole_file(path);
  CsvScanner scanner(text, delimiter, path);
  return header_of(scanner, path);
}

CsvColumns read_csv(const std::string& path, const CsvRequest& request) {
  const std::string text = read_whole_file(path);
  CsvScanner scanner(text, request.delimiter(), path);
  CsvColumns out;
  out.header = header_of(scanner, path);
  const ColumnPlan plan = plan_columns(path, out.header, request, out);
  const auto lines = static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1;
  for (auto* column : plan.numbers)
    if (column) column->reserve(lines);

  std::vector<std::string_view> fields;
  fields.reserve(out.header.size());
  while (scanner.next_record(fields)) {
    FT_CHECK(fields.size() == out.header.size(), "{}:{}: {} fields, but the header has {} columns{}", path,
             scanner.record_line(), fields.size(), out.header.size(),
             delimiter_hint(fields.size(), request.delimiter()));
    for (size_t c = 0; c < fields.size(); ++c) {
      if (plan.numbers[c]) {
        float value = 0;
        const Cell cell = parse_number(fields[c], value);
        if (cell != Cell::kNumber)
          fail_cell(path, scanner.record_line(), out.header[c], fields[c], cell, request);
        plan.numbers[c]->push_back(value);
      } else if (plan.labels[c]) {
        const std::string_view label = trimmed(fields[c]);
        if (label.empty())
          fail_cell(path, scanner.record_line(), out.header[c], label, Cell::kEmpty, request);
        plan.labels[c]->emplace_back(label);
      }
    }
    ++out.rows;
  }
  FT_CHECK(out.rows > 0, "the CSV file '{}' has a header but no rows", path);
  return out;
}

}  // namespace fasttrain
