#include "fasttrain/data/loader.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "fasttrain/util/check.h"

namespace fasttrain {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int auto_worker_count(int processes_sharing) {
  // The trainer runs its math on the intra-op pool, which takes the physical cores. Loader workers
  // only copy bytes (a Fashion-MNIST batch of 256 takes well under a millisecond), so a few threads
  // keep any trainer fed, and more would steal cores from compute: one worker per four hardware
  // threads of this process's share, at least 1 (so loading still overlaps compute on a 2-core
  // machine) and at most 4. A process with one hardware thread or less to itself (2 ranks on 2
  // cores) builds its batches in the training thread: a worker would only take turns with compute
  // (measured: 2 ranks of the classic config, 5392 samples/s without workers, 4153 with one each).
  const int hardware = static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, processes_sharing);
  if (hardware <= 1) return 0;
  return std::max(1, std::min(4, hardware / 4));
}

// The worker side. Protocol (everything under `mutex`):
//  - `generation` changes whenever the epoch is (re)started or the loader shuts down; a batch built
//    for an older generation is dropped, and workers poll it to abandon such a batch early.
//  - workers claim batch indices in increasing order (`next_claim`), at most `prefetch` ahead of the
//    consumer (`next_deliver`), counting batches in progress; finished ones wait in `ready` by index,
//    so next() returns them in order whichever worker finished first.
//  - a worker's exception is stored in its batch's slot and rethrown when the consumer reaches that
//    batch, so the batches before it are still delivered, exactly as with workers = 0.
struct DataLoader::Impl {
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  std::mutex mutex;
  std::condition_variable work_cv;   // workers: a batch can be claimed, or stop
  std::condition_variable ready_cv;  // consumer: the next batch is ready
  std::atomic<uint64_t> generation{0};
  bool started = false;
  bool stopping = false;
  bool failed = false;  // a batch of this generation threw: claim no more
  int64_t epoch = 0;
  std::shared_ptr<const EpochPlan> plan;
  int64_t next_claim = 0;
  int64_t next_deliver = 0;
  int64_t end = 0;
  std::map<int64_t, Slot> ready;
  std::exception_ptr delivered_error;  // rethrown by every next() until the next start_epoch
  std::vector<std::thread> threads;
};

DataLoader::DataLoader(ImageDataset dataset, TransformPipeline pipeline, LoaderOptions options)
    : DataLoader(std::make_shared<ImageBatchSource>(std::move(dataset), std::move(pipeline)),
                 std::move(options)) {}

DataLoader::DataLoader(std::shared_ptr<const BatchSource> source, LoaderOptions options)
    : source_(std::move(source)), options_(std::move(options)) {
  FT_CHECK(source_ != nullptr, "DataLoader needs a batch source");
  check_keys(options_, "data");
  FT_CONFIG_CHECK(options_.batch_size() > 0, "data.batch_size must be > 0, got {}", options_.batch_size());
  FT_CONFIG_CHECK(options_.workers() >= 0,
                  "data.workers must be 0 (load in the training thread) or a thread "
                  "count, got {}",
                  options_.workers());
  FT_CHECK(source_->size() > 0, "DataLoader: the source is empty ({})", source_->describe());
  FT_CHECK(options_.world_size() >= 1 && options_.rank() >= 0 && options_.rank() < options_.world_size(),
           "DataLoader: rank {} is not in [0, world_size {})", options_.rank(), options_.world_size());
  if (std::optional<EpochPlan> whole = source_->batch_plan(0, options_.shuffle(), options_.seed())) {
    const EpochPlan plan = shard_of(std::move(*whole));
    planned_batches_ = plan.batches();
    planned_samples_ = static_cast<int64_t>(plan.samples.size());
    FT_CONFIG_CHECK(planned_batches_ > 0, "{}: rank {} of {} gets no batch (fewer batches than ranks)",
                    source_->describe(), options_.rank(), options_.world_size());
  } else {
    FT_CONFIG_CHECK(!options_.drop_last() || options_.batch_size() <= samples_per_epoch(),
                    "data.batch_size {} is larger than the {} samples of {}: with drop_last every epoch "
                    "would be empty; use at most {}",
                    options_.batch_size(), samples_per_epoch(),
                    options_.world_size() > 1 ? fmt::format("rank {}'s shard", options_.rank())
                                              : std::string("the dataset"),
                    samples_per_epoch());
  }

  if (options_.device_resident()) resident_ = source_->make_resident(options_.device());
  // Resident batches are a few kernels queued from the caller's thread: no workers to feed it.
  workers_ = resident_ ? 0 : options_.workers();
  impl_ = std::make_unique<Impl>();
  impl_->threads.reserve(workers_);
  try {
    for (int w = 0; w < workers_; ++w) impl_->threads.emplace_back([this] { worker_loop(); });
  } catch (...) {
    // The destructor does not run for a half-built object: stop the threads already started here.
    shutdown();
    throw;
  }
}

DataLoader::~DataLoader() {
  shutdown();
}

void DataLoader::shutdown() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
    impl_->generation.fetch_add(1);  // in-progress batches stop at their next sample
  }
  impl_->work_cv.notify_all();
  for (auto& thread : impl_->threads) thread.join();
  impl_->threads.clear();
}

int64_t DataLoader::samples_per_epoch() const {
  if (planned_samples_ >= 0) return planned_samples_;
  const int64_t n = source_->size(), world = options_.world_size();
  if (world == 1) return n;
  if (options_.even_shards()) return (n + world - 1) / world;
  return (n - options_.rank() + world - 1) / world;
}

int64_t DataLoader::batches_per_epoch() const {
  if (planned_batches_ >= 0) return planned_batches_;
  const int64_t n = samples_per_epoch();
  const int64_t b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

bool DataLoader::fixed_batch_shape() const {
  if (!source_->fixed_shape() || planned_batches_ >= 0) return false;
  return options_.drop_last() || samples_per_epoch() % options_.batch_size() == 0;
}

std::vector<int64_t> DataLoader::rank_share(int64_t n) const {
  const int64_t world = options_.world_size();
  const int64_t dealt = options_.even_shards() ? (n + world - 1) / world * world : n;
  std::vector<int64_t> share;
  share.reserve(static_cast<size_t>((dealt + world - 1) / world));
  for (int64_t i = options_.rank(); i < dealt; i += world) share.push_back(i % n);
  return share;
}

EpochPlan DataLoader::shard_of(EpochPlan whole) const {
  if (options_.world_size() == 1) return whole;
  EpochPlan shard;  // whole batches, dealt as the samples are
  for (int64_t b : rank_share(whole.batches())) {
    const int64_t from = whole.starts[b], to = whole.starts[b + 1];
    shard.add_batch(whole.samples.data() + from, to - from);
  }
  return shard;
}

EpochPlan DataLoader::epoch_plan(int64_t epoch) const {
  if (std::optional<EpochPlan> whole = source_->batch_plan(epoch, options_.shuffle(), options_.seed())) {
    return shard_of(std::move(*whole));
  }

  std::vector<int64_t> order;
  if (options_.shuffle()) {
    order = shuffled_order(source_->size(), options_.seed(), epoch);
  } else {
    order.resize(static_cast<size_t>(source_->size()));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  if (options_.world_size() > 1) {
    std::vector<int64_t> shard;
    for (int64_t i : rank_share(static_cast<int64_t>(order.size())))
      shard.push_back(order[static_cast<size_t>(i)]);
    order = std::move(shard);
  }
  // Consecutive slices of batch_size; with drop_last the samples after the last full batch stay in
  // `samples` (the epoch's order) but in no batch.
  EpochPlan plan;
  plan.samples = std::move(order);
  const int64_t batch = options_.batch_size(), total = static_cast<int64_t>(plan.samples.size());
  for (int64_t b = 1; b <= batches_per_epoch(); ++b) plan.starts.push_back(std::min(b * batch, total));
  return plan;
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  FT_CHECK(epoch >= 0, "DataLoader::start_epoch: epoch must be >= 0, got {}", epoch);
  FT_CHECK(first_batch >= 0 && first_batch <= batches_per_epoch(),
           "DataLoader::start_epoch: first_batch must be in [0, {}] (batches per epoch), got {}",
           batches_per_epoch(), first_batch);
  auto plan = std::make_shared<const EpochPlan>(epoch_plan(epoch));
  if (resident_) resident_->start_epoch(*plan);  // the order on the device, once per epoch
  FT_CHECK(plan->batches() == batches_per_epoch(),
           "{}: epoch {} has {} batches, epoch 0 had {}; a source's batch count must not change",
           source_->describe(), epoch, plan->batches(), batches_per_epoch());
  std::map<int64_t, Impl::Slot> abandoned;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->generation.fetch_add(1);
    impl_->started = true;
    impl_->failed = false;
    impl_->epoch = epoch;
    impl_->plan = std::move(plan);
    impl_->next_claim = first_batch;
    impl_->next_deliver = first_batch;
    impl_->end = batches_per_epoch();
    impl_->delivered_error = nullptr;
    abandoned.swap(impl_->ready);
  }
  impl_->work_cv.notify_all();
}

std::optional<Batch> DataLoader::build_batch(int64_t epoch, int64_t index, const EpochPlan& plan,
                                             uint64_t generation) const {
  BatchRequest request;
  request.samples = plan.samples.data() + plan.starts[index];
  request.count = plan.starts[index + 1] - plan.starts[index];
  request.epoch = epoch;
  request.seed = options_.seed();
  request.shuffle = options_.shuffle();
  request.pinned = options_.device().is_cuda() && options_.pin_memory();
  request.channels_last = options_.channels_last();
  const std::atomic<uint64_t>& current = impl_->generation;
  request.abandoned = [&current, generation] {
    return current.load(std::memory_order_relaxed) != generation;
  };
  Batch batch = resident_ ? resident_->build(request) : source_->build(request);
  if (request.abandoned()) return std::nullopt;
  FT_CHECK(batch.count > 0,
           "{} built a batch with Batch::count = {} for {} samples: set count to what the batch "
           "holds (its samples, or its target tokens), which samples/s and samples seen count",
           source_->describe(), batch.count, request.count);
  batch.epoch = epoch;
  batch.index = index;
  return batch;
}

void DataLoader::worker_loop() {
  Impl& impl = *impl_;
  std::unique_lock<std::mutex> lock(impl.mutex);
  const int64_t window = options_.prefetch();
  while (true) {
    impl.work_cv.wait(lock, [&] {
      return impl.stopping || (impl.started && !impl.failed && impl.next_claim < impl.end &&
                               impl.next_claim < impl.next_deliver + window);
    });
    if (impl.stopping) return;
    const int64_t index = impl.next_claim++;
    const int64_t epoch = impl.epoch;
    const uint64_t generation = impl.generation.load();
    const std::shared_ptr<const EpochPlan> plan = impl.plan;
    lock.unlock();

    Impl::Slot slot;
    bool abandoned = false;
    try {
      std::optional<Batch> built = build_batch(epoch, index, *plan, generation);
      abandoned = !built;
      if (built) slot.batch = std::move(*built);
    } catch (...) {
      slot.error = std::current_exception();
    }

    lock.lock();
    if (abandoned || impl.generation.load() != generation) {
      // The epoch was restarted (or the loader is stopping) meanwhile: drop the batch, outside the
      // lock, and look for work.
      lock.unlock();
      slot = Impl::Slot{};
      lock.lock();
      continue;
    }
    if (slot.error) impl.failed = true;
    impl.ready.emplace(index, std::move(slot));
    impl.ready_cv.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  Impl& impl = *impl_;
  Batch batch;
  if (workers_ == 0) {
    FT_CHECK(impl.started, "DataLoader::next: call start_epoch first");
    if (impl.delivered_error) std::rethrow_exception(impl.delivered_error);
    if (impl.next_deliver >= impl.end) return std::nullopt;
    // With no workers the trainer waits for the whole build: count it as data wait.
    const auto begin = Clock::now();
    try {
      // The caller's own thread: nothing can abandon this batch.
      batch = *build_batch(impl.epoch, impl.next_deliver, *impl.plan, impl.generation.load());
    } catch (...) {
      impl.delivered_error = std::current_exception();
      throw;
    }
    wait_seconds_ += std::chrono::duration<double>(Clock::now() - begin).count();
    ++impl.next_deliver;
  } else {
    std::unique_lock<std::mutex> lock(impl.mutex);
    FT_CHECK(impl.started, "DataLoader::next: call start_epoch first");
    if (impl.delivered_error) std::rethrow_exception(impl.delivered_error);
    if (impl.next_deliver >= impl.end) return std::nullopt;
    auto it = impl.ready.find(impl.next_deliver);
    if (it == impl.ready.end()) {
      const auto begin = Clock::now();
      impl.ready_cv.wait(lock, [&] { return (it = impl.ready.find(impl.next_deliver)) != impl.ready.end(); });
      wait_seconds_ += std::chrono::duration<double>(Clock::now() - begin).count();
    }
    Impl::Slot slot = std::move(it->second);
    impl.ready.erase(it);
    if (slot.error) {
      impl.delivered_error = slot.error;
      std::rethrow_exception(slot.error);
    }
    ++impl.next_deliver;
    lock.unlock();
    impl.work_cv.notify_all();  // the window moved: one more batch may be claimed
    batch = std::move(slot.batch);
  }
  if (!options_.device().is_cpu() && !resident_) {
    // From pinned memory this copy is asynchronous; it is queued on the consumer's current stream,
    // so the compute that follows on that stream sees the data.
    const bool non_blocking = options_.device().is_cuda() && options_.pin_memory();
    const auto begin = Clock::now();
    batch = batch.map([&](const torch::Tensor& t) { return t.to(options_.device(), non_blocking); });
    copy_seconds_ += std::chrono::duration<double>(Clock::now() - begin).count();
  }
  return batch;
}

}  // namespace fasttrain
