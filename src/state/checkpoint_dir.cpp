#include "fasttrain/state/checkpoint_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "fasttrain/detail/file_io.h"
#include "fasttrain/detail/sha256.h"
#include "fasttrain/util/check.h"

namespace fasttrain {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStepPrefix = "step-";
constexpr const char* kTmpPrefix = ".tmp-";
// A manifest lists file names and digests: a few KB. Anything near this is not one.
constexpr uint64_t kMaxManifestBytes = 16 << 20;

// Staging directories of live CheckpointWriters in this process: latest_checkpoint must not remove
// a directory that is being written right now.
std::mutex& active_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<std::string>& active_staging() {
  static std::set<std::string> names;
  return names;
}

// N of a canonical "step-N" (no sign, no leading zeros), or -1.
int64_t parse_step_name(const std::string& name) {
  const std::string prefix = kStepPrefix;
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  if (digits.size() > 1 && digits[0] == '0') return -1;
  return std::stoll(digits);
}

bool starts_with(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

// A name that stays inside the checkpoint directory and is not ours.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name.find('\0') == std::string::npos &&
         name[0] != '.' && name != kCheckpointManifestName;
}

bool is_lower_hex(const std::string& text, size_t length) {
  return text.size() == length && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// rename(2) that fails instead of replacing an existing (empty) directory.
void rename_no_replace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return;
  if (errno == EINVAL || errno == ENOSYS) {
    // A file system without RENAME_NOREPLACE: check, then rename (rename fails on a non-empty target).
    std::error_code ec;
    FT_CHECK(!fs::exists(to, ec), "cannot rename '{}' to '{}': the target exists", from, to);
    if (::rename(from.c_str(), to.c_str()) == 0) return;
  }
  FT_FAIL("cannot rename '{}' to '{}': {}", from, to, std::strerror(errno));
}

CheckpointManifest parse_manifest(const std::string& dir, const std::string& path) {
  std::error_code ec;
  FT_CHECK(fs::exists(path, ec), "checkpoint '{}': no {} (an incomplete or interrupted checkpoint)", dir,
           kCheckpointManifestName);
  const std::vector<uint8_t> bytes = read_binary_file(path, kMaxManifestBytes);
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::parse_error& e) {
    FT_FAIL("{}: not valid JSON at byte {}: {}", path, e.byte, e.what());
  }
  FT_CHECK(manifest.is_object(), "{}: expected a JSON object", path);
  FT_CHECK(manifest.value("format", "") == kCheckpointFormat, "{}: 'format' must be \"{}\", found {}", path,
           kCheckpointFormat, manifest.contains("format") ? manifest["format"].dump() : "nothing");
  FT_CHECK(manifest.contains("version") && manifest["version"].is_number_unsigned(),
           "{}: 'version' must be a non-negative integer", path);
  const uint64_t version = manifest["version"].get<uint64_t>();
  FT_CHECK(version == kCheckpointFormatVersion,
           "{}: format version {} is not supported (this fasttrain reads version {}); written by another "
           "fasttrain release?",
           path, version, kCheckpointFormatVersion);
  FT_CHECK(manifest.contains("step") && manifest["step"].is_number_unsigned() &&
               manifest["step"].get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
           "{}: 'step' must be an integer >= 0", path);
  CheckpointManifest result;
  result.step = manifest["step"].get<int64_t>();
  FT_CHECK(manifest.contains("files") && manifest["files"].is_array(), "{}: 'files' must be an array", path);
  std::set<std::string> seen;
  for (size_t i = 0; i < manifest["files"].size(); ++i) {
    const nlohmann::json& item = manifest["files"][i];
    FT_CHECK(
        item.is_object() && item.contains("file") && item["file"].is_string() && item.contains("bytes") &&
            item["bytes"].is_number_unsigned() && item.contains("sha256") && item["sha256"].is_string(),
        "{}: files[{}] must be {{\"file\": string, \"bytes\": integer >= 0, \"sha256\": string}}, found {}",
        path, i, item.dump());
    CheckpointFileEntry entry{item["file"].get<std::string>(), item["bytes"].get<uint64_t>(),
                              item["sha256"].get<std::string>()};
    FT_CHECK(is_plain_file_name(entry.file), "{}: files[{}] has an unsafe or reserved name '{}'", path, i,
             entry.file);
    FT_CHECK(is_lower_hex(entry.sha256, 64),
             "{}: files[{}] '{}': sha256 must be 64 lowercase hex digits, found '{}'", path, i, entry.file,
             entry.sha256);
    FT_CHECK(seen.insert(entry.file).second, "{}: file '{}' is listed twice", path, entry.file);
    result.files.push_back(std::move(entry));
  }
  return result;
}

void remove_quietly(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  return kStepPrefix + std::to_string(step);
}

CheckpointWriter::CheckpointWriter(std::string root, int64_t step) : root_(std::move(root)), step_(step) {
  FT_CHECK(step >= 0, "checkpoint step must be >= 0, got {}", step);
  std::error_code ec;
  fs::create_directories(root_, ec);
  FT_CHECK(!ec, "cannot create the checkpoint directory '{}': {}", root_, ec.message());
  const fs::path final_dir = fs::path(root_) / checkpoint_dir_name(step);
  FT_CHECK(!fs::exists(final_dir, ec),
           "checkpoint '{}' already exists; checkpoints are never overwritten (resume from it, or remove it)",
           final_dir.string());
  staging_name_ = fmt::format("{}{}-{}", kTmpPrefix, checkpoint_dir_name(step), random_hex_suffix());
  staging_ = (fs::path(root_) / staging_name_).string();
  {
    std::lock_guard<std::mutex> lock(active_mutex());
    active_staging().insert(staging_name_);
  }
  if (::mkdir(staging_.c_str(), 0755) != 0) {
    const int saved = errno;
    std::lock_guard<std::mutex> lock(active_mutex());
    active_staging().erase(staging_name_);
    FT_FAIL("cannot create the staging directory '{}': {}", staging_, std::strerror(saved));
  }
}

CheckpointWriter::~CheckpointWriter() {
  if (!committed_) remove_quietly(staging_);
  std::lock_guard<std::mutex> lock(active_mutex());
  active_staging().erase(staging_name_);
}

std::string CheckpointWriter::file(const std::string& name) const {
  FT_CHECK(is_plain_file_name(name),
           "checkpoint file name '{}' is not allowed: use a plain name without '/', not starting with '.', "
           "other than {}",
           name, kCheckpointManifestName);
  return (fs::path(staging_) / name).string();
}

std::string CheckpointWriter::commit() {
  FT_CHECK(!committed_, "checkpoint '{}' is already committed", staging_);
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(staging_)) {
    const std::string name = entry.path().filename().string();
    FT_CHECK(entry.is_regular_file() && !entry.is_symlink(),
             "checkpoint '{}': '{}' is not a regular file; checkpoints hold plain files only", staging_,
             name);
    FT_CHECK(name[0] != '.',
             "checkpoint '{}': hidden file '{}' (a leftover temporary file of a failed write?)", staging_,
             name);
    FT_CHECK(name != kCheckpointManifestName, "checkpoint '{}': {} is written by commit(), not by the caller",
             staging_, kCheckpointManifestName);
    names.push_back(name);
  }
  FT_CHECK(!names.empty(), "checkpoint '{}': no files were written into it", staging_);
  std::sort(names.begin(), names.end());

  nlohmann::json files = nlohmann::json::array();
  for (const std::string& name : names) {
    const std::string path = (fs::path(staging_) / name).string();
    fsync_file(path);
    uint64_t bytes = 0;
    const std::string digest = sha256_file(path, &bytes);
    files.push_back({{"file", name}, {"bytes", bytes}, {"sha256", digest}});
  }
  const nlohmann::json manifest = {{"format", kCheckpointFormat},
                                   {"version", kCheckpointFormatVersion},
                                   {"step", step_},
                                   {"files", files}};
  const std::string text = manifest.dump(2) + "\n";
  // AtomicFile fsyncs the manifest and then the staging directory, which makes every entry durable.
  write_file_atomically((fs::path(staging_) / kCheckpointManifestName).string(), text.data(), text.size());

  const std::string final_dir = (fs::path(root_) / checkpoint_dir_name(step_)).string();
  rename_no_replace(staging_, final_dir);
  committed_ = true;
  fsync_directory(root_);
  return final_dir;
}

CheckpointManifest verify_checkpoint(const std::string& dir) {
  std::error_code ec;
  FT_CHECK(fs::is_directory(dir, ec), "checkpoint '{}' is not a directory", dir);
  const std::string manifest_path = (fs::path(dir) / kCheckpointManifestName).string();
  CheckpointManifest manifest = parse_manifest(dir, manifest_path);
  const int64_t named_step = parse_step_name(fs::path(dir).filename().string());
  FT_CHECK(named_step < 0 || named_step == manifest.step, "{}: says step {} but the directory is step-{}",
           manifest_path, manifest.step, named_step);

  std::set<std::string> listed;
  for (const CheckpointFileEntry& entry : manifest.files) listed.insert(entry.file);
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    FT_CHECK(name == kCheckpointManifestName || listed.count(name),
             "checkpoint '{}': '{}' is not listed in {} (added after the checkpoint was written?)", dir, name,
             kCheckpointManifestName);
  }
  // Sizes first: a truncated copy is found without reading gigabytes.
  for (const CheckpointFileEntry& entry : manifest.files) {
    const fs::path path = fs::path(dir) / entry.file;
    FT_CHECK(fs::is_regular_file(fs::symlink_status(path, ec)), "checkpoint '{}': file '{}' is missing", dir,
             entry.file);
    const uint64_t size = fs::file_size(path, ec);
    FT_CHECK(!ec, "checkpoint '{}': cannot stat '{}': {}", dir, entry.file, ec.message());
    FT_CHECK(size == entry.bytes, "checkpoint '{}': file '{}' has {} bytes, the manifest says {} ({})", dir,
             entry.file, size, entry.bytes, size < entry.bytes ? "truncated" : "modified");
  }
  for (const CheckpointFileEntry& entry : manifest.files) {
    const std::string digest = sha256_file((fs::path(dir) / entry.file).string());
    FT_CHECK(digest == entry.sha256,
             "checkpoint '{}': file '{}' is corrupt: sha256 {}, the manifest says {} (modified after it was "
             "written)",
             dir, entry.file, digest, entry.sha256);
  }
  return manifest;
}

std::vector<CheckpointInfo> list_checkpoints(const std::string& root) {
  std::vector<CheckpointInfo> result;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return result;
  for (const fs::directory_entry& entry : fs::directory_iterator(root)) {
    const int64_t step = parse_step_name(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) result.push_back({step, entry.path().string()});
  }
  std::sort(result.begin(), result.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  return result;
}

std::optional<CheckpointInfo> latest_checkpoint(const std::string& root, std::vector<std::string>* skipped) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  std::vector<fs::path> stale;
  {
    std::lock_guard<std::mutex> lock(active_mutex());
    for (const fs::directory_entry& entry : fs::directory_iterator(root)) {
      const std::string name = entry.path().filename().string();
      if (starts_with(name, kTmpPrefix) && !active_staging().count(name)) stale.push_back(entry.path());
    }
  }
  for (const fs::path& path : stale) {
    fs::remove_all(path, ec);
    if (ec && skipped) skipped->push_back(fmt::format("{}: cannot remove: {}", path.string(), ec.message()));
  }

  std::vector<CheckpointInfo> all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      verify_checkpoint(it->dir);
      return *it;
    } catch (const Error& e) {
      if (skipped) skipped->push_back(e.what());
    }
  }
  return std::nullopt;
}

std::vector<std::string> prune_checkpoints(const std::string& root, int keep) {
  FT_CONFIG_CHECK(
      keep >= 2,
      "checkpoint.keep must be >= 2 (so that a damaged newest checkpoint still leaves one to resume "
      "from), got {}",
      keep);
  std::vector<CheckpointInfo> all = list_checkpoints(root);
  std::vector<std::string> removed;
  std::vector<fs::path> doomed;
  for (size_t i = 0; i + keep < all.size(); ++i) {
    doomed.push_back(fs::path(root) / fmt::format("{}prune-{}-{}", kTmpPrefix,
                                                  checkpoint_dir_name(all[i].step), random_hex_suffix()));
    rename_no_replace(all[i].dir, doomed.back().string());
    removed.push_back(all[i].dir);
  }
  if (removed.empty()) return removed;
  // The renames are what matters; make them durable before the slow deletes.
  fsync_directory(root);
  for (const fs::path& path : doomed) {
    std::error_code ec;
    fs::remove_all(path, ec);
    FT_CHECK(!ec, "cannot remove '{}' (was {}): {}", path.string(), removed[&path - doomed.data()],
             ec.message());
  }
  return removed;
}

}  // namespace fasttrain
