// Private to lib/front/resp: the state of one RESP connection behind RespSession and its
// Answers (resp_session.h). resp_session.cc owns the reply slots, the command loop and MULTI;
// resp_commands.cc the command table and what each command does.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "front/resp/resp_session.h"

namespace sluice::front::resp::detail {

// Command flags, as COMMAND INFO names them.
enum CommandFlag : uint32_t {
  kWrite = 1u << 0,
  kReadonly = 1u << 1,
  kDenyOom = 1u << 2,
  kNoScript = 1u << 3,
  kLoading = 1u << 4,
  kStale = 1u << 5,
  kFast = 1u << 6,
  kNoAuth = 1u << 7,
  kAdmin = 1u << 8,
  kSkipSlowlog = 1u << 9,
};

struct CommandSpec;
using Run = void (*)(SessionCore&, std::span<const std::string_view>);

struct CommandSpec {
  std::string_view name;  // lower case; "client|setname" for a subcommand
  int arity;              // Redis's: n exactly n arguments (the name included), -n at least n
  uint32_t flags;
  int first_key, last_key, key_step;
  Run run;  // nullptr: a container (subcommands)
  std::span<const CommandSpec> subcommands;
  // The arity error, when the command has its own (CL.THROTTLE's usage text): "" when `args`
  // is acceptable, else the error text; nullptr: Redis's arity rule.
  std::string_view (*own_arity)(std::span<const std::string_view> args);
};

// The door's commands, and lookups (names in any case).
std::span<const CommandSpec> command_table();
const CommandSpec* find_command(std::string_view name);
const CommandSpec* find_subcommand(const CommandSpec& container, std::string_view name);
void write_command_info(RespWriter& w, const CommandSpec& spec);

class SessionCore : public std::enable_shared_from_this<SessionCore> {
 public:
  SessionCore(const Config& config, Backend& backend, RespCounters& counters, uint64_t client_id,
              std::function<void()> wake);

  size_t feed(std::string_view input);

  // A writer for the next reply, in order: into output when nothing is awaited before it.
  RespWriter writer();
  // A new slot for a backend answer, and its Answer.
  template <class T>
  Answer<T> await();
  // Called by Answer: `encode` writes the slot's reply.
  template <class T>
  void fill(uint64_t slot, const T* value, std::string_view error);
  // Ends the connection once what came before is answered.
  void close_after_reply() { closing_ = true; }

  const Config& config;
  Backend& backend;
  RespCounters& counters;
  const uint64_t client_id;
  Protocol protocol = Protocol::kResp2;
  bool authenticated;
  int db = 0;
  std::string name;  // CLIENT SETNAME
  bool in_multi = false;
  std::string output;

  // Checks and runs (or queues, in MULTI) one command.
  void dispatch(std::span<const std::string_view> args);
  void exec();
  void discard_multi();
  void multi_error(std::string_view text);  // an error that fails the MULTI it is part of

  bool closing_ = false;
  size_t awaited_ = 0;

 private:
  struct Slot {
    uint64_t seq = 0;
    bool filled = false;
    Protocol protocol = Protocol::kResp2;
    std::string bytes;
  };
  Slot& push_slot(bool filled);
  void flush();
  void queue(std::span<const std::string_view> args);

  std::function<void()> wake_;
  RespParser parser_;
  bool in_feed_ = false;
  // Reply slots from the oldest still awaited: a ring (slots_[head_], ...), grown by doubling.
  std::vector<Slot> slots_;
  size_t head_ = 0, count_ = 0;
  uint64_t next_seq_ = 1;
  // MULTI's queue: every argument's bytes in one string, and each command's argument count.
  std::string queued_bytes_;
  std::vector<uint32_t> queued_sizes_;  // argument sizes, command after command
  std::vector<uint32_t> queued_argc_;
  std::vector<std::string_view> exec_args_;
  bool multi_failed_ = false;
  std::string error_scratch_;
};

}  // namespace sluice::front::resp::detail
