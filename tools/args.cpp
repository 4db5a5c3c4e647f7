#include "tools/args.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "ir/error.h"

namespace kiln::cli {

double parse_real(const std::string& flag, const std::string& text, Range range) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  const bool underflow = errno == ERANGE && std::fabs(v) <= std::numeric_limits<double>::min();
  if (text.empty() || end != text.c_str() + text.size())
    throw Error(fmt::format("{} expects a number, got '{}'", flag, text));
  if (errno == ERANGE && !underflow)
    throw Error(fmt::format("{} {} is out of range (a double holds at most {:g})", flag, text,
                            std::numeric_limits<double>::max()));
  if (!std::isfinite(v)) throw Error(fmt::format("{} must be a finite number, got '{}'", flag, text));
  switch (range) {
    case Range::non_negative:
      if (v < 0) throw Error(fmt::format("{} must be >= 0, got '{}'", flag, text));
      break;
    case Range::positive:
      if (v <= 0)
        throw Error(fmt::format("{} must be > 0, got '{}'{}", flag, text, underflow ? " (it rounds to 0)" : ""));
      break;
  }
  return v;
}

int parse_count(const std::string& flag, const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    throw Error(fmt::format("{} expects a count (0, 1, 2, ...), got '{}'", flag, text));
  int v = 0;
  if (std::from_chars(text.data(), text.data() + text.size(), v).ec != std::errc{})
    throw Error(fmt::format("{} {} is out of range (at most {})", flag, text, std::numeric_limits<int>::max()));
  return v;
}

namespace {
// "; did you mean ...?" after an error's subject, or nothing.
std::string suggestion(const std::string& did_you_mean) { return did_you_mean.empty() ? "" : "; " + did_you_mean; }
}  // namespace

// CLI11's layout, rearranged: the usage line first (scripts and tests look for it), then the
// description, arguments, options, commands and the details; descriptions are wrapped.
class Formatter : public CLI::Formatter {
 public:
  std::map<const CLI::App*, std::string> usage;

  std::string make_option(const CLI::Option* opt, bool is_positional) const override {
    return two_columns(make_option_name(opt, is_positional) + make_option_opts(opt), make_option_desc(opt));
  }
  std::string make_subcommand(const CLI::App* sub) const override {
    return two_columns(sub->get_name(), sub->get_description());
  }

  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    const std::string& u = usage.at(app);
    std::string out = "usage: " + name + (u.empty() ? "" : " " + u) + "\n\n" + app->get_description() + "\n";
    out += make_positionals(app) + make_groups(app, mode) + make_subcommands(app, mode);
    if (!app->get_footer().empty()) out += "\n" + app->get_footer() + "\n";
    return out;
  }

 private:
  static constexpr size_t kColumn = 30, kWidth = 96;

  // "  left      text wrapped at kWidth, continued under its first word".
  static std::string two_columns(const std::string& left, const std::string& text) {
    std::string out = "  " + left;
    out += out.size() + 2 > kColumn ? "\n" + std::string(kColumn, ' ') : std::string(kColumn - out.size(), ' ');
    size_t col = kColumn, start = 0;
    while (start < text.size()) {
      size_t end = std::min(text.find(' ', start), text.size());
      if (col > kColumn && col + 1 + (end - start) > kWidth) {
        out += "\n" + std::string(kColumn, ' ');
        col = kColumn;
      } else if (col > kColumn) {
        out += ' ';
        ++col;
      }
      out += text.substr(start, end - start);
      col += end - start;
      start = end + 1;
    }
    return out + "\n";
  }
};

Parser::Parser(const std::string& description, const std::string& footer)
    : app_(description, "kiln"), formatter_(std::make_shared<Formatter>()) {
  formatter_->label("Positionals", "arguments");
  formatter_->usage[&app_] = "<command> [options]";
  app_.formatter(formatter_);
  app_.footer(footer);
  app_.option_defaults()->group("options");
  app_.set_help_flag("-h,--help", "show this help");
  app_.add_flag("--version", version_, "show the version");
  app_.allow_extras();  // unknown commands and options are reported by check_leftovers
}

CLI::App* Parser::add_command(const std::string& name, const std::string& summary, const std::string& usage,
                              const std::string& details) {
  CLI::App* cmd = app_.add_subcommand(name, summary);
  cmd->group("commands");
  cmd->footer(details);
  cmd->set_help_flag("-h,--help", "show this help");
  cmd->allow_extras();
  formatter_->usage[cmd] = usage;
  return cmd;
}

void Parser::add_file(CLI::App* cmd, std::string& file, const std::string& help) {
  cmd->add_option("FILE", file,
                  help.empty() ? "the model: a Kiln graph (.kir) or an ONNX model (.onnx); '-' reads a .kir graph "
                                 "from standard input"
                               : help)
      ->type_name("");
}

void Parser::add_flag(CLI::App* cmd, const std::string& flag, bool& out, const std::string& help) {
  cmd->add_flag(flag, out, help);
}

void Parser::add_replaced(CLI::App* cmd, const std::string& flag, const std::string& message) {
  cmd->add_flag_callback(flag, [this, error = flag + ": " + message] {
       if (!value_error_) value_error_ = error;
     })->group("");
}

CLI::Option* Parser::add_value(CLI::App* cmd, const std::string& flag, const std::string& type,
                               std::function<void(const std::string&)> convert, const std::string& help) {
  auto keep_first_error = [this, convert = std::move(convert)](const std::string& text) {
    try {
      convert(text);
    } catch (const Error& e) {
      if (!value_error_) value_error_ = e.what();
    }
  };
  return cmd->add_option_function<std::string>(flag, keep_first_error, help)
      ->type_name(type)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void Parser::add_text(CLI::App* cmd, const std::string& flag, const std::string& type, std::string& out,
                      const std::string& help) {
  add_value(cmd, flag, type, [&out](const std::string& text) { out = text; }, help);
}

void Parser::add_list(CLI::App* cmd, const std::string& flag, const std::string& type,
                      std::vector<std::string>& out, const std::string& help) {
  // One value per occurrence, so that `--input x=a.npy model.kir` leaves model.kir as FILE.
  cmd->add_option(flag, out, help)->type_name(type)->allow_extra_args(false);
}

void Parser::add_choice(CLI::App* cmd, const std::string& flag, std::vector<std::string> choices, std::string& out,
                        const std::string& help, bool device_suffix) {
  std::string names;
  for (const std::string& c : choices) names += (names.empty() ? "" : "|") + c;
  if (device_suffix) names += "[:N]";
  auto convert = [&out, flag, choices, device_suffix](const std::string& text) {
    std::string name = text;
    if (size_t colon = text.find(':'); device_suffix && colon != std::string::npos) {
      name = text.substr(0, colon);
      if (!device_number(std::string_view(text).substr(colon + 1)))
        throw Error(fmt::format("{}={}: the device after ':' is a number (e.g. {}:0)", flag, text, name));
    }
    if (std::find(choices.begin(), choices.end(), name) == choices.end()) {
      std::string list;
      for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
      throw Error(fmt::format("{}={} is not one of {}{}", flag, text, list, suggestion(did_you_mean(text, choices))));
    }
    out = text;
  };
  add_value(cmd, flag, names, convert, help);
}

void Parser::add_real(CLI::App* cmd, const std::string& flag, Range range, std::optional<double>& out,
                      const std::string& help) {
  add_value(cmd, flag, "X", [&out, flag, range](const std::string& text) { out = parse_real(flag, text, range); },
            help);
}

void Parser::add_count(CLI::App* cmd, const std::string& flag, std::optional<int>& out, const std::string& help) {
  add_value(cmd, flag, "N", [&out, flag](const std::string& text) { out = parse_count(flag, text); }, help);
}

// CLI11 keeps what it did not recognize (allow_extras); report the first piece in Kiln's words.
void Parser::check_leftovers(const CLI::App* cmd) const {
  const std::string name = cmd ? cmd->get_name() : "";
  const std::string see = cmd ? fmt::format(" (see 'kiln {} --help')", name) : " (see 'kiln --help')";
  bool after_dashes = false;  // after `--`, everything is an argument
  for (const std::string& a : cmd ? cmd->remaining() : app_.remaining()) {
    if (a == "--" && !after_dashes) {
      after_dashes = true;
      continue;
    }
    if (!after_dashes && a.size() > 1 && a[0] == '-') {
      const std::string option = a.substr(0, a.find('='));
      std::vector<std::string> options;
      for (const CLI::Option* o : (cmd ? cmd : &app_)->get_options()) {
        for (const std::string& l : o->get_lnames()) options.push_back("--" + l);
        for (const std::string& s : o->get_snames()) options.push_back("-" + s);
      }
      throw Error(fmt::format("{}unknown option '{}'{}{}", cmd ? name + ": " : "", option,
                              suggestion(did_you_mean(option, options)), see));
    }
    if (!cmd) {
      std::vector<std::string> commands;
      for (const CLI::App* c : app_.get_subcommands([](const CLI::App*) { return true; }))
        commands.push_back(c->get_name());
      throw Error(fmt::format("unknown command '{}'{}{}", a, suggestion(did_you_mean(a, commands)), see));
    }
    throw Error(cmd->get_option_no_throw("FILE")
                    ? fmt::format("{} takes one FILE argument, got also '{}'{}", name, a, see)
                    : fmt::format("{} takes no arguments, got '{}'{}", name, a, see));
  }
}

CLI::App* Parser::parse(int argc, char** argv, int& status) {
  CLI::App* cmd = nullptr;
  try {
    app_.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app_.help().c_str(), stdout);
    status = 0;
    return nullptr;
  } catch (const CLI::ParseError& e) {
    // What CLI11 still reports itself: a missing value ("--emit: 1 required TYPE missing") or a
    // flag given a value it cannot read. Both messages start with the option's name.
    std::string msg = e.what();
    if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) && msg.find(" required ") != std::string::npos)
      msg = msg.substr(0, msg.find(':')) + " needs a value";
    if (!msg.empty()) msg[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(msg[0])));
    std::vector<CLI::App*> given = app_.get_subcommands();
    std::string see = given.empty() ? "kiln --help" : "kiln " + given[0]->get_name() + " --help";
    throw Error(fmt::format("{} (see '{}')", msg, see));
  }
  if (value_error_) throw Error(*value_error_);
  std::vector<CLI::App*> given = app_.get_subcommands();
  if (!given.empty()) cmd = given[0];
  check_leftovers(nullptr);
  if (cmd) {
    check_leftovers(cmd);
    return cmd;
  }
  if (version_) {
    fmt::print("kiln {}\n", KILN_VERSION);
    status = 0;
    return nullptr;
  }
  std::fputs(app_.help().c_str(), stderr);  // no command: the overview, as an error
  status = 1;
  return nullptr;
}

CompileOptions with_device_option(CompileOptions options, std::optional<int> device) {
  if (device && resolve_target(options) != "cuda")
    throw Error(fmt::format("--device {} is an option of the cuda target, not {}", *device, resolve_target(options)));
  options.device = device.value_or(0);
  return resolve_device(options);
}

}  // namespace kiln::cli
