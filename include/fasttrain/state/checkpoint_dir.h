#pragma once
// Atomic, verified checkpoint directories. A run killed at any instant (SIGKILL, OOM, pre-emption,
// power loss) must resume from a complete checkpoint, and a checkpoint damaged later (a truncated
// copy, a flipped bit) must be detected before any of it is parsed.
//
//   <root>/step-1200/            committed: every file fsynced, manifest.json written last
//     model.safetensors
//     optimizer.safetensors
//     manifest.json              {"format": "fasttrain-checkpoint", "version": 1, "step": 1200,
//                                 "files": [{"file", "bytes", "sha256"}, ...]}
//   <root>/.tmp-step-1300-<random>/   being written (or left by a crash: ignored and removed)
//
//   fasttrain::CheckpointWriter writer("runs/x/checkpoints", step);
//   fasttrain::save_safetensors(writer.file("model.safetensors"), fasttrain::module_state(*model));
//   writer.commit();  // fsync files + manifest + directory, rename to step-N, fsync the root
//
//   if (auto latest = fasttrain::latest_checkpoint("runs/x/checkpoints")) {
//     auto model_state = fasttrain::load_safetensors(latest->dir + "/model.safetensors");
//   }
//   fasttrain::prune_checkpoints("runs/x/checkpoints", /*keep=*/3);
//
// The rename is the commit point: `step-N` either does not exist or is complete. One process writes
// into a root at a time (latest_checkpoint removes the `.tmp-*` directories of other processes).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fasttrain {

constexpr const char* kCheckpointManifestName = "manifest.json";
constexpr const char* kCheckpointFormat = "fasttrain-checkpoint";
constexpr int kCheckpointFormatVersion = 1;

struct CheckpointFileEntry {
  std::string file;
  uint64_t bytes = 0;
  std::string sha256;  // 64 lowercase hex digits
};

struct CheckpointManifest {
  int64_t step = 0;
  std::vector<CheckpointFileEntry> files;  // sorted by name
};

struct CheckpointInfo {
  int64_t step = 0;
  std::string dir;  // <root>/step-N
};

// Writes one checkpoint. The constructor creates `<root>` if needed and a fresh staging directory;
// write the checkpoint's files (flat, no subdirectories) at `file(name)`, then commit(). Without a
// commit (an exception while writing) the destructor removes the staging directory.
class CheckpointWriter {
 public:
  // An error when `<root>/step-<step>` already exists: a checkpoint is never replaced.
  CheckpointWriter(std::string root, int64_t step);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // `<staging>/<name>`: a plain file name, not hidden and not "manifest.json".
  std::string file(const std::string& name) const;
  const std::string& staging_dir() const { return staging_; }
  int64_t step() const { return step_; }

  // fsyncs and hashes every file, writes manifest.json (fsynced), fsyncs the staging directory,
  // renames it to `<root>/step-N` (never over an existing one) and fsyncs the root. Returns the
  // committed directory. Errors: no files, a subdirectory or other non-file, a hidden file (a
  // leftover temporary), a failing system call.
  std::string commit();

 private:
  std::string root_;
  int64_t step_;
  std::string staging_;
  std::string staging_name_;
  bool committed_ = false;
};

// "step-<step>".
std::string checkpoint_dir_name(int64_t step);

// Checks `dir` against its manifest, sizes first and then SHA-256 digests, before anything in it is
// parsed: every listed file present with the right size and digest, no unlisted files, the step
// equal to the N of a `step-N` directory name. The error names the file and expected vs found.
CheckpointManifest verify_checkpoint(const std::string& dir);

// The committed `step-N` directories of `root`, ascending by step, not verified. Empty when `root`
// does not exist.
std::vector<CheckpointInfo> list_checkpoints(const std::string& root);

// The highest step-N of `root` that verifies, or nullopt. Checkpoints that fail verification are
// skipped (their reasons appended to `skipped` when given, so that the caller can report them);
// stale `.tmp-*` directories left by interrupted writes or prunes are removed.
std::optional<CheckpointInfo> latest_checkpoint(const std::string& root,
                                                std::vector<std::string>* skipped = nullptr);

// Removes all but the `keep` highest-numbered checkpoints, oldest first, each renamed to a `.tmp-*`
// name before it is deleted so that an interrupted prune never leaves a half-deleted `step-N`.
// `keep` >= 2 (a ConfigError naming checkpoint.keep otherwise): if the newest checkpoint turns out
// to be damaged, the one before it is still there. Returns the removed step-N directories.
std::vector<std::string> prune_checkpoints(const std::string& root, int keep);

}  // namespace fasttrain
