// A map of at most `capacity` values that drops its least recently used one to make room: the
// cuDNN attention's built graphs, one a shape ([Note: the cuDNN attention] in
// kernels/cudnn_attention.h), which generation would otherwise grow by one a token.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <utility>

namespace zerort {

template <typename Key, typename Value>
class BoundedCache {
 public:
  explicit BoundedCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The value under `key`, now the most recently used; null if absent.
  Value* Find(const Key& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }

  // Puts `value` under `key` (absent) as the most recently used, dropping the least recently
  // used value first when the cache is full (a caller whose values may still be in use checks
  // full() before).
  Value* Insert(const Key& key, Value value) {
    if (full()) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++dropped_;
    }
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    return &order_.front().second;
  }

  // Drops every value, least recently used first.
  void Clear() {
    while (!order_.empty()) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

  bool full() const { return order_.size() >= capacity_; }
  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }
  // How many values were dropped to make room since the cache was made.
  size_t dropped() const { return dropped_; }

 private:
  using Entry = std::pair<Key, Value>;
  size_t capacity_;
  std::list<Entry> order_;  // most recently used first
  std::map<Key, typename std::list<Entry>::iterator> index_;
  size_t dropped_ = 0;
};

}  // namespace zerort
