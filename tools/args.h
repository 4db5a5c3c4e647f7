// The `kiln` tool's command line: one CLI11 parser for every command, with Kiln's own typed,
// range-checked values, a help layout that starts with the usage line, and every usage error
// reported as one `kiln: error: ...` line (exit status 1, like every other error).
// CLI11 is heavy to compile: only tools/ includes this header.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codegen/backend.h"
#include "tools/suggest.h"

namespace kiln::cli {

enum class Range { non_negative, positive };

// `text` given to `flag` as a finite double in `range`; a kiln::Error naming the flag otherwise
// ("--lr expects a number, got 'abc'", "--lr 1e400 is out of range", "--rtol must be >= 0, ...").
double parse_real(const std::string& flag, const std::string& text, Range range);
// `text` as a count 0, 1, 2, ... that fits an int.
int parse_count(const std::string& flag, const std::string& text);

class Parser {
 public:
  Parser(const std::string& description, const std::string& footer);

  // A command: `summary` is its line in `kiln --help`, `usage` follows "usage: kiln NAME ",
  // `details` ends its own --help.
  CLI::App* add_command(const std::string& name, const std::string& summary, const std::string& usage,
                        const std::string& details);

  // The FILE argument: by default a .kir graph or an .onnx model ('-' for a graph on standard
  // input); `help` describes it otherwise.
  void add_file(CLI::App* cmd, std::string& file, const std::string& help = "");
  void add_flag(CLI::App* cmd, const std::string& flag, bool& out, const std::string& help);
  // --flag VALUE or --flag=VALUE; the last one given counts.
  void add_text(CLI::App* cmd, const std::string& flag, const std::string& type, std::string& out,
                const std::string& help);
  // Repeatable: each --flag VALUE is one more element.
  void add_list(CLI::App* cmd, const std::string& flag, const std::string& type, std::vector<std::string>& out,
                const std::string& help);
  // device_suffix: a choice may carry ":N" (cuda:1), kept in `out` for resolve_device.
  void add_choice(CLI::App* cmd, const std::string& flag, std::vector<std::string> choices, std::string& out,
                  const std::string& help, bool device_suffix = false);
  void add_real(CLI::App* cmd, const std::string& flag, Range range, std::optional<double>& out,
                const std::string& help);
  void add_count(CLI::App* cmd, const std::string& flag, std::optional<int>& out, const std::string& help);
  // A flag the command no longer has, kept out of --help: giving it is the usage error
  // "FLAG: MESSAGE" (MESSAGE says what replaces it).
  void add_replaced(CLI::App* cmd, const std::string& flag, const std::string& message);

  // Parses the command line. Returns the command to run, or nullptr when the parser has done
  // all there is to do (printed help or the version), with the exit status in `status`.
  // Usage errors are thrown as kiln::Error.
  CLI::App* parse(int argc, char** argv, int& status);

 private:
  // A value callback that keeps the first conversion error for later, so that --help still wins.
  CLI::Option* add_value(CLI::App* cmd, const std::string& flag, const std::string& type,
                         std::function<void(const std::string&)> convert, const std::string& help);
  void check_leftovers(const CLI::App* cmd) const;

  CLI::App app_;
  std::shared_ptr<class Formatter> formatter_;
  std::optional<std::string> value_error_;
  bool version_ = false;
};

// `options` with --device N applied (only the cuda target takes it) and the target's
// ":N" suffix resolved (resolve_device): one clear error for a device a target has not.
CompileOptions with_device_option(CompileOptions options, std::optional<int> device);

}  // namespace kiln::cli
