// KvEvents' topics, as the control thread writes them: namespaces linked to topics, each
// tenant's share of the queue, events appended and coalesced, what was announced across
// restarts. The sockets and the thread that publishes are kv_event_publisher.cc's.
#include "daemon/events/kv_events.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "protocol/base/clock.h"
#include "protocol/base/logging.h"

namespace kvtier {

Result<uint64_t> KvEvents::AddNamespace(std::string_view encoded_ns, std::string_view tenant, std::string_view model,
                                        uint32_t tokens_per_block, const EventSource& source) {
  if (source.hashes == EventHashForm::kNone) return uint64_t{0};
  const std::string_view served = model.substr(0, model.find('|'));
  const std::string name = ExpandTopic(
      options_.topic, source.routable_id.empty() ? std::string_view(host_) : source.routable_id, host_, served, tenant);
  const std::optional<uint32_t> rank =
      source.dp_rank >= 0 ? std::optional(static_cast<uint32_t>(source.dp_rank)) : std::nullopt;
  MutexLock lock(&mu_);
  // Refused before anything changes.
  if (!source.routable_id.empty()) {
    auto held = routable_.find(source.routable_id);
    if (held != routable_.end() && held->second.first != tenant) {
      topics_refused_.fetch_add(1, std::memory_order_relaxed);
      return PermissionDenied("routable_id '" + std::string(source.routable_id) +
                              "' is declared by another tenant's engine; each engine declares its own address");
    }
  }
  auto found = by_name_.find({name, rank});
  Topic* t = found == by_name_.end() ? nullptr : found->second;
  TenantState& ts = tenants_[std::string(tenant)];
  const bool charged = t != nullptr && t->tenants.count(tenant) > 0;
  if (!charged && ts.topics >= options_.max_topics_per_tenant) {
    topics_refused_.fetch_add(1, std::memory_order_relaxed);
    if (ts.topics == 0 && ts.namespaces == 0) tenants_.erase(tenants_.find(tenant));
    return ResourceExhausted("tenant '" + std::string(tenant) + "' holds events.max_topics_per_tenant (" +
                             std::to_string(options_.max_topics_per_tenant) +
                             ") KV event topics, lingering ones among them (events.topic_linger after their last "
                             "engine detaches)");
  }
  if (t == nullptr) {
    topics_.push_back(std::make_unique<Topic>());
    t = topics_.back().get();
    t->key = {name, rank};
    by_name_[t->key] = t;
    topic_count_.store(static_cast<uint32_t>(topics_.size()), std::memory_order_relaxed);
  }
  if (t->links == 0) {
    // Revived, or new: tenants left charged at 0 while it lingered are released.
    for (auto it = t->tenants.begin(); it != t->tenants.end();) {
      if (it->first != tenant) {
        Uncharge(it->first);
        it = t->tenants.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (t->tenants.emplace(std::string(tenant), 0).second) ++ts.topics;
  ++t->tenants.find(tenant)->second;
  ++t->links;
  if (!source.routable_id.empty() &&
      std::find(t->routable_ids.begin(), t->routable_ids.end(), source.routable_id) == t->routable_ids.end()) {
    t->routable_ids.emplace_back(source.routable_id);
    auto& [holder, topics] = routable_[std::string(source.routable_id)];
    holder = tenant;
    ++topics;
  }
  auto it = by_namespace_.find(encoded_ns);
  if (it == by_namespace_.end()) {
    const uint32_t block_size = source.group.block_tokens ? source.group.block_tokens : tokens_per_block;
    it = by_namespace_
             .emplace(std::string(encoded_ns),
                      Announced{source.hashes, block_size, source.group, std::string(tenant), &ts, {}})
             .first;
    ++ts.namespaces;
  }
  std::vector<Topic*>& topics = it->second.topics;
  if (std::find(topics.begin(), topics.end(), t) == topics.end()) {
    topics.push_back(t);
    t->namespaces.emplace_back(encoded_ns);
  }
  const uint64_t link = next_link_++;
  links_.emplace(link, Link{t, std::string(tenant)});
  return link;
}

void KvEvents::RemoveNamespace(uint64_t link) {
  MutexLock lock(&mu_);
  auto it = links_.find(link);
  if (it == links_.end()) return;
  Topic* t = it->second.topic;
  auto charged = t->tenants.find(it->second.tenant);
  --charged->second;
  --t->links;
  if (charged->second == 0 && t->links > 0) {
    Uncharge(charged->first);
    t->tenants.erase(charged);
  }
  if (t->links == 0) t->idle_since_ns = SystemClock::Default()->NowNanos();
  links_.erase(it);
}

void KvEvents::Uncharge(const std::string& tenant) {
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return;
  --it->second.topics;
  if (it->second.topics == 0 && it->second.namespaces == 0) tenants_.erase(it);
}

std::vector<KvEvents::TopicKey> KvEvents::EndIdleTopics(int64_t now_ns) {
  std::vector<TopicKey> ended;
  for (auto it = topics_.begin(); it != topics_.end();) {
    Topic* t = it->get();
    if (t->links > 0 || now_ns - t->idle_since_ns < options_.topic_linger_ns) {
      ++it;
      continue;
    }
    for (const std::string& ns : t->namespaces) {
      auto a = by_namespace_.find(ns);
      if (a == by_namespace_.end()) continue;
      std::erase(a->second.topics, t);
      if (a->second.topics.empty()) {
        auto owner = tenants_.find(a->second.owner);
        by_namespace_.erase(a);
        if (owner != tenants_.end() && --owner->second.namespaces == 0 && owner->second.topics == 0) {
          tenants_.erase(owner);
        }
      }
    }
    for (const auto& [tenant, links] : t->tenants) Uncharge(tenant);
    for (const std::string& id : t->routable_ids) {
      auto r = routable_.find(id);
      if (r != routable_.end() && --r->second.second == 0) routable_.erase(r);
    }
    by_name_.erase(t->key);
    ended.push_back(t->key);
    it = topics_.erase(it);
  }
  if (!ended.empty()) topic_count_.store(static_cast<uint32_t>(topics_.size()), std::memory_order_relaxed);
  return ended;
}

bool KvEvents::Admit(TenantState* tenant, uint64_t bytes) {
  // An equal share of the buffer (events and bytes) for each tenant with namespaces, and
  // the buffer's bounds.
  const uint64_t tenants = std::max<size_t>(1, tenants_.size());
  const uint64_t share = std::max<uint64_t>(1, options_.queue_events / tenants);
  const uint64_t byte_share = options_.queue_bytes / tenants;
  if (queued_ >= options_.queue_events || tenant->queued >= share || queued_bytes_ + bytes > options_.queue_bytes ||
      tenant->queued_bytes + bytes > byte_share) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  ++queued_;
  ++tenant->queued;
  queued_bytes_ += bytes;
  tenant->queued_bytes += bytes;
  return true;
}

KvEvent* KvEvents::Append(Topic& t, const Announced& ns, KvEvent::Kind kind, TierKind tier, uint64_t bytes) {
  if (!Admit(ns.tenant, sizeof(KvEvent) + bytes)) return nullptr;
  if (t.pending.empty()) order_.push_back(&t);
  t.pending.push_back(KvEvent{.kind = kind,
                              .block_size = ns.block_size,
                              .tier = tier,
                              .signed_hashes = ns.hashes == EventHashForm::kSglang,
                              .bytes = bytes,
                              .group = ns.group});
  return &t.pending.back();
}

void KvEvents::Add(std::string_view encoded_ns, KvEvent::Kind kind, TierKind tier, const BlockHash& hash,
                   const BlockHash* parent, const StoredKeys& keys) {
  MutexLock lock(&mu_);
  auto it = by_namespace_.find(encoded_ns);
  if (it == by_namespace_.end()) return;
  const Announced& ns = it->second;
  const uint64_t h = EventHash(hash, ns.hashes);
  const std::optional<uint64_t> p =
      parent && !parent->empty() ? std::optional(EventHash(*parent, ns.hashes)) : std::nullopt;
  for (Topic* t : ns.topics) AddTo(*t, ns, kind, tier, h, p, keys);
}

void KvEvents::AddTo(Topic& t, const Announced& ns, KvEvent::Kind kind, TierKind tier, uint64_t h,
                     std::optional<uint64_t> p, StoredKeys keys) {
  if (!options_.token_ids || keys.tokens.size() != ns.block_size) keys.tokens = {};
  if (!options_.token_ids || keys.extra.size() != 1) keys.extra = {};
  const bool signed_hashes = ns.hashes == EventHashForm::kSglang;
  // What the event grows by (a new event adds its own size and the LoRA name).
  const uint64_t bytes = sizeof(h) + keys.tokens.size_bytes() + (keys.extra.empty() ? 0 : keys.extra.front().size());
  // Consecutive removals join one BlockRemoved; the next block of a chain being stored
  // joins the previous BlockStored (vLLM's form) when both have tokens or neither has,
  // likewise extra keys, and both name the same LoRA adapter.
  if (!t.pending.empty()) {
    KvEvent& last = t.pending.back();
    const bool joins = last.kind == kind && last.tier == tier && last.signed_hashes == signed_hashes &&
                       last.group == ns.group && last.block_size == ns.block_size &&
                       last.hashes.size() < options_.batch_size && last.bytes + bytes <= options_.message_bytes &&
                       (kind == KvEvent::Kind::kRemoved ||
                        (p && last.hashes.back() == *p && last.token_ids.empty() == keys.tokens.empty() &&
                         last.extra_keys.empty() == keys.extra.empty() && last.lora_name == keys.lora_name &&
                         last.lora_id == keys.lora_id));
    if (joins) {
      if (!Admit(ns.tenant, bytes)) return;
      last.hashes.push_back(h);
      last.bytes += bytes;
      last.token_ids.insert(last.token_ids.end(), keys.tokens.begin(), keys.tokens.end());
      last.extra_keys.insert(last.extra_keys.end(), keys.extra.begin(), keys.extra.end());
      return;
    }
  }
  KvEvent* e = Append(t, ns, kind, tier, bytes + keys.lora_name.size());
  if (e == nullptr) return;
  e->hashes.push_back(h);
  if (kind == KvEvent::Kind::kStored) {
    e->parent = p;
    e->token_ids.assign(keys.tokens.begin(), keys.tokens.end());
    e->extra_keys.assign(keys.extra.begin(), keys.extra.end());
    e->lora_name = keys.lora_name;
    e->lora_id = keys.lora_id;
  }
}

KvEvents::Counters KvEvents::counters() const {
  Counters c;
  c.events = events_.load(std::memory_order_relaxed);
  c.messages = messages_.load(std::memory_order_relaxed);
  c.dropped = dropped_.load(std::memory_order_relaxed);
  c.replays = replays_.load(std::memory_order_relaxed);
  c.refused = refused_.load(std::memory_order_relaxed);
  c.retracted = retracted_.load(std::memory_order_relaxed);
  c.topics_removed = topics_removed_.load(std::memory_order_relaxed);
  c.topics_refused = topics_refused_.load(std::memory_order_relaxed);
  c.topics = topic_count_.load(std::memory_order_relaxed);
  c.subscribers = subscribers_.load(std::memory_order_relaxed);
  c.replay_peers = replay_peers_.load(std::memory_order_relaxed);
  c.first_sequence = first_seq_;
  return c;
}

// ---- what was announced, across restarts ---------------------------------------------------

void KvEvents::LoadState() {
  if (options_.state_path.empty()) return;
  std::ifstream in(options_.state_path);
  if (!in) return;
  std::stringstream text;
  text << in.rdbuf();
  size_t n = 0;
  earlier_ = ParseAnnouncedState(text.str(), &n);
  if (n == 0) {
    earlier_.clear();
  } else {
    KVTIER_LOG(NOTICE) << "events: " << n << " block hashes announced by the last run are removed in "
                       << kRetractDelay_ns / 1'000'000 << " ms";
  }
}

void KvEvents::SaveState() {
  if (options_.state_path.empty() || !state_dirty_) return;
  // Write and rename: a crash leaves the old file or the new one, never half of one.
  const std::string tmp = options_.state_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << EncodeAnnouncedState(announced_);
    if (!out) {
      KVTIER_LOG(WARNING) << "events: cannot write " << tmp;
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, options_.state_path, ec);
  if (ec) KVTIER_LOG(WARNING) << "events: cannot replace " << options_.state_path << ": " << ec.message();
  state_dirty_ = false;
}

void KvEvents::Retract() {
  std::vector<std::pair<TopicKey, KvEvent>> removals;
  uint64_t n = 0;
  for (auto& [key, a] : earlier_) {
    const auto now = announced_.find(key);
    for (auto& [medium, set] : a.hashes) {
      KvEvent e;
      e.kind = KvEvent::Kind::kRemoved;
      e.tier = medium.first;
      e.signed_hashes = a.signed_hashes;
      e.group.index = medium.second;
      for (uint64_t h : set) {
        // Announced again by this run: still true.
        if (now != announced_.end()) {
          auto it = now->second.hashes.find(medium);
          if (it != now->second.hashes.end() && it->second.count(h)) continue;
        }
        e.hashes.push_back(h);
      }
      n += e.hashes.size();
      if (!e.hashes.empty()) removals.emplace_back(key, std::move(e));
    }
  }
  earlier_.clear();
  const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto& [key, e] : removals) PublishRemoved(key, e, ts);
  retracted_.fetch_add(n, std::memory_order_relaxed);
  events_.fetch_add(n, std::memory_order_relaxed);
  state_dirty_ = true;  // the earlier run's file is replaced by this run's
  KVTIER_LOG(NOTICE) << "events: removed " << n << " block hashes announced by the last run";
}

}  // namespace kvtier
