#pragma once
// FT_ARG declares an option with a chained setter and a getter, like TORCH_ARG:
//
//   struct LoaderOptions {
//     explicit LoaderOptions(int64_t batch_size) : batch_size_(batch_size) {}
//     FT_ARG(int64_t, batch_size);
//     FT_ARG(int, workers) = 2;
//   };
//   auto options = LoaderOptions(128).workers(4);   // options.workers() == 4
#include <utility>

#define FT_ARG(T, name)                                   \
 public:                                                  \
  inline auto name(const T& new_value)->decltype(*this) { \
    this->name##_ = new_value;                            \
    return *this;                                         \
  }                                                       \
  inline auto name(T&& new_value)->decltype(*this) {      \
    this->name##_ = std::move(new_value);                 \
    return *this;                                         \
  }                                                       \
  inline const T& name() const noexcept {                 \
    return this->name##_;                                 \
  }                                                       \
  inline T& name() noexcept {                             \
    return this->name##_;                                 \
  }                                                       \
                                                          \
 private:                                                 \
  T name##_ /* NOLINT */
