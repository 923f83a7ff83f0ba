#pragma once
// kvctl's read-only views of a daemon's stats: status, tiers, sessions, agents (text or JSON) and
// the live top screen. Each returns kvctl's exit status.

#include <string>

#include "engine/control_client.h"

namespace kvctl {

// "1d2h", "3h4m", "5m6s", "7.8s".
std::string Duration(double s);
// Prints "kvctl: WHAT: STATUS" to stderr; 1.
int Die(const std::string& what, const kvtier::Status& s);
int Status(const kvtier::DaemonStats& s, const std::string& socket, bool as_json);
int Tiers(const kvtier::DaemonStats& s, bool as_json);
int Sessions(const kvtier::DaemonStats& s, bool as_json);
// Agentic sessions (SessionHint): state, TTL left, requests, hit tokens, cached blocks per tier.
int Agents(const kvtier::DaemonStats& s, bool as_json);
// Redraws one 80x24 screen every `interval_s`, `iterations` times (0: until interrupted).
int Top(kvtier::ControlClient& c, const std::string& socket, double interval_s, int iterations, bool as_json);

}  // namespace kvctl
