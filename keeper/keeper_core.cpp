#include <ampactor/keeper/keeper_core.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>

namespace ampactor {

namespace {

template <class T, class V>
bool holds(const V& v) {
  return std::holds_alternative<T>(v);
}

template <class T, class = void>
struct has_k : std::false_type {};
template <class T>
struct has_k<T, std::void_t<decltype(T::k)>> : std::true_type {};

bool is_update(const KeeperInput& in) {
  return holds<UpdateScale>(in) || holds<UpdateWhenClosed>(in) || holds<SetScale>(in);
}

}  // namespace

bool is_request(const KeeperInput& in) {
  return in.index() <= std::size_t(6);  // the requests come first in KeeperInput
}
static_assert(std::is_same_v<std::variant_alternative_t<6, KeeperInput>, LoadStateDict>);
static_assert(std::is_same_v<std::variant_alternative_t<7, KeeperInput>, UnscaleDone>);

iteration_t iteration_of(const KeeperInput& in) {
  return std::visit(
      [](const auto& m) -> iteration_t {
        if constexpr (has_k<std::decay_t<decltype(m)>>::value)
          return m.k;
        else
          return -1;
      },
      in);
}

/// Calls the tap; one that throws is dropped (with a line on stderr) and the keeper goes on.
template <class F>
void KeeperCore::notify(F f) {
  if (!tap_) return;
  try {
    f(*tap_);
  } catch (const std::exception& e) {
    std::cerr << "ampactor: scale_keeper tap dropped: " << e.what() << "\n";
    tap_.reset();
  }
}

KeeperCore::KeeperCore(const GradScalerOptions& opts, ScalePolicy policy,
                       std::shared_ptr<KeeperTap> tap)
    : state_((opts.validate(), opts)), policy_(policy), tap_(std::move(tap)) {
  notify([&](KeeperTap& t) { t.started(opts, policy); });
}

KeeperCore::~KeeperCore() {
  stop();
}

void KeeperCore::stop() {
  if (stopped_) return;
  stopped_ = true;
  notify([](KeeperTap& t) { t.stopped(); });
}

ScaleParams KeeperCore::params() const {
  return {applied_through_,        state_.get_scale(),       state_.growth_factor(),
          state_.backoff_factor(), state_.growth_interval(), state_.growth_tracker()};
}

void KeeperCore::emit(KeeperOutput out) {
  notify([&](KeeperTap& t) { t.output(out); });
  out_->push_back(std::move(out));
}

ScaleGuard KeeperCore::guard() const {
  return ScaleGuard{state_.backoffs_in_row(), state_.collapsing()};
}

ReplyMessage KeeperCore::scale_answer(iteration_t k) const {
  if (halted_) return *halted_;
  return ScaleReply{k, state_.scale(), guard()};
}

void KeeperCore::reply(peer_id to, std::uint64_t request, iteration_t k, ReplyMessage msg) {
  emit(KeeperReply{to, request, k, std::move(msg)});
}

std::vector<KeeperOutput> KeeperCore::handle(peer_id from, const KeeperInput& in,
                                             std::uint64_t request) {
  std::vector<KeeperOutput> out;
  out_ = &out;
  notify([&](KeeperTap& t) { t.input(from, in); });
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, ScaleRequest> || std::is_same_v<T, GetParams>) {
          on(from, request, m);
        } else if constexpr (std::is_same_v<T, UnscaleDone> || std::is_same_v<T, IterationClosed>) {
          on(m);
        } else if constexpr (std::is_same_v<T, Subscribe>) {
          if (std::find(subscribers_.begin(), subscribers_.end(), m.subscriber) ==
              subscribers_.end())
            subscribers_.push_back(m.subscriber);
        } else if constexpr (std::is_same_v<T, Unsubscribe>) {
          subscribers_.erase(std::remove(subscribers_.begin(), subscribers_.end(), m.subscriber),
                             subscribers_.end());
        } else {
          // Updates, setters, state_dict and load: in mailbox order, after the updates before
          // them.
          if constexpr (std::is_same_v<T, UpdateScale> || std::is_same_v<T, UpdateWhenClosed> ||
                        std::is_same_v<T, SetScale>)
            note_update(m.k);
          queue_.push_back(Queued{from, request, m});
          drain();
        }
      },
      in);
  out_ = nullptr;
  return out;
}

void KeeperCore::note_update(iteration_t k) {
  if (!started_) {
    started_ = true;
    first_missing_update_ = k;
  }
  if (k == first_missing_update_) ++first_missing_update_;
}

void KeeperCore::on(peer_id from, std::uint64_t request, const ScaleRequest& r) {
  if (policy_ == ScalePolicy::exact) {
    if (!started_) {
      started_ = true;
      first_missing_update_ = r.k;
    } else if (r.k > first_missing_update_) {
      reply(
          from, request, r.k,
          KeeperError{errc::protocol_misuse,
                      "ScaleRequest for iteration " + std::to_string(r.k) +
                          ", but the update of iteration " + std::to_string(first_missing_update_) +
                          " was never sent: under the exact policy each iteration's update "
                          "(UpdateScale, UpdateWhenClosed or SetScale) must be sent before the "
                          "next iteration's ScaleRequest."});
      return;
    }
  }
  state_.lazy_init();
  if (policy_ == ScalePolicy::lagged || queue_.empty()) {
    reply(from, request, r.k, scale_answer(r.k));
    return;
  }
  queue_.push_back(Queued{from, request, r});
}

void KeeperCore::on(peer_id from, std::uint64_t request, const GetParams& g) {
  if (!g.up_to_date || queue_.empty()) {
    reply(from, request, -1, params());
    return;
  }
  queue_.push_back(Queued{from, request, g});
}

void KeeperCore::on(const UnscaleDone& d) {
  if (d.k <= applied_through_) return;  // late report for an applied update: ignored
  Unscales& slot = unscales_[d.k];
  ++slot.count;
  if (d.found_inf) {
    slot.found_inf = true;
    slot.min_inf_scale = std::min(slot.min_inf_scale, d.scale_used);
  }
  drain();
}

void KeeperCore::on(const IterationClosed& c) {
  if (c.k <= applied_through_) return;
  closed_[c.k] = c;
  drain();
}

bool KeeperCore::ready(const KeeperInput& in) const {
  if (iteration_of(in) <= applied_through_) return true;  // a duplicate is dropped
  if (auto* s = std::get_if<SetScale>(&in)) return !s->after_jobs || closed_.count(s->k) != 0;
  if (auto* w = std::get_if<UpdateWhenClosed>(&in)) return closed_.count(w->k) != 0;
  const auto& u = std::get<UpdateScale>(in);
  const auto it = unscales_.find(u.k);
  const std::int32_t got = it == unscales_.end() ? 0 : it->second.count;
  if (got >= u.unscales) return true;
  // A job whose unscales were counted in advance failed before making them: they never come.
  const auto closed = closed_.find(u.k);
  return closed != closed_.end() && closed->second.abandoned;
}

void KeeperCore::apply(const KeeperInput& in) {
  const iteration_t k = iteration_of(in);
  state_.lazy_init();
  UpdateApplied out;
  out.k = k;
  const auto closed = closed_.find(k);
  const bool abandoned = closed != closed_.end() && closed->second.abandoned;
  if (auto* s = std::get_if<SetScale>(&in); s && !(s->after_jobs && abandoned)) {
    state_.set_scale(s->new_scale);
    top_since_set_ = state_.scale();
    halted_.reset();  // a scale the user chose ends a halt at the minimum
  } else if (s) {
    out.abandoned = true;  // its jobs failed or were cancelled: as any update, it changes nothing
  } else if (closed != closed_.end() &&
             (closed->second.abandoned || closed->second.unscales == 0)) {
    // A failed, cancelled or unscale-less iteration: like torch, where update() is then never
    // reached or refuses, the state stays as it is.
    out.abandoned = true;
  } else {
    const auto it = unscales_.find(k);
    const Unscales got = it == unscales_.end() ? Unscales{} : it->second;
    out.found_inf = got.found_inf;
    // One overflow event, one backoff: an overflow found only with scales larger than the current
    // one was produced before the backoff that already answered it. Not when the scale came down
    // by update(new_scale) or a load (min_inf_scale above every scale since): no backoff answered
    // it, and RoundPipe backs off from the new scale.
    const bool stale = policy_ == ScalePolicy::lagged && got.found_inf &&
                       got.min_inf_scale > state_.scale() && got.min_inf_scale <= top_since_set_;
    if (stale) {
      state_.reset_tracker();
    } else {
      try {
        const UpdateOutcome o = state_.update(got.found_inf);
        out.backed_off = o.backed_off;
        out.grew = o.grew;
        top_since_set_ = std::max(top_since_set_, state_.scale());
      } catch (const ScalerError& e) {
        // The deepspeed rule at its minimum: the state stays; every later scale request gets
        // the error (the trainer's next scale() throws it) until update(new_scale) or a load.
        halted_ = KeeperError{e.code(), e.what()};
        out.halted = true;
      }
    }
  }
  unscales_.erase(k);
  if (closed != closed_.end()) closed_.erase(closed);
  applied_through_ = std::max(applied_through_, k);
  out.scale = state_.scale();
  out.growth_tracker = state_.growth_tracker();
  out.below_one = out.scale < 1.0f;
  out.guard = guard();
  emit(KeeperPush{subscribers_, out});
}

namespace {
/// A setter's or load's refusal as a reply.
template <class F>
std::optional<KeeperError> attempt(F f) {
  try {
    f();
  } catch (const ScalerError& e) {
    return KeeperError{e.code(), e.what()};
  }
  return std::nullopt;
}
}  // namespace

void KeeperCore::answer(const Queued& q) {
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        std::optional<KeeperError> err;
        if constexpr (std::is_same_v<T, ScaleRequest>) {
          reply(q.from, q.request, m.k, scale_answer(m.k));
          return;
        } else if constexpr (std::is_same_v<T, GetStateDict>) {
          reply(q.from, q.request, -1, to_message(make_state_dict(state_)));
          return;
        } else if constexpr (std::is_same_v<T, SetGrowthFactor>) {
          err = attempt([&] { state_.set_growth_factor(m.value); });
        } else if constexpr (std::is_same_v<T, SetBackoffFactor>) {
          err = attempt([&] { state_.set_backoff_factor(m.value); });
        } else if constexpr (std::is_same_v<T, SetGrowthInterval>) {
          err = attempt([&] { state_.set_growth_interval(m.value); });
        } else if constexpr (std::is_same_v<T, LoadStateDict>) {
          err = attempt([&] { load_state_dict(state_, from_message(m.state)); });
          if (!err) {
            halted_.reset();
            top_since_set_ = float(state_.get_scale());
          }
        }
        if (err)
          reply(q.from, q.request, -1, std::move(*err));
        else
          reply(q.from, q.request, -1, params());
      },
      q.in);
}

/// Runs queued commands in mailbox order until an update must wait.
void KeeperCore::drain() {
  while (!queue_.empty()) {
    const Queued& head = queue_.front();
    if (is_update(head.in)) {
      if (!ready(head.in)) return;
      // An update is never applied twice.
      if (iteration_of(head.in) > applied_through_) apply(head.in);
    } else {
      answer(head);
    }
    queue_.pop_front();
  }
}

}  // namespace ampactor
