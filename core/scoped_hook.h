#pragma once
// A thread-local hook installed for a scope: the hook installed before it comes back when
// the scope ends, so guards nest. The registry's hooks (OpHookGuard, HostReadHookGuard,
// DeferHookGuard, PendingHookGuard) and autograd's SetGradHookGuard are this template over
// their own thread-local slot.
#include <utility>

namespace kiln {

template <class Hook>
class ScopedHook {
 public:
  ScopedHook(Hook& slot, Hook hook) : slot_(slot), previous_(std::exchange(slot, std::move(hook))) {}
  ~ScopedHook() { slot_ = std::move(previous_); }
  ScopedHook(const ScopedHook&) = delete;
  ScopedHook& operator=(const ScopedHook&) = delete;

 private:
  Hook& slot_;
  Hook previous_;
};

}  // namespace kiln
