#pragma once
// CSV files as columns: the selected columns of a table with a header row, as numbers (float) or as
// text (labels), in one pass over the file; the other columns are skipped without being read as
// numbers.
//
//   fasttrain::CsvColumns table = fasttrain::read_csv("weather.csv",
//       fasttrain::CsvRequest().numbers({"temp_max", "wind"}).labels({"weather"}));
//   table.numbers.at("wind")   // one float per row
//
// RFC 4180: fields may be quoted ("a, b" and "say ""hi""", line breaks inside quotes), lines end in
// \n or \r\n, a last line without a line break counts, empty lines are skipped. Numbers are what
// std::from_chars reads (1, -2.5, 3e-4), with spaces around them allowed. Every error names the file,
// the line, the column and the cell: a row with another number of fields than the header, an empty cell,
// a cell that is not a number, NaN and infinities (a model cannot train on them: clean or drop the rows).
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fasttrain/util/arg.h"

namespace fasttrain {

// What to do when a column holds a cell that is not a number, by column name (added to the error).
using CsvHints = std::map<std::string, std::string>;

struct CsvRequest {
  FT_ARG(std::vector<std::string>, numbers) = {};  // columns read as numbers
  FT_ARG(std::vector<std::string>, labels) = {};   // columns kept as text
  FT_ARG(char, delimiter) = ',';
  FT_ARG(CsvHints, hints) = {};
};

struct CsvColumns {
  std::vector<std::string> header;  // every column of the file, in order
  int64_t rows = 0;                 // data rows (the header and empty lines not counted)
  std::map<std::string, std::vector<float>> numbers;
  std::map<std::string, std::vector<std::string>> labels;
};

// A cell as read_csv reads a number: a finite float, spaces around it allowed.
bool parse_csv_number(std::string_view cell, float& out);

// The header's names, without reading the rows.
std::vector<std::string> read_csv_header(const std::string& path, char delimiter = ',');

// Errors name `path`; a requested column missing from the header is an error listing the header.
CsvColumns read_csv(const std::string& path, const CsvRequest& request);

}  // namespace fasttrain
