#pragma once
// torchrun's error file: a rank that fails writes the JSON record that torchelastic's @record writes
// for a Python worker, to the path torchrun gives it in TORCHELASTIC_ERROR_FILE, so torchrun's failure
// summary names the error instead of "error_file: <N/A>".
//
//   catch (const fasttrain::Error& error) {
//     fasttrain::write_torchelastic_error_file("fasttrain.Error", error.what());
//     ...
//   }
#include <string>

namespace fasttrain {

// {"message": {"message": "<kind>: <message>", "extraInfo": {"py_callstack": "<kind>: <message>", "timestamp":
// "<seconds>"}}} (torch/distributed/elastic/multiprocessing/errors/error_handler.py, record_exception),
// written to $TORCHELASTIC_ERROR_FILE. False (nothing written) where the variable is not set or the file
// cannot be written: the error is reported on stderr all the same.
bool write_torchelastic_error_file(const std::string& kind, const std::string& message);

}  // namespace fasttrain
